#!/usr/bin/env bash
# A single-node Ceph cluster for developing and testing Weir's RBD backend
# (docs/RBD.md): 1 monitor, 1 manager and 1 OSD (memstore: data in memory,
# capped by WEIR_CEPH_MEMSTORE_MIB) on loopback, in one directory, with an RBD
# pool of size 1.
#
#   scripts/ceph-dev.sh start    # installs the Debian packages if missing (as root),
#                                # starts the daemons, creates the pool; prints `env`
#   scripts/ceph-dev.sh env      # export lines: WEIR_CEPH_CONF, _KEYRING, _CLIENT, _POOL
#   scripts/ceph-dev.sh status   # daemons and `ceph -s`
#   scripts/ceph-dev.sh stop     # kills the daemons, removes the directory
#
# Environment: WEIR_CEPH_DIR (default /tmp/weir-ceph), WEIR_CEPH_PORT (monitor's
# msgr v1 port, default 6789; msgr v2 is that minus 3489, default 3300),
# WEIR_CEPH_POOL (default weir), WEIR_CEPH_MEMSTORE_MIB (default 4096).
# `start` is idempotent: a cluster already answering in WEIR_CEPH_DIR is kept.
set -euo pipefail

DIR=${WEIR_CEPH_DIR:-/tmp/weir-ceph}
PORT=${WEIR_CEPH_PORT:-6789}
PORT2=$((PORT - 3489))
POOL=${WEIR_CEPH_POOL:-weir}
MEM_MIB=${WEIR_CEPH_MEMSTORE_MIB:-4096}
CONF=$DIR/ceph.conf
KEYRING=$DIR/client.admin.keyring
PKGS="ceph-mon ceph-mgr ceph-osd ceph-common"

say() { echo "ceph-dev: $*" >&2; }
die() { say "error: $*"; exit 1; }

ceph_() { timeout 30 ceph -c "$CONF" -k "$KEYRING" --connect-timeout 10 "$@"; }

install_packages() {
  local missing=()
  for pair in ceph-mon:ceph-mon ceph-mgr:ceph-mgr ceph-osd:ceph-osd ceph:ceph-common rbd:ceph-common; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local pkgs
  pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "missing $pkgs and cannot install them (not root, or no apt-get); install: $PKGS"
  fi
  say "installing $pkgs (log: /tmp/weir-ceph-apt.log)"
  if ! { timeout 300 apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends $pkgs; } \
       >/tmp/weir-ceph-apt.log 2>&1; then
    die "could not install $pkgs (see /tmp/weir-ceph-apt.log)"
  fi
}

pids() { cat "$DIR"/run/*.pid 2>/dev/null || true; }

running() {
  [ -f "$CONF" ] || return 1
  local p n=0
  for p in $(pids); do kill -0 "$p" 2>/dev/null || return 1; n=$((n + 1)); done
  [ "$n" = 3 ] # mon, mgr, osd
}

print_env() {
  cat <<EOF
export WEIR_CEPH_CONF=$CONF
export WEIR_CEPH_KEYRING=$KEYRING
export WEIR_CEPH_CLIENT=admin
export WEIR_CEPH_POOL=$POOL
EOF
}

wait_for() { # seconds, description, command...
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { say "timed out after ${secs}s waiting for $what"; tail -20 "$DIR"/log/*.log >&2 || true; return 1; }
    sleep 0.5
  done
}

pool_clean() {
  # Every placement group active+clean, at least one of them.
  local s
  s=$(ceph_ pg stat 2>/dev/null) || return 1
  [[ "$s" =~ ^([0-9]+)\ pgs:\ ([0-9]+)\ active\+clean ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] &&
    [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ]
}

start() {
  if running; then
    say "already running in $DIR"
    print_env
    return 0
  fi
  install_packages
  [ -e "$DIR" ] && { say "removing the stale $DIR"; stop_quiet; }
  local t0=$SECONDS
  mkdir -p "$DIR"/{run,log,mon,mgr,osd}
  chmod 700 "$DIR"
  local fsid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$PORT2,v1:127.0.0.1:$PORT]
public addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
mon data = $DIR/mon/\$cluster-\$id
mgr data = $DIR/mgr/\$cluster-\$id
osd data = $DIR/osd/\$cluster-\$id
osd objectstore = memstore
memstore device bytes = $((MEM_MIB << 20))
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
auth allow insecure global id reclaim = false
mgr initial modules =
# Small machines: few threads, little memory.
osd op num shards = 1
osd op num threads per shard = 2
osd memory target = 939524096
# A client that died holding an RBD image's exclusive lock (a gateway killed
# with -9) keeps its watch until this expires; librbd then breaks the lock
# (blocklisting the dead client) for the next writer. Default 30 s.
osd client watch timeout = 5

[mon]
keyring = $DIR/mon.keyring

[mgr]
keyring = $DIR/mgr/\$cluster-\$id/keyring

[osd]
keyring = $DIR/osd/\$cluster-\$id/keyring

[client]
keyring = $KEYRING
log file = $DIR/log/client.\$pid.log
admin socket =
EOF
  ceph-authtool --create-keyring "$DIR/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$KEYRING" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  chmod 600 "$KEYRING" "$DIR/mon.keyring"
  ceph-authtool "$DIR/mon.keyring" --import-keyring "$KEYRING" >/dev/null
  monmaptool --create --addv a "[v2:127.0.0.1:$PORT2,v1:127.0.0.1:$PORT]" --fsid "$fsid" "$DIR/monmap" >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring"
  ceph-mon -c "$CONF" -i a 2>>"$DIR/log/daemons.err"
  wait_for 30 "the monitor" ceph_ mon stat
  mkdir -p "$DIR/mgr/ceph-x"
  ceph_ auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
    -o "$DIR/mgr/ceph-x/keyring"
  ceph-mgr -c "$CONF" -i x 2>>"$DIR/log/daemons.err"
  local uuid id
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(ceph_ osd new "$uuid")
  mkdir -p "$DIR/osd/ceph-$id"
  ceph-osd -c "$CONF" -i "$id" --no-mon-config --mkfs --mkkey --osd-uuid "$uuid" >"$DIR/log/osd-mkfs.log" 2>&1 ||
    { cat "$DIR/log/osd-mkfs.log" >&2; die "ceph-osd --mkfs failed"; }
  ceph_ auth add "osd.$id" osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
    -i "$DIR/osd/ceph-$id/keyring" >/dev/null 2>&1
  ceph-osd -c "$CONF" -i "$id" 2>>"$DIR/log/daemons.err"
  wait_for 60 "the OSD to be up" bash -c "ceph -c '$CONF' -k '$KEYRING' osd stat | grep -q '1 up'"
  ceph_ osd pool create "$POOL" 16 16 >/dev/null 2>&1
  ceph_ osd pool set "$POOL" size 1 --yes-i-really-mean-it >/dev/null 2>&1
  timeout 60 rbd -c "$CONF" -k "$KEYRING" pool init "$POOL"
  wait_for 90 "pool $POOL's placement groups to be active+clean" pool_clean
  say "up in $((SECONDS - t0)) s: 1 mon, 1 mgr, 1 OSD (memstore, $MEM_MIB MiB) in $DIR; RBD pool $POOL"
  say "config $CONF, keyring $KEYRING (client.admin)"
  print_env
}

stop_quiet() {
  local p
  for p in $(pids); do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 1 40); do
    local alive=0
    for p in $(pids); do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.25
  done
  for p in $(pids); do kill -9 "$p" 2>/dev/null || true; done
  case "$DIR" in
    /|"") die "refusing to remove $DIR" ;;
  esac
  rm -rf "$DIR"
}

case "${1:-}" in
  start) start ;;
  stop) stop_quiet; say "stopped; removed $DIR" ;;
  status)
    if running; then
      say "running in $DIR (pids $(pids | tr '\n' ' '))"
      ceph_ -s
    else
      say "not running"; exit 1
    fi ;;
  env)
    running || die "not running (scripts/ceph-dev.sh start)"
    print_env ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
