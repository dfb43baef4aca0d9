# The guest's common start, sourced by tests/vm/batch.sh and benchmarks/rdma_bw_vm.py's boot: helpers
# (log, wait_port), and rxe0, a Soft-RoCE device on lo, ACTIVE, with $GID the index of its RoCE v2
# GID for 127.0.0.1. Exits 3 when rdma_rxe cannot be had.
log() { echo "== $*"; }
wait_port() {
  i=0
  while ! ss -ltnH "sport = :$1" | grep -q .; do
    i=$((i+1)); [ $i -gt 600 ] && { echo "port $1 never listened"; return 1; }; sleep 0.1
  done
}
ip link set lo up
modprobe rdma_rxe || { echo "no rdma_rxe"; exit 3; }
rdma link add rxe0 type rxe netdev lo || exit 3
for i in $(seq 50); do grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && break; sleep 0.1; done
# one grep over the port's 1,024 GID entries: a `cat` for each was a minute of the guest's time (a
# process costs tens of milliseconds under emulation)
GID=""
for g in $(grep -lx "0000:0000:0000:0000:0000:ffff:7f00:0001" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null); do
  n=${g##*/}
  [ "$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n 2>/dev/null)" = "RoCE v2" ] && GID=$n
done
echo "$GID" > $OUT/gid
log "rxe0 on lo, GID index $GID"; ibv_devinfo -d rxe0 | head -20
