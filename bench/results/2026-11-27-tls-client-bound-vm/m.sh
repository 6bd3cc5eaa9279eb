#!/bin/bash
# m.sh PORT LABEL BS QD PID  -> MB/s, server CPU s/GiB, fio cpu usr+sys %
PORT=$1; LABEL=$2; BS=$3; QD=$4; PID=$5; RT=${RT:-4}
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
out=$(HOME=/tmp/tls/tls/home fio --name=j --ioengine=nbd --uri=nbds://localhost:$PORT/ --rw=read --bs=$BS --iodepth=$QD --time_based --runtime=$RT --output-format=terse --terse-version=3 2>&1 | tail -1)
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
echo "$out" | awk -F';' -v l=$LABEL -v t="$((t1-t0))" -v rt=$RT '{bw=$7/1024; gib=$6/1024/1024; printf "%s MB/s=%.0f srvCPU s/GiB=%.3f fio usr=%s sys=%s\n", l, bw*1.048576, (t/100)/gib, $88, $89}'
