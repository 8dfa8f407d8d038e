#!/usr/bin/env bash
# NBD over TLS: weir serve with and without TLS against nbdkit with and without
# --tls, same file, two clients for all four: nbdcopy (libnbd, GnuTLS) on one
# connection and one thread, so --requests is the queue depth, and `weir load`
# (rustls) with one VM on one connection at the same depth. 4 KiB reads at depth 32
# (export → null:), 4 KiB writes at depth 32 (a file in the page cache → export),
# 1 MiB reads at depth 4; all on loopback. fio's nbd engine cannot do TLS (libnbd
# refuses a certificate directory in the URI it is given) and qemu-img bench takes
# no TLS object.
#
# The two clients send a request differently over TLS: libnbd seals a WRITE's header
# and its payload as two TLS records and sends them as two TCP segments (its
# tls_send ignores MSG_MORE, also upstream), and takes each reply in its own
# record; weir load hands rustls all it has ready at once. On a 2-core machine the
# client shares the cores with the server, so a client's own cost per TLS request
# caps both servers: the server's CPU per I/O is printed beside the rates.
#   bench/tls.sh                 # REPS=3 SIZE_MIB=256 RUNTIME=5 by default
#   REPS=5 SIZE_MIB=512 bench/tls.sh
#   CLIENTS=nbdcopy bench/tls.sh # one client only (nbdcopy or weir-load)
# Prints, per client, IOPS (and MB/s) per server and cell, medians of REPS runs
# (servers interleaved within each rep), weir TLS ÷ weir plain and weir TLS ÷
# nbdkit TLS, then the server's and the client's CPU per I/O. Certificates are made
# with openssl in the work directory. Missing tools (nbdcopy, nbdkit, openssl) are
# installed with apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-3}"
SIZE_MIB="${SIZE_MIB:-256}"
RUNTIME="${RUNTIME:-5}"
read -r -a CLIENT_LIST <<< "${CLIENTS:-nbdcopy weir-load}"
WORK="${WORK:-${TMPDIR:-/tmp}/weir-tls-bench}"

need() { command -v "$1" >/dev/null 2>&1; }
missing=()
need nbdcopy || missing+=(libnbd-bin)
need nbdkit || missing+=(nbdkit)
need openssl || missing+=(openssl)
[ -x /usr/bin/time ] || missing+=(time)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null
fi

cargo build --release -p weir >/dev/null
WEIR="$PWD/target/release/weir"

rm -rf "$WORK"; mkdir -p "$WORK/data/pools/qos" "$WORK/pki/server" "$WORK/pki/client"
FILE="$WORK/disk.img"
echo "writing the $SIZE_MIB MiB test file $FILE"
head -c $((SIZE_MIB << 20)) /dev/urandom > "$FILE"
cp "$FILE" "$WORK/source.img"
sync
ln -s "$FILE" "$WORK/data/pools/qos/bench.img"

# A CA and a server certificate for 127.0.0.1 (ECDSA P-256), laid out for nbdkit
# (--tls-certificates DIR) and libnbd (tls-certificates=DIR in the URI).
(
  cd "$WORK/pki"
  ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256)
  openssl req -x509 -nodes -days 2 "${ec[@]}" -keyout ca-key.pem -out ca-cert.pem -subj "/CN=bench CA" 2>/dev/null
  openssl req -new -nodes "${ec[@]}" -keyout server-key.pem -out server.csr -subj "/CN=127.0.0.1" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
  openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
    -out server-cert.pem -extfile server.ext 2>/dev/null
  cp ca-cert.pem server-cert.pem server-key.pem server/
  cp ca-cert.pem client/
)

# Ports apart from bench/nbd-peers.sh (10909-10913) and server-instructions.sh (10959-10960).
BASE_PORT="${BASE_PORT:-10981}"
P_WEIR=$BASE_PORT; P_ADMIN=$((BASE_PORT + 1)); P_NBDKIT_TLS=$((BASE_PORT + 2)); P_NBDKIT=$((BASE_PORT + 3))
cat > "$WORK/weir.toml" <<EOF
listen = "127.0.0.1:$P_WEIR"
admin_listen = "127.0.0.1:$P_ADMIN"
data_dir = "$WORK/data"
tls = "on"
tls_cert = "$WORK/pki/server/server-cert.pem"
tls_key = "$WORK/pki/server/server-key.pem"
[[pools]]
name = "qos"
[[policies]]
name = "best-effort"
[[volumes]]
name = "bench"
size = "${SIZE_MIB}MiB"
policy = "best-effort"
pool = "qos"
EOF

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
"$WEIR" serve --config "$WORK/weir.toml" > "$WORK/weir.out" 2> "$WORK/weir.log" & pids+=($!)
PID_WEIR=$!
nbdkit -f -i 127.0.0.1 -p "$P_NBDKIT_TLS" --tls=require --tls-certificates="$WORK/pki/server" \
  file "$FILE" 2> "$WORK/nbdkit-tls.log" & pids+=($!)
PID_NBDKIT_TLS=$!
nbdkit -f -i 127.0.0.1 -p "$P_NBDKIT" file "$FILE" 2> "$WORK/nbdkit.log" & pids+=($!)
PID_NBDKIT=$!
for port in $P_WEIR $P_NBDKIT_TLS $P_NBDKIT; do
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done

SERVERS=(weir-tls weir-plain nbdkit-tls nbdkit-plain)
declare -A PID=([weir-tls]=$PID_WEIR [weir-plain]=$PID_WEIR [nbdkit-tls]=$PID_NBDKIT_TLS [nbdkit-plain]=$PID_NBDKIT)
declare -A URI=(
  [weir-tls]="nbds://127.0.0.1:$P_WEIR/bench?tls-certificates=$WORK/pki/client"
  [weir-plain]="nbd://127.0.0.1:$P_WEIR/bench"
  [nbdkit-tls]="nbds://127.0.0.1:$P_NBDKIT_TLS/bench?tls-certificates=$WORK/pki/client"
  [nbdkit-plain]="nbd://127.0.0.1:$P_NBDKIT/bench"
)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK_HZ=$(getconf CLK_TCK)
CELLS=(4k-read-qd32 4k-write-qd32 1m-read-qd4)
declare -A SIZE=([4k-read-qd32]=4096 [4k-write-qd32]=4096 [1m-read-qd4]=1048576)
declare -A DEPTH=([4k-read-qd32]=32 [4k-write-qd32]=32 [1m-read-qd4]=4)
declare -A SPEC=([4k-read-qd32]="bs=4k,seqread,qd=32,vms=1" [4k-write-qd32]="bs=4k,seqwrite,qd=32,vms=1" [1m-read-qd4]="bs=1m,seqread,qd=4,vms=1")
declare -A RESULTS CPU CLIENT
# One nbdcopy run of `cell` against server `s`: the whole export, one connection.
# Prints the I/Os it did.
copy() {
  local s=$1 cell=$2 src dst
  if [ "$cell" = 4k-write-qd32 ]; then src="$WORK/source.img"; dst="${URI[$s]}"
  else src="${URI[$s]}"; dst="null:"; fi
  /usr/bin/time -o "$WORK/client.time" -f "%U %S" \
    nbdcopy --connections=1 --threads=1 --requests="${DEPTH[$cell]}" \
    --request-size="${SIZE[$cell]}" "$src" "$dst"
  echo $(( (SIZE_MIB << 20) / SIZE[$cell] ))
}
# One `weir load` run of `cell` against server `s` for RUNTIME seconds, one VM on
# one connection, at the same URI as nbdcopy (libnbd's ?tls-certificates=DIR).
# Prints the I/Os it did.
load() {
  local s=$1 cell=$2
  /usr/bin/time -o "$WORK/client.time" -f "%U %S" \
    "$WEIR" load -q --json -d "$RUNTIME" -t "${URI[$s]}" \
    "${SPEC[$cell]}" > "$WORK/load.json" 2> "$WORK/load.err" || { cat "$WORK/load.err" >&2; exit 1; }
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['cases'][0]['total']['ios'])" "$WORK/load.json"
}
# Warm the page cache and each server's first connection.
for s in "${SERVERS[@]}"; do copy "$s" 1m-read-qd4 > /dev/null; done

echo "uptime: $(uptime)"
for rep in $(seq "$REPS"); do
  for client in "${CLIENT_LIST[@]}"; do
    for cell in "${CELLS[@]}"; do
      for s in "${SERVERS[@]}"; do
        c0=$(cpu_ticks "${PID[$s]}")
        t0=$(date +%s.%N)
        if [ "$client" = nbdcopy ]; then count=$(copy "$s" "$cell"); else count=$(load "$s" "$cell"); fi
        t1=$(date +%s.%N)
        c1=$(cpu_ticks "${PID[$s]}")
        key="$client/$s/$cell"
        if [ "$client" = nbdcopy ]; then
          RESULTS[$key]+="$(python3 -c "print(f'{$count / ($t1 - $t0):.0f}')") "
        else
          RESULTS[$key]+="$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['cases'][0]['total']['iops']))" "$WORK/load.json") "
        fi
        CPU[$key]+="$(python3 -c "print(f'{($c1 - $c0) / $TICK_HZ / $count * 1e6:.2f}')") "
        CLIENT[$key]+="$(python3 -c "import sys; u, s = map(float, open(sys.argv[1]).read().split()[-2:]); print(f'{(u + s) / $count * 1e6:.2f}')" "$WORK/client.time") "
      done
    done
  done
done

median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
for client in "${CLIENT_LIST[@]}"; do
  printf '\nclient: %s\n%-14s' "$client" "cell"; for s in "${SERVERS[@]}"; do printf '%24s' "$s IOPS (MB/s)"; done
  printf '%18s%18s\n' "TLS ÷ plain" "TLS ÷ nbdkit TLS"
  for cell in "${CELLS[@]}"; do
    printf '%-14s' "$cell"
    declare -A M=()
    for s in "${SERVERS[@]}"; do
      # shellcheck disable=SC2086
      M[$s]=$(median ${RESULTS[$client/$s/$cell]})
      printf '%24s' "$(python3 -c "print(f'{${M[$s]}:,.0f} ({${M[$s]} * ${SIZE[$cell]} / 1e6:,.0f})')")"
    done
    printf '%18s%18s\n' "$(python3 -c "print(f'{${M[weir-tls]} / ${M[weir-plain]}:.2f}x')")" \
      "$(python3 -c "print(f'{${M[weir-tls]} / ${M[nbdkit-tls]}:.2f}x')")"
  done
  for what in server client; do
    printf '\n%s CPU µs per I/O, client %s (median)\n%-14s' "$what" "$client" "cell"
    for s in "${SERVERS[@]}"; do printf '%14s' "$s"; done; echo
    for cell in "${CELLS[@]}"; do
      printf '%-14s' "$cell"
      for s in "${SERVERS[@]}"; do
        if [ "$what" = server ]; then v=${CPU[$client/$s/$cell]}; else v=${CLIENT[$client/$s/$cell]}; fi
        # shellcheck disable=SC2086
        printf '%14.2f' "$(median $v)"
      done
      echo
    done
  done
done
echo "raw IOPS per rep:"; for k in "${!RESULTS[@]}"; do echo "  $k: ${RESULTS[$k]}"; done | sort
