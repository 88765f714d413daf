#!/bin/bash
# fire.sh OUT ROUNDS BUILD...: the 50k fires/s delayed-message bench, each
# run against a fresh `herald serve` on its defaults, the builds (herald
# binaries) alternating, ROUNDS rounds. Each run leaves OUT/<n>-<round>.txt
# (the bench's output) and OUT/<n>-<round>.metrics (the scheduler's
# lateness histograms, scraped from /metrics at the end), n being the
# build's place in the list. Summarize with:
#   for f in OUT/*.metrics; do echo $f; grep 'fire_lateness_seconds_bucket{le="0.02"}\|fire_lateness_seconds_count' $f; done
set -eu
. "$(dirname "$0")/lib.sh"
out=$1 rounds=$2
shift 2
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  n=0
  for bin in "$@"; do
    n=$((n + 1))
    fresh_broker "$bin" "$out/$n-$r.serve.log"
    "$bin" bench --fire-rate 50000 --fire-after 30s --count 500000 --partitions 4 > "$out/$n-$r.txt" 2>&1
    curl -s 127.0.0.1:7480/metrics | grep -E 'herald_scheduler_(fire|send)_lateness_seconds_(bucket|count)' > "$out/$n-$r.metrics"
    stop_broker
  done
done
