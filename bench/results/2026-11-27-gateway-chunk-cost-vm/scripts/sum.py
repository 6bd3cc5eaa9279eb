import sys,re,statistics as st
rows={}
for l in open(sys.argv[1]):
    m=re.match(r'([\w]+) read 1M (qd\d+)\s+(\d+) MB/s.*gw ([\d.]+) s/GiB.*member ([\d.]+) s/GiB',l)
    if m:
        rows.setdefault((m[2],m[1]),[]).append((int(m[3]),float(m[4]),float(m[5])))
for k in sorted(rows):
    v=rows[k]
    print(k, "n=%d MB/s median %d [%d..%d]  gw %.3f  member %.3f" % (len(v), st.median(x[0] for x in v), min(x[0] for x in v), max(x[0] for x in v), st.median(x[1] for x in v), st.median(x[2] for x in v)))
