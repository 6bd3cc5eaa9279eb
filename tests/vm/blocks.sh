# What the block layer asks beyond reads and writes: discard and zeroout read back as
# zeros, FLUSH and FUA go out (the host counts them), a read-only export refuses writes,
# and offsets past 4 GiB land where they should.

# is_zero DEV OFFSET_MIB LENGTH_MIB: 0 if the range reads as zeros, 1 if not, 2 if it
# cannot be read.
is_zero() {
    local a b
    dd if="$1" bs=1M skip="$2" count="$3" iflag=direct of=/tmp/range 2>/dev/null || return 2
    a=$(md5sum </tmp/range)
    b=$(head -c $(($3 << 20)) /dev/zero | md5sum)
    [ "$a" = "$b" ]
}

# is_data DEV OFFSET_MIB LENGTH_MIB: the range reads, and not as zeros.
is_data() {
    is_zero "$@"
    [ $? = 1 ]
}

discard_reads_zeros() {
    local dev=/dev/nbd1 status=0
    connect $dev disk || return 1
    dd if=/dev/urandom of=$dev bs=1M count=16 oflag=direct || status=1
    blkdiscard -o $((2 << 20)) -l $((4 << 20)) $dev || status=1
    is_zero $dev 2 4 || { echo "discarded range reads back non-zero"; status=1; }
    is_data $dev 0 2 || { echo "data before the discarded range does not read back"; status=1; }
    blkdiscard -z -o $((8 << 20)) -l $((4 << 20)) $dev || status=1
    is_zero $dev 8 4 || { echo "zeroed-out range reads back non-zero"; status=1; }
    is_data $dev 12 4 || { echo "data after the zeroed range does not read back"; status=1; }
    note "write_zeroes_max_bytes $(cat /sys/block/nbd1/queue/write_zeroes_max_bytes) discard_max_bytes $(cat /sys/block/nbd1/queue/discard_max_bytes)"
    disconnect $dev
    return $status
}

flush_and_fua() {
    local dev=/dev/nbd1 status=0
    connect $dev disk || return 1
    note "the kernel sees fua=$(cat /sys/block/nbd1/queue/fua) write_cache=$(cat /sys/block/nbd1/queue/write_cache)"
    # O_DIRECT|O_DSYNC writes to a block device go out with FUA.
    dd if=/dev/urandom of=$dev bs=4k count=$FUA_WRITES seek=4096 oflag=direct,dsync || status=1
    # Buffered writes, then fsync: a FLUSH.
    dd if=/dev/urandom of=$dev bs=64k count=16 seek=512 conv=fsync || status=1
    disconnect $dev
    return $status
}

read_only_refuses_writes() {
    local dev=/dev/nbd2 status=0
    connect $dev ro || return 1
    [ "$(blockdev --getro $dev)" = 1 ] || { echo "the device is not read-only"; status=1; }
    if dd if=/dev/zero of=$dev bs=4k count=1 oflag=direct 2>/tmp/dd.err; then
        echo "a write to the read-only device succeeded"
        status=1
    fi
    # The kernel refuses that one itself; made writable here, the device sends the write,
    # and the server must refuse it (the host checks the file is unchanged).
    blockdev --setrw $dev
    if dd if=/dev/zero of=$dev bs=4k count=1 oflag=direct 2>/tmp/dd.err; then
        echo "the server took a write to a read-only export"
        status=1
    fi
    note "a write the kernel sent to the read-only export: $(tail -n 1 /tmp/dd.err)"
    [ "$(dd if=$dev bs=1M count=1 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)" = "$RO_MD5" ] ||
        { echo "the read-only export does not read back what the host wrote"; status=1; }
    disconnect $dev
    return $status
}

past_four_gib() {
    local dev=/dev/nbd3 status=0
    connect $dev big || return 1
    [ "$(blockdev --getsize64 $dev)" = "$BIG_BYTES" ] || { echo "size $(blockdev --getsize64 $dev)"; status=1; }
    dd if=/dev/urandom of=/host/far.bin bs=64k count=16 2>/dev/null
    # BIG_AT_MIB is past 4 GiB: the offset needs more than 32 bits.
    dd if=/host/far.bin of=$dev bs=1M seek="$BIG_AT_MIB" oflag=direct || status=1
    dd if=$dev of=/tmp/far.back bs=1M skip="$BIG_AT_MIB" count=1 iflag=direct || status=1
    cmp /host/far.bin /tmp/far.back || status=1
    # The last block of the device.
    dd if=/host/far.bin of=$dev bs=64k count=1 seek=$((BIG_BYTES / 65536 - 1)) oflag=direct || status=1
    disconnect $dev
    return $status
}

check "discard and zeroout read back as zeros" discard_reads_zeros
check "FLUSH and FUA sent" flush_and_fua
check "read-only export refuses writes" read_only_refuses_writes
check "offsets past 4 GiB" past_four_gib
