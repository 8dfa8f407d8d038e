//! `weir sim` and `weir load` as a user runs them: every shipped scenario with `--json`, determinism
//! across processes, and errors that name the file, line and field.

use std::path::PathBuf;
use std::process::Command;

use weir_testkit::TempDir;

fn weir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn shipped_scenarios() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("scenarios"))
        .expect("scenarios/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "expected the shipped scenarios, found {files:?}"
    );
    files
}

#[test]
fn every_shipped_scenario_runs_with_json() {
    for file in shipped_scenarios() {
        // A fiftieth of each case's simulated time: this checks the command and the
        // document's shape for every file; the scenarios' figures are checked at
        // length by weir-sim's own tests.
        let mut cmd = weir();
        cmd.args(["sim", "-q", "--json", "--scale-duration", "0.02"])
            .arg(&file);
        if file.ends_with("vdi-week.toml") {
            // Its phases of 2,500 desktops take minutes even shortened: one phase here.
            cmd.args(["--case", "steady-state"]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{}: stdout is not JSON: {e}", file.display()));
        let cases = doc["cases"].as_array().expect("cases array");
        assert!(!cases.is_empty(), "{}: no cases", file.display());
        for case in cases {
            let workloads = case["workloads"].as_array().expect("workloads");
            assert!(
                !workloads.is_empty(),
                "{}: case {} has no workloads",
                file.display(),
                case["name"]
            );
            for w in workloads {
                // A latency for every workload that completed I/O; none (null, not
                // 0 ms) for one that did not (e.g. desktops not yet powered on).
                let idle = w["ios"].as_u64() == Some(0);
                for key in ["mean", "p50", "p95", "p99"] {
                    let v = &w["latency_ms"][key];
                    assert!(
                        if idle { v.is_null() } else { v.is_number() },
                        "{}: {} latency_ms.{key} is {v} with {} I/Os",
                        file.display(),
                        w["name"],
                        w["ios"]
                    );
                }
                assert!(w["iops"].as_f64().unwrap() >= 0.0);
                assert!(w["mbps"].as_f64().unwrap() >= 0.0);
            }
        }
    }
}

#[test]
fn same_seed_same_bytes_across_processes() {
    let run = |seed: &str| {
        weir()
            .args(["sim", "-q", "--json", "hba-8g-vs-4g", "--seed", seed])
            // A fifth of the length proves the same (every case still runs).
            .args(["--scale-duration", "0.2"])
            .output()
            .unwrap()
            .stdout
    };
    let a = run("7");
    assert!(!a.is_empty());
    assert_eq!(
        a,
        run("7"),
        "same scenario and seed must print identical output"
    );
}

#[test]
fn default_scenario_prints_tables_and_html() {
    let dir = TempDir::new("cli-html");
    let html = dir.join("report.html");
    let out = weir()
        .args(["sim", "-q", "--html"])
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("sioc-shares"),
        "the embedded default is sioc-shares: {text}"
    );
    assert!(text.contains("Weir vs seed"));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") || page.starts_with("<!doctype html>"));
    assert!(page.contains("<svg"));
}

#[test]
fn bad_scenario_names_file_line_and_field() {
    let dir = TempDir::new("cli-bad");
    let file = dir.join("bad.toml");
    let good = std::fs::read_to_string(repo_root().join("scenarios/qos-invariants.toml")).unwrap();
    // Misspell a field on a known line.
    let (line_no, _) = good
        .lines()
        .enumerate()
        .find(|(_, l)| l.starts_with("queue_depth"))
        .unwrap();
    let bad: String = good
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == line_no {
                l.replace("queue_depth", "queue_dept")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&file, bad).unwrap();
    let out = weir().args(["sim", "-q"]).arg(&file).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml"), "names the file: {err}");
    assert!(
        err.contains(&format!(":{}:", line_no + 1)),
        "names line {}: {err}",
        line_no + 1
    );
    assert!(err.contains("queue_dept"), "names the field: {err}");
    assert!(!err.contains("panicked"), "{err}");

    let out = weir()
        .args(["sim", "-q", "no-such-scenario"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("built-ins"));
}

/// A report is written beside its path and renamed over it: a run that fails
/// leaves the old report whole (session 30: `weir load --html` emptied it); a
/// report over the scenario it runs, or two reports to one file, are refused;
/// an unwritable standard output is an error, not a panic.
#[test]
fn reports_replace_their_files_only_when_written() {
    let dir = TempDir::new("cli-reports");
    let keep = dir.join("keep.html");
    std::fs::write(&keep, "OLD").unwrap();
    let out = weir()
        .args([
            "load",
            "-q",
            "-d",
            "1s",
            "--target",
            "nbd://127.0.0.1:1/x",
            "bs=4k",
            "--html",
        ])
        .arg(&keep)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        std::fs::read_to_string(&keep).unwrap(),
        "OLD",
        "the old report was touched"
    );
    let scenario = repo_root().join("scenarios").join("qos-invariants.toml");
    let copy = dir.join("s.toml");
    std::fs::copy(&scenario, &copy).unwrap();
    let out = weir()
        .args(["sim", "-q"])
        .arg(&copy)
        .arg("--html")
        .arg(&copy)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("would overwrite the scenario"), "{err}");
    let same = dir.join("same.out");
    let out = weir()
        .args(["sim", "-q", "qos-invariants", "--json-out"])
        .arg(&same)
        .arg("--html")
        .arg(&same)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("two reports"), "{err}");
    let full = std::fs::File::create("/dev/full");
    if let Ok(full) = full {
        let out = weir()
            .args(["sim", "-q", "qos-invariants", "--scale-duration", "0.05"])
            .stdout(full)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("cannot write the output") && !err.contains("panicked"),
            "{err}"
        );
    } else {
        println!("skipped: no /dev/full here");
    }
}

#[test]
fn report_paths_are_checked_before_the_run() {
    let dir = TempDir::new("cli-paths");
    for flag in ["--html", "--json-out"] {
        let bad = dir.join("no-such-dir").join("report");
        let started = std::time::Instant::now();
        // The full vdi-week would take many minutes: failing fast means before it.
        let out = weir()
            .args(["sim", "-q", "vdi-week", flag])
            .arg(&bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{flag}: failed only after {:?}",
            started.elapsed()
        );
        assert!(out.stdout.is_empty(), "{flag}: no report printed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("checked before running") && err.contains("no-such-dir"),
            "{flag}: {err}"
        );
    }
    // `weir load` too: before connecting to anything (this target is closed).
    let bad = dir.join("no-such-dir").join("report.html");
    let out = weir()
        .args([
            "load",
            "--target",
            "nbd://127.0.0.1:1/x",
            "-d",
            "5s",
            "app-profiles",
            "--html",
        ])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("checked before running") && err.contains("no-such-dir"),
        "load: {err}"
    );
    // A good --json-out path gets the same document as --json.
    let file = dir.join("report.json");
    let out = weir()
        .args([
            "sim",
            "-q",
            "--json",
            "--scale-duration",
            "0.05",
            "qos-invariants",
            "--json-out",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read(&file).unwrap(), out.stdout);
}

#[test]
fn text_fits_the_width_and_summary_is_short() {
    let columns = |text: &str| text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    let run = |args: &[&str], env_columns: Option<&str>| {
        let mut cmd = weir();
        cmd.args(["sim", "-q", "--scale-duration", "0.1", "hba-8g-vs-4g"])
            .args(args)
            .env_remove("COLUMNS");
        if let Some(c) = env_columns {
            cmd.env("COLUMNS", c);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let wide = run(&[], None);
    assert!(columns(&wide) > 80, "not a terminal, no COLUMNS: no limit");
    let narrow = run(&["--width", "80"], None);
    assert!(columns(&narrow) <= 80, "{}", columns(&narrow));
    // The terminal's width (COLUMNS) when no --width is given.
    assert!(columns(&run(&[], Some("72"))) <= 72);
    let summary = run(&["--summary"], None);
    assert!(summary.lines().count() < 40, "{summary}");
    assert!(summary.contains("Summary (sweep over block_kib)"));
    assert!(!summary.contains("━━ Case"));
    let out = weir()
        .args(["sim", "-q", "--width", "0", "qos-invariants"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn scale_duration_is_checked() {
    let out = weir()
        .args(["sim", "-q", "--scale-duration", "1.5", "qos-invariants"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--scale-duration"));
}

#[test]
fn load_reports_a_bad_target_clearly() {
    let out = weir()
        .args([
            "load",
            "-q",
            "-t",
            "http://127.0.0.1/x",
            "-d",
            "1s",
            "bs=4k,randread,qd=1,vms=1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "setup errors exit 2: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nbd://"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A target that is not an NBD server (it closes without a greeting, as an HTTP
/// server does after its header deadline): the error says so and names the ports.
#[test]
fn load_names_a_target_that_is_not_nbd() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().take(8) {
            drop(s);
        }
    });
    let target = format!("nbd://127.0.0.1:{port}/x");
    let out = weir()
        .args([
            "load",
            "-q",
            "-t",
            &target,
            "-d",
            "1s",
            "bs=4k,randread,qd=1,vms=1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("before any NBD greeting") && err.contains("10809"),
        "{err}"
    );
}

/// `weir sim … | head -1`: the reader closing the pipe ends the simulator the way
/// it ends any Unix filter (SIGPIPE), not with a "Broken pipe" panic.
#[test]
fn sim_into_a_closed_pipe_stops_quietly() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    let mut child = weir()
        .args(["sim", "raid-characterization", "--scale-duration", "0.05"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("weir runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("Weir report"), "{first}");
    // The read end is closed here (dropped with the reader).
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}", out.status);
}

/// 100,000 VMs against a real target stay well under 1.5 GB (session 30: 2.9 GB,
/// 28 KB of latency histogram per VM; the VMs' own histograms are coarser
/// beyond 1,000 VMs now, the totals still exact to 3 significant figures).
#[test]
fn a_hundred_thousand_vms_fit_in_memory() {
    if !weir_testkit::require_tool("nbdkit", &["--version"]) {
        return;
    }
    let (_nbdkit, port) = weir_testkit::start_nbdkit(&["memory", "2G"]);
    let mut child = weir()
        .args(["load", "-q", "-d", "1s", "-t"])
        .arg(format!("nbd://127.0.0.1:{port}/"))
        .arg("bs=4k,vms=100000")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    while child.try_wait().unwrap().is_none() {
        if let Ok(s) = std::fs::read_to_string(&status_file) {
            let hwm = s.lines().find(|l| l.starts_with("VmHWM:"));
            if let Some(kb) = hwm.and_then(|l| l.split_whitespace().nth(1)?.parse().ok()) {
                peak_kb = peak_kb.max(kb);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    println!("100,000 VMs: peak RSS {} MB", peak_kb / 1024);
    assert!(peak_kb > 0, "never measured");
    assert!(peak_kb < 1_500_000, "peak RSS {peak_kb} KB");
}

/// `weir load --width N` fits its tables in N columns, as `weir sim` does
/// (session 30: lines of 363 columns whatever the terminal).
#[test]
fn weir_load_fits_its_tables_in_the_width() {
    if !weir_testkit::require_tool("nbdkit", &["--version"]) {
        return;
    }
    let (_nbdkit, port) = weir_testkit::start_nbdkit(&["memory", "1G"]);
    let out = weir()
        .args(["load", "-q", "-d", "0.5s", "--width", "60", "-t"])
        .arg(format!("nbd://127.0.0.1:{port}/"))
        .arg("bs=4k,vms=2")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(
        widest <= 60 && text.lines().count() > 5,
        "{widest} columns:\n{text}"
    );
}
