#!/bin/sh
# The VM tier's batch: every scenario of one boot, run as root in the guest from the checkout.
# Results go to $OUT as small files the tests read; each step logs what it ran to stdout (console.log).
set -u
. "$OUT/env.sh"
PY="$PWD/.venv/bin/python"
NH="$PY -m nodehealth.cli"
# Bytecode is written (into the guest's RAM overlay): a module compiles once a boot, not at each of the
# batch's ~35 Python starts (this checkout's modules have no bytecode of their own where the host writes none)
# the device's resource counts (the kernel's own QP1 and its PD/CQ are always there)
counts() { rdma resource show | grep rxe0 | sed 's/^[0-9]*: //'; }
# each step's start, in seconds since the guest booted (the test prints them: where the tier's time goes)
step() { echo "$(cut -d' ' -f1 /proc/uptime) $1" >> $OUT/steps.txt; }
step setup

. tests/vm/rxe.sh
counts > $OUT/res_base.txt

step bandwidth
# 1. bandwidth (benchmarks/rdma_bw.sh): ib_write_bw and rdma-bw interleaved at each size, ${REPS} rounds
# (one for the tests, which assert what each run did, not its speed: a round of the three sizes is ~12 s
# of the guest's instruction clock; benchmarks/rdma_bw_vm.py runs more for benchmarks/RESULTS.md)
SIZES=${SIZES-4096 65536 1048576}
REPS=${REPS:-1}
. benchmarks/rdma_bw.sh
port=$bw_port

step memlock
# 2. memlock: a non-root user with ulimit -l 64 (root ignores the limit)
chmod 755 /root /root/.pyenv 2>/dev/null; chmod 666 /dev/infiniband/uverbs*
port=$((port+1))
ib_write_bw -d rxe0 -x $GID -s 1048576 -n 20 -p $port > /dev/null 2>&1 &
wait_port $port
setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "ulimit -l 64; ib_write_bw -d rxe0 -x $GID -s 1048576 -n 20 -p $port 127.0.0.1" > $OUT/memlock_perftest.txt 2>&1
echo "rc $?" >> $OUT/memlock_perftest.txt
kill %1 2>/dev/null; wait
setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "ulimit -l 64; $NH rdma-bw -d rxe0 -x $GID -s 1048576 -n 20 -p $port 127.0.0.1" > $OUT/memlock_nh.txt 2>&1
echo "rc $?" >> $OUT/memlock_nh.txt
cat $OUT/memlock_perftest.txt $OUT/memlock_nh.txt

step failures
# 3. failures: wrong GID index, a port set down, a bogus out-of-band message, a peer killed mid-test
$NH rdma-bw -d rxe0 -x 99 -p 18700 127.0.0.1 > $OUT/wronggid.txt 2>&1; echo "rc $?" >> $OUT/wronggid.txt
$NH rdma-bw -d rxe0 -x $GID -p 18799 127.0.0.1 > $OUT/unreachable.txt 2>&1; echo "rc $?" >> $OUT/unreachable.txt
ip link add nhdown type dummy && rdma link add rxe1 type rxe netdev nhdown && ip link set nhdown down
sleep 0.5
$NH rdma-bw -d rxe1 -x 0 -p 18701 127.0.0.1 > $OUT/portdown.txt 2>&1; echo "rc $?" >> $OUT/portdown.txt
$NH rdma-bw -d rxe0 -x $GID -p 18702 --timeout 20 > $OUT/bogus.txt 2>&1 &
wait_port 18702
$PY -c "import socket; s=socket.create_connection(('127.0.0.1',18702)); s.sendall(b'GET / HTTP/1.0\r\n\r\n'); s.recv(10)" 2>/dev/null
wait $!; echo "rc $?" >> $OUT/bogus.txt
$NH rdma-bw -d rxe0 -x $GID -s 1048576 -p 18703 --timeout 20 > $OUT/killed_server.txt 2>&1 &
spid=$!
wait_port 18703
( $NH rdma-bw -d rxe0 -x $GID -s 1048576 -D 30 -p 18703 --timeout 20 127.0.0.1 > $OUT/killed.txt 2>&1; echo "rc $?" >> $OUT/killed.txt ) &
cpid=$!
i=0  # both sides hold their queue pairs: the test is under way
until [ "$(rdma resource show qp | grep -c 'comm python')" -ge 2 ] || [ $i -gt 600 ]; do i=$((i+1)); sleep 0.1; done
sleep 2
counts > $OUT/res_during.txt
rdma resource show qp >> $OUT/res_during.txt
kill -9 $spid
wait $spid
wait $cpid
i=0  # the kernel releases a killed process's objects; a soft device may take a moment
until [ "$(counts)" = "$(cat $OUT/res_base.txt)" ] || [ $i -gt 300 ]; do i=$((i+1)); sleep 0.1; done
echo "settled after $i tenths of a second" > $OUT/res_settle.txt
counts > $OUT/res_after.txt
rdma resource show qp >> $OUT/res_after.txt
rdma resource show > $OUT/rdma_resource.txt
cat $OUT/wronggid.txt $OUT/unreachable.txt $OUT/portdown.txt $OUT/bogus.txt $OUT/killed.txt $OUT/res_*.txt

step kernel-log
# 4. kernel log: the daemon's stream takes the printk module's records (facility 0), not a
# userspace write of the same text (facility 1)
ip link set lo up
report() { $PY -c "import urllib.request as u, sys; sys.stdout.write(u.urlopen('http://127.0.0.1:9456/v1/report').read().decode())"; }
$NH daemon --listen 127.0.0.1:9456 --interval 1 --state-dir /tmp/nhstate > $OUT/daemon.log 2>&1 &
dpid=$!
wait_port 9456
sleep 2
echo "NVRM: Xid (PCI:0000:5e:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." > /dev/kmsg
sleep 4
report > $OUT/report_user.json
insmod $OUT/nh_printk.ko gpu=0000:3b:00
sleep 4
report > $OUT/report_kernel.json
dmesg -x | grep -E "Xid|blocked for more" > $OUT/kmsg_raw.txt
kill $dpid; wait $dpid
cat $OUT/kmsg_raw.txt

step periodic-rdma
# 5. the daemon's periodic RDMA test: rail rxe0:1 against a peer at 127.0.0.1, which is this same
# daemon serving rxe0 (one node plays both ends); rxe0 is held to 1000 Gb/s so the check has a
# rate to judge (Soft-RoCE has no line rate of its own); a client from another address is refused;
# /metrics and the report are kept
cat > /tmp/nhrdma.json <<EOF
{"rdma_bw": {"enabled": true, "peers": ["127.0.0.1"], "rails": ["rxe0:1"], "port": 18800, "interval_seconds": 5,
             "duration_seconds": 2, "start_delay_seconds": 0, "timeout_seconds": 30},
 "checks": {"rdma_bw": {"expected_gbps": {"rxe0": 1000}}}}
EOF
$NH daemon --listen 127.0.0.1:9458 --interval 2 --config /tmp/nhrdma.json --state-dir /tmp/nhrdma > $OUT/rdma_daemon.log 2>&1 &
dpid=$!
wait_port 9458
$PY - <<'EOF'
import os, re, time, urllib.request as u
out = os.environ["OUT"]
get = lambda path: u.urlopen("http://127.0.0.1:9458" + path, timeout=10).read().decode()
end = time.time() + 240
while time.time() < end:
    try:
        metrics, report = get("/metrics"), get("/v1/report")
    except OSError:
        metrics = report = ""
    ok = re.search(r'nodehealth_rdma_bw_runs_total\{device="rxe0",port="1",result="ok"\} (\d+)', metrics)
    if ok and int(ok.group(1)) >= 2 and "RdmaBandwidthLow" in report:
        break
    time.sleep(1)
# a stranger (127.0.0.2: not the peer 127.0.0.1) is closed without a test and counted as refused
import socket
with socket.create_connection(("127.0.0.1", 18800), timeout=60, source_address=("127.0.0.2", 0)) as s:
    s.sendall(b"an endpoint line, as a client sends first\n")
    answer = b""
    try:
        while chunk := s.recv(512):
            answer += chunk
    except ConnectionResetError:  # the server closed before reading all of it: the line came first
        pass
    open(f"{out}/rdma_stranger.txt", "w").write(answer.decode())
end = time.time() + 30  # the count shows from the daemon's next pass
while 'nodehealth_rdma_bw_served_total{result="refused"}' not in get("/metrics") and time.time() < end:
    time.sleep(0.5)
open(f"{out}/rdma_metrics.txt", "w").write(get("/metrics"))
open(f"{out}/rdma_report.json", "w").write(get("/v1/report"))
EOF
kill $dpid; wait $dpid; echo "daemon rc $?" >> $OUT/rdma_daemon.log
(cd /sys/class/infiniband/rxe0 && for f in hca_type board_id fw_ver node_type ports/1/rate ports/1/state \
  ports/1/phys_state ports/1/link_layer; do [ -e $f ] && echo "$f: $(cat $f)"; done) > $OUT/rxe0_sysfs.txt
grep rdma_ $OUT/rdma_metrics.txt; cat $OUT/rxe0_sysfs.txt; tail -20 $OUT/rdma_daemon.log

step netcheck
# 6. netcheck over rdma-bw between five rxe devices, each on its own cable to a switch namespace
. tests/vm/netcheck.sh
step end
exit 0
