import json, sys
t = sys.stdin.read(); j = json.loads(t[t.index('{'):])['jobs'][0]
r, b, job, dt = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rw = 'write' if job.startswith('w') else 'read'
n = j[rw]['total_ios']
print(r, b, 'iops=%d' % j[rw]['iops'], 'gw_us_per_io=%.2f' % (dt * 1e6 / 100 / max(n, 1)), 'lat_us=%.1f' % (j[rw]['lat_ns']['mean'] / 1000))
