#!/bin/bash
# wr.sh BIN...: on the loopback rig, 4K randwrite QD1/QD32 through the cache and on the backing directly
for r in 1 2; do for b in "$@"; do
  /tmp/cr/up.sh $b >/dev/null 2>&1
  for t in cache:nbd://127.0.0.1:11804/v backing:nbd://127.0.0.1:11801/vol; do for qd in 1 32; do
    fio --name=c --ioengine=nbd --uri=${t#*:} --rw=randwrite --bs=4k --iodepth=$qd --size=128m --runtime=4 --time_based --output-format=json --output=/tmp/cr/o.json >/dev/null
    echo "$r $(basename $b) ${t%%:*} qd$qd $(python3 -c "import json; j=json.load(open('/tmp/cr/o.json'))['jobs'][0]['write']; print(int(j['iops']), int(j['lat_ns']['mean']/1000))")"
  done; done
done; done
pkill -f sluice-cr-
