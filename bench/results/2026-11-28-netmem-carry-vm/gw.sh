#!/bin/bash
cd /work/main
for r in 1 2; do for b in dcec c4; do
  bench/run --only gateway --no-build --sluice /tmp/sluice-$b --runtime 3 --repeat 3 --out /tmp/nm/gw-$r-$b > /tmp/nm/gw-$r-$b.log 2>&1
done; done
echo done > /tmp/nm/gw-finished
