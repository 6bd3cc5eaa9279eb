# A raid10 pool served by sluice on the host, under the kernel client: a member is killed
# while fio writes, the writes go on, and everything written reads back right.

member_killed_mid_write() {
    local dev=/dev/nbd1 status=0 fio_pid
    connect $dev vol || return 1
    large_requests $dev
    # Paced, so that the host's kill lands in the middle of it.
    fio --name=verify --filename=$dev --direct=1 --ioengine=libaio --iodepth=8 --rw=randwrite \
        --bs=64k --size=32M --rate=4m --verify=crc32c --verify_fatal=1 --minimal >/tmp/fio.out 2>&1 &
    fio_pid=$!
    # Writes are under way once the device has completed some.
    local i=0
    while [ "$(awk '{print $5}' /sys/block/nbd1/stat)" -lt 64 ]; do
        i=$((i + 1))
        [ $i -gt 300 ] && { echo "fio wrote nothing in 30 s"; kill $fio_pid; disconnect $dev; return 1; }
        sleep 0.1
    done
    tell_host writing
    wait_host killed || status=1
    # Writes still to come when the member died: fio writes 32 MiB (65536 sectors), then
    # reads it back.
    local written
    written=$(awk '{print $7}' /sys/block/nbd1/stat)
    [ "$written" -lt 65536 ] || { echo "fio had written everything before the member died: nothing was tested"; status=1; }
    note "the member died after $((written / 2048)) of 32 MiB were written"
    # Bounded: a pool that hangs is what this checks for.
    local i=0
    while kill -0 $fio_pid 2>/dev/null; do
        i=$((i + 1))
        [ $i -gt 1200 ] && { echo "fio still runs 120 s after the member died"; kill $fio_pid; status=1; break; }
        sleep 0.1
    done
    wait $fio_pid || { cat /tmp/fio.out; status=1; }
    disconnect $dev
    return $status
}

check "raid10 pool, a member killed mid-write" member_killed_mid_write
