#!/bin/sh
# netcheck over rdma-bw between five "nodes" in the guest, each an rxe device on its own veth whose
# other end is a port of one bridge in a switch namespace (nhfabric). Debian 6.1's rdma_rxe sends
# and receives in the initial namespace only, so the nodes' ends stay there; policy routing (an
# `oif` rule per veth, the local table moved after them) sends each device's packets out of its own
# cable instead of short-circuiting through lo, and accept_local/arp_ignore let a host that owns every
# address take them in on the right port. Faults: a switch port down (broken), tbf on a cable (slow),
# nftables dropping RoCE at a node (broken); then `netcheck job` on every node. Sourced by batch.sh;
# writes $OUT/netcheck_*.
NODES="1 2 3 4 5"
ip netns add nhfabric
ip -n nhfabric link add br0 type bridge
ip -n nhfabric link set br0 up
ip rule add pref 1000 lookup local
ip rule del pref 0
sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.all.accept_local=1
for i in $NODES; do
  ip link add nc$i type veth peer name sw$i netns nhfabric
  sysctl -qw net.ipv4.conf.nc$i.rp_filter=0 net.ipv4.conf.nc$i.accept_local=1 \
    net.ipv4.conf.nc$i.arp_ignore=1 net.ipv4.conf.nc$i.arp_announce=2
  ip addr add 10.9.0.$i/32 dev nc$i
  ip link set nc$i up
  ip -n nhfabric link set sw$i master br0 up
  ip route add 10.9.0.0/24 dev nc$i src 10.9.0.$i table $((100 + i))
  ip rule add pref $((100 + i)) oif nc$i lookup $((100 + i))
  rdma link add rxe_nc$i type rxe netdev nc$i
done
for i in $NODES; do
  for t in $(seq 50); do grep -q ACTIVE /sys/class/infiniband/rxe_nc$i/ports/1/state && break; sleep 0.1; done
done
ip rule show; rdma link show
step netcheck-agents
agents=""
for i in $NODES; do
  $NH netcheck serve --listen 10.9.0.$i:9460 --name node$i > $OUT/netcheck_agent$i.log 2>&1 &
  agents="$agents $!"
done
i=0
until [ "$(ss -ltnH 'sport = :9460' | wc -l)" -ge 5 ] || [ $i -gt 600 ]; do i=$((i+1)); sleep 0.1; done
HOSTS=$(for i in $NODES; do printf '10.9.0.%s:9460,' $i; done)
# Soft-RoCE here is bound by the guest's one emulated CPU, shared by a round's concurrent tests; the guest's
# clock counts its instructions (tests/vm/tier.py), so what a test reads does not move with the host's load
# (about 1 Gbit/s a pair by that clock). Slow is judged at a fifth of the median, and the slow cable runs at
# 10 Mbit/s, the slowest link a test waits for (nodehealth/rdma/bw.py). A test lasts a quarter second: the
# guest's busy second costs the host about five of emulation.
SLOW="--slow-fraction 0.2"
ncheck() { $NH netcheck run --hosts "$HOSTS" --seconds ${NC_SECONDS:-0.25} $SLOW "$@"; }

step netcheck-clean
log "netcheck over rdma-bw: a clean fabric"
bytes() { for i in $NODES; do echo $(cat /sys/class/net/nc$i/statistics/tx_bytes /sys/class/net/nc$i/statistics/rx_bytes); done; }
bytes > $OUT/netcheck_bytes_before.txt
ncheck --json > $OUT/netcheck_clean.json 2> $OUT/netcheck_clean.err; echo "rc $?" >> $OUT/netcheck_clean.err
bytes > $OUT/netcheck_bytes_after.txt  # the writes took the cables, not lo
cat $OUT/netcheck_clean.json $OUT/netcheck_clean.err $OUT/netcheck_bytes_*.txt

step netcheck-faults
log "netcheck over rdma-bw: node2's switch port down, node4's cable limited by tbf"
ip -n nhfabric link set sw2 down
tc qdisc add dev nc4 root tbf rate 10mbit burst 64kb latency 3s
ip netns exec nhfabric tc qdisc add dev sw4 root tbf rate 10mbit burst 64kb latency 3s
ncheck --json > $OUT/netcheck_faults.json 2> $OUT/netcheck_faults.err; echo "rc $?" >> $OUT/netcheck_faults.err
cat $OUT/netcheck_faults.json $OUT/netcheck_faults.err
ip -n nhfabric link set sw2 up
tc qdisc del dev nc4 root; ip netns exec nhfabric tc qdisc del dev sw4 root

step netcheck-nft
log "netcheck over rdma-bw: nftables drops RoCE (UDP 4791) arriving at node5"
for t in $(seq 50); do grep -q ACTIVE /sys/class/infiniband/rxe_nc2/ports/1/state && break; sleep 0.1; done
nft -f - <<'NFT'
table inet nhfault {
  chain input { type filter hook input priority -10; iifname "nc5" udp dport 4791 drop; }
}
NFT
ncheck --json > $OUT/netcheck_nft.json 2> $OUT/netcheck_nft.err; echo "rc $?" >> $OUT/netcheck_nft.err
step netcheck-tcp
# Forced TCP: streams between two addresses of one host take lo here, so it passes where RDMA fails
ncheck --json --method tcp > $OUT/netcheck_tcp.json 2>> $OUT/netcheck_nft.err; echo "rc $?" >> $OUT/netcheck_nft.err
cat $OUT/netcheck_nft.json $OUT/netcheck_nft.err
nft delete table inet nhfault
kill $agents
for p in $agents; do wait $p; done

step netcheck-job
# A fault whose verdict does not hang on the emulation's speed (a 15 Mbit/s cable once read above a fifth
# of the others' median here, and every node said sound), and that fails node3's tests at once (RoCE
# dropped by nftables stalls each for 10 s): the faults step proves slow; this one proves that every node
# runs the job and prints the same verdict. The agents' TCP between the nodes' addresses takes lo.
log "netcheck job on every node over rdma-bw, node3's switch port down"
ip -n nhfabric link set sw3 down
agents=""
for i in $NODES; do
  ( $NH netcheck job --hosts "$HOSTS" --listen 10.9.0.$i --name node$i --seconds ${NC_SECONDS:-0.25} $SLOW --wait 60 \
      --json > $OUT/netcheck_job$i.json 2> $OUT/netcheck_job$i.err; echo "rc $?" >> $OUT/netcheck_job$i.err ) &
  agents="$agents $!"
done
for p in $agents; do wait $p; done
ip -n nhfabric link set sw3 up
cat $OUT/netcheck_job1.json $OUT/netcheck_job*.err
cat $OUT/netcheck_agent*.log
