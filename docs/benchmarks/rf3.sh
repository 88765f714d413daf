#!/bin/bash
# The RF=3 benchmarks (BENCHMARKS.md, "commit latency at 1,000 transactions/s,
# RF=3"). Usage: HERALD=path/to/herald OUT=dir rf3.sh TAG [bench flags...]
# Three fresh local nodes in a temporary directory (client ports 7420, 7430,
# 7440; admin 7480, 7490, 7500), a topic herald-bench of 4 partitions RF=3,
# then `herald bench` against the three with the flags given; its output goes
# to OUT/rf3-TAG.txt and its summary lines to stdout. The nodes are stopped
# and their data removed at the end.
tag=$1; shift
H=${HERALD:-herald}
P=1@127.0.0.1:7501,2@127.0.0.1:7511,3@127.0.0.1:7521
D=$(mktemp -d)
pids=""
for n in 1 2 3; do
  l=$((7410+n*10)); a=$((7470+n*10)); c=$((7491+n*10))
  $H serve --data $D/d$n --node-id $n --listen 127.0.0.1:$l --admin 127.0.0.1:$a --cluster 127.0.0.1:$c --peers $P > $D/n$n.log 2>&1 &
  pids="$pids $!"
done
for i in $(seq 1 300); do
  n=$(curl -s 127.0.0.1:7480/cluster 2>/dev/null | grep -o '"node_id"' | wc -l)
  [ "$n" -ge 4 ] && break; sleep 0.2
done
ok=0
for i in $(seq 1 100); do $H topic create herald-bench --partitions 4 --replication 3 --addr 127.0.0.1:7420 >/dev/null 2>&1 && ok=1 && break; sleep 0.3; done
[ $ok = 1 ] || echo "topic create failed"
$H bench --addr 127.0.0.1:7420,127.0.0.1:7430,127.0.0.1:7440 "$@" > ${OUT:-.}/rf3-$tag.txt 2>&1
echo "$tag rc=$? $(grep -E '^transactions|^produced' ${OUT:-.}/rf3-$tag.txt | tr '\n' ' ')"
kill $pids; wait $pids 2>/dev/null
rm -rf "$D"
