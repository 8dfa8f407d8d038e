#!/usr/bin/env bash
# Issue 14's history and `weir top` figures, on one `weir serve` with 1,000 volumes:
#   1. the history store's size: apparent (the bound: fixed-size ring files) and
#      allocated on disk after RUN_S seconds of sampling;
#   2. the server's CPU (utime + stime from /proc/<pid>/stat) over RUN_S seconds
#      idle (the sampler alone), then over RUN_S seconds while `weir top --batch
#      -d 1` polls every second (target: < 5 % of one core).
#   bench/history-top.sh              # RUN_S=60 VOLUMES=1000
# Prints the figures; docs/PERFORMANCE.md keeps them with the command.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_S="${RUN_S:-60}"
VOLUMES="${VOLUMES:-1000}"
cargo build --release -p weir </dev/null >/dev/null 2>&1 || cargo build --release -p weir </dev/null
WEIR="$PWD/target/release/weir"
WORK="$(mktemp -d)"
pid=""
cleanup() { [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$WORK"; echo "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NBD_PORT=$(port); ADMIN_PORT=$(port)
{
  echo "listen = \"127.0.0.1:$NBD_PORT\""
  echo "admin_listen = \"127.0.0.1:$ADMIN_PORT\""
  echo "data_dir = \"$WORK/data\""
  for i in $(seq -w 1 "$VOLUMES"); do
    printf '[[volumes]]\nname = "vol-%s"\nsize = "1MiB"\npolicy = "business-critical"\n' "$i"
  done
} >"$WORK/weir.toml"
"$WEIR" serve --config "$WORK/weir.toml" >"$WORK/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -f "$WORK/data/admin-token" ] && break; sleep 0.1; done
sleep 3
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
cpu_over() { # CPU % of one core over $1 seconds of the server
  local t0 t1; t0=$(ticks); sleep "$1"; t1=$(ticks)
  awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$1" 'BEGIN { printf "%.2f", 100 * (b - a) / hz / s }'
}
idle=$(cpu_over "$RUN_S")
"$WEIR" top --admin "127.0.0.1:$ADMIN_PORT" --data-dir "$WORK/data" --batch -d 1 -n $((RUN_S + 5)) >"$WORK/top.out" &
top_pid=$!
sleep 2
polled=$(cpu_over "$RUN_S")
wait "$top_pid"
frames=$(grep -c '^weir top' "$WORK/top.out")
rows=$(grep -c "^vol-" "$WORK/top.out")
apparent=$(du -sb --apparent-size "$WORK/data/history" | cut -f1)
allocated=$(du -sB1 "$WORK/data/history" | cut -f1)
echo "volumes: $VOLUMES; server CPU idle (sampler only): $idle % of one core; with weir top polling every 1 s: $polled % ($frames frames, $((rows / frames)) volume rows each)"
echo "history store: $((apparent / 1000000)) MB apparent (the bound), $((allocated / 1000000)) MB allocated after $((2 * RUN_S + 5)) s"
