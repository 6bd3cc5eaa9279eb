# sluice itself on Debian 12's kernel (6.1): served from inside the guest, on every data
# path, over TLS (kTLS where the kernel takes the keys), and as a pool of members that run
# in the guest too. The clients are libnbd's tools and the kernel's nbd client, over
# loopback.

start_server() {
    local args="" path
    for path in $DATA_PATHS; do args="$args --export=$path=/srv/$path.img,data-path=$path"; done
    serve 10809 /host/sluice-guest.log $args || return 1
    # What the server said about the kernel it found (io_uring features, fallbacks).
    note "sluice on $(uname -r) said: $(grep -iE 'warn|error|fall|io_uring|support|kernel' /host/sluice-guest.log | tr '\n' ' ')"
    return 0
}

# nbdcopy in and out of each data path's export, compared.
copy_round_trip() {
    local path=$1 uri=nbd://127.0.0.1:10809/$1
    nbdcopy /srv/data "$uri" || return 1
    nbdcopy "$uri" /srv/back || return 1
    cmp -n $((32 << 20)) /srv/data /srv/back
}

kernel_client_round_trip() {
    local path=$1 dev=/dev/nbd1 status
    nbd-client 127.0.0.1 10809 $dev -N "$path" || return 1
    large_requests $dev
    fio --name=verify --filename=$dev --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite \
        --bs=64k --size=16M --verify=crc32c --verify_fatal=1 --minimal >/tmp/fio.out
    status=$?
    nbd-client -d $dev
    [ $status = 0 ] || cat /tmp/fio.out
    return $status
}

# A raid10 pool of four members (sluice in the guest, on Unix sockets), served by sluice.
pool_round_trip() {
    local status=0
    pool_file /srv/pool.toml 'layout = "raid10"\nstripe-unit = "64K"\n' m 4 33 || return 1
    $SLUICE pool init pool:/srv/pool.toml || return 1
    serve 10811 /host/sluice-pool.log --export=vol=pool:/srv/pool.toml || return 1
    local pool_server=$served
    nbdcopy /srv/data nbd://127.0.0.1:10811/vol && nbdcopy nbd://127.0.0.1:10811/vol /srv/back &&
        cmp -n $((32 << 20)) /srv/data /srv/back || status=1
    kill $pool_server
    return $status
}

# run_tests BINARY: one of the suite's test binaries, here in the guest (it finds sluice at
# the path it was built with: scripts/vm mounts the repository at the same place).
run_tests() {
    local out status
    out=$("$1" --test-threads=2 2>&1)
    status=$?
    note "$(basename "${1%-*}"): $(echo "$out" | grep -E '^test result' | tail -n 1)$(echo "$out" | grep -c SKIPPED | sed 's/^0$//; s/.\+/, & skipped/')"
    [ $status = 0 ] || echo "$out" | tail -n 40
    return $status
}

check "storage for the guest's exports" storage $DATA_PATHS
check "sluice starts on 6.1" start_server
for path in $DATA_PATHS; do
    check "nbdcopy round trip on $path" copy_round_trip "$path"
    check "kernel client on $path" kernel_client_round_trip "$path"
done
check "raid10 pool in the guest" pool_round_trip
for binary in $TEST_BINARIES; do
    check "the $(basename "${binary%-*}") tests" run_tests "$binary"
done
