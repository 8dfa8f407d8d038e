#!/usr/bin/env bash
# Weir on Ceph RBD (backend = "rbd", QoS on: the volume has the mission-critical
# policy) beside the peer Ceph users run today: qemu-nbd exporting the same RBD
# image through QEMU's rbd driver (qemu-block-extra), --cache=none (librbd's
# cache off, as in Weir). fio (nbd engine, one connection) 4 KiB randread and
# randwrite at QD1 and QD32, 1 MiB sequential read and write at QD4, on a
# 1 GiB image filled beforehand. The servers take turns (never both open);
# REPS rounds, each server once per job per round; prints every run, the
# medians and Weir ÷ qemu-nbd.
#
#   bench/rbd.sh                 # REPS=2 RUNTIME=10; the cluster of
#                                # $WEIR_CEPH_CONF, else scripts/ceph-dev.sh's
#                                # (started if needed, left running)
#   ONLY="randwrite-4k-qd1" bench/rbd.sh   # some jobs (names as printed)
#   QOS=false bench/rbd.sh       # Weir's pool without its QoS gate (qos = false)
#
# qemu-nbd needs QEMU's rbd module: when the installed QEMU has none (Debian's
# qemu-block-extra is missing, or does not match the installed qemu-utils),
# bookworm's qemu-utils and qemu-block-extra of one version are fetched with
# `apt-get download` and unpacked under $WORK (nothing is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-2}"
RUNTIME="${RUNTIME:-10}"
WORK="${WORK:-${TMPDIR:-/tmp}/weir-rbd-bench}"
P_W=10941; P_WA=10942; P_Q=10943
. bench/lib.sh
require_fio_nbd

ceph_cluster

rm -rf "$WORK"; mkdir -p "$WORK"
cargo build --release -p weir >/dev/null 2>&1 < /dev/null
WEIR="$PWD/target/release/weir"
IMG="bench-$$"
RBD_SPEC="rbd:$POOL/$IMG:conf=$WEIR_CEPH_CONF:id=$CLIENT${WEIR_CEPH_KEYRING:+:keyring=$WEIR_CEPH_KEYRING}"
rbd_ create --size 1G "$POOL/$IMG"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rbd_ rm --no-progress "$POOL/$IMG" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# qemu-nbd with an rbd driver.
QEMU_NBD=qemu-nbd
export QEMU_MODULE_DIR=""
if ! qemu-img info -f raw "$RBD_SPEC" >/dev/null 2>&1; then
  ver=$(apt-cache policy qemu-block-extra | awk '/Candidate:/ {print $2}')
  [ -n "$ver" ] && [ "$ver" != "(none)" ] || { echo "no qemu-block-extra in apt's lists (apt-get update?)"; exit 1; }
  (cd "$WORK" && timeout 300 apt-get download -q "qemu-utils=$ver" "qemu-block-extra=$ver" >/dev/null 2>&1) ||
    { echo "apt-get download qemu-utils=$ver qemu-block-extra=$ver failed"; exit 1; }
  for d in "$WORK"/*.deb; do dpkg -x "$d" "$WORK/qemu"; done
  QEMU_NBD="$WORK/qemu/usr/bin/qemu-nbd"
  export QEMU_MODULE_DIR="$WORK/qemu/usr/lib/x86_64-linux-gnu/qemu"
fi
echo "peer: $("$QEMU_NBD" --version | head -1)${QEMU_MODULE_DIR:+ (unpacked under $WORK)}"

echo "filling $POOL/$IMG (1 GiB) ..."
rbd_ bench --io-type write --io-pattern seq --io-size 4M --io-threads 4 --io-total 1G "$POOL/$IMG" >/dev/null

wait_port() { for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; echo "port $1 not open; logs:"; tail -5 "$WORK"/*.log; exit 1; }

cat > "$WORK/weir.toml" <<CONF
listen = "127.0.0.1:$P_W"
admin_listen = "127.0.0.1:$P_WA"
data_dir = "$WORK/weir"
[[pools]]
name = "ceph"
backend = "rbd"
rbd_pool = "$POOL"
rbd_ceph_conf = "$WEIR_CEPH_CONF"
rbd_client = "$CLIENT"
${WEIR_CEPH_KEYRING:+rbd_keyring = \"$WEIR_CEPH_KEYRING\"}
qos = ${QOS:-true}
[[volumes]]
name = "$IMG"
pool = "ceph"
size = "1GiB"
policy = "mission-critical"
CONF

start() {
  case "$1" in
    weir)
      "$WEIR" serve --config "$WORK/weir.toml" >"$WORK/weir.out" 2>>"$WORK/weir.log" & pid=$!
      wait_port $P_W; URI="nbd://127.0.0.1:$P_W/$IMG" ;;
    qemu-nbd)
      "$QEMU_NBD" -f raw --cache=none -b 127.0.0.1 -p $P_Q -x "$IMG" -e 8 --persistent \
        "$RBD_SPEC" >"$WORK/qemu.log" 2>&1 & pid=$!
      wait_port $P_Q; URI="nbd://127.0.0.1:$P_Q/$IMG" ;;
  esac
}
stop() { kill "$pid" 2>/dev/null || echo "warning: the server (pid $pid) had exited; logs in $WORK" >&2; wait "$pid" 2>/dev/null || true; pid=""; }

# name rw bs qd  (figure: IOPS for 4k, MiB/s for 1m)
JOBS=("randread-4k-qd1 randread 4k 1" "randread-4k-qd32 randread 4k 32"
      "randwrite-4k-qd1 randwrite 4k 1" "randwrite-4k-qd32 randwrite 4k 32"
      "read-1m-qd4 read 1m 4" "write-1m-qd4 write 1m 4")
if [ -n "${ONLY:-}" ]; then # e.g. ONLY="randwrite-4k-qd1 read-1m-qd4"
  sel=(); for j in "${JOBS[@]}"; do [[ " $ONLY " == *" ${j%% *} "* ]] && sel+=("$j"); done; JOBS=("${sel[@]}")
fi
fio_run() { # rw bs qd -> "iops MiB/s p99_us"
  if ! fio --name=b --ioengine=nbd --uri="$URI" --rw="$1" --bs="$2" --iodepth="$3" --size=1g \
    --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json >"$WORK/fio.json" 2>&1; then
    echo "fio $* against $URI failed:" >&2; cat "$WORK/fio.json" >&2; tail -5 "$WORK"/*.log >&2; return 1
  fi
  python3 -c '
import json,sys
t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]
d=j["read"] if j["read"]["io_bytes"] else j["write"]
p=d.get("clat_ns",{}).get("percentile",{}).get("99.000000",0)/1000
print("%.0f %.1f %.0f" % (d["iops"], d["bw_bytes"]/1048576, p))' <"$WORK/fio.json"
}
echo "uptime: $(uptime)"
echo "fio nbd engine, ${RUNTIME}s per run (+1s ramp), $REPS rounds; image $POOL/$IMG 1 GiB, filled"
declare -A R
for rep in $(seq "$REPS"); do
  for srv in weir qemu-nbd; do
    start $srv
    for j in "${JOBS[@]}"; do
      set -- $j
      r=$(fio_run "$2" "$3" "$4") || exit 1
      R[$srv,$1]="${R[$srv,$1]:-} $r"
      printf 'round %s %-9s %-17s IOPS %6s  MiB/s %7s  p99 %6s us\n' "$rep" "$srv" "$1" $r
    done
    stop
  done
done
echo
printf '%-17s %12s %12s %8s   (median of %s; IOPS for 4k, MiB/s for 1m)\n' job weir qemu-nbd ratio "$REPS"
for j in "${JOBS[@]}"; do
  set -- $j
  col=1; [ "$3" = 1m ] && col=2
  med() { echo "${R[$1,$2]}" | python3 -c "
import sys,statistics
v=[float(x) for x in sys.stdin.read().split()]
print('%.1f' % statistics.median(v[$col-1::3]))"; }
  w=$(med weir "$1"); q=$(med qemu-nbd "$1")
  printf '%-17s %12s %12s %7.2fx\n' "$1" "$w" "$q" "$(python3 -c "print($w/$q if $q else 0)")"
done
