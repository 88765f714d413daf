#!/usr/bin/env bash
# The test command: every package under the race detector, real brokers on
# loopback included. Long chaos and soak runs are not part of it.
set -euo pipefail
cd "$(dirname "$0")"
go test -race -timeout 25m -count=1 ./...
# The cluster package's tests that run several nodes in one process cannot
# run under -race (see cluster/membership_test.go): they run here without it.
go test -timeout 10m -count=1 ./cluster/...
