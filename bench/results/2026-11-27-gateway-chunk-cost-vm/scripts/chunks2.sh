#!/bin/bash
# chunks2.sh ROUNDS: pool gateways of /tmp/pg/sluice-final (09a13d3, --chunk auto and --chunk 512K) and /tmp/pg/sluice-cost (061e766, auto), interleaved, rotating order
cd /tmp/pg
pkill -f "127.0.0.1:1083[1-9]"; sleep 1
cat /var/tmp/sluice-bench-2G-gateway.img > /dev/null
B=/tmp/pg/sluice-final
./rig.sh $B 10831
./rig.sh /tmp/pg/sluice-cost 10832
./rig.sh $B 10833 "--chunk 512K"
cfg=("10831 old" "10832 new" "10833 old512k")
for r in $(seq ${1:-6}); do
  for k in 0 1 2; do
    i=$(( (k + r) % 3 )); set -- ${cfg[$i]}
    ./m.sh $1 $2 read 1M 8
  done
  for k in 0 1 2; do
    i=$(( (k + r) % 3 )); set -- ${cfg[$i]}
    ./m.sh $1 $2 read 1M 1
  done
done
