# What a server restart does to today's kernel client (nbd-client 3.24 on 6.1). The host
# kills sluice and starts it again on the same port and file. Acknowledged writes must be
# there afterwards, whatever the client does; what the client does is recorded:
# - with a timeout (-t): I/O after the restart fails with EIO and the device stays dead;
# - netlink mode without one: a read in flight hangs until `nbd-client -d`.

# write_acknowledged DEV: 4 MiB written and fsynced: acknowledged by the server.
write_acknowledged() {
    dd if=/dev/urandom of=/tmp/acked bs=1M count=4 2>/dev/null
    dd if=/tmp/acked of="$1" bs=1M conv=fsync oflag=direct 2>/dev/null
}

# reads_back DEV: a fresh connection reads back what was acknowledged.
reads_back() {
    local status=0
    connect "$1" disk || return 1
    dd if="$1" of=/tmp/back bs=1M count=4 iflag=direct 2>/dev/null || status=1
    cmp /tmp/acked /tmp/back || status=1
    disconnect "$1"
    return $status
}

with_timeout() {
    local dev=/dev/nbd1 status=0 start
    connect $dev disk -t 5 || return 1
    write_acknowledged $dev || { disconnect $dev; return 1; }
    tell_host restart-1
    wait_host restarted-1 || status=1
    start=$(now)
    if dd if=$dev of=/dev/null bs=4k count=1 skip=100 iflag=direct 2>/tmp/err; then
        echo "a read after the restart succeeded on the old connection"
        status=1
    fi
    note "-t 5: the read failed after $(( ($(now) - start) / 100 )) s: $(tail -n 1 /tmp/err)"
    if dd if=$dev of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; then
        echo "the device came back by itself"
        status=1
    fi
    disconnect $dev
    reads_back $dev || { echo "acknowledged data lost"; status=1; }
    return $status
}

netlink_hangs_until_disconnect() {
    local dev=/dev/nbd2 status=0 reader
    connect $dev disk || return 1
    write_acknowledged $dev || { disconnect $dev; return 1; }
    tell_host restart-2
    wait_host restarted-2 || status=1
    dd if=$dev of=/dev/null bs=4k count=1 skip=200 iflag=direct 2>/tmp/err &
    reader=$!
    # Ten seconds is far past the restart; a client that reconnected would have answered.
    sleep 10
    if kill -0 $reader 2>/dev/null; then
        note "netlink without -t: the read was still waiting 10 s after the restart (state $(awk '{print $3}' /proc/$reader/stat))"
    else
        wait $reader && { echo "the read succeeded on the old connection"; status=1; }
        note "netlink without -t: the read ended by itself: $(tail -n 1 /tmp/err)"
    fi
    disconnect $dev
    local i=0
    while kill -0 $reader 2>/dev/null; do
        i=$((i + 1))
        [ $i -gt 300 ] && { echo "the read still hangs 30 s after nbd-client -d"; status=1; break; }
        sleep 0.1
    done
    wait $reader && { echo "the read succeeded after nbd-client -d"; status=1; }
    note "after nbd-client -d the read ended: $(tail -n 1 /tmp/err)"
    reads_back $dev || { echo "acknowledged data lost"; status=1; }
    return $status
}

check "restart under nbd-client -t 5" with_timeout
check "restart under netlink nbd-client without a timeout" netlink_hangs_until_disconnect
