#!/bin/bash
# txn.sh OUT ROUNDS HERALD MODE...: transactional throughput against plain
# produce, each run against a fresh single-node `herald serve` on its
# defaults, the modes alternating in ROUNDS rounds. A mode is the extra
# bench flags in one word with commas for spaces ("plain" for none), e.g.
#   txn.sh /tmp/t 3 ./herald plain --txn-size,100,--txn-written-once,--txn-in-flight,8
# Each run leaves OUT/<n>-<round>.txt (the bench's output, n the mode's
# place in the list). With PROFILE=1 it also leaves the broker's CPU
# profile of 8 s in the middle of the run (OUT/<n>-<round>.broker.pprof)
# and the bench client's (OUT/<n>-<round>.client.pprof). PRODUCERS sets
# the producers (default 4); DATA_BASE puts the data dirs under it (e.g.
# /dev/shm, to take the disk out). Summarize with:
#   grep -H 'produced' OUT/*.txt
set -eu
. "$(dirname "$0")/lib.sh"
out=$1 rounds=$2 bin=$3
shift 3
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  n=0
  for mode in "$@"; do
    n=$((n + 1))
    extra=""
    [ "$mode" != plain ] && extra=${mode//,/ }
    fresh_broker "$bin" "$out/$n-$r.serve.log" --admin-pprof
    prof=""
    if [ "${PROFILE:-}" = 1 ]; then
      (sleep 2; curl -s -o "$out/$n-$r.broker.pprof" "127.0.0.1:7480/debug/pprof/profile?seconds=8") &
      prof=$!
      export HERALD_CPUPROFILE="$out/$n-$r.client.pprof"
    fi
    # shellcheck disable=SC2086 # extra is words on purpose
    "$bin" bench --producers ${PRODUCERS:-4} --consumers 0 --size 1024 --duration 10s $extra > "$out/$n-$r.txt" 2>&1
    unset HERALD_CPUPROFILE
    [ -n "$prof" ] && wait "$prof"
    stop_broker
  done
done
