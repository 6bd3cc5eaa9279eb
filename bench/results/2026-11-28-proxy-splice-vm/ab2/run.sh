#!/bin/bash
cd /work/main
for r in 1 2; do
for b in base q new; do
  bench/run --only gateway --runtime 3 --repeat 3 --tcp-congestion cubic --no-build --sluice /tmp/sluice-$b --out /tmp/gwab2/$b-$r > /tmp/gwab2/$b-$r.log 2>&1
done
done
echo done > /tmp/gwab2/finished
