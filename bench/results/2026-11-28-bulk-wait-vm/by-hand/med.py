import sys, statistics as st, collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    f=l.split()
    if len(f)<10: continue
    d[(f[1],f[2])].append((float(f[3]),float(f[7]),float(f[9])))
for k in sorted(d):
    v=d[k]; print(k[0],k[1].ljust(7),'n=%d'%len(v),'MB/s med %6.0f'%st.median(x[0] for x in v),'s/GiB med %.3f'%st.median(x[1] for x in v),'lat med %.1f'%st.median(x[2] for x in v))
