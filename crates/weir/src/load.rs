//! `weir load` on the command line: clap arguments, progress bar and printing; the
//! run itself is weir-load's (exit status 1 when [`run_command`] returns `Ok(false)`).

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;
use weir_load::{LoadOptions, LoadOutcome, LoadScenario, ScenarioSource, Target, TlsFiles};

#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// What to run: a scenario TOML file (its [[workload]]/[[model]]/[[vm]] part), a
    /// `weir sim` built-in scenario name, a profile (oltp, vdi-boot…, with overrides:
    /// `oltp,vms=8`) or a simple spec (`bs=4k,randread,qd=32,vms=4`)
    pub scenario: String,
    /// NBD exports to drive: nbd://HOST[:PORT]/EXPORT, or nbds://… over TLS (with
    /// --tls-ca, or libnbd's ?tls-certificates=DIR), comma-separated or repeated
    #[arg(long, short = 't', value_name = "URI[,URI…]", required = true)]
    pub target: Vec<String>,
    /// PEM file of the CA that signed the nbds:// servers' certificates (which must
    /// name the target's host)
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate for nbds:// targets: the identity their access groups
    /// see (with --tls-key)
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Measured wall-clock time: 30, 30s, 5m, 1h, 500ms (default: the scenario's
    /// duration_s divided by --time-scale, or 10 s); the scenario's warm-up runs before it
    #[arg(long, short = 'd', value_name = "TIME", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Model seconds per wall-clock second: 10 runs a 30-minute storm in 3 minutes
    #[arg(long, default_value_t = 1.0, value_name = "FACTOR")]
    pub time_scale: f64,
    /// Most NBD connections over all targets (default: up to 4 per target)
    #[arg(long, short = 'c', value_name = "N")]
    pub connections: Option<u32>,
    /// Write verifiable patterns and check every read; mismatches fail the run
    #[arg(long)]
    pub verify: bool,
    /// With --verify: the targets start zeroed, so never-written blocks must read as zeroes
    #[arg(long, requires = "verify")]
    pub target_zeroed: bool,
    /// With --verify: after the run, read back up to SIZE per target of what was
    /// written and check it (0: off)
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size)]
    pub final_check: u64,
    /// Most bytes the VMs' requests may hold in flight at once (the driver's
    /// buffers): past it requests wait for room, and the report says how many did
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub max_in_flight: u64,
    /// Seed for the models and the write patterns (default: the scenario's)
    #[arg(long)]
    pub seed: Option<u64>,
    /// Timeline interval, wall clock (default: 1 s)
    #[arg(long, value_name = "TIME", value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Print one JSON document instead of tables
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report with charts to FILE (checked before the run)
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// No progress bar
    #[arg(long, short)]
    pub quiet: bool,
    /// Fit the tables in N columns (default: the terminal's width, or unlimited when
    /// the output is not a terminal)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub width: Option<u16>,
}

/// `90`, `90s`, `1.5m`, `2h`, `250ms` → a duration.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let factor = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m, h)"
            ));
        }
    };
    let x: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 30s, 5m)"))?;
    let secs = x * factor;
    if !(secs.is_finite() && secs > 0.0 && secs <= 30.0 * 86400.0) {
        return Err(format!("{text:?}: must be > 0 and at most 30 days"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `0`, `4096`, `64MiB`, `1g` → bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    weir_load::parse_bytes(text)
}

impl LoadArgs {
    pub fn options(&self) -> Result<LoadOptions> {
        let targets = Target::parse_list(&self.target.join(","))?;
        let scenario = LoadScenario::load(&ScenarioSource::parse(
            &self.scenario,
            weir_sim::builtin_scenarios(),
        ))?;
        let mut o = LoadOptions::new(targets, scenario);
        o.duration = self.duration;
        o.time_scale = self.time_scale;
        o.connections = self.connections;
        o.verify = self.verify;
        o.target_zeroed = self.target_zeroed;
        o.seed = self.seed;
        o.timeline_interval = self.interval;
        o.final_check_bytes = self.final_check;
        o.max_bytes_in_flight = self.max_in_flight;
        o.tls = self.tls_ca.clone().map(|ca| TlsFiles {
            ca,
            cert_key: self.tls_cert.clone().zip(self.tls_key.clone()),
        });
        Ok(o)
    }
}

/// Runs `weir load`: progress bar on a terminal, the report on stdout (tables or
/// JSON), optional HTML; failures (I/O errors, broken connections, verify
/// mismatches) on stderr. `Ok(false)`: the run did not pass (exit non-zero).
pub fn run_command(args: &LoadArgs) -> Result<bool> {
    let opts = args.options()?;
    let scenario = std::path::Path::new(&args.scenario);
    let input: Vec<&std::path::Path> = scenario.is_file().then_some(scenario).into_iter().collect();
    let html = crate::sim::ReportFile::check(&args.html, &input, &[])?;
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(1000);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
                .expect("static template"),
        );
        bar
    });
    let mut on_progress = |p: &weir_load::LoadProgress| {
        if let Some(bar) = &bar {
            bar.set_position((p.elapsed_s / p.duration_s.max(1e-9) * 1000.0) as u64);
            bar.set_message(format!(
                "{:.0} IOPS, {} I/Os, {} errors, {} mismatches",
                p.iops, p.ios, p.errors, p.mismatched_reads
            ));
        }
    };
    let outcome = weir_load::run(opts, &mut on_progress).context("weir load")?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    print_outcome(args, &outcome, html)?;
    Ok(outcome.passed())
}

fn print_outcome(
    args: &LoadArgs,
    outcome: &LoadOutcome,
    html: Option<crate::sim::ReportFile>,
) -> Result<()> {
    if args.json {
        outln!("{}", weir_report::render_json(&outcome.report));
    } else {
        let options = weir_report::TextOptions {
            width: args
                .width
                .map(usize::from)
                .or_else(crate::sim::terminal_width),
            ..Default::default()
        };
        out!("{}", weir_report::render_text(&outcome.report, &options));
    }
    if let (Some(path), Some(file)) = (&args.html, html) {
        file.write(&weir_report::render_html(&outcome.report))?;
        if !args.json {
            errln!("HTML report written to {}", path.display());
        }
    }
    if let Some(v) = &outcome.verify {
        errln!(
            "verify: {} reads checked ({} sectors), {} mismatched sectors",
            v.reads_checked,
            v.sectors_checked,
            v.mismatched_sectors
        );
        for m in &v.first_mismatches {
            errln!("  mismatch: {m}");
        }
    }
    for e in outcome.first_errors.iter().take(5) {
        errln!("  error: {e}");
    }
    if outcome.held_for_byte_cap > 0 {
        errln!(
            "note: {} requests waited for --max-in-flight ({} bytes): the load ran below the depth its scenario asks for",
            outcome.held_for_byte_cap,
            args.max_in_flight
        );
    }
    let failures = outcome.failures();
    if failures.is_empty() {
        errln!("weir load: passed ({} I/Os)", outcome.ios);
    } else {
        errln!("weir load: FAILED: {}", failures.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn arguments_become_options() {
        let cli = Cli::try_parse_from([
            "weir-load",
            "--target",
            "nbd://127.0.0.1:10809/a,nbd://127.0.0.1/b",
            "-t",
            "nbd://[::1]/c",
            "--duration",
            "2m",
            "--time-scale",
            "10",
            "-c",
            "8",
            "--verify",
            "--target-zeroed",
            "--seed",
            "3",
            "--final-check",
            "1m",
            "--max-in-flight",
            "4GiB",
            "bs=4k,randrw",
        ])
        .unwrap();
        let o = cli.load.options().unwrap();
        assert_eq!(o.targets.len(), 3);
        assert_eq!(o.targets[2].host, "::1");
        assert_eq!(o.duration, Some(Duration::from_secs(120)));
        assert_eq!(
            (
                o.time_scale,
                o.connections,
                o.verify,
                o.target_zeroed,
                o.seed
            ),
            (10.0, Some(8), true, true, Some(3))
        );
        assert_eq!(o.scenario, LoadScenario::from_spec("bs=4k,randrw").unwrap());
        assert_eq!(o.final_check_bytes, 1 << 20);
        assert_eq!(o.max_bytes_in_flight, 4 << 30);
        let cli = Cli::try_parse_from([
            "weir-load",
            "-t",
            "nbd://h/x",
            "--final-check",
            "0",
            "bs=4k",
        ])
        .unwrap();
        assert_eq!(cli.load.options().unwrap().final_check_bytes, 0);
        let cli = Cli::try_parse_from(["weir-load", "-t", "nbd://h/x", "bs=4k"]).unwrap();
        assert_eq!(cli.load.options().unwrap().final_check_bytes, 256 << 20);
        assert_eq!(
            cli.load.options().unwrap().max_bytes_in_flight,
            weir_load::DEFAULT_MAX_BYTES_IN_FLIGHT
        );
        assert!(
            Cli::try_parse_from(["weir-load", "bs=4k"]).is_err(),
            "--target is required"
        );
        assert!(
            Cli::try_parse_from(["weir-load", "-t", "nbd://h/x", "--target-zeroed", "bs=4k"])
                .is_err(),
            "--target-zeroed needs --verify"
        );
        let cli = Cli::try_parse_from(["weir-load", "-t", "http://h/x", "bs=4k"]).unwrap();
        assert!(
            cli.load
                .options()
                .unwrap_err()
                .to_string()
                .contains("nbd://")
        );
    }

    #[test]
    fn tls_files_go_together() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["weir-load", "-t", "nbds://h/x"];
            args.extend(extra);
            args.push("bs=4k");
            Cli::try_parse_from(args)
        };
        let o = parse(&["--tls-ca", "ca.pem"])
            .unwrap()
            .load
            .options()
            .unwrap();
        assert!(o.targets[0].tls);
        assert_eq!(
            o.tls,
            Some(TlsFiles {
                ca: "ca.pem".into(),
                cert_key: None
            })
        );
        let o = parse(&["--tls-ca", "a", "--tls-cert", "c", "--tls-key", "k"])
            .unwrap()
            .load
            .options()
            .unwrap();
        assert_eq!(o.tls.unwrap().cert_key, Some(("c".into(), "k".into())));
        assert!(
            parse(&["--tls-ca", "a", "--tls-cert", "c"]).is_err(),
            "a cert needs its key"
        );
        assert!(parse(&["--tls-key", "k"]).is_err(), "a key needs its cert");
        assert!(
            parse(&["--tls-cert", "c", "--tls-key", "k"]).is_err(),
            "and the CA"
        );
        assert_eq!(parse(&[]).unwrap().load.options().unwrap().tls, None);
    }
}
