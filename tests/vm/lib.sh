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
    # On the console at once, so that a guest stopped at its time limit shows which check
    # it was in.
    echo "# running $name" >&3
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
    # nbd-client has no handshake timeout of its own.
    timeout 60 nbd-client 10.0.2.2 "$SERVER_PORT" "$dev" -N "$name" "$@"
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

# For scenarios that run sluice inside the guest.
# The binary the host's test was built against (env.sh), else the release build.
SLUICE=${SLUICE:-/target/release/sluice}

# serve PORT LOG ARGS...: starts sluice in the background and waits (bounded) until it
# accepts connections; its pid is in $served and (for callers that ran it inside a check,
# in a subshell) in /tmp/pid-PORT.
# Stops the server on PORT (SIGTERM) and waits, at most 15 s, until nothing listens there
# any more: a server started next on the same port would otherwise fail to bind while
# serve() found the old one still answering.
stop_server() {
    local port=$1 i=0
    kill "$(cat /tmp/pid-$port)" 2>/dev/null
    while (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 150 ]; then
            echo "the server on port $port still listens 15 s after SIGTERM"; return 1
        fi
        sleep 0.1
    done
}

serve() {
    local port=$1 log=$2 i=0
    shift 2
    # Its stdout must not be the check's, which would wait for it to close.
    $SLUICE serve --listen 127.0.0.1:$port "$@" >/dev/null 2>"$log" &
    served=$!
    echo $served >/tmp/pid-$port
    until (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 300 ] || ! kill -0 $served 2>/dev/null; then
            echo "sluice did not start:"; cat "$log"; return 1
        fi
        sleep 0.1
    done
}

# storage NAMES...: ext4 on a RAM disk at /srv (O_DIRECT works there, unlike tmpfs), a
# 64 MiB image per name, and 32 MiB of random data in /srv/data.
storage() {
    modprobe brd rd_nr=1 rd_size=$((384 * 1024)) || return 1
    mkfs.ext4 -q -F /dev/ram0 && mkdir -p /srv && mount -t ext4 /dev/ram0 /srv || return 1
    local name
    for name in "$@"; do truncate -s 64M /srv/$name.img; done
    dd if=/dev/urandom of=/srv/data bs=1M count=32 2>/dev/null
}

# The ULP and the ciphers the kernel's TLS uses (AES-GCM, ChaCha20-Poly1305).
kernel_has_ktls() {
    local m
    for m in tls gcm ctr ghash_generic aesni_intel ghash_clmulni_intel chacha20poly1305 chacha_x86_64 poly1305_x86_64; do
        modprobe $m || return 1
    done
    grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp
}

# pool_file FILE LAYOUT-LINES PREFIX N MIB: N pool members, each sluice serving a file
# of MIB MiB on /tmp/PREFIXi.sock, waited for (bounded); then the pool file FILE with
# LAYOUT-LINES and their URIs.
pool_file() {
    local file=$1 layout=$2 prefix=$3 count=$4 mib=$5 i members=""
    for i in $(seq 1 "$count"); do
        truncate -s ${mib}M /srv/$prefix$i.img
        $SLUICE serve /srv/$prefix$i.img --unix /tmp/$prefix$i.sock >/dev/null 2>/tmp/$prefix$i.log &
        members="$members\"nbd+unix:///?socket=/tmp/$prefix$i.sock\", "
    done
    for i in $(seq 1 "$count"); do
        local n=0
        until [ -S /tmp/$prefix$i.sock ] && nbdinfo --size "nbd+unix:///?socket=/tmp/$prefix$i.sock" >/dev/null 2>&1; do
            n=$((n + 1)); [ $n -gt 300 ] && { echo "member $i did not start"; cat /tmp/$prefix$i.log; return 1; }
            sleep 0.1
        done
    done
    printf '%bmembers = [%s]\n' "$layout" "${members%, }" >"$file"
}

finish() {
    exit $failed
}

modprobe nbd nbds_max=16 max_part=0 || echo "not ok loading nbd.ko"
