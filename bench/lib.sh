# Shared by the bench scripts (sourced, from the repository's root).

# Exits with the reason unless fio with its nbd engine (libnbd) is here.
require_fio_nbd() {
  command -v fio >/dev/null || { echo "fio is not installed"; exit 1; }
  fio --enghelp 2>/dev/null | grep -qw nbd || { echo "fio has no nbd engine (needs libnbd)"; exit 1; }
}

# The TOML value of a pool's `device` for DEVICE: a preset name as is, an inline
# table as is, or `seed-000` for seed 000's array as `weir sim mixed-workload-cache`
# models it (16 × 7.2K SATA RAID 10, write-back controller, without its flash tier).
device_toml() {
  case "$1" in
    seed-000) echo '{ controller = "pcie-gen2", drive = "sata-7200", raid = { level = 10, drives = 16, stripe_element_bytes = 65536 }, policy = { write_policy = "write-back", read_policy = "no-read-ahead", io_policy = "cached", battery = "good", disk_cache = false } }' ;;
    \{*) echo "$1" ;;
    *) echo "\"$1\"" ;;
  esac
}

# The Ceph cluster to use: $WEIR_CEPH_CONF's, or the dev cluster (started if
# needed, scripts/ceph-dev.sh). Sets CLIENT and POOL, defines rbd_ (the rbd CLI
# on that cluster).
ceph_cluster() {
  if [ -z "${WEIR_CEPH_CONF:-}" ]; then
    scripts/ceph-dev.sh start >/dev/null
    eval "$(scripts/ceph-dev.sh env)"
  fi
  CLIENT="${WEIR_CEPH_CLIENT:-admin}"
  POOL="${WEIR_CEPH_POOL:-weir}"
  rbd_() { rbd -c "$WEIR_CEPH_CONF" --id "$CLIENT" ${WEIR_CEPH_KEYRING:+-k "$WEIR_CEPH_KEYRING"} "$@"; }
}

# Starts `$WEIR serve --config $WORK/NAME.toml` (output in $WORK/NAME.out and
# .log) and waits until PORT answers; every server started so is killed when
# the script exits, and then the paths in WEIR_SCRATCH (large data and cache
# files a script does not keep) are removed.
WEIR_PIDS=()
WEIR_SCRATCH=()
weir_stop_all() {
  local p
  for p in "${WEIR_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${WEIR_PIDS[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
  [ ${#WEIR_SCRATCH[@]} -eq 0 ] || rm -rf "${WEIR_SCRATCH[@]}"
}
# Waits up to 10 s for 127.0.0.1:PORT to accept a connection; false if it never does.
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
serve_weir() {
  local name=$1 port=$2
  "$WEIR" serve --config "$WORK/$name.toml" > "$WORK/$name.out" 2> "$WORK/$name.log" &
  WEIR_PIDS+=($!)
  trap weir_stop_all EXIT
  wait_port "$port" && return
  echo "weir serve ($name) did not open port $port; log:"; tail -n 5 "$WORK/$name.log"; exit 1
}
