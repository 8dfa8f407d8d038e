#!/usr/bin/env bash
# Three `weir serve` gateways on one Ceph RBD pool, with and without datastore-wide
# congestion control between them (issue 13 item 3; the live version of the
# simulator's `ceph-gateways` and `sioc-shares` two-host cases). Gateway A serves
# fleet-a (High shares, 2000), gateway B fleet-b (Normal, 1000), gateway C a light
# database volume db (Normal, 10 ms latency target). fio (nbd engine) floods fleet-a
# and fleet-b with 4 KiB random reads at QD64 each while db runs QD4; with control
# on, each gateway's window steps with the latency all three share through the
# `sioc` image (gateway_stats_volume). Prints IOPS per gateway, the A:B split and
# db's latency, control off then on, REPS rounds.
#
#   bench/gateways.sh            # REPS=2 RUNTIME=20 RAMP=15 THRESHOLD_MS=10 FLOOD_QD=64
#                                # OSD_CPU=0.3; the cluster of $WEIR_CEPH_CONF, else
#                                # scripts/ceph-dev.sh's (started if needed)
#
# On one small machine the OSD, the gateways and fio share the cores, and each flood
# is bounded by the CPU its own gateway gets rather than by the cluster: windows
# then move requests from the cluster into the gateways' queues and change nothing.
# So the local ceph-osd processes are put in a cgroup (v1 cpu controller) limited to
# OSD_CPU cores, which makes the cluster the bottleneck, as real OSDs on disks are
# (OSD_CPU=0: no limit; skipped with a note where the cgroup cannot be made).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-2}"
RUNTIME="${RUNTIME:-20}"
RAMP="${RAMP:-15}"
THRESHOLD_MS="${THRESHOLD_MS:-10}"
OSD_CPU="${OSD_CPU:-0.3}"
FLOOD_QD="${FLOOD_QD:-64}"
FAIR_RATE="${FAIR_RATE:-true}"
PERIOD_MS="${PERIOD_MS:-250}"
WORK="${WORK:-${TMPDIR:-/tmp}/weir-gateways-bench}"
. bench/lib.sh
require_fio_nbd

ceph_cluster

rm -rf "$WORK"; mkdir -p "$WORK"
cargo build --release -p weir >/dev/null 2>&1 < /dev/null
WEIR="$PWD/target/release/weir"
P="gwb$$"   # image prefix
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  unlimit_osds
  # A killed gateway's watch lingers until the OSDs expire it: retry for a while.
  for i in fleet-a fleet-b db sioc; do
    for _ in $(seq 40); do
      rbd_ rm --no-progress "$POOL/$P-$i" >/dev/null 2>&1 && break
      rbd_ info "$POOL/$P-$i" >/dev/null 2>&1 || break
      sleep 1
    done
  done
}
trap cleanup EXIT

CG=/sys/fs/cgroup/cpu/weir-gateways-bench-osd
limit_osds() {
  [ "$OSD_CPU" = 0 ] && { echo "OSDs: no CPU limit (OSD_CPU=0)"; return; }
  if mkdir -p "$CG" 2>/dev/null && echo 10000 >"$CG/cpu.cfs_period_us" &&
    echo "$(python3 -c "print(int($OSD_CPU * 10000))")" >"$CG/cpu.cfs_quota_us"; then
    for p in $(pgrep -x ceph-osd); do echo "$p" >"$CG/cgroup.procs"; done
    echo "OSDs: limited to $OSD_CPU cores (cgroup $CG)"
  else
    echo "OSDs: no CPU limit (cannot make $CG): the cluster may not be the bottleneck"
  fi
}
unlimit_osds() {
  [ -d "$CG" ] || return 0
  for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do echo "$p" >/sys/fs/cgroup/cpu/cgroup.procs; done
  rmdir "$CG" 2>/dev/null || true
}

for i in fleet-a fleet-b db; do
  rbd_ create --size 512M "$POOL/$P-$i"
  rbd_ bench --io-type write --io-pattern seq --io-size 4M --io-threads 4 --io-total 512M "$POOL/$P-$i" >/dev/null
done
echo "images $POOL/$P-{fleet-a,fleet-b,db} (512 MiB each, filled)"
limit_osds

wait_port() { for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; echo "port $1 not open; logs:"; tail -n 5 "$WORK"/*.log; exit 1; }

# gateway N(0-2) CONTROL(true|false) VOLUME POLICY
gateway() {
  local n=$1 control=$2 vol=$3 policy=$4 dir="$WORK/gw$1"
  mkdir -p "$dir"
  cat > "$dir/weir.toml" <<CONF
listen = "127.0.0.1:$((10950 + n))"
admin_listen = "127.0.0.1:$((10960 + n))"
data_dir = "$dir/data"
[[pools]]
name = "ceph"
backend = "rbd"
rbd_pool = "$POOL"
rbd_ceph_conf = "$WEIR_CEPH_CONF"
rbd_client = "$CLIENT"
${WEIR_CEPH_KEYRING:+rbd_keyring = \"$WEIR_CEPH_KEYRING\"}
max_in_flight = 128
gateway_congestion = { enabled = $control, threshold_ms = $THRESHOLD_MS, period_ms = $PERIOD_MS, gamma = 0.5, beta_per_1000_shares = 2, fair_rate = $FAIR_RATE }
$( $control && printf 'gateway_stats_volume = "%s-sioc"\ngateway_id = %s\n' "$P" "$n" )
[[policies]]
name = "high"
shares = 2000
[[policies]]
name = "normal"
shares = 1000
[[policies]]
name = "db"
shares = 1000
latency_target_ms = 10
[[volumes]]
name = "$P-$vol"
pool = "ceph"
size = "512MiB"
policy = "$policy"
[[volumes]]
name = "$P-sioc"
pool = "ceph"
size = "64KiB"
policy = "normal"
CONF
  "$WEIR" serve --config "$dir/weir.toml" >"$dir/out" 2>>"$WORK/gw$n.log" & pids+=($!)
  wait_port $((10950 + n))
}

fio_job() { # port volume qd out
  fio --name=g --ioengine=nbd --uri="nbd://127.0.0.1:$1/$P-$2" --rw=randread --bs=4k \
    --iodepth="$3" --size=512m --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
    --output-format=json >"$4" 2>&1
}
stats() { # fio json -> "iops mean_ms p99_ms"
  python3 -c '
import json,sys
t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]["read"]
c=j["clat_ns"]; print("%.0f %.1f %.1f" % (j["iops"], c["mean"]/1e6, c["percentile"]["99.000000"]/1e6))' "$1"
}

echo "uptime: $(uptime)"
echo "fio nbd engine 4 KiB randread: fleet-a QD$FLOOD_QD on A, fleet-b QD$FLOOD_QD on B, db QD4 on C;" \
  "${RAMP}s ramp + ${RUNTIME}s measured; threshold ${THRESHOLD_MS} ms"
printf '%-5s %-7s %8s %8s %6s %9s %9s %8s  %s\n' round control A_IOPS B_IOPS split db_IOPS db_mean db_p99 \
  "window/in-flight/depth limit/queued A B C @ latency (mid-run)"
for rep in $(seq "$REPS"); do
  for control in false true; do
    gateway 0 $control fleet-a high
    gateway 1 $control fleet-b normal
    gateway 2 $control db db
    fio_job 10950 fleet-a "$FLOOD_QD" "$WORK/a.json" & fa=$!
    fio_job 10951 fleet-b "$FLOOD_QD" "$WORK/b.json" & fb=$!
    fio_job 10952 db 4 "$WORK/db.json" & fd=$!
    if [ -n "${TRACE:-}" ]; then
      for t in $(seq $((RAMP + RUNTIME - 2))); do
        sleep 1; line="t=$t"
        for n in 0 1 2; do
          line+=$(curl -s -H "Authorization: Bearer $(cat "$WORK/gw$n/data/admin-token")" \
            "http://127.0.0.1:$((10960 + n))/v1/pools" | python3 -c '
import json,sys
p=json.load(sys.stdin)[0]; w=p.get("gateway_window"); r=p.get("gateway_rate")
print(" %s/%s/%s/%s@%s%s" % (w, p["in_flight"], p["depth_limit"], p["queued"], p.get("gateway_latency_ms"), " r=%.0f" % r if r else ""), end="")')
        done
        echo "$line" >> "$WORK/trace-$control"
      done
    else
      sleep $((RAMP + RUNTIME / 2))
    fi
    windows=""
    for n in 0 1 2; do # each gateway's window and the latency it stepped with, mid-run
      windows+=$(curl -s -H "Authorization: Bearer $(cat "$WORK/gw$n/data/admin-token")" \
        "http://127.0.0.1:$((10960 + n))/v1/pools" | python3 -c '
import json,sys
p=json.load(sys.stdin)[0]; w=p.get("gateway_window")
r=p.get("gateway_rate")
print(" %s/%s/%s/%s@%s%s" % (w if w is not None else "-", p["in_flight"], p["depth_limit"], p["queued"], "%.1fms" % p["gateway_latency_ms"] if p.get("gateway_latency_ms") else "-", " %.0f/s" % r if r else ""), end="")')
    done
    wait $fa $fb $fd || { echo "fio failed:"; tail -n 3 "$WORK"/*.json "$WORK"/*.log; exit 1; }
    read -r ai _ _ < <(stats "$WORK/a.json")
    read -r bi _ _ < <(stats "$WORK/b.json")
    read -r di dm dp < <(stats "$WORK/db.json")
    printf '%-5s %-7s %8s %8s %6.2f %9s %7s ms %5s ms  %s\n' "$rep" "$control" "$ai" "$bi" \
      "$(python3 -c "print($ai/$bi)")" "$di" "$dm" "$dp" "$windows"
    for p in "${pids[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
    pids=()
  done
done
