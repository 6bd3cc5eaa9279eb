# nbd-client -C 4: four connections to one export (the server advertises multi-conn),
# fio write+verify from four jobs at once.

multi_conn() {
    local dev=/dev/nbd1 status
    connect $dev disk -C 4 || return 1
    large_requests $dev
    note "connections: $(ls /sys/block/nbd1/pid >/dev/null 2>&1 && echo up)"
    fio --name=verify --filename=$dev --direct=1 --ioengine=libaio --iodepth=8 --numjobs=4 --rw=randwrite \
        --bs=64k --size=16M --offset_increment=16M --verify=crc32c --verify_fatal=1 --minimal >/tmp/fio.out
    status=$?
    [ $status = 0 ] || cat /tmp/fio.out
    tell_host connected
    wait_host counted || status=1
    disconnect $dev
    return $status
}

check "nbd-client -C 4 with fio verify" multi_conn
