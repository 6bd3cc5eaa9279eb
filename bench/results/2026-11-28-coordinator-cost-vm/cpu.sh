#!/bin/bash
# cpu.sh JOB ROUNDS BIN...: interleaved rounds; IOPS and gateway CPU µs per I/O
JOB=$1; R=$2; shift 2
for r in $(seq $R); do for b in "$@"; do
  ./up.sh $b > /dev/null 2>&1
  nbdcopy --request-size=1048576 in.bin nbd://127.0.0.1:10823/vol
  case $JOB in
    r1m) A="--rw=read --bs=1m --iodepth=8" ;;
    r4k) A="--rw=randread --bs=4k --iodepth=32" ;;
    r4k1) A="--rw=randread --bs=4k --iodepth=1" ;;
    w4k) A="--rw=randwrite --bs=4k --iodepth=32" ;;
  esac
  pid=$(cat gw.pid); t0=$(awk '{print $14+$15}' /proc/$pid/stat)
  out=$(fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:10823/vol $A --size=64M --time_based --runtime=4 --output-format=json 2>/dev/null)
  t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  echo "$out" | python3 parse.py $r $(basename $b) $JOB $((t1-t0))
done; done
kill $(cat m1.pid m2.pid gw.pid) 2>/dev/null
