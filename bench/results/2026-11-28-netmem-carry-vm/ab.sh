#!/bin/bash
# interleaved netmem runs: base new base new
cd /work/main
for r in 1 2; do
  for b in dcec c1; do
    bench/run --only netmem --no-build --sluice /tmp/sluice-$b --out /tmp/nm/$r-$b > /tmp/nm/$r-$b.log 2>&1
  done
done
echo done > /tmp/nm/finished
