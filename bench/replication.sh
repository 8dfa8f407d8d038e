#!/usr/bin/env bash
# Replication figures (docs/THIN.md, "Replication"): a thin volume of SIZE
# (default 1 GiB) filled with random bytes, replicated to nbdkit's memory
# plugin and to a second `weir serve` (file pool):
#   - the first cycle (a full copy): MB/s;
#   - a cycle after 1 % of the grains changed (4 KiB written into each of
#     SIZE/64KiB/100 random grains, so each ships as a whole 64 KiB grain):
#     seconds to ship, seconds to merge the released snapshot (commit_into);
#   - a cycle with nothing changed (the fixed cost: snapshot, catalog, FLUSH);
#   - for comparison, deleting a snapshot of the same shape with
#     `weir volume delete-snapshot` (merge *down*: the older, full layer is
#     copied into the newer one), which replication avoids;
#   - qemu-img compare of each target with the replicated snapshot.
#   bench/replication.sh [SIZE_MIB]        # e.g. 1024
# Needs nbdkit and qemu-img/qemu-io; builds target/release/weir first.
# Stops the processes it started (by pid).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB="${1:-1024}"
cargo build --release -q -p weir < /dev/null
W="$PWD/target/release/weir"
WORK="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
NBD=$(port); ADMIN=$(port); TNBD=$(port); TADMIN=$(port); KIT=$(port)
cat > "$WORK/src.toml" <<EOF
listen = "127.0.0.1:$NBD"
admin_listen = "127.0.0.1:$ADMIN"
data_dir = "$WORK/src"
[[pools]]
name = "thin"
format = "thin"
[[volumes]]
name = "db"
size = "${SIZE_MIB}MiB"
policy = "non-critical"
pool = "thin"
EOF
cat > "$WORK/dst.toml" <<EOF
listen = "127.0.0.1:$TNBD"
admin_listen = "127.0.0.1:$TADMIN"
data_dir = "$WORK/dst"
[[volumes]]
name = "dr"
size = "${SIZE_MIB}MiB"
policy = "non-critical"
EOF
"$W" serve --config "$WORK/src.toml" > "$WORK/src.log" 2>&1 & pids+=($!)
"$W" serve --config "$WORK/dst.toml" > "$WORK/dst.log" 2>&1 & pids+=($!)
nbdkit -f -i 127.0.0.1 -p "$KIT" memory "${SIZE_MIB}M" 2> "$WORK/nbdkit.log" & pids+=($!)
wait_port "$NBD"; wait_port "$ADMIN"; wait_port "$TNBD"; wait_port "$KIT"
V() { "$W" volume --admin "127.0.0.1:$ADMIN" "$@"; }
head -c "$((SIZE_MIB << 20))" /dev/urandom > "$WORK/random.raw"
qemu-img convert -n -f raw -O raw "$WORK/random.raw" "nbd://127.0.0.1:$NBD/db"
rm "$WORK/random.raw"
grains=$((SIZE_MIB * 16))
change_one_percent() {  # 4 KiB into each of 1 % of the grains, at random
  local n=$((grains / 100)) cmds=()
  for g in $(shuf -i 0-$((grains - 1)) -n "$n"); do cmds+=(-c "write -P $((RANDOM % 255 + 1)) $((g * 65536 + 4096)) 4k"); done
  qemu-io -f raw "${cmds[@]}" "nbd://127.0.0.1:$NBD/db" > /dev/null
  echo "changed $n grains ($((n * 64)) KiB)"
}
cat > "$WORK/report.py" <<'EOF'
import json, sys
r = json.load(sys.stdin)[0]
c = r["last_cycle"]
kind = "full" if c["full"] else "changes"
mb = (c["shipped_bytes"] + c["zeroed_bytes"]) / 1e6
print(f"  {c['snapshot']}: {kind}: {c['shipped_bytes'] / 2**20:.1f} MiB written, "
      f"{c['zeroed_bytes'] / 2**20:.1f} MiB zeroed in {c['seconds']:.3f} s "
      f"({mb / c['seconds']:.0f} MB/s), merge {c['merge_seconds']:.3f} s, {c['requests']} requests")
EOF
report() { V replications db --json | python3 "$WORK/report.py"; }  # the last cycle
compare() { qemu-img compare -f raw -F raw "nbd://127.0.0.1:$NBD/$1" "$2" | sed 's/^/  /'; }
last() { V replications db --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["last_snapshot"])'; }
for to in "nbd://127.0.0.1:$KIT/" "nbd://127.0.0.1:$TNBD/dr"; do
  echo "== $SIZE_MIB MiB volume to $to"
  V replicate db --to "$to" --once > /dev/null; report; compare "$(last)" "$to"
  change_one_percent
  V replicate db --to "$to" --once > /dev/null; report; compare "$(last)" "$to"
  echo "nothing changed:"
  V replicate db --to "$to" --once > /dev/null; report
  V replicate db --stop > /dev/null
done
echo "== for comparison: delete-snapshot (merge down) of the same shape"
V flatten db > /dev/null  # one layer holding the whole volume, as a replicated base
V snapshot db s1 > /dev/null; change_one_percent; V snapshot db s2 > /dev/null
start=$(date +%s.%N); V delete-snapshot db s1 > /dev/null; end=$(date +%s.%N)
python3 -c "print(f'  weir volume delete-snapshot db s1: {$end - $start:.3f} s')"
