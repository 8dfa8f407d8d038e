#!/usr/bin/env bash
# NBD over TLS: weir serve with and without TLS against nbdkit with and without
# --tls, same file, same client: nbdcopy (libnbd, GnuTLS; fio's nbd engine
# cannot do TLS, qemu-img bench takes no TLS object) on one connection and one
# thread, so --requests is the queue depth: 4 KiB reads at depth 32 (export →
# null:), 4 KiB writes at depth 32 (a file in the page cache → export), 1 MiB
# reads at depth 4; all on loopback.
#   bench/tls.sh                 # REPS=3 SIZE_MIB=256 by default
#   REPS=5 SIZE_MIB=512 bench/tls.sh
# Prints IOPS (and MB/s) per server and cell, medians of REPS runs (servers
# interleaved within each rep), weir TLS ÷ weir plain and weir TLS ÷ nbdkit TLS,
# then the server's and the client's CPU per I/O (client and server share the
# machine's cores: a client that spends more per I/O over TLS caps both servers). Certificates are made with openssl in the work
# directory. Missing tools (nbdcopy, nbdkit, openssl) are installed with apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-3}"
SIZE_MIB="${SIZE_MIB:-256}"
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
declare -A RESULTS CPU CLIENT
# One nbdcopy run of `cell` against server `s`: the whole export, one connection.
copy() {
  local s=$1 cell=$2 src dst
  if [ "$cell" = 4k-write-qd32 ]; then src="$WORK/source.img"; dst="${URI[$s]}"
  else src="${URI[$s]}"; dst="null:"; fi
  /usr/bin/time -o "$WORK/client.time" -f "%U %S" \
    nbdcopy --connections=1 --threads=1 --requests="${DEPTH[$cell]}" \
    --request-size="${SIZE[$cell]}" "$src" "$dst"
}
# Warm the page cache and each server's first connection.
for s in "${SERVERS[@]}"; do copy "$s" 1m-read-qd4; done

echo "uptime: $(uptime)"
for rep in $(seq "$REPS"); do
  for cell in "${CELLS[@]}"; do
    count=$(( (SIZE_MIB << 20) / SIZE[$cell] ))
    for s in "${SERVERS[@]}"; do
      c0=$(cpu_ticks "${PID[$s]}")
      t0=$(date +%s.%N)
      copy "$s" "$cell"
      t1=$(date +%s.%N)
      c1=$(cpu_ticks "${PID[$s]}")
      iops=$(python3 -c "print(f'{$count / ($t1 - $t0):.0f}')")
      cpu_us=$(python3 -c "print(f'{($c1 - $c0) / $TICK_HZ / $count * 1e6:.2f}')")
      RESULTS[$s/$cell]+="$iops "
      CPU[$s/$cell]+="$cpu_us "
      CLIENT[$s/$cell]+="$(python3 -c "import sys; u, s = map(float, open(sys.argv[1]).read().split()[-2:]); print(f'{(u + s) / $count * 1e6:.2f}')" "$WORK/client.time") "
    done
  done
done

median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
printf '\n%-14s' "cell"; for s in "${SERVERS[@]}"; do printf '%24s' "$s IOPS (MB/s)"; done
printf '%18s%18s\n' "TLS ÷ plain" "TLS ÷ nbdkit TLS"
for cell in "${CELLS[@]}"; do
  printf '%-14s' "$cell"
  declare -A M=()
  for s in "${SERVERS[@]}"; do
    # shellcheck disable=SC2086
    M[$s]=$(median ${RESULTS[$s/$cell]})
    printf '%24s' "$(python3 -c "print(f'{${M[$s]}:,.0f} ({${M[$s]} * ${SIZE[$cell]} / 1e6:,.0f})')")"
  done
  printf '%18s%18s\n' "$(python3 -c "print(f'{${M[weir-tls]} / ${M[weir-plain]}:.2f}x')")" \
    "$(python3 -c "print(f'{${M[weir-tls]} / ${M[nbdkit-tls]}:.2f}x')")"
done
printf '\nserver CPU µs per I/O (median)\n%-14s' "cell"; for s in "${SERVERS[@]}"; do printf '%14s' "$s"; done; echo
for cell in "${CELLS[@]}"; do
  printf '%-14s' "$cell"
  # shellcheck disable=SC2086
  for s in "${SERVERS[@]}"; do printf '%14s' "$(median ${CPU[$s/$cell]})"; done
  echo
done
printf '\nclient (nbdcopy) CPU µs per I/O (median)\n%-14s' "cell"; for s in "${SERVERS[@]}"; do printf '%14s' "$s"; done; echo
for cell in "${CELLS[@]}"; do
  printf '%-14s' "$cell"
  # shellcheck disable=SC2086
  for s in "${SERVERS[@]}"; do printf '%14s' "$(median ${CLIENT[$s/$cell]})"; done
  echo
done
echo "raw IOPS per rep:"; for k in "${!RESULTS[@]}"; do echo "  $k: ${RESULTS[$k]}"; done | sort
