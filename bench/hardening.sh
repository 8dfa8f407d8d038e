#!/usr/bin/env bash
# Hostile-client runs of issue 15 (docs/HARDENING.md), on the real `weir serve`:
#   bench/hardening.sh                 # both runs, full size
#   bench/hardening.sh unread          # a client pipelining 1,000,000 READs of 60 KiB
#                                      # that never reads a reply: server RSS above idle,
#                                      # fio's 4 KiB QD8 x4 throughput beside it vs alone
#   bench/hardening.sh flood           # 20,000 idle connections against a server limited
#                                      # to 1,024 descriptors, from one address and from 80:
#                                      # a client from 127.0.0.2 every 250 ms, served or
#                                      # refused and how fast; admin API; CPU; log size
# Knobs: HOSTILE_READS (1000000), PHASE_S (4), ROUNDS (5), FLOOD (20000),
# STEADY_S (5). WEIR_BIN=path runs another build of weir (e.g. one before the
# fixes; give it HOSTILE_READS=100000 then: unbounded, 1,000,000 replies of
# 60 KiB would take 60 GB). Needs fio (apt-get install fio) and, for the flood,
# enough descriptors in this shell for 9,000 connections per helper process.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(unread flood)
t() { cargo test -p weir --release --test hardening -- --ignored --nocapture --exact "$1" </dev/null 2>&1 | grep -E '^(RESULT|round|well-behaved|skipped)' ; }
for r in "${runs[@]}"; do
  case "$r" in
    unread) t bench_unread_replies ;;
    flood)
      FLOOD_HOSTS=1 t bench_idle_flood
      FLOOD_HOSTS=80 t bench_idle_flood ;;
    *) echo "unknown run '$r' (known: unread flood)" >&2; exit 2 ;;
  esac
done
