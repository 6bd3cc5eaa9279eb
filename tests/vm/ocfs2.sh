# OCFS2 on two nodes (o2cb, the guests' private network) over one sluice export, then over
# a raid10 pool served by sluice: both mount it, each reads the file the other wrote,
# both create files in one directory at once, both unmount, and fsck.ocfs2 finds it clean.

cluster_up() {
    modprobe configfs && modprobe ocfs2_stack_o2cb && modprobe ocfs2_dlmfs && modprobe ocfs2 || return 1
    mount -t configfs none /sys/kernel/config 2>/dev/null
    mkdir -p /dlm /sbin && mount -t ocfs2_dlmfs ocfs2_dlmfs /dlm || return 1
    # mount.ocfs2 runs the heartbeat helper from /sbin.
    ln -sf /tools/bin/ocfs2_hb_ctl /sbin/ocfs2_hb_ctl
    cat >/etc/ocfs2/cluster.conf <<CONF
cluster:
	node_count = 2
	heartbeat_mode = local
	name = sluice

node:
	ip_port = 7777
	ip_address = 192.168.7.1
	number = 1
	name = node1
	cluster = sluice

node:
	ip_port = 7777
	ip_address = 192.168.7.2
	number = 2
	name = node2
	cluster = sluice
CONF
    o2cb register-cluster sluice
}

# shared_filesystem EXPORT DEVICE: the whole round on one export.
shared_filesystem() {
    local name=$1 dev=$2 dir=/mnt/$1 me=$SLUICE_NODE other=$((3 - SLUICE_NODE)) status=0
    connect $dev "$name" || return 1
    if [ "$me" = 1 ]; then
        mkfs.ocfs2 -q -F -N 2 -b 4K -C 64K -L "$name" --cluster-stack=o2cb --cluster-name=sluice $dev || status=1
    fi
    barrier "$name-made" || status=1
    mkdir -p "$dir" && mount.ocfs2 $dev "$dir" || { disconnect $dev; return 1; }
    barrier "$name-mounted" || status=1
    dd if=/dev/urandom of="$dir/from-node$me" bs=1M count=8 2>/dev/null && sync || status=1
    md5sum <"$dir/from-node$me" >"/host/$name-node$me.md5"
    barrier "$name-written" || status=1
    md5sum <"$dir/from-node$other" | cmp - "/host/$name-node$other.md5" ||
        { echo "node $me read node $other's file differently"; status=1; }
    mkdir -p "$dir/many" 2>/dev/null
    barrier "$name-dir" || status=1
    for i in $(seq 1 "$FILES_PER_NODE"); do echo "node $me file $i" >"$dir/many/n$me-$i" || status=1; done
    sync
    barrier "$name-created" || status=1
    local count
    count=$(ls "$dir/many" | wc -l)
    [ "$count" = $((2 * FILES_PER_NODE)) ] || { echo "node $me sees $count files, not $((2 * FILES_PER_NODE))"; status=1; }
    grep -q "node $other file $FILES_PER_NODE" "$dir/many/n$other-$FILES_PER_NODE" || status=1
    umount "$dir" || status=1
    # The kernel asks ocfs2_hb_ctl to stop the device's heartbeat at unmount; make sure it
    # has, before the device goes (a region left beating keeps the node in the cluster).
    ocfs2_hb_ctl -K -d $dev o2cb 2>/dev/null
    barrier "$name-unmounted" || status=1
    if [ "$me" = 1 ]; then
        fsck.ocfs2 -fn $dev >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; status=1; }
    fi
    barrier "$name-checked" || status=1
    disconnect $dev
    return $status
}

# Each node leaves the cluster, and neither powers off before both have: o2cb fences (resets)
# a node that still has cluster state when its peer's connection drops.
cluster_down() {
    barrier leaving || return 1
    local i=0
    # Heartbeat regions are the directories under the cluster's heartbeat node.
    while [ -n "$(find /sys/kernel/config/cluster/sluice/heartbeat -mindepth 1 -maxdepth 1 -type d)" ]; do
        i=$((i + 1))
        [ $i -gt 300 ] && { echo "heartbeat regions still active 30 s after the last unmount"; break; }
        sleep 0.1
    done
    o2cb unregister-cluster sluice || return 1
    barrier left
}

check "o2cb cluster up" cluster_up
n=1
for export in $EXPORTS; do
    # A device of its own: the last one's heartbeat may still hold it for a moment.
    check "OCFS2 on two nodes over $export" shared_filesystem "$export" /dev/nbd$n
    n=$((n + 1))
done
check "o2cb cluster down" cluster_down
