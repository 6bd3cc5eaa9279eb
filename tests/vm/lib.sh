# Sourced by every guest scenario (scripts/vm runs /host/run.sh, which sources this, then
# /host/env.sh with the test's parameters, then the scenario). A scenario is a list of
# checks; each prints one line, "ok NAME (S s)" or "not ok NAME" followed by what the
# command printed, and the script's status is the number of checks that failed.

failed=0
# Notes go to the console even from inside a check, whose output is held back.
exec 3>&1

# Hundredths of a second since boot.
now() {
    cut -d' ' -f1 /proc/uptime | tr -d .
}

# check NAME COMMAND...: runs COMMAND (a function or program), bounded by the guest's time;
# what it printed is shown when it fails.
check() {
    local name=$1 start out status
    shift
    start=$(now)
    out=$("$@" 2>&1)
    status=$?
    local took=$(($(now) - start))
    took="$((took / 100)).$(printf %02d $((took % 100)))"
    if [ $status -eq 0 ]; then
        echo "ok $name (${took} s)"
    else
        echo "not ok $name (status $status after ${took} s)"
        failed=$((failed + 1))
        [ -n "$out" ] && echo "$out" | sed 's/^/  | /'
    fi
    return 0
}

# note TEXT: a line the host test keeps in its report (measurements, observed behaviour).
note() {
    echo "note $*" >&3
}

# Tells the host a step is reached (a file in the share), and waits (bounded) for the
# host's answer file.
tell_host() {
    : >"/host/$1"
}
wait_host() {
    local file=$1 limit=${2:-120} i=0
    while [ ! -e "/host/$file" ]; do
        i=$((i + 1))
        [ $i -gt $((limit * 10)) ] && { echo "the host did not answer $file within ${limit}s"; return 1; }
        sleep 0.1
    done
}

# barrier NAME: waits (bounded) until every node has reached NAME.
barrier() {
    local name=$1 limit=${2:-180} n
    : >"/host/$name.$SLUICE_NODE"
    for n in $(seq 1 "$SLUICE_NODES"); do
        wait_host "$name.$n" "$limit" || return 1
    done
}

# connect DEVICE EXPORT [nbd-client options...]: the kernel client to the host's sluice.
connect() {
    local dev=$1 name=$2
    shift 2
    nbd-client 10.0.2.2 "$SERVER_PORT" "$dev" -N "$name" "$@"
}

disconnect() {
    nbd-client -d "$1"
}

# The kernel splits writes at max_sectors_kb (128 KiB by default); 1 MiB requests need it
# raised.
large_requests() {
    local name=${1#/dev/}
    echo 1024 >"/sys/block/$name/queue/max_sectors_kb"
}

finish() {
    exit $failed
}

modprobe nbd nbds_max=16 max_part=0
