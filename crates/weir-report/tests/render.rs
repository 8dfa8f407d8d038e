mod fixtures;

use fixtures::{comparison, mixed_workload_report, raid_sweep_report, sioc_report, workload};
use weir_report::{
    CaseReport, IoSizeHistogram, ScenarioReport, TextOptions, TimelineSeries, parse_json,
    render_html, render_json, render_text,
};

/// Checks that every element opened is closed in order (void elements and `/>` aside),
/// skipping `<style>` content and comments.
fn assert_balanced(html: &str) {
    const VOID: [&str; 6] = ["meta", "br", "hr", "img", "input", "link"];
    let mut stack: Vec<String> = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find('<') {
        rest = &rest[start..];
        if rest.starts_with("<!") {
            let end = rest.find('>').expect("unterminated declaration");
            rest = &rest[end + 1..];
            continue;
        }
        let end = rest.find('>').expect("unterminated tag");
        let tag = &rest[1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack
                .pop()
                .unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(open, name.trim(), "mismatched closing tag");
            continue;
        }
        let name: String = tag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        assert!(!name.is_empty(), "bad tag <{tag}>");
        if tag.ends_with('/') || VOID.contains(&name.as_str()) {
            continue;
        }
        if name == "style" {
            let close = rest.find("</style>").expect("unterminated style");
            assert!(!rest[..close].contains('<'), "'<' inside style");
            rest = &rest[close + "</style>".len()..];
            continue;
        }
        stack.push(name);
    }
    assert!(stack.is_empty(), "unclosed elements: {stack:?}");
}

#[test]
fn text_has_tables_totals_and_mismatch_markers() {
    let text = render_text(&sioc_report(), &TextOptions::default());
    assert!(text.starts_with("Weir report: sioc-and-service-levels (seed 42, 2 cases)"));
    assert!(text.contains("Weir vs seed, predictions: 5 of 8 within ±20%"));
    assert!(text.contains("━━ Case 1/2: two-hosts datastore-wide on"));
    // Workload rows with volume and host, thousands separators, a total line.
    let vm_a = text
        .lines()
        .find(|l| l.contains("VM A (High)") && l.contains("vol-a"))
        .expect("VM A row");
    assert!(
        vm_a.contains("host-1") && vm_a.contains("512.8") && vm_a.contains("24.6"),
        "{vm_a}"
    );
    let sql = text
        .lines()
        .find(|l| l.contains("SQL OLTP"))
        .expect("SQL row");
    assert!(sql.contains("31,250"), "{sql}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("total") && l.contains("62,790"))
    );
    // Comparison rows: within 20% marked ok, beyond marked clearly.
    let vm_b = text
        .lines()
        .find(|l| l.contains("VM B (Normal) MB/s"))
        .expect("comparison row");
    assert!(vm_b.contains("0.95×") && vm_b.contains("ok"), "{vm_b}");
    let p99 = text
        .lines()
        .find(|l| l.contains("datastore latency p99 ms"))
        .expect("p99 row");
    assert!(
        p99.contains("2.99×") && p99.contains("!! >20%") && p99.contains("tail"),
        "{p99}"
    );
    let boot = text
        .lines()
        .find(|l| l.contains("power-on read MB/s"))
        .expect("boot row");
    assert!(boot.contains("0.71×") && boot.contains("!! >20%"), "{boot}");
    // Components with utilisation; timeline sparklines.
    let ctl = text
        .lines()
        .find(|l| l.contains("array controller"))
        .expect("component row");
    assert!(ctl.contains("93.0%") && ctl.contains('█'), "{ctl}");
    assert!(
        text.lines()
            .any(|l| l.contains("VM A MB/s") && l.chars().any(|c| ('▁'..='█').contains(&c)))
    );
    assert!(!text.contains("Sweep"), "no sweep table without params");
    assert!(!text.contains('\x1b'), "colour is off by default");
}

#[test]
fn text_colour_is_optional() {
    let plain = render_text(&sioc_report(), &TextOptions::default());
    let coloured = render_text(
        &sioc_report(),
        &TextOptions {
            color: true,
            ..Default::default()
        },
    );
    assert!(coloured.contains("\x1b[1;31m!! >20%\x1b[0m"));
    let stripped = coloured
        .split('\x1b')
        .enumerate()
        .map(|(i, part)| {
            if i == 0 {
                part
            } else {
                part.split_once('m').map_or(part, |(_, rest)| rest)
            }
        })
        .collect::<String>();
    assert_eq!(stripped, plain, "colour adds escapes only");
}

#[test]
fn text_sweep_table_has_params_as_columns() {
    let text = render_text(
        &raid_sweep_report(),
        &TextOptions {
            sparklines: false,
            ..Default::default()
        },
    );
    assert!(text.contains("Summary (sweep over block_kib, queue_depth)"));
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("case "))
        .expect("sweep header");
    for column in [
        "block_kib",
        "queue_depth",
        "IOPS",
        "MB/s",
        "mean ms",
        "p99 ms",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("raid10-seq-write-bs4096k"))
        .expect("sweep row");
    assert!(row.contains("4,096") && row.contains("32"), "{row}");
    // 66 cases in the sweep table (one row each), before the per-case sections.
    let sweep_part = text
        .split("Summary (sweep over")
        .nth(1)
        .and_then(|t| t.split("━━ Case 1/").next())
        .unwrap_or_default();
    assert_eq!(
        sweep_part
            .lines()
            .filter(|l| l.trim_start().starts_with("raid"))
            .count(),
        66
    );
}

#[test]
fn json_round_trips_and_is_deterministic() {
    for report in [sioc_report(), raid_sweep_report()] {
        let mut finite = report.clone();
        // The fixture holds NaN gaps, which never compare equal; check them separately.
        for case in &mut finite.cases {
            for series in &mut case.timeline {
                series.values.retain(|v| v.is_finite());
            }
        }
        let json = render_json(&finite);
        assert_eq!(json, render_json(&finite.clone()));
        let back = parse_json(&json).expect("parses");
        assert!(
            back == finite,
            "parsed report differs from the rendered one"
        );
        assert_eq!(render_json(&back), json);
    }
    let json = render_json(&sioc_report());
    let scenario_at = json.find("\"scenario\"").expect("field");
    let cases_at = json.find("\"cases\"").expect("field");
    assert!(scenario_at < cases_at, "declaration order");
}

#[test]
fn json_non_finite_numbers_become_null_and_parse_back_as_nan() {
    let mut report = sioc_report();
    report.cases[0].comparisons[0].weir = f64::NAN;
    report.cases[0].comparisons[1].seed = f64::INFINITY;
    report.cases[0].params.insert("block_kib".into(), f64::NAN);
    let json = render_json(&report);
    assert!(json.contains("\"weir\": null"));
    let back = parse_json(&json).expect("parses");
    assert!(back.cases[0].comparisons[0].weir.is_nan());
    assert!(back.cases[0].comparisons[1].seed.is_nan());
    assert!(back.cases[0].params["block_kib"].is_nan());
    assert!(back.cases[1].timeline[5].values[200].is_nan());
    assert!(parse_json("{\"scenario\": 3}").is_err());
}

#[test]
fn html_is_self_contained_balanced_and_has_a_chart_per_figure() {
    let html = render_html(&sioc_report());
    assert_balanced(&html);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(!html.contains("<script"), "no scripts");
    // The only URL is the SVG namespace name, which is never fetched.
    assert_eq!(
        html.matches("http://").count(),
        html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
    );
    for external in ["https://", "src=", "href=\"http", "@import", "url("] {
        assert!(!html.contains(external), "external reference {external}");
    }
    // Case 1: comparisons bars + 2 timeline charts (MB/s, ms) + utilisation bars = 4;
    // case 2: bars + 2 timeline charts (IOPS, ms) + utilisation = 4.
    assert_eq!(html.matches("<svg").count(), 8);
    assert!(
        html.contains("Throughput (MB/s) over time") && html.contains("I/O rate (IOPS) over time")
    );
    assert!(html.contains("5 / 8"), "summary of matches");
    assert!(html.contains("differs &gt;20%"));
    assert!(html.contains("31,250"));
    assert!(
        !html.contains("NaN") && !html.contains("inf\""),
        "no non-finite coordinates"
    );
}

#[test]
fn html_sweep_has_charts_per_metric_and_series_per_raid_level_and_direction() {
    let html = render_html(&raid_sweep_report());
    assert_balanced(&html);
    assert!(html.contains("id=\"sweep\""));
    assert!(html.contains("<h3>Against block size</h3>"));
    assert!(
        html.contains(">block size (KiB)</text>"),
        "a human axis title"
    );
    assert!(html.contains("6 series"), "RAID 0/5/10 × read/write");
    for label in ["raid0 seq read", "raid5 seq write", "raid10 seq read"] {
        // A legend entry of every chart against block_kib.
        assert_eq!(
            html.matches(&format!(">{label}</text>")).count(),
            4,
            "{label}"
        );
    }
    assert!(html.contains("logarithmic"));
    // queue_depth does not vary: no chart against it.
    assert!(!html.contains("Against outstanding I/Os"));
    // 4 sweep charts + per case (66) a utilisation chart + 1 comparison chart.
    assert_eq!(html.matches("<svg").count(), 4 + 66 + 1);
    // Many cases: sections start collapsed.
    assert!(html.contains("<details>"));
}

#[test]
fn text_is_escaped_everywhere() {
    let mut report = sioc_report();
    report.scenario = "<script>alert('x')</script>".into();
    report.cases[0].name = "a <b> & \"c\"".into();
    report.cases[0].workloads[0].name = "<img src=x>".into();
    report.cases[0].comparisons[0].metric = "</text></svg><b>".into();
    report.cases[0].timeline[0].name = "</svg>".into();
    report.cases[0].components[0].name = "</text>".into();
    let html = render_html(&report);
    assert_balanced(&html);
    assert!(!html.contains("<script"));
    assert!(!html.contains("<img"));
    assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
    assert!(html.contains("a &lt;b&gt; &amp; &quot;c&quot;"));
}

#[test]
fn empty_nan_and_single_point_reports_render() {
    let empty = ScenarioReport::default();
    let html = render_html(&empty);
    assert_balanced(&html);
    assert!(html.contains("no cases"));
    assert!(render_text(&empty, &TextOptions::default()).contains("(no cases)"));
    assert!(parse_json(&render_json(&empty)).is_ok());

    let mut w = workload("nan-workload", "", "", f64::NAN, 4.0, f64::INFINITY);
    w.mbps = f64::NEG_INFINITY;
    let report = ScenarioReport {
        scenario: "degenerate".into(),
        cases: vec![
            CaseReport {
                name: "nothing measured".into(),
                duration_s: f64::NAN,
                ..Default::default()
            },
            CaseReport {
                name: "bad numbers qd1".into(),
                params: [("queue_depth".to_string(), 1.0)].into_iter().collect(),
                workloads: vec![w],
                comparisons: vec![
                    comparison("zero seed", 5.0, 0.0, "none", ""),
                    comparison("both zero", 0.0, 0.0, "none", ""),
                    comparison("nan weir", f64::NAN, 3.0, "none", ""),
                ],
                timeline: vec![
                    TimelineSeries {
                        name: "single".into(),
                        unit: "IOPS".into(),
                        interval_s: 1.0,
                        values: vec![42.0],
                    },
                    TimelineSeries {
                        name: "empty".into(),
                        unit: "MB/s".into(),
                        interval_s: 0.0,
                        values: vec![],
                    },
                    TimelineSeries {
                        name: "all nan".into(),
                        unit: "ms".into(),
                        interval_s: f64::NAN,
                        values: vec![f64::NAN; 3],
                    },
                ],
                ..Default::default()
            },
            CaseReport {
                name: "good qd8".into(),
                params: [("queue_depth".to_string(), 8.0)].into_iter().collect(),
                workloads: vec![workload("w", "", "", 100.0, 4.0, 1.0)],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let html = render_html(&report);
    assert_balanced(&html);
    assert!(!html.contains("NaN"));
    assert!(html.contains("no data"), "empty series get a placeholder");
    assert!(
        html.contains("<circle"),
        "single points are drawn as markers"
    );
    assert!(html.contains("no ratio"));
    let text = render_text(&report, &TextOptions::default());
    assert!(text.contains("n/a") && text.contains("-inf"));
    let zero_seed = text.lines().find(|l| l.contains("zero seed")).expect("row");
    assert!(zero_seed.contains("!! no ratio"), "{zero_seed}");
    let both_zero = text.lines().find(|l| l.contains("both zero")).expect("row");
    assert!(both_zero.contains("ok"), "{both_zero}");
    let json = render_json(&report);
    assert!(parse_json(&json).is_ok());
}

#[test]
fn writes_sample_reports_for_inspection() {
    let dir = std::env::temp_dir();
    for (file, report) in [
        ("weir-report-sample.html", sioc_report()),
        ("weir-report-sweep.html", raid_sweep_report()),
        ("weir-report-mixed.html", mixed_workload_report()),
    ] {
        let html = render_html(&report);
        std::fs::write(dir.join(file), &html).expect("write sample");
        let text = render_text(&report, &TextOptions::default());
        std::fs::write(dir.join(file.replace(".html", ".txt")), &text).expect("write sample");
    }
}

#[test]
fn text_renders_model_metrics_windows_and_size_histogram() {
    let text = render_text(&mixed_workload_report(), &TextOptions::default());
    assert!(text.contains("Application metrics"), "{text}");
    // Windows as columns, whole run first.
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("source") && l.contains("metric"))
        .expect("metrics header");
    let at = |s: &str| header.find(s).unwrap_or_else(|| panic!("{s} in {header}"));
    assert!(
        at("whole run") < at("pre-storm")
            && at("pre-storm") < at("storm  ")
            && at("storm  ") < at("vsi")
    );
    let opm = text
        .lines()
        .find(|l| l.contains("orders per minute"))
        .expect("opm row");
    assert!(
        opm.contains("sql (oltp)") && opm.contains("12,000") && opm.contains("11,550"),
        "{opm}"
    );
    let rpc = text
        .lines()
        .find(|l| l.contains("RPC latency < 50 ms"))
        .expect("rpc row");
    assert!(rpc.contains("pass"), "{rpc}");
    // Grade shares move to the user-experience table, not the metrics table.
    assert!(!text.contains("login good"));
    assert!(text.contains("User experience"));
    let storm_login = text
        .lines()
        .find(|l| l.contains(" login ") && l.contains("storm") && !l.contains("pre-storm"))
        .expect("storm login row");
    assert!(
        storm_login.contains("60.0%")
            && storm_login.contains("25.0%")
            && storm_login.contains("15.0%")
            && storm_login.contains("fair"),
        "{storm_login}"
    );
    assert!(storm_login.contains('█') && storm_login.contains('▓') && storm_login.contains('░'));
    let launch = text
        .lines()
        .find(|l| l.contains("application launch") && l.contains("whole run"))
        .expect("launch row");
    assert!(
        launch.contains("good") && launch.contains("≤ 10 s"),
        "{launch}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("VSImax reached") && l.contains("not reached")),
        "flag rendered as words"
    );
    // Windows table: spans, per-level rows, a total.
    assert!(text.contains("pre-storm 600–840 s · storm 840–1,140 s"));
    let level = text
        .lines()
        .find(|l| l.contains("level") && l.contains("non-critical"))
        .expect("level row");
    assert!(level.contains("6,000") && level.contains("81.0"), "{level}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("total") && l.contains("52,500"))
    );
    // Size histogram with bars and the random / sequential split.
    let bucket = text
        .lines()
        .find(|l| l.trim_start().starts_with("4–8 KiB"))
        .expect("bucket row");
    assert!(
        bucket.contains("310,000") && bucket.contains('█'),
        "{bucket}"
    );
    assert!(text.lines().any(|l| l.trim_start().starts_with("> 1 MiB")));
    let writes = text
        .lines()
        .find(|l| {
            l.trim_start().starts_with("writes") && !l.contains("sequential") && l.contains('%')
        })
        .expect("access row");
    assert!(
        writes.contains("10.0%") && writes.contains("90.0%"),
        "{writes}"
    );
}

#[test]
fn html_draws_tiles_ux_bars_window_bars_and_histogram() {
    let report = mixed_workload_report();
    let html = render_html(&report);
    assert_balanced(&html);
    // UX stacked bars + IOPS and latency per window + size histogram + access split.
    assert_eq!(html.matches("<svg").count(), 5);
    assert!(html.contains("class=\"tiles\""));
    assert!(html.contains("sql · orders per minute"));
    // Per-window values on the tile with the change from the first window.
    assert!(
        html.contains("storm <b>11,700</b> <span class=\"chg\">(-1.3%)</span>"),
        "opm tile"
    );
    assert!(html.contains("tile good\"><div class=\"l\">exchange · RPC latency, mean"));
    assert!(html.contains("not reached"));
    // Grade colours: green, amber, red segments with their shares.
    for colour in ["#59a14f", "#f0b429", "#e15759"] {
        assert!(
            html.contains(&format!("fill=\"{colour}\"><title>")),
            "{colour}"
        );
    }
    assert!(html.contains(">60%</text>"));
    assert!(html.contains("IOPS per window<span>per service level</span>"));
    assert!(html.contains("Transfer sizes"));
    assert!(html.contains("<span class=\"badge ok\">pass</span>"));
    assert!(!html.contains("NaN"));
    // No windows: grouped bars fall back to volumes; no level rows needed.
    let mut no_levels = report.clone();
    for w in &mut no_levels.cases[0].windows {
        w.figures.retain(|f| !f.name.starts_with("level:"));
    }
    let html = render_html(&no_levels);
    assert!(html.contains("per window<span>per volume</span>"));
}

#[test]
fn model_fields_are_escaped_and_survive_nan_and_empty_values() {
    let mut report = mixed_workload_report();
    let case = &mut report.cases[0];
    case.model_metrics[0].source = "<b>sql</b>".into();
    case.windows[0].name = "</svg><i>".into();
    for m in &mut case.model_metrics {
        if m.name == "login_good_pct" || m.name == "opm" {
            m.value = f64::NAN;
        }
    }
    case.windows[1].figures[0].iops = f64::INFINITY;
    let html = render_html(&report);
    assert_balanced(&html);
    assert!(!html.contains("<i>") && !html.contains("<b>sql"));
    assert!(html.contains("&lt;/svg&gt;&lt;i&gt;"));
    assert!(!html.contains("NaN"));
    let text = render_text(&report, &TextOptions::default());
    assert!(text.contains("n/a"));
    assert!(parse_json(&render_json(&report)).is_ok());

    // Empty histogram, empty windows, no grades.
    let mut report = mixed_workload_report();
    let case = &mut report.cases[0];
    case.io_sizes = Some(IoSizeHistogram::default());
    case.model_metrics.retain(|m| !m.name.ends_with("_pct"));
    for w in &mut case.windows {
        w.figures.clear();
    }
    let html = render_html(&report);
    assert_balanced(&html);
    assert!(html.contains("No transfers recorded."));
    assert!(!html.contains("User experience"));
    let text = render_text(&report, &TextOptions::default());
    assert!(text.contains("(no transfers recorded)"));
    assert!(!text.contains("User experience"));

    // A volume idle in a window has no latency (producers write 0): n/a, not 0.
    let mut report = mixed_workload_report();
    let idle = &mut report.cases[0].windows[0].figures[2];
    (idle.iops, idle.mbps, idle.ios, idle.latency_ms.mean) = (0.0, 0.0, 0, 0.0);
    let text = render_text(&report, &TextOptions::default());
    let row = text
        .lines()
        .find(|l| l.contains("vdi-nc"))
        .expect("idle volume row");
    assert!(row.contains("n/a"), "{row}");

    // A report without the new fields renders exactly as before (no new sections).
    let plain = sioc_report();
    let text = render_text(&plain, &TextOptions::default());
    for section in [
        "Application metrics",
        "User experience",
        "Windows",
        "I/O sizes",
    ] {
        assert!(!text.contains(section));
    }
}

#[test]
fn pools_of_one_kind_share_a_tile_and_repeated_windows_are_dropped() {
    let mut report = mixed_workload_report();
    let case = &mut report.cases[0];
    // A second desktop pool with slower logins, and a window that holds every login
    // of the run (it repeats the whole-run grades).
    let second: Vec<_> = case
        .model_metrics
        .iter()
        .filter(|m| m.source == "vdi")
        .map(|m| {
            let mut m = m.clone();
            m.source = "vdi-b".into();
            if m.name == "login_time_mean_s" {
                m.value += 30.0;
            }
            m
        })
        .collect();
    case.model_metrics.extend(second);
    let whole: Vec<_> = case
        .model_metrics
        .iter()
        .filter(|m| m.window.is_empty() && m.name.starts_with("app_launch"))
        .map(|m| {
            let mut m = m.clone();
            m.window = "vsi".into();
            m
        })
        .collect();
    case.model_metrics.extend(whole);
    let html = render_html(&report);
    assert_balanced(&html);
    // One login tile for both pools: the range, graded by the slower pool (42 s: fair).
    assert_eq!(html.matches("· login time, mean</div>").count(), 1);
    assert!(html.contains("tile fair\"><div class=\"l\">vdi (2) · login time, mean"));
    assert!(html.contains(">12–42<small>s</small>"));
    let text = render_text(&report, &TextOptions::default());
    let launches = text
        .lines()
        .filter(|l| l.contains("application launch") && l.contains('█'))
        .count();
    assert_eq!(launches, 2, "whole run per pool; the vsi repeat is dropped");
}

#[test]
fn io_size_histogram_records_into_the_seed_buckets() {
    let mut h = IoSizeHistogram::with_seed_buckets();
    assert_eq!(h.bucket_bytes.len(), 10);
    assert_eq!(h.reads, vec![0; 10]);
    // Bounds are inclusive: 4096 is the first bucket, 4097 the second.
    h.record(512, true, false);
    h.record(4096, true, true);
    h.record(4097, true, false);
    h.record(64 << 10, false, true);
    h.record(1 << 20, false, false);
    h.record(4 << 20, false, false); // beyond 1 MiB: the last bucket
    assert_eq!(h.reads, vec![2, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(h.writes, vec![0, 0, 0, 0, 1, 0, 0, 0, 1, 1]);
    assert_eq!(
        (
            h.sequential_reads,
            h.random_reads,
            h.sequential_writes,
            h.random_writes
        ),
        (1, 2, 1, 2)
    );
    // Without buckets only the access pattern is counted (no panic).
    let mut bare = IoSizeHistogram::default();
    bare.record(4096, false, true);
    assert_eq!(bare.sequential_writes, 1);
    assert!(bare.writes.is_empty());
}

/// Issue 16: predictions, calibrations and targets are shown apart; the header counts
/// predictions only; a target is pass / fail, never a ratio; a report with targets
/// only makes no claim against a seed.
mod kinds {
    use super::*;
    use weir_report::{Comparison, ComparisonKind, Tally};

    fn row(kind: ComparisonKind, metric: &str, weir: f64, seed: f64) -> Comparison {
        Comparison {
            metric: metric.into(),
            kind,
            weir,
            seed,
            source: "004 Table 8".into(),
            ..Comparison::default()
        }
    }

    fn target(metric: &str, weir: f64, at_most: Option<f64>, at_least: Option<f64>) -> Comparison {
        Comparison {
            metric: metric.into(),
            kind: ComparisonKind::Target,
            weir,
            seed: f64::NAN,
            at_most,
            at_least,
            source: "000 Figure 9".into(),
            ..Comparison::default()
        }
    }

    fn report(comparisons: Vec<Comparison>) -> ScenarioReport {
        ScenarioReport {
            scenario: "kinds".into(),
            seed: 1,
            cases: vec![CaseReport {
                name: "only".into(),
                duration_s: 1.0,
                workloads: vec![workload("vm", "", "", 100.0, 1.0, 1.0)],
                comparisons,
                ..CaseReport::default()
            }],
            ..ScenarioReport::default()
        }
    }

    #[test]
    fn the_header_counts_predictions_only() {
        let mut calibrated = row(ComparisonKind::Calibration, "fitted figure", 100.0, 100.0);
        calibrated.fitted = "create_base_s".into();
        let r = report(vec![
            row(ComparisonKind::Prediction, "predicted hit", 105.0, 100.0),
            row(ComparisonKind::Prediction, "predicted miss", 200.0, 100.0),
            calibrated.clone(),
            calibrated,
            target("latency ms", 4.0, Some(10.0), None),
        ]);
        let text = render_text(&r, &TextOptions::default());
        let header = text.lines().nth(1).unwrap();
        assert!(
            header.starts_with("Weir vs seed, predictions: 1 of 2 within ±20%;"),
            "{header}"
        );
        assert!(header.contains("2 calibrations"), "{header}");
        assert!(header.contains("not counted"), "{header}");
        assert!(header.contains("targets: 1 of 1 pass"), "{header}");
        // The three kinds in their own sections, calibrations with the parameter.
        let p = text
            .find("Weir vs seed: predictions (1 of 2 within ±20%)")
            .expect("predictions");
        let c = text
            .find("Calibrations (seed figures a parameter")
            .expect("calibrations");
        let t = text
            .find("Targets (configured limits: pass / fail) (1 of 1 pass)")
            .expect("targets");
        assert!(p < c && c < t);
        assert!(text[c..t].contains("create_base_s") && text[c..t].contains("fitted"));
        assert!(!text[p..c].contains("fitted figure"));
        let t = Tally::of(&r.cases[0].comparisons);
        assert_eq!(
            (t.predictions, t.within, t.calibrations, t.targets, t.passed),
            (2, 1, 2, 1, 1)
        );
        // HTML and the summary column count the same way.
        let html = render_html(&r);
        assert!(html.contains("1 / 2") && html.contains("seed predictions within ±20%"));
        assert!(html.contains("calibrations (fitted on the seed: not counted)"));
        assert_balanced(&html);
        // JSON carries the kind and reads it back.
        let json = render_json(&r);
        assert!(
            json.contains("\"kind\": \"calibration\"") && json.contains("\"kind\": \"target\"")
        );
        let back = parse_json(&json).unwrap();
        let kinds = |r: &ScenarioReport| -> Vec<(ComparisonKind, String, Option<f64>)> {
            r.cases[0]
                .comparisons
                .iter()
                .map(|c| (c.kind, c.fitted.clone(), c.at_most))
                .collect()
        };
        assert_eq!(kinds(&back), kinds(&r));
        assert!(back.cases[0].comparisons[4].seed.is_nan());
    }

    #[test]
    fn a_target_renders_pass_or_fail_not_a_ratio() {
        let r = report(vec![
            target("RPC latency ms", 12.0, Some(50.0), None),
            target("reserved IOPS", 1400.0, None, Some(1500.0)),
            target("share ratio", 2.0, Some(2.05), Some(1.95)),
            target("not reached", f64::NAN, Some(1.0), None),
        ]);
        let text = render_text(&r, &TextOptions::default());
        let line = |m: &str| text.lines().find(|l| l.contains(m)).unwrap().to_string();
        let rpc = line("RPC latency ms");
        assert!(
            rpc.contains("≤ 50") && rpc.contains("pass") && !rpc.contains('×'),
            "{rpc}"
        );
        let res = line("reserved IOPS");
        assert!(res.contains("≥ 1,500") && res.contains("FAIL"), "{res}");
        let share = line("share ratio");
        assert!(
            share.contains("1.95 – 2.05") && share.contains("pass"),
            "{share}"
        );
        assert!(line("not reached").contains("not measured"));
        // The summary's per-case column says it too ("3/4 pass" read as a failure).
        let summary = render_text(
            &r,
            &TextOptions {
                summary: true,
                ..TextOptions::default()
            },
        );
        let case = summary
            .lines()
            .find(|l| l.trim_start().starts_with("only"))
            .unwrap();
        assert!(case.contains("2/4 pass (1 not measured)"), "{summary}");
        assert!(r.cases[0].comparisons[0].ratio().is_nan());
        let html = render_html(&r);
        assert!(
            html.contains(">FAIL<") && html.contains(">pass<") && html.contains("targets pass")
        );
        assert_balanced(&html);
    }

    #[test]
    fn targets_only_make_no_claim_against_a_seed() {
        let r = report(
            (0..8)
                .map(|i| target(&format!("invariant {i}"), 1.0, Some(2.0), None))
                .collect(),
        );
        for opts in [
            TextOptions::default(),
            TextOptions {
                summary: true,
                ..TextOptions::default()
            },
        ] {
            let text = render_text(&r, &opts);
            assert!(!text.contains("vs seed"), "{text}");
            assert!(!text.contains("8 of 8 figures"), "{text}");
            assert!(
                text.contains("no seed predictions; targets: 8 of 8 pass"),
                "{text}"
            );
        }
        let html = render_html(&r);
        assert!(!html.contains("seed predictions within") && !html.contains("vs seed"));
        assert!(html.contains("8 / 8") && html.contains("targets pass"));
    }
}
