#!/usr/bin/env bash
# Weir vs other NBD servers, same 1 GiB file, fio's nbd engine on loopback (issue 3).
#   bench/nbd-peers.sh            # REPS=3 RUNTIME=5 by default
#   REPS=2 RUNTIME=4 bench/nbd-peers.sh
#   SERVERS_ONLY="weir-qos nbdkit" CELLS_MATCH=qd1 bench/nbd-peers.sh   # a subset
#   PIN=split bench/nbd-peers.sh  # servers on CPU 1, fio on CPU 0 (PIN=same: all on CPU 0)
#   BUSY_POLL_US=0 bench/nbd-peers.sh   # weir's busy_poll_us (default: the server's, 200)
# On a small VM the QD1 cells mostly measure where the scheduler puts the two ends:
# a request and its reply each wake the other side's vCPU when they run apart
# (≈ 4× the round trip of running together, for every server). Unpinned, that
# placement differs run to run; PIN makes it the same for every server.
# Servers: weir serve with QoS on (a best-effort policy: no limits), weir with
# `qos = false`, weir with `direct_io = true` (QoS on), nbdkit (file plugin),
# qemu-nbd, nbd-server. Cells: 4 KiB randread/randwrite at QD1 and QD32, 1 MiB
# sequential read/write at QD4. Prints IOPS (and MB/s), Weir ÷ best peer, and
# QoS-on ÷ QoS-off, direct ÷ buffered, for throughput and for the server's CPU per
# I/O (robust to other load on the machine). Missing peers are installed with apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-3}"
RUNTIME="${RUNTIME:-5}"
PIN="${PIN:-}"
case "$PIN" in
  "") SRV_PIN=(); FIO_PIN=() ;;
  same) SRV_PIN=(taskset -c 0); FIO_PIN=(taskset -c 0) ;;
  split) SRV_PIN=(taskset -c 1); FIO_PIN=(taskset -c 0) ;;
  *) echo "PIN must be same or split" >&2; exit 2 ;;
esac
WORK="${WORK:-${TMPDIR:-/tmp}/weir-nbd-peers}"

need() { command -v "$1" >/dev/null 2>&1; }
missing=()
need fio || missing+=(fio)
need nbdkit || missing+=(nbdkit)
need qemu-nbd || missing+=(qemu-utils)
need nbd-server || missing+=(nbd-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null
fi
. bench/lib.sh
require_fio_nbd

cargo build --release -p weir >/dev/null
WEIR="$PWD/target/release/weir"

rm -rf "$WORK"; mkdir -p "$WORK/data/pools/qos" "$WORK/data/pools/raw" "$WORK/data/pools/direct"
FILE="$WORK/disk.img"
echo "writing the 1 GiB test file $FILE"
head -c 1073741824 /dev/urandom > "$FILE"
sync
for p in qos raw direct; do ln -s "$FILE" "$WORK/data/pools/$p/bench-$p.img"; done

P_WEIR=10909; P_ADMIN=10910; P_NBDKIT=10911; P_QEMU=10912; P_NBDSRV=10913
cat > "$WORK/weir.toml" <<EOF
${BUSY_POLL_US:+busy_poll_us = $BUSY_POLL_US}
listen = "127.0.0.1:$P_WEIR"
admin_listen = "127.0.0.1:$P_ADMIN"
data_dir = "$WORK/data"
[[pools]]
name = "qos"
[[pools]]
name = "raw"
qos = false
[[pools]]
name = "direct"
direct_io = true
[[policies]]
name = "best-effort"
[[volumes]]
name = "bench-qos"
size = "1GiB"
policy = "best-effort"
pool = "qos"
[[volumes]]
name = "bench-raw"
size = "1GiB"
policy = "best-effort"
pool = "raw"
[[volumes]]
name = "bench-direct"
size = "1GiB"
policy = "best-effort"
pool = "direct"
EOF
cat > "$WORK/nbd-server.conf" <<EOF
[generic]
    listenaddr = 127.0.0.1
    port = $P_NBDSRV
    allowlist = true
[bench]
    exportname = $FILE
EOF

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$WORK/nbd-server.pid" ] && kill "$(cat "$WORK/nbd-server.pid")" 2>/dev/null || true
}
trap cleanup EXIT
"${SRV_PIN[@]}" "$WEIR" serve --config "$WORK/weir.toml" > "$WORK/weir.out" 2> "$WORK/weir.log" & pids+=($!)
PID_WEIR=$!
"${SRV_PIN[@]}" nbdkit -f -i 127.0.0.1 -p "$P_NBDKIT" file "$FILE" 2> "$WORK/nbdkit.log" & pids+=($!)
PID_NBDKIT=$!
"${SRV_PIN[@]}" qemu-nbd -f raw -b 127.0.0.1 -p "$P_QEMU" -x bench --persistent --shared=16 "$FILE" 2> "$WORK/qemu-nbd.log" & pids+=($!)
PID_QEMU=$!
"${SRV_PIN[@]}" nbd-server -C "$WORK/nbd-server.conf" -p "$WORK/nbd-server.pid" 2> "$WORK/nbd-server.log"
for port in $P_WEIR $P_NBDKIT $P_QEMU $P_NBDSRV; do
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done
# Server CPU (user + system, with reaped children: nbd-server forks per client),
# in clock ticks; per I/O it is robust to other load on the machine, where IOPS
# on a shared 2-core box are not.
declare -A PID=([weir-qos]=$PID_WEIR [weir-noqos]=$PID_WEIR [weir-direct]=$PID_WEIR
  [nbdkit]=$PID_NBDKIT [qemu-nbd]=$PID_QEMU [nbd-server]="$(cat "$WORK/nbd-server.pid")")
cpu_ticks() { awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"; }
TICK_HZ=$(getconf CLK_TCK)

declare -A URI=(
  [weir-qos]="nbd://127.0.0.1:$P_WEIR/bench-qos"
  [weir-noqos]="nbd://127.0.0.1:$P_WEIR/bench-raw"
  [weir-direct]="nbd://127.0.0.1:$P_WEIR/bench-direct"
  [nbdkit]="nbd://127.0.0.1:$P_NBDKIT/"
  [qemu-nbd]="nbd://127.0.0.1:$P_QEMU/bench"
  [nbd-server]="nbd://127.0.0.1:$P_NBDSRV/bench"
)
SERVERS=(weir-qos weir-noqos weir-direct nbdkit qemu-nbd nbd-server)
# name rw bs iodepth
CELLS=("randread-4k-qd1 randread 4k 1" "randread-4k-qd32 randread 4k 32"
       "randwrite-4k-qd1 randwrite 4k 1" "randwrite-4k-qd32 randwrite 4k 32"
       "read-1m-qd4 read 1m 4" "write-1m-qd4 write 1m 4")
# Optional filters (profiling): SERVERS="weir-qos nbdkit" CELLS_MATCH="qd1"
[ -n "${SERVERS_ONLY:-}" ] && read -r -a SERVERS <<<"$SERVERS_ONLY"
if [ -n "${CELLS_MATCH:-}" ]; then
  kept=(); for c in "${CELLS[@]}"; do [[ "$c" == *"$CELLS_MATCH"* ]] && kept+=("$c"); done; CELLS=("${kept[@]}")
fi
RESULTS="$WORK/results.tsv"; : > "$RESULTS"
echo "uptime: $(uptime)"
[ -n "$PIN" ] && echo "pinned: servers on CPU ${SRV_PIN[2]}, fio on CPU ${FIO_PIN[2]}"
echo "running ${#SERVERS[@]} servers x ${#CELLS[@]} cells x $REPS reps x ${RUNTIME}s"
for rep in $(seq "$REPS"); do
  for cell in "${CELLS[@]}"; do
    read -r cname rw bs qd <<<"$cell"
    # Each rep starts the cell with a different server (page cache, writeback and
    # CPU frequency favour no one in particular).
    n=${#SERVERS[@]}; order=()
    for i in $(seq 0 $((n - 1))); do order+=("${SERVERS[$(( (i + rep - 1) % n ))]}"); done
    for s in "${order[@]}"; do
      t0=$(cpu_ticks "${PID[$s]}")
      out=$("${FIO_PIN[@]}" fio --name="$cname" --ioengine=nbd --uri="${URI[$s]}" --rw="$rw" --bs="$bs" \
        --iodepth="$qd" --size=1g --time_based --runtime="$RUNTIME" --ramp_time=1 \
        --output-format=json 2>/dev/null || true)
      sleep 0.2  # let nbd-server reap its per-client child
      t1=$(cpu_ticks "${PID[$s]}")
      python3 -c '
import json, sys
ticks, hz = int(sys.argv[1]), int(sys.argv[2])
try:
    t = sys.stdin.read(); j = json.loads(t[t.index("{"):]); job = j["jobs"][0]
    d = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    # Server CPU covers the 1 s ramp too: I/Os ≈ IOPS × (runtime + ramp).
    ios = max(d["iops"] * (int(sys.argv[3]) + 1), 1)
    print("%.0f\t%.1f\t%.2f" % (d["iops"], d["bw_bytes"] / 1e6, ticks * 1e6 / hz / ios))
except Exception:
    print("0\t0\t0")' "$((t1 - t0))" "$TICK_HZ" "$RUNTIME" <<<"$out" | sed "s/^/$rep\t$cname\t$s\t/" >> "$RESULTS"
    done
  done
done

python3 - "$RESULTS" "${SERVERS[@]}" <<'EOF'
import sys, statistics, collections
path, servers = sys.argv[1], sys.argv[2:]
iops = collections.defaultdict(list); mbs = collections.defaultdict(list)
cpu = collections.defaultdict(list); cells = []
for line in open(path):
    rep, cell, s, i, m, c = line.rstrip("\n").split("\t")
    if cell not in cells: cells.append(cell)
    iops[(cell, s)].append(float(i)); mbs[(cell, s)].append(float(m)); cpu[(cell, s)].append(float(c))
med = lambda v: statistics.median(v) if v else 0.0
peers = [p for p in ("nbdkit", "qemu-nbd", "nbd-server") if p in servers]
div = lambda a, b: a / b if b else 0.0
def table(title, value, best_of, fmt):
    print()
    print(title)
    print(f"{'cell':<18}" + "".join(f"{s:>13}" for s in servers)
          + f"{'weir/best':>11}{'best peer':>12}{'qos on/off':>12}{'direct/buf':>12}")
    for c in cells:
        v = lambda s: value(c, s)
        row = f"{c:<18}" + "".join(format(v(s), fmt).rjust(13) for s in servers)
        best = best_of(peers, key=v) if peers else None
        print(row + f"{div(v('weir-qos'), v(best)) if best else 0:>11.2f}{best or '-':>12}"
              f"{div(v('weir-qos'), v('weir-noqos')):>12.2f}{div(v('weir-direct'), v('weir-qos')):>12.2f}")
big = lambda c: c.startswith(("read-1m", "write-1m"))
table("Throughput: IOPS (MB/s for the 1 MiB cells), median of reps; higher is better",
      lambda c, s: med(mbs[(c, s)]) if big(c) else med(iops[(c, s)]), max, ".0f")
table("Server CPU per I/O, µs (user + system), median of reps; lower is better",
      lambda c, s: med(cpu[(c, s)]), min, ".1f")
EOF
