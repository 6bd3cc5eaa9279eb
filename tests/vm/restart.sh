# What a server restart does to today's kernel client (nbd-client 3.24 on 6.1). For each
# of nbd-client's modes: a request is put in flight while the host holds the server
# stopped (SIGSTOP), the host kills it (SIGKILL) and starts it again on the same port and
# file. What becomes of the request in flight, and of a new one, is checked and noted;
# every write acknowledged before the kill must be there for a new connection.

# write_acknowledged DEV: 4 MiB written with O_DIRECT and fsynced: acknowledged.
write_acknowledged() {
    dd if=/dev/urandom of=/tmp/acked bs=1M count=4 2>/dev/null
    dd if=/tmp/acked of="$1" bs=1M conv=fsync oflag=direct 2>/dev/null
}

# reads_back DEV: a fresh connection reads back what was acknowledged.
reads_back() {
    local status=0
    connect "$1" disk || { echo "could not connect again after the restart"; return 1; }
    dd if="$1" of=/tmp/back bs=1M count=4 iflag=direct 2>/dev/null || { echo "could not read after reconnecting"; status=1; }
    cmp /tmp/acked /tmp/back || { echo "acknowledged data lost"; status=1; }
    disconnect "$1"
    return $status
}

# in_flight_across_restart N DEV: a read left in flight while the host stops, kills and
# restarts the server (files pause-N, paused-N, restart-N, restarted-N); its pid is in
# $reader, its errors in /tmp/reader.err.
in_flight_across_restart() {
    local n=$1 dev=$2 i=0
    tell_host pause-$n
    wait_host paused-$n || return 1
    # Its stdout is not the check's, which would wait for it to close.
    dd if=$dev of=/dev/null bs=4k count=1 skip=$((100 * n)) iflag=direct >/dev/null 2>/tmp/reader.err &
    reader=$!
    until [ "$(awk '{print $1}' /sys/block/${dev#/dev/}/inflight)" -gt 0 ]; do
        i=$((i + 1))
        [ $i -gt 100 ] && { echo "the read never went in flight"; return 1; }
        sleep 0.1
    done
    tell_host restart-$n
    wait_host restarted-$n || return 1
    # Whether the read was still pending when the new server was up.
    pending_at_restart=0
    kill -0 $reader 2>/dev/null && pending_at_restart=1
    return 0
}

# The read must have been pending across the restart for what follows to mean anything.
pending_across_restart() {
    [ $pending_at_restart = 1 ] || { echo "the read ended before the server was restarted: $(cat /tmp/reader.err)"; return 1; }
}

# ends_within SECONDS: waits for $reader; 0 if it ended (its status in $reader_status).
ends_within() {
    local i=0
    while kill -0 $reader 2>/dev/null; do
        i=$((i + 1))
        [ $i -gt $(($1 * 10)) ] && return 1
        sleep 0.1
    done
    wait $reader
    reader_status=$?
    return 0
}

with_timeout() {
    local dev=/dev/nbd1 status=0 start
    # Long enough that the host's stop, kill and restart happen within it, even on a busy
    # machine: the read must be pending when the new server is up.
    connect $dev disk -t 15 || return 1
    write_acknowledged $dev || { disconnect $dev; return 1; }
    in_flight_across_restart 1 $dev && pending_across_restart || status=1
    start=$(now)
    if ! ends_within 60; then
        echo "the read in flight still waits 60 s after the restart, with -t 15"
        status=1
    elif [ $reader_status = 0 ]; then
        echo "the read in flight succeeded across the restart"
        status=1
    else
        note "-t 15: the read in flight failed $(( ($(now) - start) / 100 )) s after the restart: $(head -n 1 /tmp/reader.err)"
    fi
    if dd if=$dev of=/dev/null bs=4k count=1 iflag=direct 2>/tmp/err; then
        echo "a new read on the old device succeeded: the client came back by itself"
        status=1
    else
        note "-t 15: a new read fails at once: $(head -n 1 /tmp/err)"
    fi
    disconnect $dev
    reads_back $dev || status=1
    return $status
}

netlink_without_timeout() {
    local dev=/dev/nbd2 status=0
    connect $dev disk || return 1
    write_acknowledged $dev || { disconnect $dev; return 1; }
    in_flight_across_restart 2 $dev && pending_across_restart || status=1
    # Ten seconds is far past the restart; a client that reconnected would have answered.
    if ends_within 10; then
        [ $reader_status = 0 ] && { echo "the read in flight succeeded across the restart"; status=1; }
        note "netlink without -t: the read in flight failed by itself: $(head -n 1 /tmp/reader.err)"
    else
        note "netlink without -t: the read in flight still waits 10 s after the restart (state $(awk '{print $3}' /proc/$reader/stat))"
        if dd if=$dev of=/dev/null bs=4k count=1 iflag=direct 2>/tmp/err; then
            echo "a new read succeeded while the old one hangs"
            status=1
        else
            note "netlink without -t: a new read meanwhile fails: $(head -n 1 /tmp/err)"
        fi
        disconnect $dev
        if ! ends_within 30; then
            echo "the read still waits 30 s after nbd-client -d"
            status=1
        else
            [ $reader_status = 0 ] && { echo "the read succeeded after nbd-client -d"; status=1; }
            note "netlink without -t: nbd-client -d ended the read: $(head -n 1 /tmp/reader.err)"
        fi
    fi
    disconnect $dev 2>/dev/null
    reads_back $dev || status=1
    return $status
}

# ioctl mode with -persist: nbd-client is meant to reconnect. What it does is noted.
ioctl_persist() {
    local dev=/dev/nbd3 status=0
    nbd-client 10.0.2.2 "$SERVER_PORT" $dev -N disk -nonetlink -persist || return 1
    write_acknowledged $dev || { nbd-client -d $dev; return 1; }
    in_flight_across_restart 3 $dev || status=1
    if ends_within 30; then
        note "ioctl -persist: the read in flight $([ $reader_status = 0 ] && echo succeeded || echo "failed: $(head -n 1 /tmp/reader.err)") $([ $pending_at_restart = 1 ] && echo 'after the restart' || echo 'when the server died, before the restart'); the device $([ -e /sys/block/nbd3/pid ] && echo 'is still served by nbd-client' || echo 'has no nbd-client any more')"
        [ $reader_status = 0 ] && { echo "the read in flight succeeded across the restart"; status=1; }
    else
        note "ioctl -persist: the read in flight still waits 30 s after the restart"
    fi
    nbd-client -d $dev 2>/dev/null
    ends_within 30 || { echo "the read still waits 30 s after nbd-client -d"; status=1; }
    reads_back $dev || status=1
    return $status
}

check "restart under nbd-client -t 15" with_timeout
check "restart under netlink nbd-client without a timeout" netlink_without_timeout
check "restart under ioctl nbd-client -persist" ioctl_persist
