#!/usr/bin/env bash
# Thin volumes (issue 11), each figure beside its peer measured in the same run:
#   clones     2,500 linked clones of a 20 GiB image (weir volume clone --count)
#              vs 2,500 `qemu-img create -b` overlays
#   snapshot   snapshot of a 1 TiB volume with GiB written (WRITTEN_GIB, default 10;
#              FILL_COMPRESS=N makes fio's data N % compressible, for a TMPDIR on a
#              compressing file system when the disk is smaller than WRITTEN_GIB)
#   writes     4 KiB random writes (fio nbd engine, QD32): first writes to a clone
#              vs a plain volume vs qemu-nbd over a qcow2 clone of the same image;
#              writes to owned grains vs a plain volume
#   reads      4 KiB random reads through a 3-deep chain vs a plain volume
#   storm      STORM_CLONES clones (default 100) each reading the same STORM_MIB
#              (default 256) of their image at once: bytes read from the layer
#              files with and without the clone-aware cache, and the same storm
#              on full copies (plain volumes)
#   meta       committing grain-map changes: Weir's map file vs SQLite (WAL, FULL)
#   flatten    flattening a FLATTEN_GIB (default 2) GiB clone: how long admin calls
#              and new connections to another volume take meanwhile (vs idle)
#   bench/thin.sh [clones snapshot writes reads storm meta flatten]   (default: all)
# Needs fio (nbd engine), qemu-img, qemu-nbd. Prints one line per figure.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(clones snapshot writes reads storm meta flatten)
cargo build --release -q -p weir
W="${WEIR_BIN:-$PWD/target/release/weir}"  # WEIR_BIN: another build (A/B)
work=$(mktemp -d "${TMPDIR:-/tmp}/weir-thin-bench.XXXXXX")
trap 'pkill -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
NBD=127.0.0.1:13809
ADMIN=127.0.0.1:13810
A="--admin $ADMIN --data-dir $work/data"   # the CLI reads the admin token there

serve() { # serve CONFIG_BODY: a fresh server on a fresh data dir
  pkill -f "$work/weir.toml" 2>/dev/null || true
  sleep 0.3
  rm -rf "$work/data"
  { echo "data_dir = \"$work/data\""; echo "listen = \"$NBD\""; echo "admin_listen = \"$ADMIN\""; echo "$1"; } > "$work/weir.toml"
  "$W" serve -c "$work/weir.toml" > "$work/serve.log" 2>&1 &
  for _ in $(seq 50); do nbdinfo --list "nbd://$NBD" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "server did not start"; cat "$work/serve.log"; exit 1
}
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc -l; }
fio_iops() { # fio_iops URI RW EXTRA...: IOPS of a 4 KiB QD32 job
  local uri=$1 rw=$2; shift 2
  fio --name=b --ioengine=nbd --uri="$uri" --rw="$rw" --bs=4k --iodepth=32 \
      --output-format=json "$@" 2>/dev/null \
    | python3 -c 'import json,sys; d=sys.stdin.read(); j=json.loads(d[d.find("{"):])["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}
storm_fio() { # every job reads its volume's first STORM_MIB once; fio's aggregate MiB/s
  fio --ioengine=nbd --rw=read --bs=1m --iodepth=2 --size="${mib}m" --group_reporting \
      --output-format=json "$@" 2>/dev/null \
    | python3 -c 'import json,sys; d=sys.stdin.read(); print(round(json.loads(d[d.find("{"):])["jobs"][0]["read"]["bw_bytes"]/1048576))'
}
metric() { curl -s -H "Authorization: Bearer $(cat "$work/data/admin-token")" "http://$ADMIN/metrics" | awk -v m="$1" '$1 ~ "^"m {s+=$2} END {printf "%.0f\n", s}'; }
POOLS='
[[pools]]
name = "plain"
[[pools]]
name = "thin"
format = "thin"
'

for t in "${targets[@]}"; do case "$t" in
clones)
  serve "$POOLS
[[volumes]]
name = \"img\"
size = \"20GiB\"
policy = \"non-critical\"
pool = \"thin\""
  qemu-io -f raw -c "write -P 0x5a 0 1G" "nbd://$NBD/img" >/dev/null
  "$W" volume snapshot img gold $A >/dev/null
  t0=$(now); "$W" volume clone img@gold vm --count 2500 $A >/dev/null; weir_s=$(since "$t0")
  # One command per clone, as the peer is run (each rewrites the catalog).
  t0=$(now); for i in $(seq 2500); do "$W" volume clone img@gold one-$i $A >/dev/null; done; weir1_s=$(since "$t0")
  qemu-img create -f raw "$work/img.raw" 20G >/dev/null
  t0=$(now)
  for i in $(seq 2500); do qemu-img create -q -f qcow2 -b "$work/img.raw" -F raw "$work/vm$i.qcow2"; done
  qemu_s=$(since "$t0")
  rm -f "$work"/vm*.qcow2
  printf 'clones: 2,500 linked clones of a 20 GiB image: weir one command %.2f s, weir one command per clone %.1f s, qemu-img create -b per clone %.1f s (%.1fx / %.1fx faster)\n' "$weir_s" "$weir1_s" "$qemu_s" "$(echo "$qemu_s / $weir_s" | bc -l)" "$(echo "$qemu_s / $weir1_s" | bc -l)"
  ;;
snapshot)
  gib=${WRITTEN_GIB:-10}
  serve "$POOLS
[[volumes]]
name = \"big\"
size = \"1TiB\"
policy = \"non-critical\"
pool = \"thin\""
  # GiB written spread over the whole TiB (one 1 MiB write every 1 TiB / (gib × 1024)).
  stride=$(( 1024 / gib ))
  fio --name=fill --ioengine=nbd --uri="nbd://$NBD/big" --rw=write:$(( (stride - 1) ))m --bs=1m \
      --iodepth=16 --size=1024g --io_size=${gib}g \
      ${FILL_COMPRESS:+--buffer_compress_percentage=$FILL_COMPRESS --refill_buffers} >/dev/null 2>&1
  qemu-io -f raw -c flush "nbd://$NBD/big" >/dev/null   # written and flushed, as a VM would
  for i in 1 2 3 4 5; do
    t0=$(now); "$W" volume snapshot big "s$i" $A >/dev/null; s=$(since "$t0")
    echo "snapshot: 1 TiB volume, $gib GiB written: weir volume snapshot (whole command) $(printf %.0f "$(echo "$s*1000" | bc -l)") ms"
  done
  ;;
writes)
  reps=${REPS:-3}
  serve "$POOLS
[[volumes]]
name = \"p\"
size = \"2GiB\"
policy = \"non-critical\"
pool = \"plain\"
[[volumes]]
name = \"img\"
size = \"2GiB\"
policy = \"non-critical\"
pool = \"thin\""
  qemu-io -f raw -c "write -P 0x5a 0 1G" -c "write -P 0x5a 1G 1G" "nbd://$NBD/img" >/dev/null
  qemu-io -f raw -c "write -P 0x5a 0 1G" -c "write -P 0x5a 1G 1G" "nbd://$NBD/p" >/dev/null
  "$W" volume snapshot img gold $A >/dev/null
  "$W" volume clone img@gold c --count "$reps" $A >/dev/null
  qemu-img create -q -f raw "$work/img.raw" 2G
  qemu-io -f raw -c "write -P 0x5a 0 1G" -c "write -P 0x5a 1G 1G" "$work/img.raw" >/dev/null
  # First writes: one 4 KiB write per 64 KiB grain, random order, each grain once.
  first=(--blockalign=64k --size=2g --io_size=128m)
  tf=(); pf=(); qf=(); to=(); po=()
  for r in $(seq "$reps"); do
    tf+=("$(fio_iops "nbd://$NBD/c-$r" randwrite "${first[@]}")")
    pf+=("$(fio_iops "nbd://$NBD/p" randwrite "${first[@]}")")
    qemu-img create -q -f qcow2 -b "$work/img.raw" -F raw "$work/c$r.qcow2"
    qemu-nbd -f qcow2 -t -p 13811 -b 127.0.0.1 --cache=writeback "$work/c$r.qcow2" & qpid=$!
    sleep 0.5
    qf+=("$(fio_iops "nbd://127.0.0.1:13811" randwrite "${first[@]}")")
    kill $qpid; wait $qpid 2>/dev/null || true
    # Owned grains: the same job again on the clone (every grain now its own).
    to+=("$(fio_iops "nbd://$NBD/c-$r" randwrite "${first[@]}")")
    po+=("$(fio_iops "nbd://$NBD/p" randwrite "${first[@]}")")
  done
  med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  t=$(med "${tf[@]}"); p=$(med "${pf[@]}"); q=$(med "${qf[@]}"); o=$(med "${to[@]}"); po_m=$(med "${po[@]}")
  echo "writes: first writes (copy-up), medians of $reps: thin $t IOPS (${tf[*]}), plain $p (${pf[*]}), qemu-nbd qcow2 overlay $q (${qf[*]}): $(printf %.2f "$(echo "$t/$p" | bc -l)")x plain, $(printf %.2f "$(echo "$t/$q" | bc -l)")x qemu-nbd"
  echo "writes: owned grains, medians of $reps: thin $o IOPS (${to[*]}), plain $po_m (${po[*]}): $(printf %.2f "$(echo "$o/$po_m" | bc -l)")x"
  ;;
reads)
  serve "$POOLS
[[volumes]]
name = \"p\"
size = \"2GiB\"
policy = \"non-critical\"
pool = \"plain\"
[[volumes]]
name = \"img\"
size = \"2GiB\"
policy = \"non-critical\"
pool = \"thin\""
  qemu-io -f raw -c "write -P 0x5a 0 1G" -c "write -P 0x5a 1G 1G" "nbd://$NBD/img" >/dev/null
  qemu-io -f raw -c "write -P 0x5a 0 1G" -c "write -P 0x5a 1G 1G" "nbd://$NBD/p" >/dev/null
  # A 3-deep chain: img@s → c1 (writes 1/3) @s → c2 (writes 1/3) @s → c3.
  "$W" volume snapshot img s $A >/dev/null; "$W" volume clone img@s c1 $A >/dev/null
  qemu-io -f raw -c "write -P 0x11 0 680M" "nbd://$NBD/c1" >/dev/null
  "$W" volume snapshot c1 s $A >/dev/null; "$W" volume clone c1@s c2 $A >/dev/null
  qemu-io -f raw -c "write -P 0x22 680M 680M" "nbd://$NBD/c2" >/dev/null
  "$W" volume snapshot c2 s $A >/dev/null; "$W" volume clone c2@s c3 $A >/dev/null
  opts=(--size=2g --time_based --runtime=10)
  thin=$(fio_iops "nbd://$NBD/c3" randread "${opts[@]}")
  plain=$(fio_iops "nbd://$NBD/p" randread "${opts[@]}")
  echo "reads: 4 KiB random reads through a 3-deep chain $thin IOPS, plain $plain: $(printf %.2f "$(echo "$thin/$plain" | bc -l)")x"
  ;;
storm)
  n=${STORM_CLONES:-100}; mib=${STORM_MIB:-256}
  for cache in "1GiB" "0"; do
    serve "
[[pools]]
name = \"thin\"
format = \"thin\"
clone_cache = \"$cache\"
[[volumes]]
name = \"img\"
size = \"${mib}MiB\"
policy = \"non-critical\"
pool = \"thin\""
    qemu-io -f raw -c "write -P 0x5a 0 ${mib}M" "nbd://$NBD/img" >/dev/null
    "$W" volume snapshot img gold $A >/dev/null
    "$W" volume clone img@gold vm --count "$n" $A >/dev/null
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    before=$(metric weir_thin_read_bytes_total)
    jobs=(); for i in $(seq -w 1 "$n"); do jobs+=(--name="vm$i" --uri="nbd://$NBD/vm-$i"); done
    bw=$(storm_fio "${jobs[@]}")
    read_mib=$(( ($(metric weir_thin_read_bytes_total) - before) / 1048576 ))
    echo "storm: $n clones × $mib MiB, clone_cache = $cache: $read_mib MiB read from layer files ($(printf %.2f "$(echo "$read_mib/$mib" | bc -l)")x the image), $bw MiB/s aggregate (fio)"
  done
  # The same storm on full copies: plain volumes, each a copy of the image.
  vols=""; for i in $(seq -w 1 "$n"); do vols="$vols
[[volumes]]
name = \"full-$i\"
size = \"${mib}MiB\"
policy = \"non-critical\"
pool = \"plain\""; done
  serve "$POOLS$vols"
  for i in $(seq -w 1 "$n"); do qemu-io -f raw -c "write -P 0x5a 0 ${mib}M" "nbd://$NBD/full-$i" >/dev/null; done
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  jobs=(); for i in $(seq -w 1 "$n"); do jobs+=(--name="f$i" --uri="nbd://$NBD/full-$i"); done
  bw=$(storm_fio "${jobs[@]}")
  echo "storm: $n full copies × $mib MiB (plain volumes): $bw MiB/s aggregate (fio)"
  ;;
flatten)
  gib=${FLATTEN_GIB:-2}
  serve "$POOLS
[[volumes]]
name = \"img\"
size = \"${gib}GiB\"
policy = \"non-critical\"
pool = \"thin\"
[[volumes]]
name = \"other\"
size = \"1GiB\"
policy = \"non-critical\"
pool = \"thin\""
  fio --name=fill --ioengine=nbd --uri="nbd://$NBD/img" --rw=write --bs=1m --iodepth=8 \
      --size="${gib}g" >/dev/null 2>&1
  "$W" volume snapshot img gold $A >/dev/null
  "$W" volume clone img@gold c1 $A >/dev/null
  probe() { # one admin call and one new NBD connection, ms
    local t0; t0=$(now)
    "$W" volume list $A >/dev/null
    nbdinfo --size "nbd://$NBD/other" >/dev/null
    printf '%.0f\n' "$(echo "($(now) - $t0) * 1000" | bc -l)"
  }
  idle=$(for i in $(seq 10); do probe; done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  t0=$(now); "$W" volume flatten c1 $A >/dev/null & pid=$!
  sleep 0.05
  : > "$work/probes"
  while kill -0 "$pid" 2>/dev/null; do probe >> "$work/probes"; sleep 0.05; done
  wait "$pid"; flat_s=$(since "$t0")
  read -r n med max < <(sort -n "$work/probes" | awk '{a[NR]=$1} END {print NR, a[int((NR+1)/2)], a[NR]}')
  printf 'flatten: %s GiB clone flattened in %.1f s; meanwhile %s probes (weir volume list + a new NBD connection to another volume): median %s ms, max %s ms (idle: median %s ms)\n' \
    "$gib" "$flat_s" "$n" "$med" "$max" "$idle"
  ;;
meta)
  mkdir -p "$work/w" "$work/s"
  cargo run --release -q -p weir-thin --example commit_cost -- "$work/w"
  python3 bench/thin-meta.py "$work/s"
  ;;
*) echo "unknown: $t (known: clones snapshot writes reads storm meta flatten)" >&2; exit 2 ;;
esac; done
