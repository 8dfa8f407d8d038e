#!/usr/bin/env bash
# The flash read cache (issue 12, docs/FLASH_CACHE.md): a gateway (an upstream
# pool) with a flash_cache in front of a weir serve whose pool is an emulated
# array, fio (nbd engine) in the same run against
#   cached  — the gateway volume with cache = "flash"
#   direct  — the same upstream export through the gateway without the cache
#   plain   — a file volume of the gateway on the cache's file system (the peer
#             for "cache hits ≥ 0.9× a plain volume on the cache directory")
#   bench/flash-cache.sh                       # REPS=3 RUNTIME=10
#   DEVICE=15k-sas-raid5x24 bench/flash-cache.sh
# Two loads: 4 KiB randread QD32 over a hot set that fits the cache (after one
# warming pass), and a skewed load (zipf 1.2) over the whole volume; for each,
# IOPS and what the upstream served (its read counter).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-3}"
RUNTIME="${RUNTIME:-10}"
DEVICE="${DEVICE:-15k-sas-raid5x24}"
HOT_MIB="${HOT_MIB:-512}"
VOL_GIB="${VOL_GIB:-8}"
CACHE_GIB="${CACHE_GIB:-2}"
WORK="${WORK:-${TMPDIR:-/tmp}/weir-flash-bench}"
. bench/lib.sh
require_fio_nbd

cargo build --release -p weir >/dev/null < /dev/null
WEIR="${WEIR_BIN:-$PWD/target/release/weir}"
rm -rf "$WORK"; mkdir -p "$WORK/up" "$WORK/gw/pools/local" "$WORK/cache"
head -c $((HOT_MIB << 20)) /dev/urandom > "$WORK/gw/pools/local/plain.img"
chmod 600 "$WORK/gw/pools/local/plain.img"

P_UP=10941; P_UPA=10942; P_GW=10943; P_GWA=10944
cat > "$WORK/up.toml" <<CONF
listen = "127.0.0.1:$P_UP"
admin_listen = "127.0.0.1:$P_UPA"
data_dir = "$WORK/up"
[[pools]]
name = "default"
device = $(device_toml "$DEVICE")
[[policies]]
name = "best-effort"
[[volumes]]
name = "db"
size = "${VOL_GIB}GiB"
policy = "best-effort"
CONF
cat > "$WORK/gw.toml" <<CONF
listen = "127.0.0.1:$P_GW"
admin_listen = "127.0.0.1:$P_GWA"
data_dir = "$WORK/gw"
[[pools]]
name = "gw"
upstream = "nbd://127.0.0.1:$P_UP"
flash_cache = { dir = "$WORK/cache", size = "${CACHE_GIB}GiB" }
[[pools]]
name = "local"
[[policies]]
name = "best-effort"
[[volumes]]
name = "cached"
export = "db"
policy = "best-effort"
pool = "gw"
cache = "flash"
[[volumes]]
name = "direct"
export = "db"
size = "${VOL_GIB}GiB"
policy = "best-effort"
pool = "gw"
[[volumes]]
name = "plain"
size = "${HOT_MIB}MiB"
policy = "best-effort"
pool = "local"
CONF
serve_weir up $P_UP
serve_weir gw $P_GW

# fio: IOPS of a 4 KiB randread QD32 run; $2 = size, $3 = extra options.
run() {
  fio --name=fc --ioengine=nbd --uri="nbd://127.0.0.1:$P_GW/$1" --rw=randread --bs=4k \
    --iodepth=32 --size="$2" $3 --time_based --runtime="$RUNTIME" --ramp_time=1 \
    --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); print("%.0f" % json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"])'
}
# Reads the upstream has served so far.
upstream_reads() {
  curl -s "http://127.0.0.1:$P_UPA/metrics" -H "Authorization: Bearer $(cat "$WORK/up/admin-token")" |
    awk '/^weir_volume_ios_total\{volume="db",op="read"\}/ {print $2}'
}
median() { python3 -c 'import statistics,sys; print("%.0f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

echo "uptime: $(uptime)"
echo "upstream device $DEVICE, volume ${VOL_GIB} GiB; gateway flash cache ${CACHE_GIB} GiB; 4 KiB randread QD32, ${RUNTIME}s x ${REPS}"
# Warm the hot set: one pass of random 64 KiB reads (random, so not a scan).
fio --name=warm --ioengine=nbd --uri="nbd://127.0.0.1:$P_GW/cached" --rw=randread --bs=64k \
  --iodepth=32 --size="${HOT_MIB}m" --output-format=terse >/dev/null 2>&1
fio --name=warm --ioengine=nbd --uri="nbd://127.0.0.1:$P_GW/plain" --rw=read --bs=1m \
  --iodepth=4 --size="${HOT_MIB}m" --output-format=terse >/dev/null 2>&1
c=(); p=(); d=()
for rep in $(seq "$REPS"); do
  before=$(upstream_reads)
  ci=$(run cached "${HOT_MIB}m" ""); after=$(upstream_reads)
  pi=$(run plain "${HOT_MIB}m" "")
  di=$(run direct "${HOT_MIB}m" "")
  c+=("$ci"); p+=("$pi"); d+=("$di")
  echo "hot set rep $rep: cached $ci IOPS (upstream served $((after - before)) reads), plain $pi, through to the array $di"
done
mc=$(median "${c[@]}"); mp=$(median "${p[@]}"); md=$(median "${d[@]}")
python3 -c "print(f'hot set medians: cached $mc, plain $mp, array $md IOPS; cached/plain {$mc/$mp:.2f}, cached/array {$mc/$md:.1f}')"

zc=(); zd=(); zu=(); zud=()
for rep in $(seq "$REPS"); do
  before=$(upstream_reads)
  zci=$(run cached "${VOL_GIB}g" "--random_distribution=zipf:1.2"); mid=$(upstream_reads)
  zdi=$(run direct "${VOL_GIB}g" "--random_distribution=zipf:1.2"); after=$(upstream_reads)
  zc+=("$zci"); zd+=("$zdi"); zu+=($((mid - before))); zud+=($((after - mid)))
  echo "zipf 1.2 rep $rep: cached $zci IOPS (upstream $((mid - before)) reads), uncached $zdi IOPS (upstream $((after - mid)) reads)"
done
mzc=$(median "${zc[@]}"); mzd=$(median "${zd[@]}")
python3 -c "print(f'zipf medians: cached $mzc, uncached $mzd IOPS: {$mzc/$mzd:.2f}x')"
curl -s "http://127.0.0.1:$P_GWA/metrics" -H "Authorization: Bearer $(cat "$WORK/gw/admin-token")" |
  grep -E '^weir_(volume|pool)_flash_cache_(hits|misses|scan_bypasses|resident_bytes|errors)' || true
