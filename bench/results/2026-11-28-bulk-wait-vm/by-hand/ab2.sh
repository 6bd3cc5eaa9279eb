#!/bin/bash
# ab2.sh ROUNDS JOBS... : base vs new (vs bp0), interleaved, fio nbd over loopback, cubic
port=12900; img=/var/tmp/sluice-bench-2G.img
cat $img > /dev/null
rounds=$1; shift
sysctl -qw net.ipv4.tcp_congestion_control=cubic
for r in $(seq $rounds); do for job in "$@"; do for s in ${SERVERS:-base new}; do
  port=$((port+1))
  case $s in
  nbdkit) nbdkit -f -p $port -i 127.0.0.1 file $img & p=$!;;
  base) /tmp/sluice-base serve --listen 127.0.0.1:$port $img > /dev/null 2>&1 & p=$!;;
  new) /tmp/sluice-new serve --listen 127.0.0.1:$port $img > /dev/null 2>&1 & p=$!;;
  new2) /tmp/sluice-final serve --listen 127.0.0.1:$port $img > /dev/null 2>&1 & p=$!;;
  bp0) /tmp/sluice-final serve --busy-poll 0 --listen 127.0.0.1:$port $img > /dev/null 2>&1 & p=$!;;
  esac
  sleep 0.5
  case $job in
  1m1) a="--rw=read --bs=1m --iodepth=1";; 1m8) a="--rw=read --bs=1m --iodepth=8";;
  128k1) a="--rw=read --bs=128k --iodepth=1";; 256k1) a="--rw=read --bs=256k --iodepth=1";;
  4k1) a="--rw=randread --bs=4k --iodepth=1";; 4k32) a="--rw=randread --bs=4k --iodepth=32";;
  1m8x4) a="--rw=read --bs=1m --iodepth=8 --numjobs=4 --group_reporting";;
  esac
  t0=$(awk '{print $14+$15}' /proc/$p/stat)
  fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:$port/ $a --size=2G --time_based --runtime=3 --output-format=json > /tmp/ab2-fio.json 2>/dev/null
  t1=$(awk '{print $14+$15}' /proc/$p/stat)
  python3 -c "
import json; t=open('/tmp/ab2-fio.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]['read']
gib=j['io_bytes']/2**30; print('$r $job %-6s %6.0f MB/s %7.0f IOPS %6.3f s/GiB %7.1f us lat' % ('$s', j['bw_bytes']/1e6, j['iops'], ($t1-$t0)/100/gib, j['lat_ns']['mean']/1e3))"
  kill $p; wait $p 2>/dev/null
done; done; done
sysctl -qw net.ipv4.tcp_congestion_control=bbr
