#!/bin/bash
# sweep.sh BIN "QDS" "PATHS": 1M seq reads, MB/s and server CPU s/GiB per queue depth and data path
port=10900
for s in $3; do for qd in $2; do
  port=$((port+1))
  $1 serve --listen 127.0.0.1:$port --data-path $s /var/tmp/sluice-bench-2G.img > /dev/null 2>&1 & p=$!
  sleep 0.5; cat /var/tmp/sluice-bench-2G.img > /dev/null
  t0=$(awk '{print $14+$15}' /proc/$p/stat)
  out=$(fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:$port/ --rw=read --bs=1m --iodepth=$qd --size=2G --time_based --runtime=3 --output-format=json 2>/dev/null)
  t1=$(awk '{print $14+$15}' /proc/$p/stat)
  echo "$out" | python3 -c "
import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):])['jobs'][0]['read']
gib=j['io_bytes']/2**30; print('$s QD$qd %.0f MB/s %.3f s/GiB' % (j['bw_bytes']/1e6, ($t1-$t0)/100/gib))"
  kill $p; wait $p 2>/dev/null
done; done
