# kTLS: sluice in the guest (whose kernel has tls.ko) hands each TLS session's keys to the
# kernel, so splice and O_DIRECT work under TLS. Clients: libnbd (GnuTLS, TLS 1.3) and the
# kernel's nbd client (nbd-client, TLS 1.2). A handoff made wrong on purpose (the test hook
# SLUICE_TEST_KTLS_FAULT) must end in an error, never in wrong data. CPU per GiB with and
# without kTLS is noted (TCG: information, not performance).

CLIENT_PKI=/host/pki-client
SERVER_PKI=/host/pki-server

# uri PORT EXPORT
uri() {
    echo "nbds://127.0.0.1:$1/$2?tls-certificates=$CLIENT_PKI"
}

start_tls_server() {
    # At debug level the log names each connection's protocol version and suite.
    serve 10810 /host/sluice-ktls.log --log-level=debug --tls=require --tls-certificates=$SERVER_PKI \
        --export=splice=/srv/splice.img,data-path=splice --export=direct=/srv/direct.img,data-path=direct
}

# The log line of the newest connection says which TLS it got.
last_connection() {
    grep -E 'opened export .* over TLS' /host/sluice-ktls.log | tail -n 1
}

libnbd_tls13() {
    local path=$1 status=0
    nbdcopy /srv/data "$(uri 10810 $path)" || return 1
    last_connection | grep -q '(kTLS)' || { echo "not kTLS: $(last_connection)"; status=1; }
    nbdcopy "$(uri 10810 $path)" /srv/back || return 1
    cmp -n $((32 << 20)) /srv/data /srv/back || status=1
    nbdinfo --map "$(uri 10810 $path)" >/tmp/map || status=1
    grep -E 'TLSv1\.3' /host/sluice-ktls.log >/dev/null || { echo "no TLS 1.3 connection logged"; status=1; }
    return $status
}

nbd_client_tls12() {
    local dev=/dev/nbd1 status=0
    nbd-client 127.0.0.1 10810 $dev -N direct --certfile $CLIENT_PKI/client-cert.pem \
        --keyfile $CLIENT_PKI/client-key.pem --cacertfile $CLIENT_PKI/ca-cert.pem --tlshostname localhost || return 1
    last_connection | grep -q '(kTLS)' || { echo "not kTLS: $(last_connection)"; status=1; }
    large_requests $dev
    # Reads, writes (some FUA), a flush, a discard.
    fio --name=verify --filename=$dev --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite \
        --bs=64k --size=16M --verify=crc32c --verify_fatal=1 --minimal >/tmp/fio.out || { cat /tmp/fio.out; status=1; }
    dd if=/dev/urandom of=$dev bs=4k count=16 seek=8192 oflag=direct,dsync 2>/dev/null || status=1
    blkdiscard -o $((48 << 20)) -l $((4 << 20)) $dev || status=1
    sync
    nbd-client -d $dev
    grep -E 'TLSv1\.2' /host/sluice-ktls.log >/dev/null || { echo "no TLS 1.2 connection logged"; status=1; }
    return $status
}

# wrong_handoff FAULT: a server whose handoff is wrong in one direction. Reads and writes
# fail; the export's file is what it was.
wrong_handoff() {
    local fault=$1 status=0
    cp /srv/data /srv/fault.img
    truncate -s 64M /srv/fault.img
    SLUICE_TEST_KTLS_FAULT=$fault serve 10812 /host/sluice-fault-$fault.log --tls=require \
        --tls-certificates=$SERVER_PKI --export=fault=/srv/fault.img,data-path=splice || return 1
    local server=$served
    local code
    timeout 60 nbdcopy "$(uri 10812 fault)" /srv/fault-back 2>/tmp/err
    code=$?
    # A failure that proves nothing: a hang, or a client that could not run.
    case $code in
    0) echo "read through a wrong handoff did not fail"; status=1 ;;
    124 | 126 | 127) echo "nbdcopy ended with $code: $(cat /tmp/err)"; status=1 ;;
    esac
    grep -q "SLUICE_TEST_KTLS_FAULT=$fault" /host/sluice-fault-$fault.log &&
        grep -q '(kTLS)' /host/sluice-fault-$fault.log ||
        { echo "the faulty server did not hand a session to the kernel"; status=1; }
    note "$fault: the read failed: $(tail -n 2 /tmp/err | tr '\n' ' ')"
    dd if=/dev/urandom of=/srv/other bs=1M count=4 2>/dev/null
    timeout 60 nbdcopy /srv/other "$(uri 10812 fault)" 2>/tmp/err
    code=$?
    case $code in
    0) echo "write through a wrong handoff did not fail"; status=1 ;;
    124 | 126 | 127) echo "nbdcopy ended with $code: $(cat /tmp/err)"; status=1 ;;
    esac
    note "$fault: the write failed: $(tail -n 2 /tmp/err | tr '\n' ' ')"
    kill $server; wait $server 2>/dev/null
    # Writes the server decrypted may have landed before the client gave up (a wrong send
    # sequence number breaks only the replies), but every 4 KiB block must hold either what
    # was there or what the client wrote: nothing else.
    local f
    for f in fault.img data other; do
        rm -rf /tmp/blocks-$f && mkdir /tmp/blocks-$f
        head -c $((4 << 20)) /srv/$f | split -b 4096 -a 4 - /tmp/blocks-$f/
        (cd /tmp/blocks-$f && md5sum * | cut -d' ' -f1) >/tmp/sums-$f
        [ "$(wc -l </tmp/sums-$f)" = 1024 ] || { echo "could not split $f into 1024 blocks"; return 1; }
    done
    paste -d' ' /tmp/sums-fault.img /tmp/sums-data /tmp/sums-other |
        awk '$1 != $2 && $1 != $3 { bad++ } END { if (bad) { print bad " blocks hold neither the old nor the new data"; exit 1 } }' ||
        status=1
    note "$fault: server log: $(grep -iE 'ktls|tls|record|closed' /host/sluice-fault-$fault.log | tail -n 3 | tr '\n' ' ')"
    return $status
}

# cpu_per_gib PORT PID EXPORT: server CPU seconds per GiB read by nbdcopy.
cpu_ticks() {
    awk '{print $14 + $15}' /proc/$1/stat
}
cpu_per_gib() {
    local port=$1 pid=$2 before after i
    before=$(cpu_ticks $pid)
    for i in 1 2 3 4; do nbdcopy "$(uri $port splice)" /dev/null || return 1; done
    after=$(cpu_ticks $pid)
    # 4 x 64 MiB = 1/4 GiB; ticks are hundredths of a second.
    echo $(( (after - before) * 4 ))
}

ktls_cpu() {
    local with without
    serve 10813 /host/sluice-userspace.log --tls=require --tls-ktls=off --tls-certificates=$SERVER_PKI \
        --export=splice=/srv/splice.img,data-path=splice || return 1
    local plain_server=$served
    with=$(cpu_per_gib 10810 "$(cat /tmp/pid-10810)") || return 1
    without=$(cpu_per_gib 10813 $plain_server) || return 1
    kill $plain_server
    grep -q '(user-space)' /host/sluice-userspace.log || { echo "--tls-ktls=off did not use user-space TLS"; return 1; }
    note "server CPU per GiB read (TCG, information only): kTLS $((with / 100)).$(printf %02d $((with % 100))) s, user-space TLS $((without / 100)).$(printf %02d $((without % 100))) s"
}

check "the kernel offers kTLS" kernel_has_ktls
check "storage for the guest's exports" storage splice direct
check "sluice starts with TLS required" start_tls_server
check "libnbd TLS 1.3 over kTLS on splice" libnbd_tls13 splice
check "libnbd TLS 1.3 over kTLS on direct" libnbd_tls13 direct
check "nbd-client TLS 1.2 over kTLS" nbd_client_tls12
check "a wrong send sequence number is caught" wrong_handoff tx-seq
check "a wrong receive sequence number is caught" wrong_handoff rx-seq
check "CPU per GiB with and without kTLS" ktls_cpu
