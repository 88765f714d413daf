# lib.sh: what the single-node bench scripts share (source it).
#
# fresh_broker BIN LOG [serve flags...]: starts `BIN serve` on its defaults
# with a new data dir (under $DATA_BASE when set, e.g. /dev/shm) and the
# flags given, its output to LOG, and waits until it answers; sets
# broker_pid and broker_dir.
fresh_broker() {
  local bin=$1 log=$2
  shift 2
  if "$bin" topic list > /dev/null 2>&1; then
    # (the client port is SO_REUSEPORT: a second broker would share it)
    echo "a broker already answers on the default port: stop it first" >&2
    return 1
  fi
  broker_dir=$(mktemp -d ${DATA_BASE:+-p "$DATA_BASE"})
  "$bin" serve --data "$broker_dir" "$@" > "$log" 2>&1 &
  broker_pid=$!
  for _ in $(seq 1 50); do
    # (its own process: another broker left on the port would answer too)
    kill -0 "$broker_pid" 2> /dev/null || break
    "$bin" topic list > /dev/null 2>&1 && kill -0 "$broker_pid" 2> /dev/null && return 0
    sleep 0.2
  done
  echo "broker did not start: $(tail -3 "$log")" >&2
  return 1
}

# stop_broker: stops the broker fresh_broker started and removes its data.
stop_broker() {
  kill "$broker_pid"
  wait "$broker_pid" 2> /dev/null || true
  rm -rf "$broker_dir"
}

# cpu_of PID: the user and system clock ticks PID has spent.
cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# machine_cpu: the machine's clock ticks in all (user to steal), idle (with
# iowait) and stolen, from /proc/stat.
machine_cpu() { awk '/^cpu /{t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $5 + $6, $9}' /proc/stat; }
