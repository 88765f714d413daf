#!/bin/bash
# txn.sh OUT ROUNDS HERALD MODE...: transactional throughput against plain
# produce, each run against a fresh single-node `herald serve` on its
# defaults, the modes alternating in ROUNDS rounds (round r starting at
# the r-th mode). A mode is the extra
# bench flags in one word with commas for spaces ("plain" for none), e.g.
#   txn.sh /tmp/t 3 ./herald plain --txn-size,100,--txn-written-once,--txn-in-flight,8
# Each run leaves OUT/<n>-<round>.txt (the bench's output, n the mode's
# place in the list). With PROFILE=1 it also leaves the broker's CPU
# profile of 8 s in the middle of the run (OUT/<n>-<round>.broker.pprof)
# and the bench client's (OUT/<n>-<round>.client.pprof). PRODUCERS sets
# the producers (default 4); DATA_BASE puts the data dirs under it (e.g.
# /dev/shm, to take the disk out). SERVE_FLAGS adds flags to every
# broker's command line. OUT/<n>-<round>.cpu gives the processor each
# side spent (the broker's from /proc, the bench's from time(1), in
# seconds) and the machine's idle and stolen share of the run. Between
# runs it syncs and waits a second, so that one run's writeback does not
# land on the next. Summarize with:
#   grep -H 'produced' OUT/*.txt; grep -H . OUT/*.cpu
# It ends with a summary: each mode's msg/s a round, its ratio to the
# first mode's in that round (put plain first), and the median ratio.
set -eu
. "$(dirname "$0")/lib.sh"
out=$1 rounds=$2 bin=$3
shift 3
mkdir -p "$out"
modes=("$@")
for r in $(seq 1 "$rounds"); do
  # Round r starts at mode r (and wraps): no mode always runs right
  # after the same one (plain produce's writeback lingers into the next).
  for i in $(seq 0 $((${#modes[@]} - 1))); do
    n=$(((i + r - 1) % ${#modes[@]} + 1))
    mode=${modes[$((n - 1))]}
    extra=""
    [ "$mode" != plain ] && extra=${mode//,/ }
    # shellcheck disable=SC2086 # SERVE_FLAGS is words on purpose
    fresh_broker "$bin" "$out/$n-$r.serve.log" --admin-pprof ${SERVE_FLAGS:-}
    b0=$(cpu_of "$broker_pid") m0=$(machine_cpu)
    prof=""
    if [ "${PROFILE:-}" = 1 ]; then
      (sleep 2; curl -s -o "$out/$n-$r.broker.pprof" "127.0.0.1:7480/debug/pprof/profile?seconds=8") &
      prof=$!
      export HERALD_CPUPROFILE="$out/$n-$r.client.pprof"
    fi
    # shellcheck disable=SC2086 # extra is words on purpose
    /usr/bin/time -f "%U %S" -o "$out/$n-$r.time" "$bin" bench --producers ${PRODUCERS:-4} --consumers 0 --size 1024 --duration 10s $extra > "$out/$n-$r.txt" 2>&1
    unset HERALD_CPUPROFILE
    [ -n "$prof" ] && wait "$prof"
    b1=$(cpu_of "$broker_pid") m1=$(machine_cpu)
    stop_broker
    awk -v b0="$b0" -v b1="$b1" -v hz="$(getconf CLK_TCK)" -v m0="$m0" -v m1="$m1" '{
      split(m0, a, " "); split(m1, z, " ")
      total = z[1] - a[1]
      printf "broker %.2f s  bench %.2f s  idle %.1f%%  steal %.1f%%\n", (b1 - b0) / hz, $1 + $2, (z[2] - a[2]) * 100 / total, (z[3] - a[3]) * 100 / total
    }' "$out/$n-$r.time" > "$out/$n-$r.cpu"
    sync
    sleep 1
  done
done
# The summary: each mode's msg/s in each round, its ratio to the first
# mode's in the same round, and the median ratio.
for n in $(seq 1 ${#modes[@]}); do
  line="${modes[$((n - 1))]}:"
  ratios=()
  for r in $(seq 1 "$rounds"); do
    base=$(sed -nE 's/^produced .*: ([0-9]+) msg\/s.*/\1/p' "$out/1-$r.txt")
    v=$(sed -nE 's/^produced .*: ([0-9]+) msg\/s.*/\1/p' "$out/$n-$r.txt")
    ratio=$(awk -v a="$v" -v b="$base" 'BEGIN { printf "%.3f", a / b }')
    ratios+=("$ratio")
    line+=" $v ($ratio)"
  done
  median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "$line; median ratio $median"
done
