#!/bin/bash
# The overload benchmark of issue 14 §4 (BENCHMARKS.md, "a light producer's
# p99 under 64 heavy producers"). Usage: overload.sh HERALD [serve flags...]
# A fresh broker on its defaults (plus the flags given) and data dir; a
# 1,000 msg/s producer alone for 10 s; then 64 producers of 1 KiB records as
# fast as they go for 20 s, with the light producer on another topic from
# their 3rd second for 15 s. Prints the light producer's produce-to-ack p99
# alone and loaded (and their ratio), the broker-side latency of sparse
# produces (herald_produce_sparse_latency_seconds, bucket bounds), and the
# heavy producers' throughput, THROTTLED answers and timeouts.
set -eu
BIN=$1; shift
d=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf $d' EXIT
$BIN serve --data $d/data --listen 127.0.0.1:37420 --admin 127.0.0.1:37480 "$@" > $d/log 2>&1 &
pid=$!
for _ in $(seq 100); do curl -sf 127.0.0.1:37480/readyz >/dev/null 2>&1 && break; sleep 0.1; done
kill -0 $pid || { echo "broker did not start:"; tail -3 $d/log; exit 1; }
light() { $BIN bench --addr 127.0.0.1:37420 --rate 1000 --producers 1 --consumers 1 --topic "$1" --duration "$2" --json 2>/dev/null; }
sparse() { curl -s 127.0.0.1:37480/metrics | grep '^herald_produce_sparse_latency_seconds_bucket' || true; }
light other 10s > $d/alone.json
sparse > $d/m0
$BIN bench --addr 127.0.0.1:37420 --producers 64 --consumers 0 --size 1024 --duration 20s --json > $d/heavy.json 2>/dev/null &
hp=$!
sleep 3 # the heavy load is under way: the light producer's start, not a wait for a condition
light other2 15s > $d/loaded.json
sparse > $d/m1
wait $hp
python3 - $d <<'PY'
import json, re, sys
d = sys.argv[1]
def hist(f):
    b = {}
    for l in open(f):
        m = re.match(r'\S+\{le="([^"]+)"\} (\S+)', l)
        if m: b[float(m.group(1))] = float(m.group(2))
    return b
def q(b, p):
    ks = sorted(b)
    if not ks or b[ks[-1]] == 0: return '-'
    for k in ks:
        if b[k] >= p * b[ks[-1]]: return '%.1f' % (k * 1000)
h0, h1 = hist(d + '/m0'), hist(d + '/m1')
hd = {k: h1[k] - h0.get(k, 0) for k in h1}
a, l, h = (json.load(open(d + f)) for f in ('/alone.json', '/loaded.json', '/heavy.json'))
print('light p99 alone %.1f ms, loaded p50 %.1f p99 %.1f ms (%.1fx) | broker sparse p50/p99 <= %s/%s ms alone, %s/%s loaded | heavy %.0f MB/s, %d THROTTLED, %d timeouts, light %d timeouts'
      % (a['ack_latency_p99_ms'], l['ack_latency_p50_ms'], l['ack_latency_p99_ms'], l['ack_latency_p99_ms'] / a['ack_latency_p99_ms'],
         q(h0, .5), q(h0, .99), q(hd, .5), q(hd, .99), h['produced_mb_per_sec'], h['throttled'], h['produce_timeouts'], l['produce_timeouts']))
PY
