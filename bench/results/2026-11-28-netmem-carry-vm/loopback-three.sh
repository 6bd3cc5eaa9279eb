#!/bin/bash
# three.sh BIN ROUNDS: on the loopback rig, 4K randread QD1/QD32 for: the RAM member directly,
# a proxy of it (--export p=nbd://member), and the cache. The member holds data written first.
BIN=$1; R=${2:-2}
cd /tmp/cr
GWARGS="--export p=nbd://127.0.0.1:11802/raw" ./up.sh $BIN >/dev/null 2>&1
fio --name=f --ioengine=nbd --uri=nbd://127.0.0.1:11802/raw --rw=write --bs=1m --iodepth=8 --size=128m --output=/dev/null
for r in $(seq $R); do
  for t in member:nbd://127.0.0.1:11802/raw proxy:nbd://127.0.0.1:11804/p cache:nbd://127.0.0.1:11804/v; do
    for qd in 1 32; do
      fio --name=c --ioengine=nbd --uri=${t#*:} --rw=randread --bs=4k --iodepth=$qd --size=128m --runtime=4 --time_based --output-format=json --output=/tmp/cr/o.json >/dev/null
      echo "$r ${t%%:*} qd$qd $(python3 -c "import json; j=json.load(open('/tmp/cr/o.json'))['jobs'][0]['read']; print(int(j['iops']), int(j['lat_ns']['mean']/1000))")"
    done
  done
done
pkill -f sluice-cr-
