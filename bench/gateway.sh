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

P_UP=10929; P_UPA=10930; P_GW=10931; P_GWA=10932
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

UP_PID=${WEIR_PIDS[0]}; GW_PID=${WEIR_PIDS[1]}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # utime + stime
HZ=$(getconf CLK_TCK)
# Prints "IOPS upstream-µs-per-I/O gateway-µs-per-I/O": each server's CPU (user +
# system, over the whole fio run, its 1 s ramp included) per I/O fio completed
# at that rate over the same time.
run() {
  local u0 g0 iops
  u0=$(ticks "$UP_PID"); g0=$(ticks "$GW_PID")
  iops=$(fio --name=gw --ioengine=nbd --uri="$1" --rw=randread --bs="$BS" --iodepth="$QD" --size="$SIZE" --randrepeat=0 \
    --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); print("%.0f" % json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"])')
  python3 -c 'import sys; i,u,g,hz,t=map(float,sys.argv[1:]); n=max(i*(t+1),1); print("%.0f %.1f %.1f" % (i, u/hz*1e6/n, g/hz*1e6/n))' \
    "$iops" "$(( $(ticks "$UP_PID") - u0 ))" "$(( $(ticks "$GW_PID") - g0 ))" "$HZ" "$RUNTIME"
}
echo "uptime: $(uptime)"
echo "fio ${BS} randread QD${QD} over $SIZE, ${RUNTIME}s x ${REPS}; upstream_connections = $CONNS${DEVICE:+; upstream device = $DEVICE}; gateway to upstream: $SCHEME://"
direct=(); gw=(); up_cpu_d=(); up_cpu_g=(); gw_cpu=()
for rep in $(seq "$REPS"); do
  # Alternate which goes first.
  if [ $((rep % 2)) -eq 1 ]; then
    read -r d ud _ < <(run "nbd://127.0.0.1:$P_UP/vol"); read -r g ug gg < <(run "nbd://127.0.0.1:$P_GW/vol")
  else
    read -r g ug gg < <(run "nbd://127.0.0.1:$P_GW/vol"); read -r d ud _ < <(run "nbd://127.0.0.1:$P_UP/vol")
  fi
  direct+=("$d"); gw+=("$g"); up_cpu_d+=("$ud"); up_cpu_g+=("$ug"); gw_cpu+=("$gg")
  echo "rep $rep: direct $d IOPS (upstream $ud µs CPU per I/O), gateway $g IOPS (upstream $ug, gateway $gg µs CPU per I/O)"
done
python3 - "${direct[*]}" "${gw[*]}" "${up_cpu_d[*]}" "${up_cpu_g[*]}" "${gw_cpu[*]}" <<'PY'
import statistics, sys
d, g, ud, ug, gg = ([float(x) for x in a.split()] for a in sys.argv[1:6])
md, mg = statistics.median(d), statistics.median(g)
print(f"median: direct {md:.0f} IOPS, gateway {mg:.0f} IOPS, gateway/direct {mg/md:.3f} (overhead {100*(1-mg/md):.1f} %)")
mud, mug, mgg = statistics.median(ud), statistics.median(ug), statistics.median(gg)
print(f"CPU per I/O (user + system, median): upstream {mud:.1f} µs direct, {mug:.1f} µs behind the gateway; "
      f"gateway {mgg:.1f} µs = {mgg/mud:.2f}x the upstream's")
PY
