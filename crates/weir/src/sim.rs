//! `weir sim`: load a scenario (file or built-in), run it, render the report.

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use weir_sim::{Progress, Scenario};

/// The scenario `weir sim` runs when given none.
pub const DEFAULT_SCENARIO: &str = "sioc-shares";

#[derive(clap::Args)]
pub struct SimArgs {
    /// Scenario: a TOML file, or the name of a built-in (see --list). Default: sioc-shares
    scenario: Option<String>,
    /// Seed for every random choice (default: the scenario's own); same seed, same output
    #[arg(long)]
    seed: Option<u64>,
    /// Print one JSON document instead of tables
    #[arg(long)]
    json: bool,
    /// Also write the JSON document to FILE (checked before the run)
    #[arg(long, value_name = "FILE")]
    json_out: Option<PathBuf>,
    /// Also write a self-contained HTML report with charts to FILE (checked before the run)
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Print only the summary: the tally (seed predictions within ±20%, calibrations
    /// not counted, targets passed), one line per case, every compared figure by kind
    #[arg(long)]
    summary: bool,
    /// Fit the tables in N columns (default: the terminal's width, or unlimited when
    /// the output is not a terminal)
    #[arg(long, value_name = "N")]
    width: Option<usize>,
    /// Multiply every case's simulated warm-up and run time by F (0 < F <= 1) for a quick look
    #[arg(long, value_name = "F")]
    scale_duration: Option<f64>,
    /// Run only the cases whose name contains TEXT
    #[arg(long, value_name = "TEXT")]
    case: Option<String>,
    /// List the built-in scenarios and exit
    #[arg(long)]
    list: bool,
    /// No progress bar
    #[arg(long, short)]
    quiet: bool,
    /// Run up to N cases at once, one per thread (default: the machine's cores);
    /// the report is the same whatever N is
    #[arg(long, short, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    jobs: Option<u16>,
}

fn load(name_or_path: &str) -> Result<Scenario> {
    if let Some((_, text)) = weir_sim::builtin_scenarios()
        .iter()
        .find(|(n, _)| *n == name_or_path)
    {
        return Ok(Scenario::from_toml_str(
            &format!("{name_or_path} (built-in)"),
            text,
        )?);
    }
    let path = PathBuf::from(name_or_path);
    if !path.exists() {
        let names: Vec<&str> = weir_sim::builtin_scenarios()
            .iter()
            .map(|(n, _)| *n)
            .collect();
        bail!(
            "no scenario file {name_or_path:?} and no built-in of that name (built-ins: {})",
            names.join(", ")
        );
    }
    Ok(Scenario::from_file(&path)?)
}

/// A report file: checked before the run (a path that cannot be written fails
/// before a run that may take minutes), written after it to a file beside and
/// renamed over the path, so a failed or interrupted run leaves what was there.
pub(crate) struct ReportFile {
    path: PathBuf,
}

impl ReportFile {
    /// Checks that `path` can be written: a scratch file beside it is created and
    /// removed (the path itself is not touched). `inputs` are files the run reads
    /// (its scenario) and `others` the other report paths: a report over one of
    /// them is refused.
    pub(crate) fn check(
        path: &Option<PathBuf>,
        inputs: &[&Path],
        others: &[&Option<PathBuf>],
    ) -> Result<Option<ReportFile>> {
        let Some(path) = path else {
            return Ok(None);
        };
        let same = |other: &Path| same_file(path, other);
        if let Some(i) = inputs.iter().find(|i| same(i)) {
            bail!(
                "the report {} would overwrite the scenario it runs ({})",
                path.display(),
                i.display()
            );
        }
        if others.iter().filter_map(|o| o.as_deref()).any(same) {
            bail!(
                "two reports are to be written to {}: give each its own file",
                path.display()
            );
        }
        if path.is_dir() {
            bail!(
                "cannot write the report to {}: it is a directory",
                path.display()
            );
        }
        let scratch = scratch_path(path);
        std::fs::File::create(&scratch).with_context(|| {
            format!(
                "cannot write the report to {} (checked before running)",
                path.display()
            )
        })?;
        let _ = std::fs::remove_file(&scratch);
        Ok(Some(ReportFile { path: path.clone() }))
    }

    /// Writes `text` beside the path, then renames it over the path.
    pub(crate) fn write(&self, text: &str) -> Result<()> {
        let scratch = scratch_path(&self.path);
        let written =
            std::fs::write(&scratch, text).and_then(|()| std::fs::rename(&scratch, &self.path));
        if written.is_err() {
            let _ = std::fs::remove_file(&scratch);
        }
        written.with_context(|| format!("writing the report to {}", self.path.display()))
    }
}

/// `.NAME.weir-tmp-PID` in the directory of `path`.
fn scratch_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or("report".into(), |n| n.to_string_lossy());
    path.with_file_name(format!(".{name}.weir-tmp-{}", std::process::id()))
}

/// Whether `a` and `b` name the same file (the same text, or one existing file).
fn same_file(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// The terminal's width in columns, from `COLUMNS` or the terminal itself; `None`
/// when the output is not a terminal.
pub(crate) fn terminal_width() -> Option<usize> {
    if let Some(n) = std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()) {
        return Some(n);
    }
    if !std::io::stdout().is_terminal() {
        return None;
    }
    ratatui::crossterm::terminal::size()
        .ok()
        .map(|(columns, _)| columns as usize)
        .filter(|&c| c > 0)
}

/// Where a run is as a fraction of all the simulated time it has to cover, and the
/// wall time left at the rate so far (`None` until there is a rate).
pub(crate) fn progress_eta(
    done_s: f64,
    total_s: f64,
    elapsed: std::time::Duration,
) -> (f64, Option<std::time::Duration>) {
    if total_s.is_nan() || total_s <= 0.0 {
        return (0.0, None);
    }
    let fraction = (done_s / total_s).clamp(0.0, 1.0);
    let eta = (fraction > 0.0 && elapsed.as_secs_f64() > 0.0).then(|| {
        std::time::Duration::from_secs_f64(elapsed.as_secs_f64() * (1.0 - fraction) / fraction)
    });
    (fraction, eta)
}

pub fn run(args: SimArgs) -> Result<()> {
    if args.list {
        for (name, text) in weir_sim::builtin_scenarios() {
            let description = Scenario::from_toml_str(name, text)
                .map(|s| s.description)
                .unwrap_or_default();
            println!("{name:<24} {description}");
        }
        return Ok(());
    }
    let mut scenario = load(args.scenario.as_deref().unwrap_or(DEFAULT_SCENARIO))?;
    if let Some(pattern) = &args.case {
        scenario.retain_cases(pattern);
        if scenario.case_names().is_empty() {
            bail!("no case of this scenario has {pattern:?} in its name");
        }
    }
    if let Some(f) = args.scale_duration {
        if !(f > 0.0 && f <= 1.0) {
            bail!("--scale-duration must be in (0, 1], not {f}");
        }
        scenario.scale_duration(f);
    }

    if args.width == Some(0) {
        bail!("--width must be at least 1");
    }
    let input: Vec<&Path> = args
        .scenario
        .as_deref()
        .map(Path::new)
        .filter(|p| p.exists())
        .into_iter()
        .collect();
    let json_file = ReportFile::check(&args.json_out, &input, &[&args.html])?;
    let html_file = ReportFile::check(&args.html, &input, &[&args.json_out])?;

    // Progress in simulated time over all the cases (the cases' lengths differ), with
    // the wall time left at the rate so far.
    let lengths = scenario.case_simulated_s();
    let total_s: f64 = lengths.iter().sum();
    let started = std::time::Instant::now();
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(1000);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
                .expect("static template"),
        );
        bar
    });
    // Cases run in parallel (-j): each case's own simulated time so far, by name.
    let names = scenario.case_names();
    let mut case_done_s = vec![0.0f64; names.len()];
    let mut finished = 0;
    let mut on_progress = |p: Progress| {
        let Some(bar) = &bar else { return };
        if let Some(i) = names.iter().position(|n| *n == p.case) {
            case_done_s[i] = if p.cases_done > finished {
                lengths[i]
            } else {
                case_done_s[i].max(p.simulated_s.min(p.case_simulated_s))
            };
        }
        finished = finished.max(p.cases_done);
        let (fraction, eta) = progress_eta(case_done_s.iter().sum(), total_s, started.elapsed());
        bar.set_position((fraction * 1000.0) as u64);
        bar.set_message(format!(
            "{:.0}%  {}/{} cases done, now {}  ETA {}",
            fraction * 100.0,
            p.cases_done,
            p.cases_total,
            p.case,
            eta.map_or("…".to_string(), |d| indicatif::HumanDuration(d)
                .to_string())
        ));
    };
    let jobs = args.jobs.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let no_faults = |_: &str, _: u64| -> Box<dyn weir_sim::fault::FaultInjector> {
        Box::new(weir_sim::fault::NoFaults)
    };
    let report = scenario.run_jobs(args.seed, jobs, &no_faults, &mut on_progress);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }

    if args.json {
        outln!("{}", weir_report::render_json(&report));
    } else {
        let options = weir_report::TextOptions {
            width: args.width.or_else(terminal_width),
            summary: args.summary,
            ..Default::default()
        };
        out!("{}", weir_report::render_text(&report, &options));
    }
    if let Some(file) = json_file {
        file.write(&format!("{}\n", weir_report::render_json(&report)))?;
    }
    if let (Some(path), Some(file)) = (&args.html, html_file) {
        file.write(&weir_report::render_html(&report))?;
        if !args.json {
            errln!("HTML report written to {}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::progress_eta;
    use std::time::Duration;

    #[test]
    fn eta_follows_the_rate_so_far() {
        let (f, eta) = progress_eta(25.0, 100.0, Duration::from_secs(10));
        assert_eq!(f, 0.25);
        assert_eq!(eta, Some(Duration::from_secs(30)));
        assert_eq!(progress_eta(0.0, 100.0, Duration::from_secs(3)).1, None);
        assert_eq!(progress_eta(5.0, 0.0, Duration::from_secs(3)), (0.0, None));
        assert_eq!(
            progress_eta(150.0, 100.0, Duration::from_secs(3)).1,
            Some(Duration::ZERO)
        );
    }
}
