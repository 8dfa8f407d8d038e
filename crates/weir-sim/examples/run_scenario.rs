//! Runs a scenario file (or a shipped scenario by name) and prints a summary:
//! `cargo run --release -p weir-sim --example run_scenario -- scenarios/sioc-shares.toml [case-filter] [--json | --text]`

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(target) = args.first() else {
        eprintln!("usage: run_scenario <file.toml | shipped name> [case filter] [--json | --text]");
        std::process::exit(2);
    };
    let json = args.iter().any(|a| a == "--json");
    let filter = args.iter().skip(1).find(|a| !a.starts_with("--"));
    let loaded = match weir_sim::Scenario::builtin(target) {
        Some(r) => r,
        None => weir_sim::Scenario::from_file(target),
    };
    let mut scenario = match loaded {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    if let Some(f) = filter {
        scenario.retain_cases(f);
    }
    let started = std::time::Instant::now();
    let report = scenario.run(None, &mut |_| {});
    let wall = started.elapsed().as_secs_f64();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
        return;
    }
    if args.iter().any(|a| a == "--text") {
        let opts = weir_report::TextOptions::default();
        println!("{}", weir_report::render_text(&report, &opts));
        return;
    }
    let events: u64 = report.cases.iter().map(|c| c.events).sum();
    for c in &report.cases {
        println!(
            "== {} ({:.0} s measured, {} I/Os)",
            c.name, c.duration_s, c.events
        );
        for w in c.workloads.iter().chain(c.total.iter()) {
            println!(
                "   {:<16} {:>9.1} IOPS {:>8.1} MB/s  lat mean {:>7.2} p99 {:>7.2} ms",
                w.name, w.iops, w.mbps, w.latency_ms.mean, w.latency_ms.p99
            );
        }
        for comp in c.components.iter().filter(|x| x.kind != "drive") {
            println!(
                "   [{:<10}] {:<22} util {:>5.1}%  {:>8.1} MB/s",
                comp.kind,
                comp.name,
                comp.utilisation * 100.0,
                comp.mbps
            );
        }
        for cmp in &c.comparisons {
            println!(
                "   cmp {:<36} weir {:>9.1} seed {:>9.1} ({:+.0}%)",
                cmp.metric,
                cmp.weir,
                cmp.seed,
                (cmp.ratio() - 1.0) * 100.0
            );
        }
    }
    eprintln!(
        "{} simulated I/Os in {:.2} s wall ({:.0} I/Os per s)",
        events,
        wall,
        events as f64 / wall
    );
}
