//! `weir sim`: load a scenario (file or built-in), run it, render the report.

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
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
    /// Also write a self-contained HTML report with charts to FILE
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
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

    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(scenario.case_names().len() as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} cases  {msg}",
            )
            .expect("static template"),
        );
        bar
    });
    let mut on_progress = |p: Progress| {
        if let Some(bar) = &bar {
            bar.set_position(p.cases_done as u64);
            bar.set_message(p.case.clone());
        }
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
        println!("{}", weir_report::render_json(&report));
    } else {
        print!(
            "{}",
            weir_report::render_text(&report, &weir_report::TextOptions::default())
        );
    }
    if let Some(path) = &args.html {
        std::fs::write(path, weir_report::render_html(&report))
            .with_context(|| format!("writing HTML report to {}", path.display()))?;
        if !args.json {
            eprintln!("HTML report written to {}", path.display());
        }
    }
    Ok(())
}
