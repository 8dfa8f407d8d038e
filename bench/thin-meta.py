#!/usr/bin/env python3
"""The peer of crates/weir-thin/examples/commit_cost.rs: the same grain-map
batches as SQLite transactions (WAL, synchronous=FULL, as an embedded ACID map
store would run), including writing and syncing the same 64 KiB grains' data
file first, so both sides pay for data + map durability.
    bench/thin-meta.py DIR"""
import os, sqlite3, statistics, sys, time

d = sys.argv[1]
db = sqlite3.connect(os.path.join(d, "map.sqlite"), isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS map (grain INTEGER PRIMARY KEY, slot INTEGER NOT NULL)")
data = os.open(os.path.join(d, "grains.data"), os.O_RDWR | os.O_CREAT, 0o600)
grains = 1 << 20
nxt = 0
slot = 0
block = b"\xa5" * 65536
for batch in (1, 16, 256, 4096):
    times = []
    for _ in range(7):
        pending = []
        for _ in range(batch):
            g = (nxt * 2654435761) % grains
            nxt += 1
            os.pwrite(data, block, slot * 65536)
            pending.append((g, slot))
            slot += 1
        t = time.perf_counter()
        os.fdatasync(data)
        db.execute("BEGIN")
        db.executemany("INSERT OR REPLACE INTO map VALUES (?, ?)", pending)
        db.execute("COMMIT")
        times.append((time.perf_counter() - t) * 1e3)
    print(f"sqlite map commit: {batch} entries: {statistics.median(times):.2f} ms (median of 7)")
