#!/bin/bash
# ab.sh JOB BIN...: interleaved rounds of one fio job against the pool gateway of each binary
JOB=$1; shift
for r in 1 2 3; do for b in "$@"; do
  ./up.sh $b > /dev/null 2>&1
  nbdcopy --request-size=1048576 in.bin nbd://127.0.0.1:10823/vol
  case $JOB in
    r1m) A="--rw=read --bs=1m --iodepth=8" ;;
    r4k) A="--rw=randread --bs=4k --iodepth=32" ;;
    r4k1) A="--rw=randread --bs=4k --iodepth=1" ;;
    w4kf) A="--rw=randwrite --bs=4k --iodepth=1 --fsync=1" ;;
  esac
  out=$(fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:10823/vol $A --size=64M --time_based --runtime=4 2>&1)
  echo "$r $(basename $b) $(echo "$out" | grep -oE '(read|write): IOPS=[^,]*, BW=[^ ]*' | head -1) $(echo "$out" | grep -E '^ +lat \(' | head -1 | tr -s ' ')"
done; done
kill $(cat m1.pid m2.pid gw.pid) 2>/dev/null
