#!/bin/bash
# rig.sh BIN PORT: member on 10830 (started once), pool gateway of BIN on PORT
IMG=/var/tmp/sluice-bench-2G-gateway.img
if ! ss -ltn | grep -q ':10830 '; then
  (setsid /tmp/pg/sluice-base serve --busy-poll 0 --listen 127.0.0.1:10830 --export m=$IMG > /tmp/pg/member.log 2>&1 &)
  sleep 1
  printf 'layout = "stripe"\nmembers = ["nbd://127.0.0.1:10830/m"]\n' > /tmp/pg/pool.toml
  /tmp/pg/sluice-base pool init --force pool:/tmp/pg/pool.toml > /tmp/pg/init.log 2>&1 || { cat /tmp/pg/init.log; exit 1; }
fi
(setsid $1 serve --listen 127.0.0.1:$2 $3 --export v=pool:/tmp/pg/pool.toml > /tmp/pg/gw-$2.log 2>&1 &)
sleep 1
