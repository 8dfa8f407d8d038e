//! One self-contained HTML page (inline CSS and SVG, no scripts, no network).
//!
//! Layout: a summary header (scenario, seed, cases, how many seed predictions Weir
//! matches within ±20% and how many the run did not measure, the calibrations shown
//! but not counted, the targets that pass, the seed documents by title,
//! links to cases); for sweeps, charts of MB/s, IOPS and latency against each swept
//! parameter (axis titles in words, the seeds' figures for the charted total as
//! diamonds) plus a sweep table; without sweeps and with three cases or more, bars of
//! each case's IOPS, MB/s and latency beside the seed's; then per case a workloads
//! table, Weir-vs-seed paired bars and tables apart for predictions and calibrations
//! (sources by title), targets as pass / fail, line charts over time
//! (one per unit, the warm-up shaded, identical series drawn once), utilisation bars.
//!
//! Series of a sweep: a case the simulator named `<case>/<param>=<value>` belongs to
//! the series `<case>`; the rule below applies to other names.
//!
//! Cases from application models add: headline tiles of the key model metrics (orders
//! per minute, RPC latency, login and launch times, VSIbase / VSImax, power-on time;
//! pools of one model kind share a tile showing their range, coloured by the worst
//! grade), stacked good / fair / poor bars per activity and window, the metrics table
//! (collapsed when long), grouped bars of IOPS and mean latency per window and service
//! level (per volume when no level figures exist) with the window table, and the I/O
//! size histogram (reads and writes as % of all I/Os) beside random / sequential bars.
//!
//! ## Sweep grouping rule
//! A parameter is *swept* when cases carry at least two distinct finite values of it.
//! For each swept parameter `p` (the x axis), the cases with a finite `p` and a headline
//! figure (`total`, or the only workload) are grouped into series so that one series
//! holds the cases that differ only by `p`:
//! 1. the case name is cut into tokens at anything other than letters, digits and `.`;
//!    tokens that spell the value of `p` (`64` in `bs64k`, `qd32`; for `*kib`/`*kb`
//!    parameters also `1m` for 1024) are dropped, the rest form the *name key*
//!    (`raid5-seq-read-bs64k` → `raid5 seq read`);
//! 2. the other parameters of the case (`queue_depth=32`) form the *param key*;
//! 3. cases with equal (name key, param key) form a series, labelled by the name key,
//!    plus the param key when the name key alone would merge series;
//! 4. if that grouping is degenerate (a series holds the same `p` twice, or every series
//!    is a single point although there are several cases), the param key alone is used.
//!
//! Series keep the order in which their first case appears; points are sorted by `p`.
//! The x axis is log2 when all values are positive and span a factor of 8 or more
//! (block sizes 4 KiB … 4 MiB, queue depths 1 … 256).

use crate::app;
use crate::format::{
    fmt_count, fmt_iops, fmt_mbps, fmt_ms, fmt_number, fmt_param, fmt_pct, fmt_ratio, fmt_thousands,
};
use crate::svg::{
    AMBER, BAD, BarSeries, GOOD, LineChart, LineSeries, PALETTE, Pair, SeedPoint, Segment, Shade,
    ShareRow, XScale, esc, grouped_bars, paired_bars, share_bars, utilisation_bars,
    utilisation_colour,
};
use crate::text::fmt_span;
use crate::{
    CaseReport, Comparison, ComparisonKind, IoSizeHistogram, ScenarioReport, TimelineSeries,
    UxGrade, WorkloadResult,
};
use std::collections::BTreeSet;
use std::fmt::Write as _;

const CSS: &str = r#"
:root{--fg:#1f2430;--muted:#6b7280;--line:#e6e8ec;--bg:#f3f5f8;--card:#fff;--accent:#4e79a7;--good:#2e7d32;--bad:#c62828}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
header.top{background:linear-gradient(135deg,#1d3557,#2f6690);color:#fff;padding:26px 40px 20px}
header.top .inner{max-width:1240px;margin:0 auto}
.brand{font-size:12px;letter-spacing:.16em;text-transform:uppercase;opacity:.75;font-weight:600}
h1{margin:4px 0 4px;font-size:28px;font-weight:700}
header.top p.desc{margin:0;opacity:.9;max-width:900px}
.kpis{display:flex;gap:12px;flex-wrap:wrap;margin-top:16px}
.kpi{background:rgba(255,255,255,.10);border:1px solid rgba(255,255,255,.20);border-radius:10px;padding:9px 16px;min-width:130px}
.kpi .v{font-size:21px;font-weight:700;font-variant-numeric:tabular-nums}
.kpi .l{font-size:12px;opacity:.8}
.kpi.ok .v{color:#b9f6ca}.kpi.off .v{color:#ffcdd2}
nav.cases{display:flex;flex-wrap:wrap;gap:6px;margin-top:16px}
nav.cases a{color:#fff;text-decoration:none;font-size:12.5px;background:rgba(255,255,255,.12);border-radius:14px;padding:3px 11px}
nav.cases a:hover{background:rgba(255,255,255,.25)}
nav.cases a.off::after{content:" \25CF";color:#ff8a80}
main{max-width:1240px;margin:0 auto;padding:22px 24px 10px}
section.card{background:var(--card);border:1px solid var(--line);border-radius:12px;padding:18px 24px 20px;margin-bottom:22px;box-shadow:0 1px 3px rgba(16,24,40,.05)}
h2{font-size:19px;margin:0;display:inline}
h3{font-size:13px;text-transform:uppercase;letter-spacing:.07em;color:var(--muted);margin:22px 0 8px;font-weight:700}
summary{cursor:pointer;list-style:none;display:flex;align-items:baseline;gap:14px;flex-wrap:wrap}
summary::-webkit-details-marker{display:none}
summary::before{content:"\25B8";color:var(--muted);transition:transform .15s}
details[open] summary::before{transform:rotate(90deg)}
.headline{color:var(--muted);font-size:13px;font-variant-numeric:tabular-nums}
.headline b{color:var(--fg)}
p.case-desc{margin:8px 0 0;color:#374151}
.meta{margin-top:6px;color:var(--muted);font-size:12.5px}
.chip{display:inline-block;background:#eef2f7;color:#334155;border-radius:10px;padding:1px 9px;margin-right:5px;font-size:12px;font-variant-numeric:tabular-nums}
.tablewrap{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums;font-size:13px}
th{font-weight:650;color:var(--muted);font-size:11.5px;text-transform:uppercase;letter-spacing:.04em;text-align:left;border-bottom:2px solid var(--line);padding:6px 10px;white-space:nowrap}
td{padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:top}
tbody tr:hover td{background:#f8fafc}
td.num,th.num{text-align:right;white-space:nowrap}
td.src{color:var(--muted);font-size:12px}
td.note{color:#4b5563;font-size:12.5px;max-width:360px}
tr.total td{font-weight:700;border-top:2px solid #cfd6df;background:#f8fafc}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:12px;font-weight:650;white-space:nowrap}
.badge.ok{background:#e8f5e9;color:var(--good)}
.badge.off{background:#fdecea;color:var(--bad)}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;vertical-align:baseline}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:16px}
figure{margin:0;border:1px solid var(--line);border-radius:10px;padding:10px 12px 6px;background:#fff}
figcaption{font-weight:650;font-size:13.5px;margin:0 0 4px 4px}
figcaption span{font-weight:400;color:var(--muted);font-size:12px;margin-left:6px}
svg.chart{width:100%;height:auto;display:block;font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;font-size:12px}
svg.bars{max-width:1140px}
svg .grid{stroke:#e9ecf0;stroke-width:1}
svg .axis{stroke:#9aa3af;stroke-width:1}
svg .tick{fill:#6b7280;font-size:11px}
svg .axis-label{fill:#374151;font-size:12px;font-weight:600}
svg .muted{fill:#8a929e;font-size:12px}
svg .bar-label{fill:#1f2430;font-size:12.5px}
svg .bar-value{fill:#374151;font-size:12px}
svg .badge-text{font-weight:700;font-size:12.5px}
svg .legend-item text{fill:#374151;font-size:12px}
p.hint{color:var(--muted);font-size:12.5px;margin:4px 0 10px}
.empty{color:var(--muted);font-style:italic}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(215px,1fr));gap:12px;margin:16px 0 4px}
.tile{border:1px solid var(--line);border-left:5px solid var(--accent);border-radius:10px;padding:10px 14px 9px;background:#fbfcfe}
.tile .l{color:var(--muted);font-size:12px;font-weight:600}
.tile .v{font-size:25px;font-weight:700;font-variant-numeric:tabular-nums;line-height:1.25}
.tile .v small{font-size:13px;font-weight:600;color:var(--muted);margin-left:4px}
.tile .w{font-size:12px;color:#4b5563;margin-top:3px;font-variant-numeric:tabular-nums}
.tile .w .chg{color:var(--muted)}
.tile.good{border-left-color:#59a14f}.tile.good .v{color:#2e7d32}
.tile.fair{border-left-color:#f0b429}.tile.fair .v{color:#a86b00}
.tile.poor{border-left-color:#e15759}.tile.poor .v{color:var(--bad)}
tr.group td{font-weight:700;background:#f3f6fa;border-bottom:1px solid #dbe2ea;padding-top:9px}
tr.group td span{font-weight:400;color:var(--muted);margin-left:6px}
td.dim{color:var(--muted)}
table.compact td{padding:3px 10px}
details.more>summary{color:var(--accent);font-size:13px;margin:2px 0 8px}
details.more:not([open])>summary::before{transform:none}
footer{max-width:1240px;margin:0 auto;padding:6px 24px 30px;color:var(--muted);font-size:12px}
"#;

/// Longer application-metrics tables start collapsed (the tiles and charts lead).
const METRICS_OPEN_ROWS: usize = 40;

/// Reports with more cases than this list them in the sweep table, not the header.
const NAV_CASES: usize = 16;

/// Chart title for a timeline unit: `MB/s` → `Throughput (MB/s)`.
fn unit_title(unit: &str) -> String {
    match unit.to_ascii_lowercase().as_str() {
        "" => "Value".to_string(),
        "mb/s" | "mib/s" | "gb/s" => format!("Throughput ({unit})"),
        "iops" | "ops/s" => format!("I/O rate ({unit})"),
        "ms" | "us" | "µs" | "s" => format!("Latency ({unit})"),
        "%" | "fraction" => format!("Utilisation ({unit})"),
        _ => unit.to_string(),
    }
}

/// The whole report as one self-contained HTML document.
pub fn render_html(report: &ScenarioReport) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let title = if report.scenario.is_empty() {
        "Weir report".to_string()
    } else {
        format!("Weir report: {}", report.scenario)
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n",
        esc(&title)
    );
    header(&mut out, report);
    out.push_str("<main>\n");
    if report.cases.is_empty() {
        out.push_str(
            "<section class=\"card\"><p class=\"empty\">This report has no cases.</p></section>\n",
        );
    }
    if report.is_sweep() {
        sweep_section(&mut out, report);
    } else {
        cases_section(&mut out, report);
    }
    let open = !report.is_sweep() || report.cases.len() <= 4;
    for (index, case) in report.cases.iter().enumerate() {
        case_section(&mut out, case, index, open);
    }
    let _ = write!(
        out,
        "</main>\n<footer>Generated by weir-report {}. Weir figures come from the run; \
         seed figures from the source documents named beside them. MB = 10<sup>6</sup> bytes.\
         </footer>\n</body>\n</html>\n",
        esc(env!("CARGO_PKG_VERSION"))
    );
    out
}

fn header(out: &mut String, report: &ScenarioReport) {
    out.push_str("<header class=\"top\"><div class=\"inner\">\n<div class=\"brand\">Weir · storage QoS report</div>\n");
    let _ = writeln!(
        out,
        "<h1>{}</h1>",
        esc(if report.scenario.is_empty() {
            "(unnamed scenario)"
        } else {
            &report.scenario
        })
    );
    if !report.description.trim().is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"desc\">{}</p>",
            esc(report.description.trim())
        );
    }
    out.push_str("<div class=\"kpis\">");
    let kpi = |out: &mut String, class: &str, value: &str, label: &str| {
        let _ = write!(
            out,
            "<div class=\"kpi {class}\"><div class=\"v\">{}</div><div class=\"l\">{}</div></div>",
            esc(value),
            esc(label)
        );
    };
    kpi(out, "", &fmt_count(report.cases.len() as u64), "cases");
    kpi(out, "", &report.seed.to_string(), "seed");
    let comparisons: Vec<_> = report.cases.iter().flat_map(|c| &c.comparisons).collect();
    let t = crate::Tally::of(comparisons.iter().copied());
    if t.predictions > 0 {
        kpi(
            out,
            if t.within == t.predictions {
                "ok"
            } else {
                "off"
            },
            &format!("{} / {}", t.within, t.predictions),
            "seed predictions within ±20%",
        );
        if t.unmeasured > 0 {
            kpi(
                out,
                "off",
                &fmt_count(t.unmeasured as u64),
                "predictions not measured in this run (too short?)",
            );
        }
    }
    if t.calibrations > 0 {
        kpi(
            out,
            "",
            &fmt_count(t.calibrations as u64),
            "calibrations (fitted on the seed: not counted)",
        );
    }
    if t.targets > 0 {
        kpi(
            out,
            if t.passed == t.targets { "ok" } else { "off" },
            &format!("{} / {}", t.passed, t.targets),
            "targets pass",
        );
    }

    let swept = swept_parameters(report);
    if !swept.is_empty() {
        let names: Vec<String> = swept.iter().map(|k| param_name(k)).collect();
        kpi(out, "", &names.join(", "), "swept");
    }
    out.push_str("</div>\n");
    let cited: BTreeSet<(&str, &str)> = comparisons
        .iter()
        .filter_map(|c| crate::seed_title(&c.source))
        .collect();
    if !cited.is_empty() {
        let list: Vec<String> = cited
            .iter()
            .map(|(n, t)| format!("<i>{}</i> ({n})", esc(t)))
            .collect();
        let _ = writeln!(
            out,
            "<p class=\"desc sources\">Seed documents: {}</p>",
            list.join("; ")
        );
    }
    if report.cases.len() > 1 {
        out.push_str("<nav class=\"cases\">");
        if report.is_sweep() {
            out.push_str("<a href=\"#sweep\">sweep charts</a>");
        }
        // Long sweeps link their cases from the sweep table instead.
        let listed = if report.cases.len() <= NAV_CASES {
            report.cases.len()
        } else {
            0
        };
        if listed == 0 {
            let _ = write!(
                out,
                "<a href=\"#sweep-cases\">all {} cases</a>",
                report.cases.len()
            );
        }
        for (index, case) in report.cases.iter().enumerate().take(listed) {
            let off = case
                .comparisons
                .iter()
                .any(|c| c.kind != ComparisonKind::Calibration && c.differs());
            let _ = write!(
                out,
                "<a href=\"#case-{}\"{}>{}</a>",
                index + 1,
                if off {
                    " class=\"off\" title=\"a prediction differs from the seed by more than 20%, or a target fails\""
                } else {
                    ""
                },
                esc(&case_title(case, index))
            );
        }
        out.push_str("</nav>\n");
    }
    out.push_str("</div></header>\n");
}

fn case_title(case: &CaseReport, index: usize) -> String {
    if case.name.is_empty() {
        format!("case {}", index + 1)
    } else {
        case.name.clone()
    }
}

fn case_section(out: &mut String, case: &CaseReport, index: usize, open: bool) {
    let _ = write!(
        out,
        "<section class=\"card case\" id=\"case-{}\">\n<details{}>\n<summary><h2>{}</h2>",
        index + 1,
        if open { " open" } else { "" },
        esc(&case_title(case, index))
    );
    case_badges(out, case);
    out.push_str("</summary>\n");
    if !case.description.trim().is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"case-desc\">{}</p>",
            esc(case.description.trim())
        );
    }
    case_chips(out, case);
    key_metric_tiles(out, case);

    out.push_str("<h3>Workloads</h3>\n");
    if case.workloads.is_empty() && case.total.is_none() {
        out.push_str("<p class=\"empty\">No workloads.</p>\n");
    } else {
        workloads_table(out, case);
    }
    model_sections(out, case);
    for kind in ComparisonKind::ALL {
        comparison_section(out, case, kind);
    }
    timeline_section(out, case);
    if !case.components.is_empty() {
        out.push_str("<h3>Components</h3>\n<figure>");
        let rows: Vec<(&str, &str, f64)> = case
            .components
            .iter()
            .map(|c| (c.name.as_str(), c.kind.as_str(), c.utilisation))
            .collect();
        out.push_str(&utilisation_bars(&rows));
        out.push_str("</figure>\n");
        components_table(out, case);
    }
    out.push_str("</details>\n</section>\n");
}

/// A case's headline figures and its badges (predictions off, targets passed),
/// in its summary line.
fn case_badges(out: &mut String, case: &CaseReport) {
    if let Some(w) = case.headline() {
        let _ = write!(
            out,
            "<span class=\"headline\"><b>{}</b> IOPS · <b>{}</b> MB/s · <b>{}</b> ms mean · <b>{}</b> ms p99</span>",
            esc(&fmt_iops(w.iops)),
            esc(&fmt_mbps(w.mbps)),
            esc(&fmt_ms(w.latency_ms.mean)),
            esc(&fmt_ms(w.latency_ms.p99))
        );
    }
    let t = crate::Tally::of(&case.comparisons);
    if t.predictions > 0 {
        let off = t.predictions - t.within;
        let _ = write!(
            out,
            "<span class=\"badge {}\">{}</span>",
            if off == 0 { "ok" } else { "off" },
            if off == 0 {
                "predictions match the seed".to_string()
            } else {
                format!("{off} of {} predictions off by >20%", t.predictions)
            }
        );
    }
    if t.targets > 0 {
        let _ = write!(
            out,
            "<span class=\"badge {}\">targets {} / {} pass</span>",
            if t.passed == t.targets { "ok" } else { "off" },
            t.passed,
            t.targets
        );
    }
}

/// The chips under a case's summary: measured time, warm-up, simulated I/Os and
/// the sweep's parameters.
fn case_chips(out: &mut String, case: &CaseReport) {
    out.push_str("<div class=\"meta\">");
    let _ = write!(
        out,
        "<span class=\"chip\">measured {} s</span>",
        esc(&fmt_number(case.duration_s))
    );
    if case.warmup_s > 0.0 {
        let _ = write!(
            out,
            "<span class=\"chip\">after {} s of warm-up (shaded in the charts)</span>",
            esc(&fmt_number(case.warmup_s))
        );
    }
    if case.events > 0 {
        let _ = write!(
            out,
            "<span class=\"chip\">{} simulated I/Os</span>",
            esc(&fmt_count(case.events))
        );
    }
    for (key, value) in &case.params {
        let _ = write!(
            out,
            "<span class=\"chip\">{} = {}</span>",
            esc(key),
            esc(&fmt_param(*value))
        );
    }
    out.push_str("</div>\n");
}

/// A case's compare rows of one kind: paired bars (not for targets) and the table.
fn comparison_section(out: &mut String, case: &CaseReport, kind: ComparisonKind) {
    let rows: Vec<&Comparison> = case.comparisons.iter().filter(|c| c.kind == kind).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "<h3>{}</h3>", esc(kind_heading(kind)));
    if kind != ComparisonKind::Target {
        let labels: Vec<String> = rows.iter().map(|c| c.metric.clone()).collect();
        let pairs: Vec<Pair<'_>> = rows
            .iter()
            .zip(&labels)
            .map(|(c, label)| Pair {
                label,
                weir: c.weir,
                seed: c.seed,
                ratio: c.ratio(),
                differs: c.differs(),
                weir_text: fmt_number(c.weir),
                seed_text: fmt_number(c.seed),
            })
            .collect();
        out.push_str("<figure>");
        out.push_str(&paired_bars(&pairs));
        out.push_str("</figure>\n");
    }
    comparisons_table(out, kind, &rows);
}

/// A case's time series, one chart per unit, the warm-up shaded.
fn timeline_section(out: &mut String, case: &CaseReport) {
    if case.timeline.is_empty() {
        return;
    }
    out.push_str("<h3>Over time</h3>\n<div class=\"charts\">\n");
    for (unit, series) in timeline_groups(&case.timeline) {
        let timed = series.iter().all(|s| valid_interval(s.interval_s));
        let names = legend_names(&series);
        let chart = LineChart {
            x_label: if timed {
                "simulated time (s)".to_string()
            } else {
                "interval".to_string()
            },
            y_label: unit.to_string(),
            series: series
                .iter()
                .zip(names)
                .map(|(s, name)| LineSeries {
                    name,
                    points: timeline_points(s),
                })
                .collect(),
            x_scale: XScale::Linear,
            ticks_at_data: false,
            y_from_zero: true,
            x_name: "t =".to_string(),
            seeds: Vec::new(),
            shade: (timed && case.warmup_s > 0.0).then(|| Shade {
                from: 0.0,
                to: case.warmup_s,
                label: format!("warm-up {} s, not measured", fmt_number(case.warmup_s)),
            }),
        };
        let _ = writeln!(
            out,
            "<figure><figcaption>{} over time<span>{} series</span></figcaption>{}</figure>",
            esc(&unit_title(unit)),
            series.len(),
            chart.render()
        );
    }
    out.push_str("</div>\n");
}

fn valid_interval(interval_s: f64) -> bool {
    interval_s.is_finite() && interval_s > 0.0
}

fn timeline_points(series: &TimelineSeries) -> Vec<(f64, f64)> {
    let step = if valid_interval(series.interval_s) {
        series.interval_s
    } else {
        1.0
    };
    series
        .values
        .iter()
        .enumerate()
        .map(|(i, v)| (i as f64 * step, *v))
        .collect()
}

/// Legend names of one chart's series: the word every name ends with when it only
/// repeats the chart's quantity (`app04 MB/s`, `app05 MB/s` → `app04`, `app05`), and
/// `model:` prefixes, left out.
fn legend_names(series: &[&TimelineSeries]) -> Vec<String> {
    let names: Vec<&str> = series
        .iter()
        .map(|s| s.name.strip_prefix("model:").unwrap_or(&s.name))
        .collect();
    let last = |n: &str| n.rsplit_once(' ').map(|(_, w)| w.to_string());
    let common = names
        .first()
        .and_then(|n| last(n))
        .filter(|w| names.iter().all(|n| last(n).as_deref() == Some(w.as_str())));
    names
        .iter()
        .map(|n| match &common {
            Some(w) => n[..n.len() - w.len()].trim_end().to_string(),
            None => n.to_string(),
        })
        .collect()
}

/// Timeline series grouped by unit, units in order of first appearance.
fn timeline_groups(timeline: &[TimelineSeries]) -> Vec<(&str, Vec<&TimelineSeries>)> {
    let mut groups: Vec<(&str, Vec<&TimelineSeries>)> = Vec::new();
    for series in timeline {
        let unit = series.unit.trim();
        match groups.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, members)) => members.push(series),
            None => groups.push((unit, vec![series])),
        }
    }
    groups
}

fn th(out: &mut String, headers: &[(&str, bool)]) {
    out.push_str("<thead><tr>");
    for (header, numeric) in headers {
        let _ = write!(
            out,
            "<th{}>{}</th>",
            if *numeric { " class=\"num\"" } else { "" },
            esc(header)
        );
    }
    out.push_str("</tr></thead>");
}

fn td_num(out: &mut String, text: &str) {
    let _ = write!(out, "<td class=\"num\">{}</td>", esc(text));
}

fn td(out: &mut String, text: &str) {
    let _ = write!(out, "<td>{}</td>", esc(text));
}

fn workloads_table(out: &mut String, case: &CaseReport) {
    let all: Vec<&WorkloadResult> = case.workloads.iter().chain(case.total.as_ref()).collect();
    let show_volume = all.iter().any(|w| w.volume.is_some());
    let show_host = all.iter().any(|w| w.host.is_some());
    let show_max = all.iter().any(|w| w.latency_ms.max != 0.0);
    let show_errors = all.iter().any(|w| w.errors != 0);
    let mut headers = vec![("workload", false)];
    if show_volume {
        headers.push(("volume", false));
    }
    if show_host {
        headers.push(("host", false));
    }
    headers.extend([
        ("IOPS", true),
        ("MB/s", true),
        ("mean ms", true),
        ("p50 ms", true),
        ("p95 ms", true),
        ("p99 ms", true),
    ]);
    if show_max {
        headers.push(("max ms", true));
    }
    if show_errors {
        headers.push(("errors", true));
    }
    out.push_str("<div class=\"tablewrap\"><table>");
    th(out, &headers);
    out.push_str("<tbody>");
    let row = |out: &mut String, w: &WorkloadResult, total: bool| {
        out.push_str(if total {
            "<tr class=\"total\">"
        } else {
            "<tr>"
        });
        td(
            out,
            if total && w.name.is_empty() {
                "total"
            } else {
                &w.name
            },
        );
        if show_volume {
            td(out, w.volume.as_deref().unwrap_or(""));
        }
        if show_host {
            td(out, w.host.as_deref().unwrap_or(""));
        }
        td_num(out, &fmt_iops(w.iops));
        td_num(out, &fmt_mbps(w.mbps));
        let l = &w.latency_ms;
        for v in [l.mean, l.p50, l.p95, l.p99] {
            td_num(out, &fmt_ms(v));
        }
        if show_max {
            td_num(out, &fmt_ms(l.max));
        }
        if show_errors {
            td_num(out, &fmt_count(w.errors));
        }
        out.push_str("</tr>");
    };
    for w in &case.workloads {
        row(out, w, false);
    }
    if let Some(total) = &case.total {
        row(out, total, true);
    }
    out.push_str("</tbody></table></div>\n");
}

/// The heading of a kind of comparison.
fn kind_heading(kind: ComparisonKind) -> &'static str {
    match kind {
        ComparisonKind::Prediction => "Weir vs seed: predictions (counted)",
        ComparisonKind::Calibration => {
            "Calibrations: seed figures a parameter was fitted on (shown, not counted)"
        }
        ComparisonKind::Target => "Targets: configured limits (pass / fail)",
    }
}

fn comparisons_table(out: &mut String, kind: ComparisonKind, rows: &[&Comparison]) {
    out.push_str("<div class=\"tablewrap\"><table>");
    let mut headers = vec![("metric", false), ("Weir", true)];
    if kind == ComparisonKind::Target {
        headers.extend([("limit", true), ("", false)]);
    } else {
        headers.extend([("seed", true), ("ratio", true), ("", false)]);
    }
    if kind == ComparisonKind::Calibration {
        headers.push(("fitted", false));
    }
    headers.extend([("source", false), ("note", false)]);
    th(out, &headers);
    out.push_str("<tbody>");
    for c in rows {
        out.push_str("<tr>");
        td(out, &c.metric);
        td_num(out, &fmt_number(c.weir));
        let (class, label) = if kind == ComparisonKind::Target {
            td_num(out, &c.condition());
            match c.passes() {
                Some(true) => ("ok", "pass"),
                Some(false) => ("off", "FAIL"),
                None => ("off", "not measured"),
            }
        } else {
            td_num(out, &fmt_number(c.seed));
            td_num(out, &fmt_ratio(c.ratio()));
            if !c.differs() {
                (
                    "ok",
                    if kind == ComparisonKind::Calibration {
                        "fitted"
                    } else {
                        "within 20%"
                    },
                )
            } else if c.not_measured() {
                ("off", "not measured")
            } else if c.ratio().is_finite() {
                ("off", "differs >20%")
            } else {
                ("off", "no ratio")
            }
        };
        let _ = write!(
            out,
            "<td><span class=\"badge {class}\">{}</span></td>",
            esc(label)
        );
        if kind == ComparisonKind::Calibration {
            let _ = write!(out, "<td class=\"note\">{}</td>", esc(&c.fitted));
        }
        let _ = write!(
            out,
            "<td class=\"src\">{}</td>",
            esc(&crate::cite_source(&c.source))
        );
        let _ = write!(out, "<td class=\"note\">{}</td>", esc(&c.note));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>\n");
}

fn components_table(out: &mut String, case: &CaseReport) {
    let show_ios = case.components.iter().any(|c| c.ios != 0);
    let show_mbps = case.components.iter().any(|c| c.mbps != 0.0);
    let mut headers = vec![("component", false), ("kind", false), ("busy", true)];
    if show_ios {
        headers.push(("I/Os", true));
    }
    if show_mbps {
        headers.push(("MB/s", true));
    }
    out.push_str("<div class=\"tablewrap\"><table>");
    th(out, &headers);
    out.push_str("<tbody>");
    for c in &case.components {
        out.push_str("<tr>");
        td(out, &c.name);
        td(out, &c.kind);
        let _ = write!(
            out,
            "<td class=\"num\"><span class=\"swatch\" style=\"background:{}\"></span>{}</td>",
            utilisation_colour(c.utilisation),
            esc(&fmt_pct(c.utilisation))
        );
        if show_ios {
            td_num(out, &fmt_count(c.ios));
        }
        if show_mbps {
            td_num(out, &fmt_mbps(c.mbps));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>\n");
}

// ---------------------------------------------------------------- application models

/// Headline tiles of the key model metrics (orders per minute, RPC latency, login and
/// launch times, VSImax…) with their per-window values. Sources of the same model kind
/// (four desktop pools) share one tile showing the range over them.
fn key_metric_tiles(out: &mut String, case: &CaseReport) {
    if case.model_metrics.is_empty() {
        return;
    }
    let columns = app::metric_columns(case);
    let groups = app::metric_groups(case, &columns);
    let mut kinds: Vec<(&str, Vec<&app::MetricGroup<'_>>)> = Vec::new();
    for g in &groups {
        let kind = if g.kind.is_empty() { g.source } else { g.kind };
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, members)) => members.push(g),
            None => kinds.push((kind, vec![g])),
        }
    }
    let whole_index = columns.iter().position(|c| c.is_empty());
    let mut tiles = String::new();
    for (kind, members) in &kinds {
        let title = match members.as_slice() {
            [only] => only.source.to_string(),
            many => format!("{kind} ({})", many.len()),
        };
        for key in app::KEY_METRICS {
            let rows: Vec<&app::MetricRow<'_>> = members
                .iter()
                .filter_map(|g| g.rows.iter().find(|r| r.name == key))
                .collect();
            let Some(first_row) = rows.first() else {
                continue;
            };
            let unit = first_row.unit;
            let values_at = |index: usize| -> Vec<f64> {
                rows.iter()
                    .filter_map(|r| r.values.get(index).copied().flatten())
                    .filter(|v| v.is_finite())
                    .collect()
            };
            let range = |values: &[f64]| -> Option<String> {
                let lo = values.iter().copied().reduce(f64::min)?;
                let hi = values.iter().copied().reduce(f64::max)?;
                let (a, b) = (
                    app::metric_value(key, lo, unit),
                    app::metric_value(key, hi, unit),
                );
                Some(if a == b { a } else { format!("{a}–{b}") })
            };
            let whole = whole_index.map(values_at).unwrap_or_default();
            let worst = whole.iter().copied().reduce(f64::max);
            let reached: Vec<f64> = members
                .iter()
                .filter_map(|g| app::metric(case, g.source, "", "vsimax_reached"))
                .map(|m| m.value)
                .collect();
            let (value_text, unit_text, class) = match (key, range(&whole)) {
                ("vsimax_sessions", None)
                    if !reached.is_empty() && reached.iter().all(|r| *r == 0.0) =>
                {
                    ("not reached".to_string(), "", "good")
                }
                (_, Some(text)) => {
                    let class = match (key, worst) {
                        ("rpc_latency_mean_ms", Some(v)) => {
                            if v < 50.0 {
                                "good"
                            } else {
                                "poor"
                            }
                        }
                        ("login_time_mean_s", Some(v)) => grade_class(UxGrade::login(v)),
                        ("app_launch_time_mean_s", Some(v)) => grade_class(UxGrade::app_load(v)),
                        _ => "",
                    };
                    (text, app::unit_label(unit), class)
                }
                (_, None) => ("n/a".to_string(), "", ""),
            };
            let _ = write!(
                tiles,
                "<div class=\"tile {class}\"><div class=\"l\">{} · {}</div>\
                 <div class=\"v\">{}<small>{}</small></div>",
                esc(&title),
                esc(&app::metric_label(key)),
                esc(&value_text),
                esc(unit_text)
            );
            if members.len() > 1 {
                let names: Vec<&str> = members.iter().map(|g| g.source).collect();
                let _ = write!(
                    tiles,
                    "<div class=\"w\">{}</div>",
                    esc(&crate::svg::truncate(&names.join(", "), 60))
                );
            }
            if key == "vsimax_sessions" {
                let most: Vec<f64> = members
                    .iter()
                    .filter_map(|g| app::metric(case, g.source, "", "vsi_sessions_max"))
                    .map(|m| m.value)
                    .filter(|v| v.is_finite())
                    .collect();
                let hits = reached.iter().filter(|r| **r == 1.0).count();
                if hits > 0 && hits < reached.len() {
                    let _ = write!(
                        tiles,
                        "<div class=\"w\">reached in {hits} of {}</div>",
                        reached.len()
                    );
                }
                if let Some(most) = range(&most) {
                    let _ = write!(
                        tiles,
                        "<div class=\"w\">{} sessions at most</div>",
                        esc(&most)
                    );
                }
            }
            // Per-window values (finite ones), with the change from the first window
            // when one source stands behind the tile.
            let mut parts = Vec::new();
            let mut texts = Vec::new();
            let mut first: Option<f64> = None;
            for (index, column) in columns.iter().enumerate() {
                if column.is_empty() {
                    continue;
                }
                let values = values_at(index);
                let Some(text) = range(&values) else { continue };
                let mut part = format!("{} <b>{}</b>", esc(column), esc(&text));
                if let [v] = values.as_slice()
                    && rows.len() == 1
                {
                    match first {
                        None => first = Some(*v),
                        Some(f) if f != 0.0 => {
                            let change = (v / f - 1.0) * 100.0;
                            let _ = write!(
                                part,
                                " <span class=\"chg\">({}{}%)</span>",
                                if change > 0.0 { "+" } else { "" },
                                esc(&fmt_thousands(change, 1))
                            );
                        }
                        Some(_) => {}
                    }
                }
                parts.push(part);
                texts.push(text);
            }
            let same_as_whole = texts.iter().all(|t| *t == value_text);
            if !parts.is_empty() && !same_as_whole {
                let _ = write!(tiles, "<div class=\"w\">{}</div>", parts.join(" · "));
            }
            tiles.push_str("</div>");
        }
    }
    if !tiles.is_empty() {
        let _ = writeln!(out, "<div class=\"tiles\">{tiles}</div>");
    }
}

fn grade_class(grade: Option<UxGrade>) -> &'static str {
    grade.map_or("", UxGrade::label)
}

/// User experience, application metrics, windows and I/O sizes of a case.
fn model_sections(out: &mut String, case: &CaseReport) {
    let columns = app::metric_columns(case);
    let ux = app::ux_rows(case, &columns);
    if !ux.is_empty() {
        out.push_str("<h3>User experience</h3>\n");
        let rules: Vec<String> = {
            let mut seen: Vec<&str> = Vec::new();
            for r in &ux {
                if !seen.contains(&r.activity) {
                    seen.push(r.activity);
                }
            }
            seen.iter()
                .filter_map(|a| {
                    app::activity_grading(a)
                        .map(|(rule, _)| format!("{}: {rule}", app::activity_label(a)))
                })
                .collect()
        };
        if !rules.is_empty() {
            let _ = writeln!(
                out,
                "<p class=\"hint\">Share of each activity graded good, fair or poor ({}).</p>",
                esc(&rules.join("; "))
            );
        }
        let rows: Vec<ShareRow> = ux
            .iter()
            .map(|r| ShareRow {
                label: format!(
                    "{} · {} · {}",
                    r.source,
                    app::activity_label(r.activity),
                    r.window
                ),
                segments: vec![
                    Segment {
                        label: "good".into(),
                        value: r.good_pct,
                        colour: GOOD,
                    },
                    Segment {
                        label: "fair".into(),
                        value: r.fair_pct,
                        colour: AMBER,
                    },
                    Segment {
                        label: "poor".into(),
                        value: r.poor_pct,
                        colour: BAD,
                    },
                ],
                note: {
                    let mut note = Vec::new();
                    if r.count.is_finite() {
                        note.push(format!("n = {}", fmt_thousands(r.count, 0)));
                    }
                    if r.mean_s.is_finite() {
                        let grade = r.mean_grade().map_or(String::new(), |g| format!(" ({g})"));
                        note.push(format!("mean {} s{grade}", fmt_number(r.mean_s)));
                    }
                    note.join(" · ")
                },
            })
            .collect();
        let _ = writeln!(out, "<figure>{}</figure>", share_bars(&rows, true));
    }
    if !case.model_metrics.is_empty() {
        out.push_str("<h3>Application metrics</h3>\n");
        let rows = app::metric_groups(case, &columns)
            .iter()
            .map(|g| g.rows.len() + 1)
            .sum::<usize>();
        if rows > METRICS_OPEN_ROWS {
            let _ = write!(
                out,
                "<details class=\"more\"><summary>All {} figures of {} sources, per window</summary>",
                case.model_metrics.len(),
                app::metric_groups(case, &columns).len()
            );
            metrics_table(out, case, &columns, !ux.is_empty());
            out.push_str("</details>\n");
        } else {
            metrics_table(out, case, &columns, !ux.is_empty());
        }
    }
    if !case.windows.is_empty() {
        windows_section(out, case);
    }
    if let Some(sizes) = &case.io_sizes {
        sizes_section(out, sizes);
    }
}

fn metrics_table(out: &mut String, case: &CaseReport, columns: &[String], skip_grades: bool) {
    out.push_str("<div class=\"tablewrap\"><table class=\"compact\">");
    let mut headers = vec![("metric", false)];
    headers.extend(columns.iter().map(|c| (app::column_label(c), true)));
    headers.push(("unit", false));
    th(out, &headers);
    out.push_str("<tbody>");
    for group in app::metric_groups(case, columns) {
        let _ = write!(
            out,
            "<tr class=\"group\"><td colspan=\"{}\">{}<span>{}</span></td></tr>",
            columns.len() + 2,
            esc(group.source),
            esc(if group.kind == group.source {
                ""
            } else {
                group.kind
            })
        );
        for row in &group.rows {
            if skip_grades && app::grade_metric(row.name).is_some() {
                continue;
            }
            out.push_str("<tr>");
            let _ = write!(
                out,
                "<td title=\"{}\">{}</td>",
                esc(row.name),
                esc(&app::metric_label(row.name))
            );
            for value in &row.values {
                match value {
                    Some(v) => {
                        let text = app::metric_value(row.name, *v, row.unit);
                        if text == "FAIL" {
                            out.push_str(
                                "<td class=\"num\"><span class=\"badge off\">FAIL</span></td>",
                            );
                        } else if text == "pass" {
                            out.push_str(
                                "<td class=\"num\"><span class=\"badge ok\">pass</span></td>",
                            );
                        } else {
                            td_num(out, &text);
                        }
                    }
                    None => td_num(out, ""),
                }
            }
            let _ = write!(
                out,
                "<td class=\"dim\">{}</td>",
                esc(app::unit_label(row.unit))
            );
            out.push_str("</tr>");
        }
    }
    out.push_str("</tbody></table></div>\n");
}

fn windows_section(out: &mut String, case: &CaseReport) {
    out.push_str("<h3>Windows</h3>\n");
    let spans: Vec<String> = case
        .windows
        .iter()
        .map(|w| {
            format!(
                "<span class=\"chip\">{} · {}–{} s</span>",
                esc(&w.name),
                esc(&fmt_span(w.start_s)),
                esc(&fmt_span(w.end_s))
            )
        })
        .collect();
    let _ = writeln!(out, "<div class=\"meta\">{}</div>", spans.join(""));
    let pivot = app::window_pivot(case);
    let levels: Vec<&app::PivotRow<'_>> = pivot
        .iter()
        .filter(|(name, _)| app::figure_kind(name).0 == "level")
        .collect();
    let (by, members): (&str, Vec<&app::PivotRow<'_>>) = if levels.is_empty() {
        (
            "volume",
            pivot
                .iter()
                .filter(|(name, _)| app::figure_kind(name).0 != "total")
                .collect(),
        )
    } else {
        ("service level", levels)
    };
    let groups: Vec<String> = case.windows.iter().map(|w| w.name.clone()).collect();
    type Figure = (
        &'static str,
        &'static str,
        fn(&WorkloadResult) -> f64,
        fn(f64) -> String,
    );
    let figures: [Figure; 2] = [
        ("IOPS", "IOPS", |w| w.iops, fmt_iops),
        ("Mean latency", "ms", app::window_latency_ms, fmt_ms),
    ];
    if !members.is_empty() {
        out.push_str("<div class=\"charts\">\n");
        for (title, unit, value, fmt) in figures {
            let series: Vec<BarSeries> = members
                .iter()
                .enumerate()
                .map(|(i, (name, per_window))| {
                    let values: Vec<f64> = per_window
                        .iter()
                        .map(|f| f.map_or(f64::NAN, value))
                        .collect();
                    BarSeries {
                        name: app::figure_kind(name).1.to_string(),
                        colour: level_colour(app::figure_kind(name).1, i),
                        tooltips: values
                            .iter()
                            .map(|v| format!("{} {unit}", fmt(*v)))
                            .collect(),
                        values,
                    }
                })
                .collect();
            let _ = writeln!(
                out,
                "<figure><figcaption>{title} per window<span>per {by}</span></figcaption>{}</figure>",
                grouped_bars(&groups, &series, unit)
            );
        }
        out.push_str("</div>\n");
    }
    // The table: one row per figure, IOPS / MB/s / mean ms per window.
    out.push_str("<div class=\"tablewrap\"><table><thead><tr><th></th><th>figure</th>");
    for w in &case.windows {
        let _ = write!(
            out,
            "<th class=\"num\">{} IOPS</th><th class=\"num\">MB/s</th><th class=\"num\">mean ms</th>",
            esc(&w.name)
        );
    }
    out.push_str("</tr></thead><tbody>");
    for (name, per_window) in &pivot {
        let (kind, label) = app::figure_kind(name);
        out.push_str(if kind == "total" {
            "<tr class=\"total\">"
        } else {
            "<tr>"
        });
        let _ = write!(
            out,
            "<td class=\"dim\">{}</td>",
            esc(if kind == "total" { "" } else { kind })
        );
        td(out, label);
        for f in per_window {
            match f {
                Some(f) => {
                    td_num(out, &fmt_iops(f.iops));
                    td_num(out, &fmt_mbps(f.mbps));
                    td_num(out, &fmt_ms(app::window_latency_ms(f)));
                }
                None => {
                    for _ in 0..3 {
                        td_num(out, "");
                    }
                }
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>\n");
}

/// Service levels keep their colours across charts (mission-critical blue, business-
/// critical orange, non-critical grey-green); anything else takes the palette.
fn level_colour(name: &str, index: usize) -> &'static str {
    match name {
        "mission-critical" => PALETTE[0],
        "business-critical" => PALETTE[1],
        "non-critical" => PALETTE[3],
        "best-effort" => PALETTE[9],
        _ => PALETTE[index % PALETTE.len()],
    }
}

fn sizes_section(out: &mut String, h: &IoSizeHistogram) {
    out.push_str("<h3>I/O sizes</h3>\n");
    let buckets = app::size_buckets(h);
    let all: u64 = buckets
        .iter()
        .map(|b| b.reads.saturating_add(b.writes))
        .fold(0, u64::saturating_add);
    let split = app::access_split(h);
    let has_split = split.iter().any(|(_, s, r)| s.saturating_add(*r) > 0);
    if all == 0 && !has_split {
        out.push_str("<p class=\"empty\">No transfers recorded.</p>\n");
        return;
    }
    out.push_str("<div class=\"charts\">\n");
    if all > 0 {
        let groups: Vec<String> = buckets.iter().map(|b| b.short_label.clone()).collect();
        let series: Vec<BarSeries> = [
            (
                "reads",
                PALETTE[0],
                buckets.iter().map(|b| b.reads).collect::<Vec<u64>>(),
            ),
            (
                "writes",
                PALETTE[1],
                buckets.iter().map(|b| b.writes).collect(),
            ),
        ]
        .into_iter()
        .map(|(name, colour, counts)| BarSeries {
            name: name.to_string(),
            colour,
            values: counts.iter().map(|c| app::pct(*c, all)).collect(),
            tooltips: counts
                .iter()
                .map(|c| {
                    format!(
                        "{} I/Os ({}% of all)",
                        fmt_count(*c),
                        fmt_thousands(app::pct(*c, all), 1)
                    )
                })
                .collect(),
        })
        .collect();
        let _ = writeln!(
            out,
            "<figure><figcaption>Transfer sizes<span>{} I/Os</span></figcaption>{}</figure>",
            esc(&fmt_count(all)),
            grouped_bars(&groups, &series, "% of I/Os")
        );
    }
    if has_split {
        let rows: Vec<ShareRow> = split
            .iter()
            .map(|(label, seq, random)| ShareRow {
                label: label.to_string(),
                segments: vec![
                    Segment {
                        label: "sequential".into(),
                        value: *seq as f64,
                        colour: PALETTE[0],
                    },
                    Segment {
                        label: "random".into(),
                        value: *random as f64,
                        colour: PALETTE[1],
                    },
                ],
                note: format!("{} I/Os", fmt_count(seq.saturating_add(*random))),
            })
            .collect();
        let _ = writeln!(
            out,
            "<figure><figcaption>Random vs sequential</figcaption>{}</figure>",
            share_bars(&rows, false)
        );
    }
    out.push_str("</div>\n");
}

// ---------------------------------------------------------------- across cases

/// Cases of a report without sweeps side by side (e.g. the nine application
/// profiles of 002 Table 15): per headline figure a bar per case, with the seed's
/// figure beside it where the case compares that figure. Three cases at least.
fn cases_section(out: &mut String, report: &ScenarioReport) {
    let cases: Vec<(usize, &CaseReport, &WorkloadResult)> = report
        .cases
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((i, c, c.headline()?)))
        .collect();
    if cases.len() < 3 {
        return;
    }
    let _ = writeln!(
        out,
        "<section class=\"card\" id=\"across\">\n<h2>Across the cases</h2>\n<p class=\"hint\">\
         {} cases side by side: each case's total (or only workload) figure, and the seed \
         document's figure beside it where the case compares one.</p>\n<div class=\"charts\">",
        cases.len()
    );
    let groups: Vec<String> = cases.iter().map(|(i, c, _)| case_title(c, *i)).collect();
    type Metric = (
        &'static str,
        &'static str,
        &'static str,
        fn(&WorkloadResult) -> f64,
    );
    let metrics: [Metric; 3] = [
        ("I/O rate", "IOPS", "iops", |w| w.iops),
        ("Throughput", "MB/s", "mbps", |w| w.mbps),
        ("Mean latency", "ms", "latency_mean_ms", |w| {
            w.latency_ms.mean
        }),
    ];
    for (title, unit, field, value) in metrics {
        let weir: Vec<f64> = cases.iter().map(|(_, _, w)| value(w)).collect();
        let seed: Vec<f64> = cases
            .iter()
            .map(|(_, c, _)| {
                headline_comparisons(c)
                    .into_iter()
                    .find(|(f, _)| *f == field)
                    .map_or(f64::NAN, |(_, c)| c.seed)
            })
            .collect();
        let tips = |v: &[f64]| -> Vec<String> {
            v.iter()
                .map(|x| format!("{} {unit}", fmt_number(*x)))
                .collect()
        };
        let mut series = vec![BarSeries {
            name: "Weir".into(),
            colour: PALETTE[0],
            tooltips: tips(&weir),
            values: weir,
        }];
        if seed.iter().any(|x| x.is_finite()) {
            series.push(BarSeries {
                name: "seed document".into(),
                colour: PALETTE[1],
                tooltips: tips(&seed),
                values: seed,
            });
        }
        let _ = writeln!(
            out,
            "<figure><figcaption>{} per case<span>{}</span></figcaption>{}</figure>",
            esc(title),
            esc(unit),
            grouped_bars(&groups, &series, unit)
        );
    }
    out.push_str("</div>\n</section>\n");
}

// ---------------------------------------------------------------- sweeps

/// Parameters with at least two distinct finite values across the cases, sorted.
pub(crate) fn swept_parameters(report: &ScenarioReport) -> Vec<String> {
    let keys: BTreeSet<&String> = report.cases.iter().flat_map(|c| c.params.keys()).collect();
    keys.into_iter()
        .filter(|key| {
            let mut values: Vec<f64> = report
                .cases
                .iter()
                .filter_map(|c| c.params.get(*key).copied())
                .filter(|v| v.is_finite())
                .collect();
            values.sort_by(f64::total_cmp);
            values.dedup();
            values.len() >= 2
        })
        .map(|k| k.to_string())
        .collect()
}

/// One line of a sweep chart: cases that differ only by the swept parameter.
pub(crate) struct SweepSeries<'a> {
    pub label: String,
    /// (parameter value, headline figure), sorted by value.
    pub points: Vec<(f64, &'a WorkloadResult)>,
    /// The seed figures compared with a headline figure of these cases (`total.mbps`),
    /// at the case's parameter value.
    pub seeds: Vec<(f64, &'a Comparison)>,
}

/// The base name of a swept case: the simulator names the cases of a `[[case]]`'s
/// sweep `<case>/<param>=<value>[,<param>=<value>…]`; that suffix, when it spells
/// exactly the case's parameters, is cut off (`8g/eight-vms/block_kib=8` →
/// `8g/eight-vms`).
pub(crate) fn sweep_base<'a>(
    name: &'a str,
    params: &std::collections::BTreeMap<String, f64>,
) -> Option<&'a str> {
    let (base, suffix) = name.rsplit_once('/')?;
    let spelled: Vec<(&str, &str)> = suffix
        .split(',')
        .map(|kv| kv.split_once('='))
        .collect::<Option<_>>()?;
    let exact = spelled.len() == params.len()
        && spelled.iter().all(|(k, v)| {
            params
                .get(*k)
                .is_some_and(|x| v.parse::<f64>().ok() == Some(*x))
        });
    (exact && !base.is_empty()).then_some(base)
}

/// Comparisons of `case` that compare its headline figure (`total.<field>`, or
/// `<workload>.<field>` when the case has that one workload), as `(field,
/// comparison)`.
fn headline_comparisons(case: &CaseReport) -> Vec<(&str, &Comparison)> {
    if case.headline().is_none() {
        return Vec::new();
    }
    let only = match case.workloads.as_slice() {
        [w] => Some(w.name.as_str()),
        _ => None,
    };
    case.comparisons
        .iter()
        .filter(|c| c.kind != ComparisonKind::Target)
        .filter(|c| !c.expr.contains('@') && !c.expr.contains(" / ") && !c.expr.contains(" + "))
        .filter_map(|c| {
            let (subject, field) = c.expr.rsplit_once('.')?;
            let headline = (subject == "total" && case.total.is_some()) || Some(subject) == only;
            headline.then_some((field, c))
        })
        .collect()
}

/// A swept parameter as an axis title: `block_kib` → `block size (KiB)`; dotted paths
/// name their last part and keep the path (`drives (array.raid.drives)`).
pub(crate) fn param_label(key: &str) -> String {
    let known = match key {
        "block_kib" => "block size (KiB)",
        "size_bytes" => "transfer size (bytes)",
        "queue_depth" => "outstanding I/Os per worker",
        "workers" => "workers per VM",
        "read_pct" => "reads (%)",
        "random_pct" => "random (%)",
        "burst_ios" => "I/Os per burst",
        "burst_delay_ms" => "delay between bursts (ms)",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    match key.rsplit_once('.') {
        Some((_, last)) => format!("{} ({key})", last.replace('_', " ")),
        None => key.replace('_', " "),
    }
}

/// [`param_label`] without its unit: `block size`.
fn param_name(key: &str) -> String {
    let label = param_label(key);
    match label.split_once(" (") {
        Some((name, _)) if !key.contains('.') => name.to_string(),
        _ => label,
    }
}

/// The digits that spell `value` in a name: `64`, `0.5`.
fn spelled(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// True when the name token spells the parameter's value (see the module docs).
fn token_spells(token: &str, key: &str, value: f64) -> bool {
    let plain = spelled(value);
    let key = key.to_ascii_lowercase();
    let kib_like = key.ends_with("kib") || key.ends_with("kb") || key.ends_with("_k");
    let mebi = (kib_like && value >= 1024.0 && (value / 1024.0).fract() == 0.0)
        .then(|| spelled(value / 1024.0));
    let chars: Vec<char> = token.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let run: String = chars[start..i].iter().collect();
            let run = run.trim_end_matches('.');
            if run == plain {
                return true;
            }
            if let Some(mebi) = &mebi {
                let next = chars.get(start + run.chars().count());
                if run == mebi && matches!(next, Some('m' | 'M')) {
                    return true;
                }
            }
        } else {
            i += 1;
        }
    }
    false
}

fn name_key(name: &str, key: &str, value: f64) -> String {
    name.split(|c: char| !(c.is_alphanumeric() || c == '.'))
        .map(|t| t.trim_matches('.'))
        .filter(|t| !t.is_empty() && !token_spells(t, key, value))
        .collect::<Vec<_>>()
        .join(" ")
}

fn param_key(case: &CaseReport, key: &str) -> String {
    case.params
        .iter()
        .filter(|(k, _)| k.as_str() != key)
        .map(|(k, v)| format!("{k}={}", fmt_param(*v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Groups `cases` into series along parameter `key` (rule in the module docs).
pub(crate) fn sweep_series<'a>(cases: &'a [CaseReport], key: &str) -> Vec<SweepSeries<'a>> {
    struct Member<'a> {
        x: f64,
        name_key: String,
        param_key: String,
        headline: &'a WorkloadResult,
        case: &'a CaseReport,
    }
    let members: Vec<Member<'a>> = cases
        .iter()
        .filter_map(|case| {
            let x = *case.params.get(key)?;
            if !x.is_finite() {
                return None;
            }
            Some(Member {
                x,
                name_key: match sweep_base(&case.name, &case.params) {
                    Some(base) => base.to_string(),
                    None => name_key(&case.name, key, x),
                },
                param_key: param_key(case, key),
                headline: case.headline()?,
                case,
            })
        })
        .collect();
    if members.is_empty() {
        return Vec::new();
    }
    // Group by a key function, keeping first-appearance order.
    let group = |key_of: &dyn Fn(&Member<'a>) -> String| -> Vec<(String, Vec<usize>)> {
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, m) in members.iter().enumerate() {
            let k = key_of(m);
            match groups.iter_mut().find(|(g, _)| *g == k) {
                Some((_, idx)) => idx.push(i),
                None => groups.push((k, vec![i])),
            }
        }
        groups
    };
    let degenerate = |groups: &[(String, Vec<usize>)]| {
        let repeated_x = groups.iter().any(|(_, idx)| {
            let mut xs: Vec<f64> = idx.iter().map(|&i| members[i].x).collect();
            xs.sort_by(f64::total_cmp);
            xs.windows(2).any(|w| w[0] == w[1])
        });
        let all_single = members.len() > 1 && groups.iter().all(|(_, idx)| idx.len() == 1);
        repeated_x || all_single
    };
    let join = |a: &str, b: &str| match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (false, true) => a.to_string(),
        (false, false) => format!("{a} · {b}"),
    };
    let by_both = group(&|m| join(&m.name_key, &m.param_key));
    let by_name = group(&|m| m.name_key.clone());
    let groups = if !degenerate(&by_both) {
        // Label by the name alone when it already separates the series.
        if by_name.len() == by_both.len() {
            by_name
        } else {
            by_both
        }
    } else {
        let by_params = group(&|m| m.param_key.clone());
        if degenerate(&by_params) {
            by_both
        } else {
            by_params
        }
    };
    let single = groups.len() == 1;
    groups
        .into_iter()
        .map(|(label, idx)| {
            let mut points: Vec<(f64, &WorkloadResult)> = idx
                .iter()
                .map(|&i| (members[i].x, members[i].headline))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut seeds = Vec::new();
            for &i in &idx {
                let m = &members[i];
                seeds.extend(
                    headline_comparisons(m.case)
                        .into_iter()
                        .map(|(_, c)| (m.x, c)),
                );
            }
            let label = if label.is_empty() {
                if single {
                    "all cases".to_string()
                } else {
                    "(unnamed)".to_string()
                }
            } else {
                label
            };
            SweepSeries {
                label,
                points,
                seeds,
            }
        })
        .collect()
}

fn sweep_section(out: &mut String, report: &ScenarioReport) {
    out.push_str("<section class=\"card\" id=\"sweep\">\n<h2>Sweep</h2>\n");
    let swept = swept_parameters(report);
    if swept.is_empty() {
        out.push_str(
            "<p class=\"hint\">The cases carry parameters, but none of them varies.</p>\n",
        );
    }
    type Metric = (
        &'static str,
        &'static str,
        &'static str,
        fn(&WorkloadResult) -> f64,
    );
    let metrics: [Metric; 4] = [
        ("Throughput", "MB/s", "mbps", |w| w.mbps),
        ("I/O rate", "IOPS", "iops", |w| w.iops),
        ("Mean latency", "ms", "latency_mean_ms", |w| {
            w.latency_ms.mean
        }),
        ("p99 latency", "ms", "latency_p99_ms", |w| w.latency_ms.p99),
    ];
    for key in &swept {
        let series = sweep_series(&report.cases, key);
        let xs: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        let (lo, hi) = xs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        let x_scale = if lo > 0.0 && hi / lo >= 8.0 {
            XScale::Log2
        } else {
            XScale::Linear
        };
        let _ = writeln!(
            out,
            "<h3>Against {}</h3>\n<p class=\"hint\">{} series; each point is one case's \
             total (or only workload) figure; hollow diamonds are the seed documents' \
             figures for it.{}</p>\n<div class=\"charts\">",
            esc(&param_name(key)),
            series.len(),
            if x_scale == XScale::Log2 {
                " The x axis is logarithmic (base 2)."
            } else {
                ""
            }
        );
        for (title, unit, field, value) in metrics {
            let seeds = series
                .iter()
                .enumerate()
                .flat_map(|(i, s)| {
                    s.seeds
                        .iter()
                        .filter(|(_, c)| c.expr.ends_with(&format!(".{field}")))
                        .map(move |(x, c)| SeedPoint {
                            series: i,
                            x: *x,
                            y: c.seed,
                            label: format!(
                                "{}: seed {} — {}",
                                c.metric,
                                fmt_number(c.seed),
                                crate::cite_source(&c.source)
                            ),
                        })
                })
                .collect();
            let chart = LineChart {
                x_label: param_label(key),
                y_label: unit.to_string(),
                series: series
                    .iter()
                    .map(|s| LineSeries {
                        name: s.label.clone(),
                        points: s.points.iter().map(|(x, w)| (*x, value(w))).collect(),
                    })
                    .collect(),
                x_scale,
                ticks_at_data: true,
                y_from_zero: true,
                x_name: format!("{} =", param_name(key)),
                seeds,
                shade: None,
            };
            let _ = writeln!(
                out,
                "<figure><figcaption>{} vs {}<span>{}</span></figcaption>{}</figure>",
                esc(title),
                esc(&param_name(key)),
                esc(unit),
                chart.render()
            );
        }
        out.push_str("</div>\n");
    }
    // Sweep table: one row per case with parameters.
    let keys: BTreeSet<&String> = report.cases.iter().flat_map(|c| c.params.keys()).collect();
    out.push_str(
        "<h3 id=\"sweep-cases\">Cases</h3>\n<div class=\"tablewrap\"><table><thead><tr><th>case</th>",
    );
    for key in &keys {
        let _ = write!(out, "<th class=\"num\">{}</th>", esc(key));
    }
    out.push_str(
        "<th class=\"num\">IOPS</th><th class=\"num\">MB/s</th><th class=\"num\">mean ms</th>\
         <th class=\"num\">p99 ms</th></tr></thead><tbody>",
    );
    for (index, case) in report.cases.iter().enumerate() {
        if case.params.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "<tr><td><a href=\"#case-{}\">{}</a></td>",
            index + 1,
            esc(&case_title(case, index))
        );
        for key in &keys {
            td_num(
                out,
                &case
                    .params
                    .get(*key)
                    .map(|v| fmt_param(*v))
                    .unwrap_or_default(),
            );
        }
        match case.headline() {
            Some(w) => {
                td_num(out, &fmt_iops(w.iops));
                td_num(out, &fmt_mbps(w.mbps));
                td_num(out, &fmt_ms(w.latency_ms.mean));
                td_num(out, &fmt_ms(w.latency_ms.p99));
            }
            None => {
                for _ in 0..4 {
                    td_num(out, "n/a");
                }
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>\n</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LatencySummary;

    fn case(name: &str, params: &[(&str, f64)], mbps: f64) -> CaseReport {
        CaseReport {
            name: name.to_string(),
            params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            duration_s: 10.0,
            total: Some(WorkloadResult {
                name: "total".into(),
                iops: mbps * 10.0,
                mbps,
                latency_ms: LatencySummary::default(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn tokens_spelling_the_value_are_dropped() {
        assert_eq!(
            name_key("raid5-seq-read-bs64k", "block_kib", 64.0),
            "raid5 seq read"
        );
        assert_eq!(
            name_key("raid5 seq read 1MiB", "block_kib", 1024.0),
            "raid5 seq read"
        );
        assert_eq!(
            name_key("raid10/qd32/bs8k", "queue_depth", 32.0),
            "raid10 bs8k"
        );
        assert_eq!(name_key("oltp 0.5", "ratio", 0.5), "oltp");
    }

    #[test]
    fn series_per_raid_level_and_direction() {
        let mut cases = Vec::new();
        for raid in [0, 5, 10] {
            for dir in ["read", "write"] {
                for bs in [4.0, 64.0, 1024.0] {
                    cases.push(case(
                        &format!("raid{raid}-seq-{dir}-bs{bs}k"),
                        &[("block_kib", bs), ("raid_level", raid as f64)],
                        bs,
                    ));
                }
            }
        }
        let series = sweep_series(&cases, "block_kib");
        assert_eq!(series.len(), 6);
        assert_eq!(series[0].label, "raid0 seq read");
        assert_eq!(series[1].label, "raid0 seq write");
        assert!(series.iter().all(|s| s.points.len() == 3));
        assert_eq!(series[0].points[2].0, 1024.0);
        // Along raid_level the name keeps the block size and direction.
        let series = sweep_series(&cases, "raid_level");
        assert_eq!(series.len(), 6);
        assert!(series.iter().all(|s| s.points.len() == 3));
    }

    #[test]
    fn unhelpful_names_fall_back_to_other_params() {
        let cases = vec![
            case("a", &[("block_kib", 4.0), ("queue_depth", 1.0)], 1.0),
            case("b", &[("block_kib", 8.0), ("queue_depth", 1.0)], 2.0),
            case("c", &[("block_kib", 4.0), ("queue_depth", 8.0)], 3.0),
            case("d", &[("block_kib", 8.0), ("queue_depth", 8.0)], 4.0),
        ];
        let series = sweep_series(&cases, "block_kib");
        let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["queue_depth=1", "queue_depth=8"]);
        assert_eq!(series[1].points[1].1.mbps, 4.0);
    }

    #[test]
    fn swept_parameters_need_two_values() {
        let report = ScenarioReport {
            cases: vec![
                case("x", &[("block_kib", 4.0), ("queue_depth", 8.0)], 1.0),
                case("y", &[("block_kib", 8.0), ("queue_depth", 8.0)], 1.0),
            ],
            ..Default::default()
        };
        assert_eq!(swept_parameters(&report), ["block_kib"]);
    }
}
