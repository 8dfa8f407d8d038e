//! Throughput of the driver itself: 4 KiB random reads against nbdkit's `null`
//! plugin, the whole driver on one thread (one core).
//!
//! `cargo run --release -p weir-load --example null_iops -- [SECONDS] [QD] [CONNECTIONS] [TARGET]`
//!
//! Without TARGET it starts `nbdkit null` on a loopback port (nbdkit must be
//! installed). With `WEIR_LOAD_VERIFY=1` it runs 50/50 random reads and writes with
//! `--verify` against `nbdkit memory` instead. Prints IOPS, MB/s, latency and the
//! driver's CPU time (from /proc/self/stat); asserts nothing.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weir_load::{LoadOptions, LoadScenario, Target};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let qd: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let connections: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let verify = std::env::var("WEIR_LOAD_VERIFY").is_ok_and(|v| v == "1");
    let mut nbdkit = None;
    let target = match args.get(3) {
        Some(t) => t.clone(),
        None => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("free port");
            let child = Command::new("nbdkit")
                .args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .args(if verify { ["memory", "1G"] } else { ["null", "64G"] })
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    eprintln!("cannot start nbdkit ({e}); install it (apt-get install nbdkit) or pass a target");
                    std::process::exit(2);
                });
            nbdkit = Some(child);
            let until = Instant::now() + Duration::from_secs(5);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if Instant::now() > until {
                    eprintln!("nbdkit did not start");
                    std::process::exit(2);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            format!("nbd://127.0.0.1:{port}/")
        }
    };
    let vms = connections.max(1);
    let mut opts = LoadOptions::new(
        Target::parse_list(&target).expect("target"),
        LoadScenario::from_spec(&format!(
            "bs=4k,{},qd={qd},vms={vms}",
            if verify { "randrw" } else { "randread" }
        ))
        .expect("access specification"),
    );
    opts.verify = verify;
    opts.target_zeroed = verify;
    opts.duration = Some(Duration::from_secs_f64(seconds));
    opts.connections = Some(connections);
    let cpu_before = cpu_seconds();
    let out = weir_load::run(opts, &mut |_| {}).expect("load run");
    let cpu = cpu_seconds() - cpu_before;
    if let Some(mut c) = nbdkit {
        let _ = c.kill();
        let _ = c.wait();
    }
    let total = out.report.cases[0].total.clone().unwrap();
    println!(
        "weir load, one thread, {vms} VM(s) × QD {qd} over {connections} connection(s), 4 KiB {}, {seconds} s against {target}:",
        if verify {
            "random 50/50 read/write with --verify"
        } else {
            "random reads"
        }
    );
    println!(
        "  {:.0} IOPS, {:.1} MB/s, latency mean {:.3} ms, p50 {:.3}, p99 {:.3}, errors {}",
        total.iops,
        total.mbps,
        total.latency_ms.mean,
        total.latency_ms.p50,
        total.latency_ms.p99,
        out.io_errors
    );
    println!(
        "  driver CPU {cpu:.2} s (user+sys) over {seconds} s: {:.0}% of one core, {:.1} µs per I/O",
        cpu / seconds * 100.0,
        cpu * 1e6 / out.ios.max(1) as f64
    );
    if let Some(v) = out.verify {
        println!(
            "  verify: {} reads checked, {} mismatched sectors",
            v.reads_checked, v.mismatched_sectors
        );
    }
}

/// utime + stime of this process, seconds (Linux; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}
