#!/bin/bash
# proxy.sh ROUNDS BIN...: member = head's binary serving the image; gateway = BIN re-exporting
# it (nbd://), fio 4K randread QD32 and 1M read QD8 through the gateway, cubic.
img=/var/tmp/sluice-bench-2G.img; cat $img > /dev/null
sysctl -qw net.ipv4.tcp_congestion_control=cubic
port=14900
for r in $(seq $1); do for b in "${@:2}"; do for job in ${JOBS:-4k32 1m8}; do
  port=$((port+2)); m=$port; g=$((port+1))
  /tmp/sluice-head serve --listen 127.0.0.1:$m $img > /dev/null 2>&1 & mp=$!; sleep 0.5
  $b serve --listen 127.0.0.1:$g --export "vol=nbd://127.0.0.1:$m/" > /tmp/proxy-gw.log 2>&1 & gp=$!
  sleep 1
  case $job in 4k32) a="--rw=randread --bs=4k --iodepth=32";; 1m8) a="--rw=read --bs=1m --iodepth=8";; esac
  t0=$(awk '{print $14+$15}' /proc/$gp/stat)
  fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:$g/vol $a --size=1G --time_based --runtime=3 --output-format=json > /tmp/proxy-fio.json 2>/dev/null
  t1=$(awk '{print $14+$15}' /proc/$gp/stat)
  python3 -c "
import json; t=open('/tmp/proxy-fio.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]['read']
gib=j['io_bytes']/2**30; print('$r $job %-18s %6.0f MB/s %7.0f IOPS gw %6.3f s/GiB' % ('$(basename $b)', j['bw_bytes']/1e6, j['iops'], ($t1-$t0)/100/gib))"
  kill $gp $mp; wait $gp $mp 2>/dev/null
done; done; done
sysctl -qw net.ipv4.tcp_congestion_control=bbr
