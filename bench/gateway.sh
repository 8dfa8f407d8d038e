#!/usr/bin/env bash
# Gateway mode (issue 12): fio (nbd engine) 4 KiB randread QD32 against a weir
# serve directly, and through a second weir serve whose pool is
# `upstream = "nbd://…"` in front of it, on loopback, in the same run.
#   bench/gateway.sh                  # REPS=5 RUNTIME=10 by default
#   DEVICE=15k-sas-raid5x24 bench/gateway.sh   # the upstream pool on an emulated array
#   DEVICE=seed-000 bench/gateway.sh   # … on seed 000's 7.2K RAID 10 (bench/lib.sh device_toml)
#   CONNS=8 bench/gateway.sh          # upstream_connections (default 4)
#   UPSTREAM_TLS=1 bench/gateway.sh   # the gateway reaches its upstream over nbds://
#                                     # (the upstream: tls = "on"; certificates made
#                                     # with openssl; fio still reads both in plain text)
#   SIZE=64g DEVICE=seed-000 bench/gateway.sh  # a volume beyond the array's cache (its
#                                     # first GiB random data, the rest sparse)
#   PIN=1 bench/gateway.sh            # the upstream and fio on CPU 0, every gateway on
#                                     # CPU 1 (threads pinned with taskset): a gateway
#                                     # with a core of its own, as on a hypervisor host
#                                     # whose storage is another machine
#   GW_BUSY_POLL_US=0 bench/gateway.sh  # the gateway's busy_poll_us (default: the server's)
#   PEERS="nbdkit qemu-nbd" bench/gateway.sh  # peer gateways in the same run (default:
#                                     # both where installed; PEERS= for none): nbdkit's
#                                     # nbd plugin and qemu-nbd over QEMU's nbd block
#                                     # driver, each in front of the same upstream
# Prints IOPS per rep and the medians, and gateway ÷ direct. Both servers run
# with QoS on (a best-effort policy); the gateway's volume file never exists:
# every READ crosses both servers. On a machine with few cores the three
# processes (fio, gateway, upstream) share them, so the gateway's CPU per I/O
# is what separates the two figures; each server's CPU per I/O is printed too
# (the machine-independent figure: what a gateway costs its hypervisor host).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-5}"
RUNTIME="${RUNTIME:-10}"
CONNS="${CONNS:-4}"
DEVICE="${DEVICE:-}"
BS="${BS:-4k}"
SIZE="${SIZE:-1g}"
QD="${QD:-32}"
UPSTREAM_TLS="${UPSTREAM_TLS:-}"
PEERS="${PEERS-nbdkit qemu-nbd}"
PIN="${PIN:-}"
WORK="${WORK:-${TMPDIR:-/tmp}/weir-gateway-bench}"
. bench/lib.sh
require_fio_nbd

cargo build --release -p weir >/dev/null < /dev/null
WEIR="${WEIR_BIN:-$PWD/target/release/weir}"  # WEIR_BIN: another build (A/B)
rm -rf "$WORK"; mkdir -p "$WORK/up/pools/default" "$WORK/gw"
WEIR_SCRATCH=("$WORK/up/pools")  # the volume file
head -c 1073741824 /dev/urandom > "$WORK/up/pools/default/vol.img"
truncate -s "$SIZE" "$WORK/up/pools/default/vol.img"
chmod 600 "$WORK/up/pools/default/vol.img"

P_UP=10929; P_UPA=10930; P_GW=10931; P_GWA=10932; P_NBDKIT=10933; P_QEMU=10934
UP_TLS=""; GW_TLS=""; SCHEME=nbd
if [ -n "$UPSTREAM_TLS" ]; then
  command -v openssl >/dev/null || { echo "UPSTREAM_TLS needs openssl"; exit 1; }
  mkdir -p "$WORK/pki"
  (cd "$WORK/pki"
   ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256)
   openssl req -x509 -nodes -days 2 "${ec[@]}" -keyout ca-key.pem -out ca-cert.pem -subj "/CN=bench CA" 2>/dev/null
   openssl req -new -nodes "${ec[@]}" -keyout server-key.pem -out server.csr -subj "/CN=127.0.0.1" 2>/dev/null
   printf 'subjectAltName=IP:127.0.0.1\n' > server.ext
   openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
     -out server-cert.pem -extfile server.ext 2>/dev/null)
  UP_TLS="tls = \"on\"
tls_cert = \"$WORK/pki/server-cert.pem\"
tls_key = \"$WORK/pki/server-key.pem\""
  GW_TLS="upstream_tls_ca = \"$WORK/pki/ca-cert.pem\""
  SCHEME=nbds
fi
cat > "$WORK/up.toml" <<CONF
listen = "127.0.0.1:$P_UP"
admin_listen = "127.0.0.1:$P_UPA"
data_dir = "$WORK/up"
# No busy polling upstream: a peer gateway that keeps one request in flight to
# it would make it poll (costing fio's CPU); Weir's gateway never does.
busy_poll_us = 0
$UP_TLS
[[pools]]
name = "default"
${DEVICE:+device = $(device_toml "$DEVICE")}
[[policies]]
name = "best-effort"
[[volumes]]
name = "vol"
size = "$(python3 -c "import sys; s=sys.argv[1].lower(); print(s[:-1] + 'GiB' if s.endswith('g') else s)" "$SIZE")"
policy = "best-effort"
CONF
cat > "$WORK/gw.toml" <<CONF
listen = "127.0.0.1:$P_GW"
admin_listen = "127.0.0.1:$P_GWA"
data_dir = "$WORK/gw"
${GW_BUSY_POLL_US:+busy_poll_us = $GW_BUSY_POLL_US}
[[pools]]
name = "gw"
upstream = "$SCHEME://127.0.0.1:$P_UP"
upstream_connections = $CONNS
$GW_TLS
[[policies]]
name = "best-effort"
[[volumes]]
name = "vol"
policy = "best-effort"
pool = "gw"
CONF
serve_weir up $P_UP
serve_weir gw $P_GW
# Warm the upstream's page cache (both paths read the same file).
fio --name=warm --ioengine=nbd --uri="nbd://127.0.0.1:$P_UP/vol" --rw=read --bs=1m --iodepth=4 \
  --size=1g --output-format=terse >/dev/null 2>&1 || true

UP_PID=${WEIR_PIDS[0]}
# Gateways in this run: NAME:PORT:PID. Peers run in front of the same upstream,
# plain nbd:// (with UPSTREAM_TLS they are left out: they would need their own
# certificates setup), each in the parallel thread model its project ships.
GATEWAYS=("weir:$P_GW:${WEIR_PIDS[1]}")
start_peer() {  # NAME PORT COMMAND...: started in the background, killed on exit
  local name=$1 port=$2; shift 2
  "$@" > "$WORK/$name.log" 2>&1 &
  local pid=$!
  WEIR_PIDS+=("$pid")
  if wait_port "$port"; then GATEWAYS+=("$name:$port:$pid"); return; fi
  echo "peer $name did not open port $port, left out; log:"; tail -n 5 "$WORK/$name.log"
}
for peer in $PEERS; do
  if [ -n "$UPSTREAM_TLS" ]; then echo "peer $peer skipped: UPSTREAM_TLS is set"; continue; fi
  case "$peer" in
    nbdkit)
      if command -v nbdkit >/dev/null && nbdkit nbd --version >/dev/null 2>&1; then
        start_peer nbdkit "$P_NBDKIT" nbdkit -f -t "$QD" -i 127.0.0.1 -p "$P_NBDKIT" nbd \
          hostname=127.0.0.1 port="$P_UP" export=vol
      else echo "peer nbdkit skipped: nbdkit or its nbd plugin is not installed"; fi ;;
    qemu-nbd)
      if command -v qemu-nbd >/dev/null; then
        start_peer qemu-nbd "$P_QEMU" qemu-nbd -b 127.0.0.1 -p "$P_QEMU" -x vol -e 8 -t \
          --image-opts "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$P_UP,export=vol"
      else echo "peer qemu-nbd skipped: qemu-nbd is not installed"; fi ;;
    *) echo "unknown peer '$peer' (known: nbdkit qemu-nbd)"; exit 2 ;;
  esac
done

FIO=(fio)
if [ -n "$PIN" ]; then
  command -v taskset >/dev/null || { echo "PIN needs taskset (util-linux)"; exit 1; }
  [ "$(nproc)" -ge 2 ] || { echo "PIN needs 2 CPUs"; exit 1; }
  taskset -a -cp 0 "$UP_PID" >/dev/null
  for g in "${GATEWAYS[@]}"; do taskset -a -cp 1 "${g##*:}" >/dev/null; done
  FIO=(taskset -c 0 fio)
fi
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # utime + stime
HZ=$(getconf CLK_TCK)
# run URI GATEWAY_PID: prints "IOPS upstream-µs-per-I/O gateway-µs-per-I/O CPUS": each
# server's CPU (user + system, over the whole fio run, its 1 s ramp included) per
# I/O fio completed at that rate over the same time (gateway 0 without one), and
# each CPU's busy share over the run (from /proc/stat: all but idle and iowait).
cpus() { grep '^cpu[0-9]' /proc/stat | tr '\n' ';'; }
# busy BEFORE AFTER: each CPU's busy share between two cpus() samples.
busy() {
  python3 -c '
import sys
def parse(s): return [list(map(int, l.split()[1:])) for l in s.split(";") if l]
a, b = parse(sys.argv[1]), parse(sys.argv[2])
out = []
for x, y in zip(a, b):
    d = [j - i for i, j in zip(x, y)]
    out.append("%.0f%%" % (100 * (1 - (d[3] + d[4]) / max(sum(d), 1))))
print("/".join(out))' "$1" "$2"
}
run() {
  local u0 g0=0 g1=0 iops c0
  u0=$(ticks "$UP_PID"); [ "$2" = 0 ] || g0=$(ticks "$2"); c0=$(cpus)
  iops=$("${FIO[@]}" --name=gw --ioengine=nbd --uri="$1" --rw=randread --bs="$BS" --iodepth="$QD" --size="$SIZE" --randrepeat=0 \
    --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); print("%.0f" % json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"])')
  [ "$2" = 0 ] || g1=$(ticks "$2")
  python3 -c 'import sys; i,u,g,hz,t=map(float,sys.argv[1:6]); n=max(i*(t+1),1); print("%.0f %.1f %.1f %s" % (i, u/hz*1e6/n, g/hz*1e6/n, sys.argv[6]))' \
    "$iops" "$(( $(ticks "$UP_PID") - u0 ))" "$(( g1 - g0 ))" "$HZ" "$RUNTIME" "$(busy "$c0" "$(cpus)")"
}
echo "uptime: $(uptime)"
echo "fio ${BS} randread QD${QD} over $SIZE, ${RUNTIME}s x ${REPS}; upstream_connections = $CONNS${DEVICE:+; upstream device = $DEVICE}; gateway to upstream: $SCHEME://${PIN:+; upstream and fio on CPU 0, gateways on CPU 1}"
echo "gateways: ${GATEWAYS[*]%%:*}"
# Each rep runs direct and every gateway, the order rotated by one per rep.
RESULTS="$WORK/results"; : > "$RESULTS"
targets=("direct:$P_UP:0" "${GATEWAYS[@]}")
for rep in $(seq "$REPS"); do
  n=${#targets[@]}
  line="rep $rep:"
  for k in $(seq 0 $((n - 1))); do
    IFS=: read -r name port pid <<< "${targets[$(( (k + rep - 1) % n ))]}"
    read -r iops ucpu gcpu cbusy < <(run "nbd://127.0.0.1:$port/vol" "$pid")
    echo "$rep $name $iops $ucpu $gcpu" >> "$RESULTS"
    if [ "$name" = direct ]; then line+=" direct $iops IOPS (upstream $ucpu µs CPU per I/O; CPUs busy $cbusy);"
    else line+=" $name $iops IOPS (upstream $ucpu, gateway $gcpu µs CPU per I/O; CPUs busy $cbusy);"; fi
  done
  echo "$line"
done
python3 - "$RESULTS" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    rep, name, iops, up, gw = line.split()
    rows[name].append((int(rep), float(iops), float(up), float(gw)))
d = rows.pop("direct")
direct = {r: i for r, i, _, _ in d}
md = statistics.median(direct.values())
print(f"median: direct {md:.0f} IOPS, upstream CPU per I/O {statistics.median(u for _, _, u, _ in d):.1f} µs")
for name, rs in rows.items():
    mg = statistics.median(i for _, i, _, _ in rs)
    ratios = [i / direct[r] for r, i, _, _ in rs]
    print(f"  {name}: {mg:.0f} IOPS, gateway/direct {mg/md:.3f} (per rep: "
          + " ".join(f"{x:.2f}" for x in ratios) + f"; median {statistics.median(ratios):.3f}), "
          f"CPU per I/O: gateway {statistics.median(g for *_, g in rs):.1f} µs, "
          f"upstream behind it {statistics.median(u for _, _, u, _ in rs):.1f} µs")
PY
