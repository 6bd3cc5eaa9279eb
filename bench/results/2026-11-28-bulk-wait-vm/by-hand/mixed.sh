#!/bin/bash
# mixed.sh ROUNDS BIN...: one worker (--threads 1) serving a 1M QD8 reader and a 4K QD1
# reader at once (two fio jobs, two connections); the 4K job's mean latency, the 1M job's
# rate, the server's CPU. cubic for the run, bbr put back.
port=13900; img=/var/tmp/sluice-bench-2G.img
cat $img > /dev/null
rounds=$1; shift
sysctl -qw net.ipv4.tcp_congestion_control=cubic
for r in $(seq $rounds); do for b in "$@"; do
  port=$((port+1))
  $b serve --threads 1 --listen 127.0.0.1:$port $img > /dev/null 2>&1 & p=$!
  sleep 0.5
  t0=$(awk '{print $14+$15}' /proc/$p/stat)
  fio --ioengine=nbd --uri=nbd://127.0.0.1:$port/ --size=2G --time_based --runtime=3 --output-format=json \
    --name=bulk --rw=read --bs=1m --iodepth=8 --name=small --rw=randread --bs=4k --iodepth=1 > /tmp/mixed-fio.json 2>/dev/null
  t1=$(awk '{print $14+$15}' /proc/$p/stat)
  python3 -c "
import json; t=open('/tmp/mixed-fio.json').read(); js=json.loads(t[t.index('{'):])['jobs']
b=js[0]['read']; s=js[1]['read']; gib=(b['io_bytes']+s['io_bytes'])/2**30
print('$r %-18s 1M %6.0f MB/s  4K %7.1f us lat %6.0f IOPS  server %6.3f s/GiB' % ('$(basename $b)', b['bw_bytes']/1e6, s['lat_ns']['mean']/1e3, s['iops'], ($t1-$t0)/100/gib))"
  kill $p; wait $p 2>/dev/null
done; done
sysctl -qw net.ipv4.tcp_congestion_control=bbr
