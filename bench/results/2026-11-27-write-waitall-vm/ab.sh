#!/bin/bash
# Interleaved A/B of two sluice binaries on buffered writes to the bench's scratch image:
#   ab.sh OLD NEW ROUNDS > raw.txt
# Each server serves the scratch image on the default data path; before every run the image
# is read into the page cache and `sync` runs; fio's nbd engine, 3 s per run, time based.
# Prints MB/s and the server's CPU seconds per GiB per run; then perf stat's counts of
# io_uring_enter calls and io_uring completions per request for one 1M run of each.
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=$3
S=/var/tmp/sluice-bench-2G-scratch.img
(setsid "$OLD" serve "$S" --listen 127.0.0.1:13201 > /tmp/ab-old.log 2>&1 &)
(setsid "$NEW" serve "$S" --listen 127.0.0.1:13202 > /tmp/ab-new.log 2>&1 &)
trap 'pkill -f "serve $S --listen 127.0.0.1:1320" || true' EXIT
sleep 1
pid() { ss -ltnp | grep ":$1 " | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; }
run() { # PORT LABEL BS QD
    cat "$S" > /dev/null; sync
    local p t0 t1 out; p=$(pid "$1"); t0=$(awk '{print $14+$15}' /proc/"$p"/stat)
    out=$(fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:"$1"/ --rw=write --bs="$3" --iodepth="$4" \
        --direct=1 --thread --time_based --runtime=3 --output-format=terse --terse-version=3 | tail -1)
    t1=$(awk '{print $14+$15}' /proc/"$p"/stat)
    echo "$out" | awk -F';' -v l="$2" -v j="$3-QD$4" -v t=$((t1 - t0)) \
        '{printf "%-4s %-9s MB/s=%5.0f IOPS=%6d srv_cpu_s_per_gib=%.3f\n", l, j, $48*1.024/1000, $49, t/100/($47/1048576)}'
}
for r in $(seq "$ROUNDS"); do
    for job in "1M 4" "128k 8" "4k 32"; do
        if [ $((r % 2)) = 1 ]; then run 13201 old $job; run 13202 new $job; else run 13202 new $job; run 13201 old $job; fi
    done
done
for port in 13201 13202; do
    cat "$S" > /dev/null; sync
    perf stat -e 'syscalls:sys_enter_io_uring_enter,io_uring:io_uring_complete' -p "$(pid $port)" -o /tmp/ab-stat.txt -- sleep 3 &
    ios=$(fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:$port/ --rw=write --bs=1M --iodepth=4 --direct=1 \
        --thread --time_based --runtime=3 --output-format=terse --terse-version=3 | tail -1 | awk -F';' '{print $49*3}')
    wait
    awk -v p=$port -v ios="$ios" '/io_uring_enter|io_uring_complete/ {gsub(",", "", $1); printf "port %s (%s) 1M-QD4 %s per request: %.1f\n", p, (p == 13201 ? "old" : "new"), $2, $1/ios}' /tmp/ab-stat.txt
done
