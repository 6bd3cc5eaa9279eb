#!/bin/bash
# 4K random writes at QD32 on sluice's default path, on `--data-path direct`, and on nbdkit's
# file plugin, with the scratch image's page cache in three states before each run, each
# starting from `sync; echo 3 > /proc/sys/vm/drop_caches`:
#   cold    - nothing of the file cached
#   read    - the file then read end to end (cached, in the folios readahead makes)
#   written - the file then written end to end with 1 MiB buffered writes and synced (cached,
#             in the folios such writes make; what the peers job before this one leaves)
#   run.sh SLUICE ROUNDS > raw.txt      (as root; fio's nbd engine, 3 s per run)
set -euo pipefail
BIN=$1 ROUNDS=$2
S=/var/tmp/sluice-bench-2G-scratch.img
(setsid "$BIN" serve "$S" --listen 127.0.0.1:13401 > /tmp/rw-default.log 2>&1 &)
(setsid "$BIN" serve "$S" --listen 127.0.0.1:13402 --data-path direct > /tmp/rw-direct.log 2>&1 &)
(setsid nbdkit -f -p 13403 -i 127.0.0.1 file file="$S" > /tmp/rw-nbdkit.log 2>&1 &)
trap 'pkill -f "serve $S --listen 127.0.0.1:1340" || true; pkill -f "nbdkit -f -p 13403" || true' EXIT
sleep 1
pid() { ss -ltnp | grep ":$1 " | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; }
run() { # PORT LABEL STATE
    sync; echo 3 > /proc/sys/vm/drop_caches
    case $3 in
        read) cat "$S" > /dev/null ;;
        written) dd if="$S" of="$S" bs=1M conv=notrunc status=none; sync ;;
    esac
    local p t0 t1 out; p=$(pid "$1"); t0=$(awk '{print $14+$15}' /proc/"$p"/stat)
    out=$(fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:"$1"/ --rw=randwrite --bs=4k --iodepth=32 \
        --direct=1 --thread --time_based --runtime=3 --output-format=terse --terse-version=3 | tail -1)
    t1=$(awk '{print $14+$15}' /proc/"$p"/stat)
    echo "$out" | awk -F';' -v l="$2" -v st="$3" -v t=$((t1 - t0)) \
        '{printf "%-7s %-8s IOPS=%6d srv_cpu_us_per_io=%.1f\n", st, l, $49, t*1e4/($49*3)}'
}
for r in $(seq "$ROUNDS"); do
    for state in cold read written; do
        run 13401 default $state; run 13402 direct $state; run 13403 nbdkit $state
    done
done
