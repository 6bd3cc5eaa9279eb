# Metadata-heavy ext4 work: thousands of small files in many directories, renamed and
# removed, then checked after a remount and by e2fsck.

small_files() {
    local dev=/dev/nbd1 dir=/mnt/small status=0
    connect $dev disk || return 1
    mkfs.ext4 -q -F -N 20000 $dev && mkdir -p $dir && mount -t ext4 $dev $dir || { disconnect $dev; return 1; }
    for d in $(seq 1 $DIRS); do
        mkdir $dir/d$d
        for f in $(seq 1 $FILES_PER_DIR); do echo "$d/$f" >$dir/d$d/f$f; done
        # Every tenth file renamed, every seventh removed: directory updates, not only creates.
        for f in $(seq 10 10 $FILES_PER_DIR); do mv $dir/d$d/f$f $dir/d$d/renamed$f; done
        for f in $(seq 7 7 $FILES_PER_DIR); do rm -f $dir/d$d/f$f; done
    done
    local before after
    before=$(cd $dir && find . -type f | sort | xargs cat | md5sum)
    note "$(find $dir -type f | wc -l) files"
    umount $dir || status=1
    echo 3 >/proc/sys/vm/drop_caches
    mount -t ext4 $dev $dir || { disconnect $dev; return 1; }
    after=$(cd $dir && find . -type f | sort | xargs cat | md5sum)
    umount $dir
    [ "$before" = "$after" ] || { echo "contents changed across the remount"; status=1; }
    e2fsck -fn $dev >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; status=1; }
    disconnect $dev
    return $status
}

check "many small files on ext4" small_files
