# rdma-bw against ib_write_bw on Soft-RoCE (rxe0), interleaved, in the VM tier's guest: for each size
# and round, ib_write_bw, `nodehealth rdma-bw` and each other version of nodehealth/rdma/bw.py in
# VERSIONS (files, run by benchmarks/rdma_bw_baseline.py, each named by its file), the order rotated
# every round; each run writes 62.5 MiB in iterations (perftest measures no peak in duration mode).
# Sourced after tests/vm/rxe.sh by tests/vm/batch.sh and by benchmarks/rdma_bw_vm.py's boot.
# Reads OUT, GID, PY, NH, SIZES, REPS, VERSIONS (optional), PROFILE (1: afterwards, one client run
# of each nodehealth version per size under cProfile, to $OUT/prof-TOOL-SIZE.out).
# Writes $OUT/bw.tsv (tool size round avg_gbps peak_gbps), nhc-SIZE.json and nhs-SIZE.json (the
# client's and the server's last result) and ibc-SIZE.txt (ib_write_bw's last report).
: > $OUT/bw.tsv
bw_port=18600
bw_ib() {  # port size iterations: "avg peak" of one ib_write_bw run
  ib_write_bw -d rxe0 -x $GID -s $2 -n $3 -F --report_gbits -p $1 > $OUT/ibs.txt 2>&1 &
  wait_port $1
  ib_write_bw -d rxe0 -x $GID -s $2 -n $3 -F --report_gbits -p $1 127.0.0.1 > $OUT/ibc-$2.txt 2>&1
  wait
  awk -v s=$2 '$1==s {print $4, $3}' $OUT/ibc-$2.txt | tail -1
}
bw_nh() {  # port command size iterations [the client's command]: "avg peak" of one rdma-bw run
  $2 rdma-bw -d rxe0 -x $GID -s $3 -n $4 -p $1 --json > $OUT/nhs.json 2> $OUT/nhs.err &
  wait_port $1
  ${5:-$2} rdma-bw -d rxe0 -x $GID -s $3 -n $4 -p $1 --json 127.0.0.1 > $OUT/nhc.json 2> $OUT/nhc.err
  echo "client rc $?" >&2; wait
  cat $OUT/nhc.err $OUT/nhs.err >&2
  # the client's one-line JSON (keys sorted): sed, where a Python start costs seconds under emulation
  sed -n 's/.*"bw_avg_gbps": \([^,}]*\),.*"bw_peak_gbps": \([^,}]*\)[,}].*/\1 \2/p' $OUT/nhc.json 2>/dev/null \
    | grep . || echo "nan nan"
}
RUNNER="$PWD/benchmarks/rdma_bw_baseline.py"
version() { for v in ${VERSIONS:-}; do [ "$(basename $v .py)" = "$1" ] && echo "$RUNNER $v"; done; }
order="ib_write_bw rdma-bw"
for v in ${VERSIONS:-}; do order="$order $(basename $v .py)"; done
for size in $SIZES; do
  n=$((65536000 / size))
  for rep in $(seq $REPS); do
    for tool in $order; do
      bw_port=$((bw_port+1))
      case $tool in
        ib_write_bw) r=$(bw_ib $bw_port $size $n) ;;
        rdma-bw) r=$(bw_nh $bw_port "$NH" $size $n); cp $OUT/nhc.json $OUT/nhc-$size.json; cp $OUT/nhs.json $OUT/nhs-$size.json ;;
        *) r=$(bw_nh $bw_port "$PY $(version $tool)" $size $n) ;;
      esac
      echo "$tool $size $rep ${r:-nan nan}" | tee -a $OUT/bw.tsv
    done
    set -- $order; first=$1; shift; order="$* $first"  # the next round starts with the next tool
  done
  if [ "${PROFILE:-}" = 1 ]; then
    bw_port=$((bw_port+1))
    bw_nh $bw_port "$NH" $size $n "$PY -m cProfile -o $OUT/prof-rdma-bw-$size.out -m nodehealth.cli" > /dev/null
    for v in ${VERSIONS:-}; do
      bw_port=$((bw_port+1)); tool=$(basename $v .py)
      bw_nh $bw_port "$PY $RUNNER $v" $size $n "$PY -m cProfile -o $OUT/prof-$tool-$size.out $RUNNER $v" > /dev/null
    done
  fi
done
