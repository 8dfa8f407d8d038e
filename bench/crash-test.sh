#!/usr/bin/env bash
# Long crash test (issue 3): SIGKILL `weir serve` in the middle of a verified write
# workload CYCLES times (default 200); after every restart each write acknowledged by
# a FLUSH or written with FUA, and each volume the admin API acknowledged, must be
# intact. Three tests: a plain volume; a thin clone beside a sibling while
# snapshots come and go; the same clone replicated to a second weir serve (the
# target compared with the last replicated snapshot every 4th restart). Prints
# cycles, writes verified and failures.
#   bench/crash-test.sh [CYCLES]
set -euo pipefail
cd "$(dirname "$0")/.."
cycles="${1:-200}"
WEIR_CRASH_CYCLES="$cycles" cargo test --release -p weir --test crash -- --nocapture 2>&1 \
  | grep -E "crash test:|test result|panicked|failures|cycle [0-9]+:" 
