#!/bin/bash
# tcp-cc.sh BIN ROUNDS: 1M sequential reads of the bench's 2 GiB image (in the page cache)
# through fio's nbd engine over loopback TCP, under each congestion control (set system-wide
# for the run, bbr restored at the end): sluice on `splice` (the default) and `copy`, and
# nbdkit's file plugin; QD1, QD8 and QD8 over 2 connections. Prints MB/s, the server's CPU
# seconds per GiB (user + system from /proc, every thread) and TCP's retransmitted segments.
bin=$1; port=11300
img=/var/tmp/sluice-bench-2G.img
cat $img > /dev/null
for r in $(seq $2); do for cc in bbr cubic; do sysctl -qw net.ipv4.tcp_congestion_control=$cc
for qd in 1 8 8x2; do for s in splice copy nbdkit; do
  port=$((port+1))
  case $s in
  nbdkit) nbdkit -f -p $port -i 127.0.0.1 file $img & p=$!;;
  *) $bin serve --listen 127.0.0.1:$port --data-path $s $img > /dev/null 2>&1 & p=$!;;
  esac
  sleep 0.5
  if [ $qd = 8x2 ]; then extra="--numjobs=2 --offset_increment=1g --size=1g --group_reporting"; d=8
  else extra="--size=2G"; d=$qd; fi
  nstat -n
  t0=$(awk '{print $14+$15}' /proc/$p/stat)
  fio --name=j --ioengine=nbd --uri=nbd://127.0.0.1:$port/ --rw=read --bs=1m --iodepth=$d $extra \
      --time_based --runtime=4 --output-format=json > /tmp/tcp-cc-fio.json 2>/dev/null
  t1=$(awk '{print $14+$15}' /proc/$p/stat)
  rt=$(nstat | awk '/TcpRetransSegs/{print $2}')
  python3 -c "
import json; t=open('/tmp/tcp-cc-fio.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]['read']
gib=j['io_bytes']/2**30; print('$r $cc QD$qd $s %.0f MB/s %.3f s/GiB %s retransmitted' % (j['bw_bytes']/1e6, ($t1-$t0)/100/gib, '${rt:-0}'))"
  kill $p; wait $p 2>/dev/null
done; done; done; done
sysctl -qw net.ipv4.tcp_congestion_control=bbr
