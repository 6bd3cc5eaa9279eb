#!/bin/bash
cd /work/main
for b in base final; do
  bench/run --only gateway --runtime 3 --repeat 5 --tcp-congestion cubic --no-build --sluice /tmp/sluice-$b --out /tmp/gwab3/$b > /tmp/gwab3/$b.log 2>&1
done
echo done > /tmp/gwab3/finished
