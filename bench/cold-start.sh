#!/usr/bin/env bash
# Issue 3's cold start: from `git clone` to a server that answers, as a newcomer
# would (README quick start), timed: a fresh clone of this repository's HEAD, an
# empty CARGO_HOME (crates downloaded again) and target directory, then
# `cargo run --release -- serve` in the background until `nbdinfo --list` answers.
#   bench/cold-start.sh            # prints "clone -> nbdinfo answers: N s"
# Stops any `weir serve` it started. Needs nbdinfo (libnbd-bin) and qemu-img
# (qemu-utils), installed with apt-get when missing; the default ports must be free.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
need() { command -v "$1" >/dev/null 2>&1; }
missing=()
need nbdinfo || missing+=(libnbd-bin)
need qemu-img || missing+=(qemu-utils)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null
fi
WORK="$(mktemp -d)"
export CARGO_HOME="$WORK/cargo-home"
DATA_HOME="$WORK/data-home"
mkdir -p "$CARGO_HOME" "$DATA_HOME"
pid=""
# The server runs below rustup's proxy and cargo (which execs it): stop the `weir`
# processes whose working directory is the clone.
cleanup() {
  for p in $(pgrep -x weir); do
    [ "$(readlink "/proc/$p/cwd")" = "$WORK/weir" ] && kill -INT "$p" 2>/dev/null
  done
  sleep 1; rm -rf "$WORK"
}
trap cleanup EXIT
if nbdinfo --list nbd://127.0.0.1 >/dev/null 2>&1; then
  echo "an NBD server already answers on 127.0.0.1:10809: stop it first" >&2; exit 2
fi
echo "uptime: $(uptime)"
t0=$(date +%s.%N)
git clone -q "$REPO" "$WORK/weir"
cd "$WORK/weir"
# The default data directory ($XDG_DATA_HOME/weir) lands in the temp dir.
XDG_DATA_HOME="$DATA_HOME" cargo run --release -- serve > "$WORK/serve.out" 2> "$WORK/serve.err" &
pid=$!
until nbdinfo --list nbd://127.0.0.1 > "$WORK/list.out" 2>&1; do
  kill -0 "$pid" 2>/dev/null || { echo "weir serve exited:"; tail -20 "$WORK/serve.err"; exit 1; }
  sleep 0.5
done
t1=$(date +%s.%N)
export_name=$(sed -n 's/^export="\(.*\)":$/\1/p' "$WORK/list.out" | head -1)
qemu-img info "nbd://127.0.0.1:10809/$export_name" | head -2
echo "exports listed: $(grep -c '^export=' "$WORK/list.out")"
grep -h "Finished" "$WORK/serve.err" || true
python3 -c "import sys; print(f'clone -> nbdinfo answers: {float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$t0" "$t1"
