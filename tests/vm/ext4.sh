# ext4 through the kernel's nbd client on each of the host's exports (one per data path):
# files written, the device let go and connected again, the files read back and checked,
# and e2fsck finds nothing to fix.

ext4_fill() {
    local dev=$1 dir=$2
    mkfs.ext4 -q -F "$dev" && mkdir -p "$dir" && mount -t ext4 "$dev" "$dir" || return 1
    dd if=/dev/urandom of="$dir/big" bs=1M count=16 2>/dev/null || return 1
    mkdir "$dir/tree" && for i in $(seq 1 50); do echo "file $i" >"$dir/tree/f$i" || return 1; done
    cat "$dir/big" "$dir"/tree/* | md5sum >/tmp/written
    umount "$dir"
}

ext4_verify() {
    local dev=$1 dir=$2
    # Nothing may come from the guest's page cache: the device is new.
    echo 3 >/proc/sys/vm/drop_caches
    mount -t ext4 "$dev" "$dir" || return 1
    cat "$dir/big" "$dir"/tree/* | md5sum >/tmp/read
    umount "$dir"
    cmp /tmp/written /tmp/read || { echo "read back $(cat /tmp/read), wrote $(cat /tmp/written)"; return 1; }
    e2fsck -fn "$dev"
}

ext4_round_trip() {
    local name=$1 dev=/dev/nbd1 status=0
    connect $dev "$name" || return 1
    ext4_fill $dev /mnt/$name || status=1
    disconnect $dev
    [ $status = 0 ] || return 1
    connect $dev "$name" || return 1
    ext4_verify $dev /mnt/$name || status=1
    umount /mnt/$name 2>/dev/null
    disconnect $dev
    return $status
}

for path in $DATA_PATHS; do
    check "ext4 on data path $path" ext4_round_trip "$path"
done
