#!/bin/bash
cd /work/main
for r in 1 2; do
for b in base new; do
  bench/run --only gateway --runtime 3 --repeat 3 --tcp-congestion cubic --no-build --sluice /tmp/sluice-$b --out /tmp/gwab/$b-$r > /tmp/gwab/$b-$r.log 2>&1
done
done
echo done > /tmp/gwab/finished
