#!/usr/bin/env bash
# The hybrid pool (issue 12 item 3, docs/HYBRID.md): a skewed load (fio
# random_distribution=zoned:90/10:10/90, 4 KiB randread QD32) on three pools of
# one `weir serve`:
#   hybrid — tier = { flash_device = $FLASH, disk_device = $DISK, … }
#   flash  — device = $FLASH (all-flash)
#   disk   — device = $DISK (all-disk)
# Throughput per $STEP s after start (the hybrid pool starts cold), the time the
# hybrid pool first reaches 0.8× the all-flash figure, and a mission-critical
# volume (10 ms target) at QD1 on the hybrid pool beside the skewed load while
# it promotes: its p50/p99 against the target.
#   bench/hybrid.sh                          # WARM_S=300 STEP=30
#   WARM_S=120 STEP=15 bench/hybrid.sh       # shorter
#   MOVES=1 bench/hybrid.sh                  # one move at a time
set -euo pipefail
cd "$(dirname "$0")/.."
WARM_S="${WARM_S:-300}"
STEP="${STEP:-30}"
FLASH="${FLASH:-ssd-raid5x8}"
DISK="${DISK:-15k-sas-raid5x24}"
VOL_GIB="${VOL_GIB:-48}"   # hot 10 %: beyond the arrays' controller caches
FLASH_GIB="${FLASH_GIB:-6}"
MIGRATION_MBPS="${MIGRATION_MBPS:-200}"
MOVES="${MOVES:-4}"        # the tier's moves_in_flight
WORK="${WORK:-${TMPDIR:-/tmp}/weir-hybrid-bench}"
. bench/lib.sh
require_fio_nbd

cargo build --release -p weir >/dev/null < /dev/null
WEIR="${WEIR_BIN:-$PWD/target/release/weir}"
rm -rf "$WORK"; mkdir -p "$WORK/data" "$WORK/flash"
WEIR_SCRATCH=("$WORK/data/pools" "$WORK/flash")  # the flash file: up to FLASH_GIB
P=10951; PA=10952
cat > "$WORK/weir.toml" <<CONF
listen = "127.0.0.1:$P"
admin_listen = "127.0.0.1:$PA"
data_dir = "$WORK/data"
[[pools]]
name = "hybrid"
tier = { flash_dir = "$WORK/flash", flash_size = "${FLASH_GIB}GiB", flash_device = "$FLASH", disk_device = "$DISK", promote_heat = 3, half_life_s = 60, migration_mbps = $MIGRATION_MBPS, moves_in_flight = $MOVES }
[[pools]]
name = "flash"
device = "$FLASH"
[[pools]]
name = "disk"
device = "$DISK"
[[policies]]
name = "best-effort"
[[volumes]]
name = "h"
pool = "hybrid"
size = "${VOL_GIB}GiB"
policy = "best-effort"
[[volumes]]
name = "mc"
pool = "hybrid"
size = "1GiB"
policy = "mission-critical"
[[volumes]]
name = "f"
pool = "flash"
size = "${VOL_GIB}GiB"
policy = "best-effort"
[[volumes]]
name = "d"
pool = "disk"
size = "${VOL_GIB}GiB"
policy = "best-effort"
CONF
serve_weir weir "$P"

# No fill: every pool's timing is its emulated device's, which does not know
# holes from data (a fill would cost 3 × VOL_GIB of disk); promotions copy the
# hot extents (zeroes) into the flash file for real.

skewed() { # VOLUME SECONDS → IOPS
  fio --name=skew --ioengine=nbd --uri="nbd://127.0.0.1:$P/$1" --rw=randread --bs=4k \
    --iodepth=32 --random_distribution=zoned:90/10:10/90 --time_based --runtime="$2" \
    --norandommap --randrepeat=0 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))'
}

flash_iops=$(skewed f "$STEP")
disk_iops=$(skewed d "$STEP")
echo "all-flash ($FLASH): $flash_iops IOPS; all-disk ($DISK): $disk_iops IOPS"
echo "hybrid (cold start, flash ${FLASH_GIB} GiB of ${VOL_GIB} GiB, migration $MIGRATION_MBPS MB/s, $MOVES moves in flight), per $STEP s:"
# The mission-critical volume at QD1 beside the first half of the warm-up.
fio --name=mc --ioengine=nbd --uri="nbd://127.0.0.1:$P/mc" --rw=randread --bs=4k \
  --iodepth=1 --time_based --runtime=$((WARM_S / 2)) --randrepeat=0 --output-format=json \
  > "$WORK/mc.json" 2>/dev/null &
MC=$!
reached=""
for ((t = STEP; t <= WARM_S; t += STEP)); do
  iops=$(skewed h "$STEP")
  ratio=$(python3 -c "print(f'{$iops / max($flash_iops, 1):.2f}')")
  echo "  ${t} s: $iops IOPS (${ratio}× all-flash)"
  if [ -z "$reached" ] && python3 -c "import sys; sys.exit(0 if $iops >= 0.8 * $flash_iops else 1)"; then
    reached=$t
  fi
done
wait "$MC"
echo "0.8× all-flash reached after: ${reached:-not within $WARM_S s}${reached:+ s}"
python3 - "$WORK/mc.json" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
r = json.loads(t[t.index("{"):])["jobs"][0]["read"]
p = r["clat_ns"]["percentile"]
print(f"mission-critical QD1 beside it (target 10 ms): {r['iops']:.0f} IOPS, "
      f"p50 {p['50.000000'] / 1e6:.2f} ms, p99 {p['99.000000'] / 1e6:.2f} ms")
PY
curl -s -H "Authorization: Bearer $(cat "$WORK/data/admin-token")" "http://127.0.0.1:$PA/metrics" \
  | grep -E '^weir_(pool|volume)_tier' | grep -v '^#' || true
