#!/bin/bash
# up.sh BIN: backing (file export) 11801, members 11802/11803 (memory:512M), cache gateway 11804 with metrics 11805
BIN=$1
pkill -f "sluice-cr-" ; sleep 0.3
cd /tmp/cr
[ -f disk.img ] || (dd if=/dev/urandom of=disk.img bs=1M count=256 status=none)
cat > cache.toml <<T
backing = "nbd://127.0.0.1:11801/vol"
members = ["nbd://127.0.0.1:11802/ram", "nbd://127.0.0.1:11803/ram"]
block = "64K"
prefetch = "off"
T
cp $BIN /tmp/cr/sluice-cr-bin
./sluice-cr-bin serve --listen 127.0.0.1:11801 --export vol=/tmp/cr/disk.img --log-level warn > b.log 2>&1 &
./sluice-cr-bin serve --listen 127.0.0.1:11802 --export ram=memory:512M --export raw=memory:256M --log-level warn > m1.log 2>&1 &
./sluice-cr-bin serve --listen 127.0.0.1:11803 --export ram=memory:512M --log-level warn > m2.log 2>&1 &
sleep 0.5
./sluice-cr-bin serve --listen 127.0.0.1:11804 --export v=cache:/tmp/cr/cache.toml --metrics 127.0.0.1:11805 --log-level info $GWARGS > c.log 2>&1 &
sleep 1.5
# warm: read the working set twice
fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:11804/v --rw=read --bs=1m --iodepth=8 --size=128m --loops=2 --output=/dev/null
