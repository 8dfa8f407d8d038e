//! Flash cache replacement policies on the workload models' traces (issue 12):
//! LRU and SLRU (weir-model's `BlockCache`, what the flash cache runs), exact
//! LRU, ARC, S3-FIFO and 2Q, each behind the flash cache's own rules (whole-read
//! hits, fills of whole blocks, the 4 MiB sequential-scan cutoff, writes
//! invalidate), at 1, 5, 10 and 25 % of the trace's footprint.
//!
//! `bench/run cache-policies`, or
//! `cargo run --release -p weir-model --example cache_policies -- [oltp] [vdi] [vdi-shared] [--json] [--seed N] [--desktops N] [--block-kib K]`
//!
//! Traces (deterministic by seed; docs/PERFORMANCE.md gives the figures):
//! * `oltp`: mixed-workload-cache's SQL VMs (seed 000's test scenario 2): 4 VMs
//!   of DVD Store heavy (12 threads, no think time, 4 vCPUs, a 50 GiB database,
//!   the model's skew: 80 % of the reads in a hot 20 %), 8 KiB reads; the log is
//!   not cached (000), the checkpoint's page writes invalidate. 600 s warm-up
//!   (the scenario's), then 1,400 s measured. One volume per VM.
//! * `vdi`: one host's pool of vdi-week's desktops (seed 004's model): power-on
//!   of every desktop (the model's 128 at a time over 4 pools: 32 here), Monday
//!   login (after the reboot) from 300 s, one every 0.624 s over the 4 pools,
//!   then steady work to 1,200 s. Keys per volume: each desktop is a linked
//!   clone, its own volume, as `weir volume clone` makes them (the flash cache
//!   is not clone-aware: the image's blocks are cached once per desktop). From
//!   cold (the cache is volatile: a host reboot empties it), all measured.
//! * `vdi-shared`: the same requests with the image's blocks keyed once for all
//!   desktops (what a clone-aware cache would see; Weir's is not).
//!
//! The models run against storage of a fixed 0.5 ms (a closed loop: latency only
//! moves when requests are issued, not which).

use std::collections::HashSet;

use serde::Serialize;
use weir_model::policy_lab::{Lru, Policy, PolicyKind, Replay, ReplayStats, TraceIo};
use weir_workload::{Direction, IoGenerator, ModelSpec, drive_fixed_latency};

const GIB: u64 = 1 << 30;
const S: u64 = 1_000_000_000;
const LATENCY_NS: u64 = 500_000;
const SIZES_PCT: [f64; 4] = [1.0, 5.0, 10.0, 25.0];
const SCAN_BYTES: u64 = 4 << 20;

struct Trace {
    name: &'static str,
    description: String,
    ios: Vec<TraceIo>,
    /// Requests before this index warm the cache and are not counted.
    warm: usize,
}

#[derive(Serialize)]
struct Cell {
    policy: &'static str,
    hit_ratio: f64,
    byte_hit_ratio: f64,
    stats: ReplayStats,
}

#[derive(Serialize)]
struct Row {
    pct_of_footprint: f64,
    capacity_blocks: u32,
    results: Vec<Cell>,
}

#[derive(Serialize)]
struct TraceReport {
    trace: &'static str,
    description: String,
    seed: u64,
    block_bytes: u32,
    scan_cutoff_bytes: u64,
    requests: usize,
    warm_up_requests: usize,
    reads: u64,
    read_bytes: u64,
    writes: u64,
    footprint_blocks: u64,
    /// Every block of the footprint fits (no eviction): the compulsory-miss ceiling.
    unbounded: ReplayStats,
    rows: Vec<Row>,
}

fn model(toml_text: &str) -> ModelSpec {
    toml::from_str(toml_text).expect("model spec")
}

fn oltp(seed: u64) -> Trace {
    let spec = model(
        "kind = \"oltp\"\nname = \"dvdstore-heavy\"\nthreads = 12\nthink_ms = 0\ndatabase_gib = 50\nvcpus = 4",
    );
    let mut gens: Vec<Box<dyn IoGenerator + Send>> = (0..4u64)
        .map(|vm| spec.build(120 * GIB, seed * 1000 + vm, 0, 1).unwrap())
        .collect();
    let (warm_s, measured_s) = (600, 1400);
    let mut ios = Vec::new();
    let mut warm = 0;
    drive_fixed_latency(&mut gens, LATENCY_NS, (warm_s + measured_s) * S, |t| {
        if !t.host_cacheable {
            return;
        }
        if t.at_ns < warm_s * S {
            warm += 1;
        }
        ios.push(TraceIo {
            volume: t.source,
            offset: t.io.offset_bytes,
            length: t.io.size_bytes,
            write: t.io.dir == Direction::Write,
        });
    });
    Trace {
        name: "oltp",
        description: format!(
            "4 VMs × DVD Store heavy (mixed-workload-cache: 12 threads, think 0 ms, 4 vCPUs, 50 GiB database, 80 % of reads in the hot 20 %, 8 KiB pages; log not cached), {warm_s} s warm-up + {measured_s} s measured"
        ),
        ios,
        warm,
    }
}

fn vdi(seed: u64, desktops: u32, shared: bool) -> Trace {
    let spec = model(&format!(
        "kind = \"vdi\"\nname = \"acme\"\ndesktops = {desktops}\nimage_gib = 24\npower_on_at_s = 0\nmax_concurrent_power_on = 128\nlogin = \"monday\"\nlogin_at_s = 300\nlogin_interval_s = 0.624\napps_per_login = 1"
    ));
    let ModelSpec::Vdi(v) = &spec else {
        unreachable!()
    };
    let image = (v.image_gib * GIB as f64) as u64;
    let volume = 200 * GIB;
    let private = (volume - image) / desktops as u64;
    // Instance 0 of the model's 4 pools (one host): the schedule's share.
    let mut gens = vec![spec.build(volume, seed, 0, 4).unwrap()];
    let end_s = 1200;
    let mut ios = Vec::new();
    drive_fixed_latency(&mut gens, LATENCY_NS, end_s * S, |t| {
        let off = t.io.offset_bytes;
        // Per-volume keys: desktop d's clone holds the image and its own area.
        // Shared: the image's blocks are one volume's (after the desktops').
        let desktop = if off < image {
            if shared { desktops } else { t.clone }
        } else {
            ((off - image) / private) as u32
        };
        ios.push(TraceIo {
            volume: desktop,
            offset: off,
            length: t.io.size_bytes,
            write: t.io.dir == Direction::Write,
        });
    });
    let keys = if shared {
        "the image's blocks cached once for all desktops (a clone-aware cache; sequential detection on the image pooled), each desktop's own area per desktop"
    } else {
        "one volume per desktop (linked clones)"
    };
    Trace {
        name: if shared { "vdi-shared" } else { "vdi" },
        description: format!(
            "{desktops} desktops of vdi-week's model (24 GiB image, 20,900 I/Os a boot, 32 power-ons at a time), power-on at 0 s, Monday login from 300 s (one every 2.5 s), steady state to {end_s} s; {keys}, from cold"
        ),
        ios,
        warm: 0,
    }
}

fn replay(policy: Box<dyn Policy>, trace: &Trace, block_bytes: u32) -> ReplayStats {
    let mut r = Replay::new(policy, block_bytes, SCAN_BYTES);
    for (i, io) in trace.ios.iter().enumerate() {
        if i == trace.warm {
            r.reset_stats();
        }
        r.apply(io);
    }
    r.stats()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let value = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name} {v}: not a number"))
            })
            .unwrap_or(default)
    };
    let seed = value("--seed", 1);
    let desktops = value("--desktops", 150) as u32;
    let block_bytes = (value("--block-kib", 4) * 1024) as u32;
    let mut names: Vec<&str> = args
        .iter()
        .filter(|a| matches!(a.as_str(), "oltp" | "vdi" | "vdi-shared"))
        .map(|a| a.as_str())
        .collect();
    if names.is_empty() {
        names = vec!["oltp", "vdi", "vdi-shared"];
    }
    let mut reports = Vec::new();
    for name in names {
        let started = std::time::Instant::now();
        let trace = match name {
            "oltp" => oltp(seed),
            "vdi" => vdi(seed, desktops, false),
            _ => vdi(seed, desktops, true),
        };
        let shift = block_bytes.trailing_zeros();
        let mut footprint = HashSet::new();
        let (mut reads, mut read_bytes, mut writes) = (0u64, 0u64, 0u64);
        for io in &trace.ios {
            if io.write {
                writes += 1;
                continue;
            }
            reads += 1;
            read_bytes += io.length as u64;
            let end = (io.offset + io.length as u64).div_ceil(block_bytes as u64);
            for b in io.offset >> shift..end {
                footprint.insert(((io.volume as u128) << 64) | b as u128);
            }
        }
        let footprint_blocks = footprint.len() as u64;
        drop(footprint);
        eprintln!(
            "{}: {} requests ({reads} reads), footprint {footprint_blocks} blocks, traced in {:.1} s",
            trace.name,
            trace.ios.len(),
            started.elapsed().as_secs_f64()
        );
        let unbounded = replay(
            Box::new(Lru::new(footprint_blocks as u32)),
            &trace,
            block_bytes,
        );
        let mut rows = Vec::new();
        for pct in SIZES_PCT {
            let capacity = (footprint_blocks as f64 * pct / 100.0).round() as u32;
            let mut results = Vec::new();
            for kind in PolicyKind::ALL {
                let t0 = std::time::Instant::now();
                let stats = replay(kind.build(capacity), &trace, block_bytes);
                eprintln!(
                    "  {pct:>4} % {:<18} {:6.2} % ({:.1} s)",
                    kind.label(),
                    stats.hit_ratio() * 100.0,
                    t0.elapsed().as_secs_f64()
                );
                results.push(Cell {
                    policy: kind.label(),
                    hit_ratio: stats.hit_ratio(),
                    byte_hit_ratio: stats.byte_hit_ratio(),
                    stats,
                });
            }
            rows.push(Row {
                pct_of_footprint: pct,
                capacity_blocks: capacity,
                results,
            });
        }
        reports.push(TraceReport {
            trace: trace.name,
            description: trace.description.clone(),
            seed,
            block_bytes,
            scan_cutoff_bytes: SCAN_BYTES,
            requests: trace.ios.len(),
            warm_up_requests: trace.warm,
            reads,
            read_bytes,
            writes,
            footprint_blocks,
            unbounded,
            rows,
        });
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&reports).unwrap());
        return;
    }
    for r in &reports {
        print_table(r);
    }
}

fn print_table(r: &TraceReport) {
    let gib = |blocks: u64| blocks as f64 * r.block_bytes as f64 / GIB as f64;
    println!("## {} (seed {})", r.trace, r.seed);
    println!();
    println!("{}.", r.description);
    println!(
        "{} requests ({} warm-up), whole trace: {} reads ({:.1} GiB), {} writes; footprint {} blocks of {} KiB ({:.1} GiB read); scan cutoff {} MiB.",
        r.requests,
        r.warm_up_requests,
        r.reads,
        r.read_bytes as f64 / GIB as f64,
        r.writes,
        r.footprint_blocks,
        r.block_bytes / 1024,
        gib(r.footprint_blocks),
        r.scan_cutoff_bytes >> 20
    );
    println!(
        "Measured reads: {}; a cache holding the whole footprint (no eviction) hits {:.1} % ({:.1} % of bytes).",
        r.unbounded.reads,
        r.unbounded.hit_ratio() * 100.0,
        r.unbounded.byte_hit_ratio() * 100.0
    );
    println!();
    print!("| cache (of footprint) |");
    for c in &r.rows[0].results {
        print!(" {} |", c.policy);
    }
    println!();
    print!("|---|");
    for _ in &r.rows[0].results {
        print!("---:|");
    }
    println!();
    for row in &r.rows {
        print!(
            "| {} % ({:.1} GiB) |",
            row.pct_of_footprint,
            gib(row.capacity_blocks as u64)
        );
        let best = row
            .results
            .iter()
            .map(|c| c.hit_ratio)
            .fold(f64::MIN, f64::max);
        for c in &row.results {
            let mark = if c.hit_ratio == best { "**" } else { "" };
            print!(
                " {mark}{:.2}{mark} / {:.2} |",
                c.hit_ratio * 100.0,
                c.byte_hit_ratio * 100.0
            );
        }
        println!();
    }
    println!();
    println!(
        "Cells: request hit ratio / byte hit ratio, % of the measured reads (best request ratio in bold)."
    );
    println!();
}
