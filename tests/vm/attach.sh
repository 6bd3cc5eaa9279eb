# `sluice attach` on Debian 12's kernel (6.1): the kernel's nbd driver gets its sockets
# from sluice's guardian, which reconnects them when the server dies. The servers run in
# the guest too (loopback), so the guest kills and restarts them itself. A recording
# writer notes every write that was acknowledged (fsync returned); after a kill -9 and a
# restart it must have seen no error, and every acknowledged write must read back from the
# server (caches dropped, the filesystem remounted). nbd-client meets the same writer and
# the same kill, in the same sitting, for comparison.

MIB=$((1 << 20))

# attach_dev LOG ARGS...: attaches in the background (the guardian's log in LOG); the
# device in $dev.
attach_dev() {
    local log=$1
    shift
    dev=$(timeout 60 $SLUICE attach "$@" 2>>"$log") || { echo "sluice attach $* failed:"; cat "$log"; return 1; }
    [ -b "$dev" ] || { echo "sluice attach printed $dev, not a block device"; cat "$log"; return 1; }
}

detach_dev() {
    timeout 30 $SLUICE detach "$1" || { echo "sluice detach $1 failed"; return 1; }
}

# restart_server PORT LOG ARGS...: kill -9 the server on PORT, wait 3 s, start it again.
restart_server() {
    local port=$1
    kill -9 "$(cat /tmp/pid-$port)"
    sleep 3
    serve "$@"
}

# Recording writers: one 64 KiB block of fresh random data per step, each made durable
# (fsync) before it counts as acknowledged, its checksum then appended to /tmp/acked.
# They stop when /tmp/stop-writer appears, or at the first error (in /tmp/writer.err).

# file_writer DIR: one file per step.
file_writer() {
    local dir=$1 i=0
    while [ ! -e /tmp/stop-writer ]; do
        head -c 65536 /dev/urandom >/tmp/block
        dd if=/tmp/block of="$dir/f$i" bs=64k conv=fsync 2>>/tmp/writer.err || return 1
        echo "$i $(md5sum </tmp/block | cut -d' ' -f1)" >>/tmp/acked
        i=$((i + 1))
    done
}

# block_writer DEV: one 64 KiB block per step, O_DIRECT, flushed.
block_writer() {
    local dev=$1 i=0
    while [ ! -e /tmp/stop-writer ]; do
        head -c 65536 /dev/urandom >/tmp/block
        dd if=/tmp/block of="$dev" bs=64k seek=$i oflag=direct conv=fsync,notrunc 2>>/tmp/writer.err || return 1
        echo "$i $(md5sum </tmp/block | cut -d' ' -f1)" >>/tmp/acked
        i=$((i + 1))
    done
}

start_writer() {
    rm -f /tmp/stop-writer /tmp/acked /tmp/writer.err
    : >/tmp/acked
    "$@" &
    writer=$!
}

acked() {
    wc -l </tmp/acked
}

# wait_acked N [SECONDS]: until N writes are acknowledged, or the writer ended, or time.
wait_acked() {
    local n=$1 limit=${2:-60} i=0
    while [ "$(acked)" -lt "$n" ]; do
        kill -0 $writer 2>/dev/null || return 1
        i=$((i + 1))
        [ $i -gt $((limit * 10)) ] && return 1
        sleep 0.1
    done
}

# stop_writer: 0 if the writer never saw an error.
stop_writer() {
    : >/tmp/stop-writer
    wait $writer
}

# verify_files DIR / verify_blocks DEV: every acknowledged write reads back.
verify_files() {
    local i sum bad=0
    while read -r i sum; do
        [ "$(md5sum <"$1/f$i" | cut -d' ' -f1)" = "$sum" ] || { echo "f$i differs from what was acknowledged"; bad=1; }
    done </tmp/acked
    return $bad
}
verify_blocks() {
    local i sum bad=0
    while read -r i sum; do
        [ "$(dd if="$1" bs=64k skip=$i count=1 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)" = "$sum" ] ||
            { echo "block $i differs from what was acknowledged"; bad=1; }
    done </tmp/acked
    return $bad
}

# The writer runs across a kill -9 and a restart of the server on PORT (args after);
# 0 if it never saw an error and made progress after the restart.
write_across_restart() {
    local before
    wait_acked 10 || { echo "the writer did not start: $(cat /tmp/writer.err)"; return 1; }
    restart_server "$@" || return 1
    before=$(acked)
    wait_acked $((before + 10)) 120 || { echo "the writer made no progress after the restart ($(acked) acknowledged): $(cat /tmp/writer.err)"; return 1; }
    stop_writer || { echo "the writer saw an error: $(cat /tmp/writer.err)"; return 1; }
}

# ext4 on an attached device; the server is killed and restarted under the writer.
ext4_across_restart() {
    local status=0
    truncate -s 256M /srv/disk.img
    serve 10809 /host/server.log --export=disk=/srv/disk.img || return 1
    attach_dev /host/attach-ext4.log --timeout 5 --dead-timeout 120 nbd://127.0.0.1:10809/disk || return 1
    mkfs.ext4 -q "$dev" && mkdir -p /mnt/a && mount "$dev" /mnt/a || return 1
    start_writer file_writer /mnt/a
    write_across_restart 10809 /host/server.log --export=disk=/srv/disk.img || status=1
    grep -q ' /mnt/a ' /proc/mounts || { echo "the filesystem is no longer mounted"; status=1; }
    $SLUICE attach --list >/tmp/list
    grep -E "^$dev +[0-9]+ +1 +1 +.*\(connected\)" /tmp/list >/dev/null || { echo "attach --list does not show one reconnection:"; cat /tmp/list; status=1; }
    umount /mnt/a || status=1
    echo 3 >/proc/sys/vm/drop_caches
    e2fsck -fn "$dev" >/tmp/fsck 2>&1 || { echo "fsck after the restart:"; cat /tmp/fsck; status=1; }
    mount "$dev" /mnt/a && { verify_files /mnt/a || status=1; umount /mnt/a; }
    note "sluice attach: $(acked) writes acknowledged across a kill -9 and a restart 3 s later, none failed; $(grep -o 'reconnected after [0-9.]* s' /host/attach-ext4.log | head -n 1)"
    detach_dev "$dev" || status=1
    stop_server 10809
    return $status
}

# The same writer and the same kill under nbd-client -t 15, for comparison: noted.
nbd_client_beside() {
    local dev=/dev/nbd9 status
    serve 10809 /host/server.log --export=disk=/srv/disk.img || return 1
    timeout 60 nbd-client 127.0.0.1 10809 $dev -N disk -t 15 || return 1
    mkfs.ext4 -q -F $dev && mkdir -p /mnt/b && mount $dev /mnt/b || return 1
    start_writer file_writer /mnt/b
    wait_acked 10 || { echo "the writer did not start"; return 1; }
    restart_server 10809 /host/server.log --export=disk=/srv/disk.img || return 1
    # Bounded: the writer either errs or goes on within the kernel's timeout and more.
    local i=0
    while kill -0 $writer 2>/dev/null && [ $i -lt 600 ]; do
        [ "$(acked)" -gt 200 ] && break
        i=$((i + 1)); sleep 0.1
    done
    : >/tmp/stop-writer
    if kill -0 $writer 2>/dev/null; then
        sleep 20
    fi
    kill -0 $writer 2>/dev/null && { note "nbd-client -t 15: the writer still hangs"; kill -9 $writer; }
    wait $writer
    status=$?
    note "nbd-client -t 15 beside it: the writer $([ $status = 0 ] && echo 'saw no error' || echo "failed: $(grep -iE 'error|failed' /tmp/writer.err | head -n 1)") after $(acked) acknowledged writes; the filesystem: $(dmesg | grep -oE 'EXT4-fs error.*|Remounting filesystem read-only' | tail -n 1)"
    umount -l /mnt/b 2>/dev/null
    nbd-client -d $dev
    stop_server 10809
    return 0
}

# A server paused (SIGSTOP: its connections stay open, nothing answers) for longer than
# --dead-timeout: the request times out and I/O fails after the dead timeout, cleanly; the
# server resumed (SIGCONT), the guardian revives the device; detach works.
past_the_dead_timeout() {
    local status=0 start took
    truncate -s 64M /srv/short.img
    serve 10812 /host/server-short.log --export=disk=/srv/short.img || return 1
    attach_dev /host/attach-short.log --timeout 3 --dead-timeout 5 nbd://127.0.0.1:10812/disk || return 1
    kill -STOP "$(cat /tmp/pid-10812)"
    start=$(now)
    if timeout 60 dd if=/dev/zero of="$dev" bs=4k count=1 oflag=direct 2>/tmp/err; then
        echo "a write succeeded with the server gone"
        status=1
    fi
    took=$(( ($(now) - start) / 100 ))
    [ $took -lt 60 ] || { echo "the write still waited 60 s after a 5 s dead timeout"; status=1; }
    note "server paused past --dead-timeout 5 (--timeout 3): the write failed after $took s: $(head -n 1 /tmp/err)"
    kill -CONT "$(cat /tmp/pid-10812)"
    local i=0
    until dd if=/dev/zero of="$dev" bs=4k count=1 oflag=direct 2>/dev/null; do
        i=$((i + 1)); [ $i -gt 60 ] && { echo "the device did not come back within 60 s of the server resuming"; status=1; break; }
        sleep 1
    done
    [ $i -le 60 ] && note "after the server resumed, a write succeeded after $i failed tries a second apart"
    detach_dev "$dev" || status=1
    [ -e /sys/block/${dev#/dev/}/pid ] && { echo "$dev is still connected after detach"; status=1; }
    $SLUICE attach --list | grep -q "^$dev " && { echo "attach --list still shows $dev"; status=1; }
    kill -9 "$(cat /tmp/pid-10812)"
    return $status
}

# Four connections, fio writing and verifying across the restart.
multi_conn_across_restart() {
    local status=0
    truncate -s 128M /srv/mc.img
    serve 10813 /host/server-mc.log --export=mc=/srv/mc.img || return 1
    attach_dev /host/attach-mc.log --connections 4 --timeout 5 nbd://127.0.0.1:10813/mc || return 1
    $SLUICE attach --list | grep -E "^$dev +[0-9]+ +0 +4 " >/dev/null || { echo "not 4 connections:"; $SLUICE attach --list; status=1; }
    # Paced, so the kill comes while it writes.
    fio --name=mc --filename="$dev" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite --bs=64k \
        --size=64M --rate=6m --verify=crc32c --verify_fatal=1 --minimal >/tmp/fio.out 2>&1 &
    local fio=$! i=0
    until [ "$(awk '{print $5}' /sys/block/${dev#/dev/}/stat)" -gt 64 ]; do
        i=$((i + 1)); [ $i -gt 300 ] && { echo "fio did not start writing"; break; }
        sleep 0.1
    done
    kill -0 $fio 2>/dev/null || { echo "fio ended before the kill"; status=1; }
    restart_server 10813 /host/server-mc.log --export=mc=/srv/mc.img || status=1
    wait $fio || { echo "fio failed across the restart:"; cat /tmp/fio.out; status=1; }
    grep -q "reconnected after .* (4 connection" /host/attach-mc.log || { echo "no reconnection of 4 connections logged"; cat /host/attach-mc.log; status=1; }
    detach_dev "$dev" || status=1
    stop_server 10813
    return $status
}

# A mirror pool whose gateway (the sluice serving it) is killed and restarted.
pool_gateway_restart() {
    local status=0
    pool_file /srv/mirror.toml 'layout = "mirror"\n' pm 2 65 || return 1
    $SLUICE pool init pool:/srv/mirror.toml || return 1
    serve 10814 /host/server-pool.log --export=vol=pool:/srv/mirror.toml || return 1
    attach_dev /host/attach-pool.log --timeout 5 nbd://127.0.0.1:10814/vol || return 1
    start_writer block_writer "$dev"
    write_across_restart 10814 /host/server-pool.log --export=vol=pool:/srv/mirror.toml || status=1
    verify_blocks "$dev" || status=1
    note "pool gateway restart: $(acked) block writes acknowledged, none failed; $(grep -o 'reconnected after [0-9.]* s' /host/attach-pool.log | head -n 1)"
    detach_dev "$dev" || status=1
    stop_server 10814
    return $status
}

# metric PORT NAME: the sum of NAME's series (whatever their labels) on the /metrics of
# the server whose metrics listen on PORT; empty if it has none.
metric() {
    local text
    text=$(timeout 10 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$0 && printf "GET /metrics HTTP/1.0\r\n\r\n" >&3 && cat <&3' "$1" 2>/dev/null)
    printf '%s\n' "$text" | awk -v s="$2" 'index($0, s "{") == 1 || index($0, s " ") == 1 { n += $NF; seen = 1 } END { if (seen) printf "%d", n }'
}

# wait_metric PORT NAME N: until NAME's sum reaches N, 30 s at most.
wait_metric() {
    local end=$((SECONDS + 30))
    until [ "$(metric "$1" "$2")" -ge "$3" ] 2>/dev/null; do
        [ $SECONDS -ge $end ] && { echo "$2 stayed at $(metric "$1" "$2"), short of $3, for 30 s"; return 1; }
        sleep 0.1
    done
}

# A cached volume (a file export as its backing, two RAM exports as its members) whose
# gateway is killed and restarted under the writer: every acknowledged write reads back
# (the gateway starts with an empty directory, so from the backing), and once those reads
# have filled the members, a second pass reads every block back from their RAM.
cached_volume_gateway_restart() {
    local status=0 blocks
    truncate -s 64M /srv/cached.img
    serve 10818 /host/server-cache-backing.log --export=back=/srv/cached.img || return 1
    serve 10819 /host/server-cache-members.log --export=ram0=memory:32M --export=ram1=memory:32M || return 1
    printf '%s\n' 'backing = "nbd://127.0.0.1:10818/back"' \
        'members = ["nbd://127.0.0.1:10819/ram0", "nbd://127.0.0.1:10819/ram1"]' \
        'block = "64K"' 'prefetch = "off"' >/srv/cache.toml
    local args="--metrics=127.0.0.1:9118 --export=vol=cache:/srv/cache.toml"
    serve 10820 /host/server-cache.log $args || return 1
    attach_dev /host/attach-cache.log --timeout 5 nbd://127.0.0.1:10820/vol || return 1
    start_writer block_writer "$dev"
    write_across_restart 10820 /host/server-cache.log $args || status=1
    blocks=$(acked)
    # The restarted gateway connects its members in the background: reads fill them once
    # both are up.
    wait_metric 9118 sluice_cache_member_up 2 || status=1
    verify_blocks "$dev" || status=1
    wait_metric 9118 sluice_cache_fills_total "$blocks" || status=1
    verify_blocks "$dev" || status=1
    [ "$(metric 9118 sluice_cache_hits_total)" -ge "$blocks" ] 2>/dev/null ||
        { echo "the second pass hit $(metric 9118 sluice_cache_hits_total) times for $blocks blocks"; status=1; }
    note "cached volume: $(acked) block writes acknowledged across a gateway restart, none failed; the second read pass hit $(metric 9118 sluice_cache_hits_total) times"
    detach_dev "$dev" || status=1
    stop_server 10820
    stop_server 10819
    stop_server 10818
    return $status
}

# The restarted server serves another file under the same name: no reconnection.
another_disk_is_refused() {
    local status=0 i=0
    truncate -s 64M /srv/first.img /srv/second.img
    serve 10815 /host/server-swap.log --export=disk=/srv/first.img || return 1
    attach_dev /host/attach-swap.log --timeout 3 --dead-timeout 5 nbd://127.0.0.1:10815/disk || return 1
    restart_server 10815 /host/server-swap.log --export=disk=/srv/second.img || return 1
    until grep -q "not reconnecting" /host/attach-swap.log; do
        i=$((i + 1)); [ $i -gt 300 ] && { echo "the guardian did not refuse within 30 s:"; cat /host/attach-swap.log; status=1; break; }
        sleep 0.1
    done
    grep -q "another disk" /host/attach-swap.log || { echo "the refusal does not say why:"; cat /host/attach-swap.log; status=1; }
    $SLUICE attach --list | grep -q "refused: the server serves another disk" || { echo "attach --list does not show the refusal"; status=1; }
    timeout 60 dd if=/dev/zero of="$dev" bs=4k count=1 oflag=direct 2>/dev/null && { echo "a write reached the other disk"; status=1; }
    note "another disk under the same name: $(grep -o 'not reconnecting.*' /host/attach-swap.log | head -n 1)"
    detach_dev "$dev" || status=1
    stop_server 10815
    return $status
}

# A read-only export, and --read-only on a writable one: writes fail at the block layer.
read_only() {
    local status=0 d
    truncate -s 64M /srv/ro.img
    serve 10816 /host/server-ro.log --export=ro=/srv/ro.img,read-only --export=rw=/srv/ro.img || return 1
    for d in "--pid-file /tmp/guardian.pid nbd://127.0.0.1:10816/ro" "--read-only nbd://127.0.0.1:10816/rw /dev/nbd5"; do
        attach_dev /host/attach-ro.log $d || return 1
        case "$d" in --pid-file*)
            grep -q "^$($SLUICE attach --list | awk -v d="$dev" '$1 == d {print $2}')\$" /tmp/guardian.pid ||
                { echo "the pid file does not hold the guardian's pid: $(cat /tmp/guardian.pid)"; status=1; } ;;
        esac
        case "$d" in *nbd5) [ "$dev" = /dev/nbd5 ] || { echo "asked for /dev/nbd5, got $dev"; status=1; } ;; esac
        [ "$(blockdev --getro "$dev")" = 1 ] || { echo "$d: $dev is not read-only"; status=1; }
        if dd if=/dev/zero of="$dev" bs=4k count=1 oflag=direct 2>/tmp/err; then
            echo "$d: a write succeeded"; status=1
        else
            grep -qE 'Operation not permitted|Read-only file system' /tmp/err || { echo "$d: the write failed otherwise: $(cat /tmp/err)"; status=1; }
        fi
        dd if="$dev" of=/dev/null bs=64k count=4 iflag=direct 2>/dev/null || { echo "$d: reads fail"; status=1; }
        detach_dev "$dev" || status=1
        [ -e /tmp/guardian.pid ] && { echo "the pid file outlived the guardian"; status=1; }
    done
    stop_server 10816
    return $status
}

# nbds://: the guardian's TLS sessions go to the kernel's TLS (kTLS), across a restart.
tls_across_restart() {
    local status=0 uri="nbds://127.0.0.1:10817/tls?tls-certificates=/host/pki-client"
    kernel_has_ktls || { echo "the guest kernel has no kTLS"; return 1; }
    truncate -s 64M /srv/tls.img
    local args="--tls=require --tls-certificates=/host/pki-server --export=tls=/srv/tls.img"
    serve 10817 /host/server-tls.log $args || return 1
    attach_dev /host/attach-tls.log --timeout 5 "$uri" || return 1
    start_writer block_writer "$dev"
    write_across_restart 10817 /host/server-tls.log $args || status=1
    verify_blocks "$dev" || status=1
    grep -q "reconnected after" /host/attach-tls.log || { echo "no reconnection logged"; status=1; }
    note "nbds:// through kTLS: $(acked) block writes acknowledged across the restart, none failed"
    detach_dev "$dev" || status=1
    stop_server 10817
    return $status
}

check "storage for the attach tests" storage
check "attach: ext4 across a kill -9 and restart" ext4_across_restart
check "nbd-client: the same writer and kill" nbd_client_beside
check "attach: past the dead timeout, then detach" past_the_dead_timeout
check "attach: 4 connections across a restart" multi_conn_across_restart
check "attach: a pool gateway restart" pool_gateway_restart
check "attach: a cached volume's gateway restart" cached_volume_gateway_restart
check "attach: another disk under the same name is refused" another_disk_is_refused
check "attach: read-only" read_only
check "attach: nbds:// over kTLS across a restart" tls_across_restart
