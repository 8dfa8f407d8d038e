#!/usr/bin/env bash
# Instructions the `weir serve` process executes for a fixed NBD job, counted by
# callgrind: a deterministic A/B figure for changes to the server or to the build
# profile (CPU time on this VM moves ±15 % between runs; this moves < 1 %).
#   bench/server-instructions.sh [WEIR_BINARY]    # default: target/release/weir
#   QOS=false bench/server-instructions.sh         # the pool bypasses the QoS scheduler
#   BUSY_POLL_US=0 bench/server-instructions.sh    # busy polling off (its loops add
#                                                  # timing-dependent instructions)
# The job (fio, nbd engine, 4,000 I/Os each): 4 KiB randwrite QD32, 4 KiB randread
# QD32, 4 KiB randwrite QD1, 1 MiB sequential write QD4, on a 256 MiB volume (QoS on,
# best-effort policy). The count covers the whole process, start-up and shutdown
# included. Needs valgrind, fio and nbdinfo (installed with apt-get when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-}"
if [ -z "$BIN" ]; then cargo build -q --release -p weir; BIN="$PWD/target/release/weir"; fi
need() { command -v "$1" >/dev/null 2>&1; }
missing=()
need valgrind || missing+=(valgrind)
need fio || missing+=(fio)
need nbdinfo || missing+=(libnbd-bin)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null
fi
W="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/data/pools/qos"
PORT=10959
cat > "$W/weir.toml" <<T
busy_poll_us = ${BUSY_POLL_US:-50}
listen = "127.0.0.1:$PORT"
admin_listen = "127.0.0.1:$((PORT + 1))"
data_dir = "$W/data"
[[pools]]
name = "qos"
qos = ${QOS:-true}
[[policies]]
name = "best-effort"
[[volumes]]
name = "v"
size = "256MiB"
policy = "best-effort"
pool = "qos"
T
valgrind --tool=callgrind --callgrind-out-file="$W/callgrind.out" "$BIN" serve --config "$W/weir.toml" \
  > "$W/serve.out" 2> "$W/serve.err" &
pid=$!
for _ in $(seq 120); do nbdinfo --list "nbd://127.0.0.1:$PORT" >/dev/null 2>&1 && break; sleep 0.5; done
for job in "randwrite 4k 32" "randread 4k 32" "randwrite 4k 1" "write 1m 4"; do
  read -r rw bs qd <<<"$job"
  fio --name=x --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/v" --rw="$rw" --bs="$bs" \
    --iodepth="$qd" --size=256m --number_ios=4000 --randseed=1 >/dev/null
done
kill -INT "$pid"; wait "$pid" || true; pid=""
n=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$W/serve.err")
[ -n "$n" ] || { echo "no callgrind total; server log:"; tail -20 "$W/serve.err"; exit 1; }
echo "weir serve instructions for the fixed job: $n"
# Keep the profile for callgrind_annotate: CALLGRIND_OUT=/path bench/server-instructions.sh
[ -z "${CALLGRIND_OUT:-}" ] || cp "$W/callgrind.out" "$CALLGRIND_OUT"
