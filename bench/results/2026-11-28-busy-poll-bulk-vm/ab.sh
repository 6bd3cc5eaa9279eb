#!/bin/bash
# ab.sh BASE NEW ROUNDS [CC]: the worker's spin while large replies wait (NEW) against
# spinning whatever it waits for (BASE), and BASE with --busy-poll 0; nbdkit's file plugin
# alongside. fio's nbd engine over loopback, the bench's 2 GiB image in the page cache,
# 3 s per run; server CPU from /proc (user + system, every thread). CC (default cubic) is
# set system-wide for the run and bbr put back at the end.
base=$1; new=$2; port=11900
img=/var/tmp/sluice-bench-2G.img
cat $img > /dev/null
sysctl -qw net.ipv4.tcp_congestion_control=${4:-cubic}
for r in $(seq $3); do for job in 1m1 1m8 4k1 4k32; do for s in base new bp0 nbdkit; do
  port=$((port+1))
  case $s in
  nbdkit) nbdkit -f -p $port -i 127.0.0.1 file $img & p=$!;;
  base) $base serve --listen 127.0.0.1:$port $img > /dev/null 2>&1 & p=$!;;
  new) $new serve --listen 127.0.0.1:$port $img > /dev/null 2>&1 & p=$!;;
  bp0) $base serve --busy-poll 0 --listen 127.0.0.1:$port $img > /dev/null 2>&1 & p=$!;;
  esac
  sleep 0.5
  case $job in
  1m1) a="--rw=read --bs=1m --iodepth=1";; 1m8) a="--rw=read --bs=1m --iodepth=8";;
  4k1) a="--rw=randread --bs=4k --iodepth=1";; 4k32) a="--rw=randread --bs=4k --iodepth=32";;
  esac
  t0=$(awk '{print $14+$15}' /proc/$p/stat)
  fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:$port/ $a --size=2G --time_based --runtime=3 --output-format=json > /tmp/ab-bp-fio.json 2>/dev/null
  t1=$(awk '{print $14+$15}' /proc/$p/stat)
  python3 -c "
import json; t=open('/tmp/ab-bp-fio.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]['read']
gib=j['io_bytes']/2**30; print('$r $job %-6s %6.0f MB/s %7.0f IOPS %6.3f s/GiB %7.1f us lat' % ('$s', j['bw_bytes']/1e6, j['iops'], ($t1-$t0)/100/gib, j['lat_ns']['mean']/1e3))"
  kill $p; wait $p 2>/dev/null
done; done; done
sysctl -qw net.ipv4.tcp_congestion_control=bbr
