#!/bin/bash
# chunks.sh ROUNDS: pool gateways of HEAD with --chunk auto / 0 / 512K, interleaved, rotating order
cd /tmp/pg
pkill -f "127.0.0.1:1083[1-9]"; sleep 1
cat /var/tmp/sluice-bench-2G-gateway.img > /dev/null
B=/tmp/pg/sluice-final
./rig.sh $B 10831
./rig.sh $B 10832 "--chunk 0"
./rig.sh $B 10833 "--chunk 512K"
cfg=("10831 auto" "10832 chunk0" "10833 c512k")
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
