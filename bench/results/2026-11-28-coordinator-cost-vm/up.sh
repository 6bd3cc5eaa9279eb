#!/bin/bash
# up.sh GATEWAY_BIN [LAYOUT]: member(s) (base binary) on 10821/10822, pool gateway on 10823
B=${1:-./sluice-new}
L=${2:-stripe}
M=${MEMBER:-/tmp/sluice-base}
kill $(cat m1.pid m2.pid gw.pid 2>/dev/null) 2>/dev/null; sleep 0.5
[ -f d1.img ] || { truncate -s 1G d1.img; truncate -s 1G d2.img; }
$M serve --listen 127.0.0.1:10821 --export disk=/tmp/pl/d1.img > m1.log 2>&1 & echo $! > m1.pid
$M serve --listen 127.0.0.1:10822 --export disk=/tmp/pl/d2.img > m2.log 2>&1 & echo $! > m2.pid
sleep 0.5
if [ "$L" = mirror ]; then
printf 'layout = "mirror"\nmembers = ["nbd://127.0.0.1:10821/disk", "nbd://127.0.0.1:10822/disk"]\n' > pool.toml
else
printf 'layout = "stripe"\nmembers = ["nbd://127.0.0.1:10821/disk"]\n' > pool.toml
fi
$B pool init --force pool:/tmp/pl/pool.toml > init.log 2>&1 || { echo init failed; cat init.log; }
$B serve --log-level ${LOG:-info} --listen 127.0.0.1:10823 --export vol=pool:/tmp/pl/pool.toml > gw.log 2>&1 & echo $! > gw.pid
sleep 0.7
