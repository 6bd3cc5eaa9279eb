#!/bin/bash
# cpu1m.sh ROUNDS: 1M seq reads, QD1 and QD8: MB/s and server CPU s/GiB; sluice splice/copy and nbdkit
port=10850
for r in $(seq $1); do for s in splice copy nbdkit; do for qd in 1 8; do
  port=$((port+1))
  if [ $s = nbdkit ]; then nbdkit -f -p $port -i 127.0.0.1 file /var/tmp/sluice-bench-2G.img & p=$!
  else /tmp/sluice-base serve --listen 127.0.0.1:$port --data-path $s /var/tmp/sluice-bench-2G.img > /dev/null 2>&1 & p=$!; fi
  sleep 0.5
  t0=$(awk '{print $14+$15}' /proc/$p/stat)
  out=$(fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:$port/ --rw=read --bs=1m --iodepth=$qd --size=2G --time_based --runtime=3 --output-format=json 2>/dev/null)
  t1=$(awk '{print $14+$15}' /proc/$p/stat)
  echo "$out" | python3 -c "
import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):])['jobs'][0]['read']
gib=j['io_bytes']/2**30; print('$r $s QD$qd %.0f MB/s %.3f s/GiB' % (j['bw_bytes']/1e6, ($t1-$t0)/100/gib))"
  kill $p; wait $p 2>/dev/null
done; done; done
