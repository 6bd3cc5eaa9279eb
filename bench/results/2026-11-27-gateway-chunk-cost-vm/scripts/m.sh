#!/bin/bash
# m.sh PORT LABEL RW BS QD: MB/s, IOPS, gateway CPU s/GiB, member (10830) CPU s/GiB
port=$1 label=$2 rw=$3 bs=$4 qd=$5 RT=${RT:-4}
pid=$(ss -ltnp | grep ":$port " | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
mpid=$(ss -ltnp | grep ":10830 " | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
t0=$(awk '{print $14+$15}' /proc/$pid/stat); m0=$(awk '{print $14+$15}' /proc/$mpid/stat)
out=$(fio --name=r --ioengine=nbd --uri=nbd://127.0.0.1:$port/${EXP:-v} --rw=$rw --bs=$bs --iodepth=$qd --size=1G --thread --time_based --runtime=$RT --output-format=terse --terse-version=3)
t1=$(awk '{print $14+$15}' /proc/$pid/stat); m1=$(awk '{print $14+$15}' /proc/$mpid/stat)
kb=$(echo "$out" | awk -F';' 'NF>8{print $7}'); iops=$(echo "$out" | awk -F';' 'NF>8{print $8}')
python3 -c "kb=$kb;iops=$iops;cpu=($t1-$t0)/100;mc=($m1-$m0)/100;gib=kb*$RT/1048576;print(f'$label $rw $bs qd$qd  {kb/1024:.0f} MB/s  {iops} IOPS  gw {cpu/gib:.3f} s/GiB {cpu*1e6/(iops*$RT):.1f} us/IO  member {mc/gib:.3f} s/GiB')"
