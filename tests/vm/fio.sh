# fio write+verify with O_DIRECT through the kernel client, 4 KiB and 1 MiB requests, on
# each of the host's exports (one per data path).

fio_verify() {
    local name=$1 bs=$2 size=$3 dev=/dev/nbd1 status
    connect $dev "$name" || return 1
    large_requests $dev
    fio --name=verify --filename=$dev --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite \
        --bs="$bs" --size="$size" --verify=crc32c --verify_fatal=1 --randrepeat=0 --minimal >/tmp/fio.out
    status=$?
    disconnect $dev
    [ $status = 0 ] || cat /tmp/fio.out
    return $status
}

for path in $DATA_PATHS; do
    check "fio 4K verify on $path" fio_verify "$path" 4k 16M
    check "fio 1M verify on $path" fio_verify "$path" 1M 64M
done
