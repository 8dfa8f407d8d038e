//! Simulated I/Os per wall-clock second.
//!
//! `cargo bench -p weir-sim --bench sim_throughput [-- [engine|disk-array] [--digest]]`
//!
//! Two large scenarios, each run a few times after a warm-up run (median printed, per
//! wall second and per CPU second of this process: the machine may be shared):
//! - `engine`: 64 VMs on 4 hosts (host schedulers with shares and limits, PARDA windows,
//!   FC links, array-side QoS on 4 volumes) on an `ideal` array: the cost of the event
//!   loop, the weir-qos schedulers and the links.
//! - `disk-array`: OLTP (random 70:30 8K) from 8 VMs on a 24 × 15K SAS RAID 5
//!   weir-model array: adds the drive, RAID and cache models.

use std::time::Instant;
use weir_sim::Scenario;

mod common;
use common::{cpu_s, digest};

const ENGINE: &str = r#"
[scenario]
name = "bench-engine"
duration_s = 10

[datastore]
congestion = { enabled = true, threshold_ms = 30, period_ms = 250 }

[array]
ideal = { servers = 64, service_us = 100 }

[array_qos]
backend_concurrency = 128

[[policy]]
name = "capped"
limit_iops = 100000

[[volume]]
name = "v1"
policy = "mission-critical"
[[volume]]
name = "v2"
policy = "business-critical"
[[volume]]
name = "v3"
policy = "capped"
[[volume]]
name = "v4"

[[host]]
name = "h1"
link = "fc-8g"
queue_depth = 64
[[host]]
name = "h2"
link = "fc-8g"
queue_depth = 64
[[host]]
name = "h3"
link = "fc-8g"
queue_depth = 64
[[host]]
name = "h4"
link = "fc-8g"
queue_depth = 64

[[workload]]
name = "w"
block_kib = 4
read_pct = 70
random_pct = 100
outstanding_ios = 8

[[vm]]
name = "a"
host = "h1"
volume = "v1"
workload = "w"
count = 16
disk_gib = 4
[[vm]]
name = "b"
host = "h2"
volume = "v2"
workload = "w"
shares = "high"
count = 16
disk_gib = 4
[[vm]]
name = "c"
host = "h3"
volume = "v3"
workload = "w"
limit_iops = 5000
count = 16
disk_gib = 4
[[vm]]
name = "d"
host = "h4"
volume = "v4"
workload = "w"
shares = "low"
count = 16
disk_gib = 4
"#;

const DISK_ARRAY: &str = r#"
[scenario]
name = "bench-disk-array"
duration_s = 20

[array]
preset = "15k-sas-raid5x24"

[[host]]
name = "h1"
link = "fc-8g"
queue_depth = 256

[[vm]]
name = "oltp"
host = "h1"
workload = "oltp"
count = 8
disk_gib = 500
"#;

fn measure(name: &str, text: &str, runs: usize) {
    let scenario = match Scenario::from_toml_str(name, text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let _ = scenario.run(None, &mut |_| {});
    let (mut wall_rates, mut cpu_rates) = (Vec::new(), Vec::new());
    let mut ios = 0;
    let mut report = None;
    for _ in 0..runs {
        let (started, cpu0) = (Instant::now(), cpu_s());
        let r = scenario.run(None, &mut |_| {});
        let (wall_s, cpu) = (started.elapsed().as_secs_f64(), cpu_s() - cpu0);
        ios = r.cases.iter().map(|c| c.events).sum::<u64>();
        wall_rates.push(ios as f64 / wall_s);
        cpu_rates.push(ios as f64 / cpu.max(1e-9));
        report = Some(r);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{name:<12} {ios:>10} simulated I/Os, median of {runs}: {:>10.0} simulated I/Os per wall second, {:>10.0} per CPU second (CPU: {:.0}–{:.0})",
        median(&mut wall_rates),
        median(&mut cpu_rates),
        cpu_rates[0],
        cpu_rates[cpu_rates.len() - 1],
    );
    if let Some(report) = report
        && std::env::args().any(|a| a == "--digest")
    {
        println!("{name:<12} report digest {:016x}", digest(&report));
    }
}

fn main() {
    // `-- engine` or `-- disk-array` runs that case only.
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Runs per case: the disk-array case is short (≈ 0.3 s), so more of them.
    for (name, text, runs) in [("engine", ENGINE, 3), ("disk-array", DISK_ARRAY, 7)] {
        let named = args.iter().any(|a| a == "engine" || a == "disk-array");
        if !named || args.iter().any(|a| a == name) {
            measure(name, text, runs);
        }
    }
}
