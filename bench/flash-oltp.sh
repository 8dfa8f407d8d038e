#!/usr/bin/env bash
# A live analog of `weir sim mixed-workload-cache` (issue 12, seed 000 scenario 2):
# heavy DVD Store OLTP (`weir load bench/flash-oltp.toml`: four SQL VMs, 12 threads,
# no think time, 4 vCPUs each, databases scaled to 2 GiB) against a gateway in front
# of a `weir serve` whose pool emulates DEVICE, once through volumes with
# `cache = "flash"` (warmed first, as 000 measured on warm caches) and once through
# the same upstream exports without it. Prints orders per minute, vCPUs busy and the
# reads and writes the upstream served in each run.
# DEVICE is a preset name or an array table (TOML inline table), e.g. seed 000's
# 7.2K SATA RAID 10 of 16 as `weir sim mixed-workload-cache` models it:
#   bench/flash-oltp.sh                  # DURATION=30s DEVICE=15k-sas-raid5x24
#   DEVICE=seed-000 bench/flash-oltp.sh  # the scenario's [array], without its flash tier
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-30s}"
DEVICE="${DEVICE:-15k-sas-raid5x24}"
WORK="${WORK:-${TMPDIR:-/tmp}/weir-flash-oltp}"
. bench/lib.sh
require_fio_nbd
cargo build --release -p weir >/dev/null < /dev/null
WEIR="${WEIR_BIN:-$PWD/target/release/weir}"
DEVICE_TOML=$(device_toml "$DEVICE")
rm -rf "$WORK"; mkdir -p "$WORK/up" "$WORK/gw" "$WORK/cache"
WEIR_SCRATCH=("$WORK/cache" "$WORK/up/pools")  # ≈ 11 GB after a run
P_UP=10951; P_UPA=10952; P_GW=10953; P_GWA=10954
{
  printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\ndata_dir = "%s/up"\n' $P_UP $P_UPA "$WORK"
  printf '[[pools]]\nname = "default"\ndevice = %s\n[[policies]]\nname = "best-effort"\n' "$DEVICE_TOML"
  for i in 1 2 3 4; do printf '[[volumes]]\nname = "sql%s"\nsize = "3GiB"\npolicy = "best-effort"\n' $i; done
} > "$WORK/up.toml"
# Two gateways on the same exports, one after the other: the uncached one ("u")
# first, then the cached one ("c"), whose connections hold each export's
# exclusive lease (docs/FLASH_CACHE.md) — while it runs the upstream refuses any
# other client's writes to them, so the two cannot run at once.
gateway_toml() {
  printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\ndata_dir = "%s/gw-%s"\n' $P_GW $P_GWA "$WORK" "$1"
  printf '[[pools]]\nname = "gw"\nupstream = "nbd://127.0.0.1:%s"\n' $P_UP
  # scan_cutoff 0: the warming pass reads each database sequentially.
  [ "$1" = c ] && printf 'flash_cache = { dir = "%s/cache", size = "12GiB", scan_cutoff = 0 }\n' "$WORK"
  printf '[[policies]]\nname = "best-effort"\n'
  for i in 1 2 3 4; do
    printf '[[volumes]]\nname = "%s%s"\nexport = "sql%s"\npolicy = "best-effort"\npool = "gw"\n' "$1" $i $i
    [ "$1" = c ] && printf 'cache = "flash"\n'
  done
  true
}
gateway_toml u > "$WORK/gw-u.toml"
gateway_toml c > "$WORK/gw-c.toml"
serve_weir up $P_UP
upstream_ios() {
  curl -s "http://127.0.0.1:$P_UPA/metrics" -H "Authorization: Bearer $(cat "$WORK/up/admin-token")" |
    awk -v op="$1" '$0 ~ "^weir_volume_ios_total\\{volume=\"sql[0-9]\",op=\"" op "\"\\}" {s += $2} END {print s + 0}'
}
load() {
  local t="" i
  for i in 1 2 3 4; do t="$t${t:+,}nbd://127.0.0.1:$P_GW/$1$i"; done
  local r0 w0; r0=$(upstream_ios read); w0=$(upstream_ios write)
  "$WEIR" load bench/flash-oltp.toml --target "$t" -d "$DURATION" -q --json > "$WORK/$1.json"
  python3 - "$WORK/$1.json" "$1" $(( $(upstream_ios read) - r0 )) $(( $(upstream_ios write) - w0 )) <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
def find(o, key):
    if isinstance(o, dict):
        if o.get("name") == key and "value" in o:
            return round(o["value"], 2)
        for v in o.values():
            r = find(v, key)
            if r is not None: return r
    elif isinstance(o, list):
        for v in o:
            r = find(v, key)
            if r is not None: return r
print(f"{'cached' if sys.argv[2] == 'c' else 'uncached'}: {find(doc, 'opm')} orders/min, "
      f"vCPUs busy {find(doc, 'vcpus_busy')}, upstream served {sys.argv[3]} reads and {sys.argv[4]} writes")
PY
}
echo "uptime: $(uptime)"
echo "device $DEVICE; weir load bench/flash-oltp.toml for $DURATION"
serve_weir gw-u $P_GW
load u
kill "${WEIR_PIDS[-1]}"; while kill -0 "${WEIR_PIDS[-1]}" 2>/dev/null; do sleep 0.1; done
serve_weir gw-c $P_GW
for i in 1 2 3 4; do
  fio --name=warm --ioengine=nbd --uri="nbd://127.0.0.1:$P_GW/c$i" --rw=read --bs=1m --iodepth=8 \
    --size=2560m --output-format=terse >/dev/null 2>&1
done
load c
