#!/bin/bash
# ab.sh BIN... : per binary, warm cache, then 4K randread QD1 and QD32 on cache and on member directly
for r in 1 2; do
for b in "$@"; do
  /tmp/cr/up.sh $b
  for qd in 1 32; do
    c=$(fio --name=c --ioengine=nbd --uri=nbd://127.0.0.1:11804/v --rw=randread --bs=4k --iodepth=$qd --size=128m --runtime=4 --time_based --output-format=json --output=/tmp/cr/o.json >/dev/null; python3 -c "import json; j=json.load(open(\"/tmp/cr/o.json\"))[\"jobs\"][0][\"read\"]; print(int(j[\"iops\"]), int(j[\"lat_ns\"][\"mean\"]/1000))")
    echo "$r $(basename $b) qd$qd cache $c"
  done
done
done
pkill -f "sluice-cr-"
