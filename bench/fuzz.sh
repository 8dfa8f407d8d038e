#!/usr/bin/env bash
# Fuzzing of the NBD protocol (issue 15, docs/HARDENING.md "Fuzzing"):
#   bench/fuzz.sh                  # both: decoder (libFuzzer) and live server
#   bench/fuzz.sh decoder          # coverage-guided, structure-aware, in-process:
#                                  # weir_nbd::fuzz::server and ::client under libFuzzer,
#                                  # RUNS inputs each (default 10,000,000)
#   bench/fuzz.sh live             # SESSIONS mutated client sessions (default 1,000,000)
#                                  # against a real `weir serve` over TCP
# Knobs: RUNS, SESSIONS, SEED (live), MAX_TOTAL_TIME (s per decoder target, 0 = none).
# The decoder run grows fuzz/corpus/<target> and then minimises it (cargo fuzz cmin):
# commit what it adds; tests/fuzz_corpus.rs replays it on every test run. A crash
# lands in fuzz/artifacts/<target>/: copy it to fuzz/regressions/<target>/.
# Installs cargo-fuzz if missing. libFuzzer's instrumentation needs rustc's -Z
# flags; RUSTC_BOOTSTRAP=1 lets the machine's one (stable) toolchain take them.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(decoder live)
for run in "${runs[@]}"; do
  case "$run" in
    decoder)
      command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
      export RUSTC_BOOTSTRAP=1
      for target in server client; do
        mkdir -p "fuzz/corpus/$target"
        echo "== libFuzzer: $target, ${RUNS:-10000000} inputs"
        log="target/fuzz-$target.log"; mkdir -p target
        if ! cargo fuzz run -O "$target" "fuzz/corpus/$target" -- \
          -runs="${RUNS:-10000000}" -max_total_time="${MAX_TOTAL_TIME:-0}" \
          -max_len=4096 -timeout=10 -rss_limit_mb=1024 -print_final_stats=1 >"$log" 2>&1; then
          tail -40 "$log"; echo "FAILED: $target (input in fuzz/artifacts/$target, log $log)"; exit 1
        fi
        grep -E '^(#[0-9]+ +DONE|Done |stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|stat::peak_rss_mb)' "$log"
        cargo fuzz cmin -O "$target" "fuzz/corpus/$target" >/dev/null 2>&1
        echo "   corpus: $(ls "fuzz/corpus/$target" | wc -l) inputs after minimising"
      done ;;
    live)
      FUZZ_SESSIONS="${SESSIONS:-1000000}" FUZZ_SEED="${SEED:-1}" \
        cargo test -p weir --release --test fuzz_live -- --nocapture 2>&1 | grep -E '^(live fuzz|test |thread|session)' ;;
    *) echo "unknown run: $run (decoder | live)"; exit 2 ;;
  esac
done
