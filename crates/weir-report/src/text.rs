//! Terminal rendering: per case a workloads table with a total line, "Weir vs seed",
//! components, timeline sparklines; for sweeps a compact table with one row per case.

use crate::format::{
    fmt_count, fmt_iops, fmt_mbps, fmt_ms, fmt_number, fmt_param, fmt_pct, fmt_ratio,
};
use crate::table::{Cell, Column, Style, Table, sanitize};
use crate::{CaseReport, Comparison, ScenarioReport, TimelineSeries, WorkloadResult};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Options of [`render_text`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextOptions {
    /// ANSI colours (off by default).
    pub color: bool,
    /// One sparkline per timeline series (on by default).
    pub sparklines: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            color: false,
            sparklines: true,
        }
    }
}

/// Widest sparkline, in characters; longer series are averaged into this many buckets.
const SPARKLINE_WIDTH: usize = 60;
const INDENT: usize = 2;

/// Readable terminal tables for every case of the report.
pub fn render_text(report: &ScenarioReport, opts: &TextOptions) -> String {
    let color = opts.color;
    let mut out = String::new();
    let title = format!(
        "Weir report: {} (seed {}, {} case{})",
        sanitize(&report.scenario),
        report.seed,
        report.cases.len(),
        if report.cases.len() == 1 { "" } else { "s" }
    );
    let _ = writeln!(out, "{}", Style::Bold.paint(&title, color));
    if !report.description.trim().is_empty() {
        let _ = writeln!(out, "{}", sanitize(report.description.trim()));
    }
    let comparisons: Vec<&Comparison> = report
        .cases
        .iter()
        .flat_map(|c| c.comparisons.iter())
        .collect();
    if !comparisons.is_empty() {
        let within = comparisons.iter().filter(|c| !c.differs()).count();
        let _ = writeln!(
            out,
            "Weir vs seed: {within} of {} figures within ±20%",
            comparisons.len()
        );
    }
    if report.cases.is_empty() {
        let _ = writeln!(out, "\n(no cases)");
    }
    let count = report.cases.len();
    for (index, case) in report.cases.iter().enumerate() {
        out.push('\n');
        render_case(&mut out, case, index + 1, count, opts);
    }
    if report.is_sweep() {
        out.push('\n');
        render_sweep(&mut out, report, color);
    }
    out
}

fn section(out: &mut String, title: &str, color: bool) {
    let _ = writeln!(out, "\n{}", Style::Bold.paint(title, color));
}

fn render_case(
    out: &mut String,
    case: &CaseReport,
    number: usize,
    count: usize,
    opts: &TextOptions,
) {
    let color = opts.color;
    let heading = format!("━━ Case {number}/{count}: {} ", sanitize(&case.name));
    let rule_len = 78usize.saturating_sub(heading.chars().count());
    let _ = writeln!(
        out,
        "{}",
        Style::Cyan.paint(&format!("{heading}{}", "━".repeat(rule_len)), color)
    );
    if !case.description.trim().is_empty() {
        let _ = writeln!(out, "{}", sanitize(case.description.trim()));
    }
    let mut facts = vec![format!("measured {} s", fmt_number(case.duration_s))];
    if case.events > 0 {
        facts.push(format!("{} simulated I/Os", fmt_count(case.events)));
    }
    if !case.params.is_empty() {
        let params: Vec<String> = case
            .params
            .iter()
            .map(|(k, v)| format!("{}={}", sanitize(k), fmt_param(*v)))
            .collect();
        facts.push(params.join(" "));
    }
    let _ = writeln!(out, "{}", facts.join(" · "));

    section(out, "Workloads", color);
    if case.workloads.is_empty() && case.total.is_none() {
        let _ = writeln!(out, "  (none)");
    } else {
        out.push_str(&workload_table(case).render(color));
    }

    if !case.comparisons.is_empty() {
        let within = case.comparisons.iter().filter(|c| !c.differs()).count();
        section(
            out,
            &format!(
                "Weir vs seed ({within} of {} within ±20%)",
                case.comparisons.len()
            ),
            color,
        );
        out.push_str(&comparison_table(&case.comparisons).render(color));
    }

    if !case.components.is_empty() {
        section(out, "Components", color);
        out.push_str(&component_table(case).render(color));
    }

    if opts.sparklines && !case.timeline.is_empty() {
        section(out, "Timeline", color);
        out.push_str(&timeline_table(&case.timeline).render(color));
    }
}

fn workload_table(case: &CaseReport) -> Table {
    let all: Vec<&WorkloadResult> = case.workloads.iter().chain(case.total.as_ref()).collect();
    let show_volume = all.iter().any(|w| w.volume.is_some());
    let show_host = all.iter().any(|w| w.host.is_some());
    let show_max = all.iter().any(|w| w.latency_ms.max != 0.0);
    let show_errors = all.iter().any(|w| w.errors != 0);
    let mut columns = vec![Column::left("workload")];
    if show_volume {
        columns.push(Column::left("volume"));
    }
    if show_host {
        columns.push(Column::left("host"));
    }
    for header in ["IOPS", "MB/s", "mean ms", "p50 ms", "p95 ms", "p99 ms"] {
        columns.push(Column::right(header));
    }
    if show_max {
        columns.push(Column::right("max ms"));
    }
    if show_errors {
        columns.push(Column::right("errors"));
    }
    let mut table = Table::new(columns).with_indent(INDENT);
    let row = |w: &WorkloadResult, style: Style| -> Vec<Cell> {
        let mut cells = vec![Cell::styled(w.name.as_str(), style)];
        if show_volume {
            cells.push(Cell::new(w.volume.as_deref().unwrap_or("")));
        }
        if show_host {
            cells.push(Cell::new(w.host.as_deref().unwrap_or("")));
        }
        cells.push(Cell::styled(fmt_iops(w.iops), style));
        cells.push(Cell::styled(fmt_mbps(w.mbps), style));
        let l = &w.latency_ms;
        for v in [l.mean, l.p50, l.p95, l.p99] {
            cells.push(Cell::styled(fmt_ms(v), style));
        }
        if show_max {
            cells.push(Cell::styled(fmt_ms(l.max), style));
        }
        if show_errors {
            let err_style = if w.errors > 0 { Style::Red } else { style };
            cells.push(Cell::styled(fmt_count(w.errors), err_style));
        }
        cells
    };
    for w in &case.workloads {
        table.add_row(row(w, Style::Plain));
    }
    if let Some(total) = &case.total {
        if !case.workloads.is_empty() {
            table.add_separator();
        }
        let mut total = total.clone();
        if total.name.is_empty() {
            total.name = "total".to_string();
        }
        table.add_row(row(&total, Style::Bold));
    }
    table
}

/// The marker column of the "Weir vs seed" table.
fn mismatch_cell(c: &Comparison) -> Cell {
    if !c.differs() {
        Cell::styled("ok", Style::Green)
    } else if c.ratio().is_finite() {
        Cell::styled("!! >20%", Style::Red)
    } else {
        Cell::styled("!! no ratio", Style::Red)
    }
}

fn comparison_table(comparisons: &[Comparison]) -> Table {
    let mut table = Table::new(vec![
        Column::left("metric"),
        Column::right("Weir"),
        Column::right("seed"),
        Column::right("ratio"),
        Column::left(""),
        Column::left("source"),
        Column::left("note"),
    ])
    .with_indent(INDENT);
    for c in comparisons {
        let ratio_style = if c.differs() {
            Style::Red
        } else {
            Style::Green
        };
        table.add_row([
            Cell::new(c.metric.as_str()),
            Cell::new(fmt_number(c.weir)),
            Cell::new(fmt_number(c.seed)),
            Cell::styled(fmt_ratio(c.ratio()), ratio_style),
            mismatch_cell(c),
            Cell::styled(c.source.as_str(), Style::Dim),
            Cell::new(c.note.as_str()),
        ]);
    }
    table
}

/// `█████░░░░░` for a busy fraction; values outside 0..1 are clamped for the bar only.
fn utilisation_bar(fraction: f64, width: usize) -> String {
    let filled = if fraction.is_finite() {
        (fraction.clamp(0.0, 1.0) * width as f64).round() as usize
    } else {
        0
    };
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

fn utilisation_style(fraction: f64) -> Style {
    match fraction {
        f if !f.is_finite() => Style::Dim,
        f if f >= 0.9 => Style::Red,
        f if f >= 0.7 => Style::Yellow,
        _ => Style::Green,
    }
}

fn component_table(case: &CaseReport) -> Table {
    let show_ios = case.components.iter().any(|c| c.ios != 0);
    let show_mbps = case.components.iter().any(|c| c.mbps != 0.0);
    let mut columns = vec![
        Column::left("component"),
        Column::left("kind"),
        Column::right("busy"),
        Column::left(""),
    ];
    if show_ios {
        columns.push(Column::right("I/Os"));
    }
    if show_mbps {
        columns.push(Column::right("MB/s"));
    }
    let mut table = Table::new(columns).with_indent(INDENT);
    for c in &case.components {
        let style = utilisation_style(c.utilisation);
        let mut cells = vec![
            Cell::new(c.name.as_str()),
            Cell::styled(c.kind.as_str(), Style::Dim),
            Cell::new(fmt_pct(c.utilisation)),
            Cell::styled(utilisation_bar(c.utilisation, 20), style),
        ];
        if show_ios {
            cells.push(Cell::new(fmt_count(c.ios)));
        }
        if show_mbps {
            cells.push(Cell::new(fmt_mbps(c.mbps)));
        }
        table.add_row(cells);
    }
    table
}

/// A sparkline of the series (NaN / inf shown as spaces), at most `width` characters.
pub(crate) fn sparkline(values: &[f64], width: usize) -> String {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if values.is_empty() || width == 0 {
        return String::new();
    }
    let buckets: Vec<f64> = if values.len() <= width {
        values.to_vec()
    } else {
        (0..width)
            .map(|b| {
                let start = b * values.len() / width;
                let end = ((b + 1) * values.len() / width).max(start + 1);
                let finite: Vec<f64> = values[start..end]
                    .iter()
                    .copied()
                    .filter(|v| v.is_finite())
                    .collect();
                if finite.is_empty() {
                    f64::NAN
                } else {
                    finite.iter().sum::<f64>() / finite.len() as f64
                }
            })
            .collect()
    };
    let finite = buckets.iter().copied().filter(|v| v.is_finite());
    let (min, max) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    buckets
        .iter()
        .map(|v| {
            if !v.is_finite() {
                ' '
            } else if max > min {
                let level = ((v - min) / (max - min) * 7.0).round() as usize;
                LEVELS[level.min(7)]
            } else {
                LEVELS[3]
            }
        })
        .collect()
}

fn timeline_table(series: &[TimelineSeries]) -> Table {
    let mut table = Table::new(vec![
        Column::left("series"),
        Column::left(""),
        Column::right("min"),
        Column::right("max"),
        Column::left("unit"),
        Column::right("points"),
    ])
    .with_indent(INDENT);
    for s in series {
        let finite = s.values.iter().copied().filter(|v| v.is_finite());
        let (min, max) = finite.fold((f64::NAN, f64::NAN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        table.add_row([
            Cell::new(s.name.as_str()),
            Cell::styled(sparkline(&s.values, SPARKLINE_WIDTH), Style::Cyan),
            Cell::new(fmt_number(min)),
            Cell::new(fmt_number(max)),
            Cell::styled(s.unit.as_str(), Style::Dim),
            Cell::new(format!(
                "{} × {} s",
                fmt_count(s.values.len() as u64),
                fmt_number(s.interval_s)
            )),
        ]);
    }
    table
}

fn render_sweep(out: &mut String, report: &ScenarioReport, color: bool) {
    let keys: BTreeSet<&str> = report
        .cases
        .iter()
        .flat_map(|c| c.params.keys().map(String::as_str))
        .collect();
    let _ = writeln!(
        out,
        "{}",
        Style::Bold.paint(
            &format!(
                "Sweep over {}",
                keys.iter()
                    .map(|k| sanitize(k))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            color
        )
    );
    let mut columns = vec![Column::left("case")];
    columns.extend(keys.iter().map(|k| Column::right(*k)));
    for header in ["IOPS", "MB/s", "mean ms", "p99 ms"] {
        columns.push(Column::right(header));
    }
    let mut table = Table::new(columns).with_indent(INDENT);
    for case in report.cases.iter().filter(|c| !c.params.is_empty()) {
        let mut cells = vec![Cell::new(case.name.as_str())];
        for key in &keys {
            cells.push(Cell::new(
                case.params
                    .get(*key)
                    .map(|v| fmt_param(*v))
                    .unwrap_or_default(),
            ));
        }
        match case.headline() {
            Some(w) => {
                cells.push(Cell::new(fmt_iops(w.iops)));
                cells.push(Cell::new(fmt_mbps(w.mbps)));
                cells.push(Cell::new(fmt_ms(w.latency_ms.mean)));
                cells.push(Cell::new(fmt_ms(w.latency_ms.p99)));
            }
            None => cells.extend((0..4).map(|_| Cell::styled("n/a", Style::Dim))),
        }
        table.add_row(cells);
    }
    out.push_str(&table.render(color));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkline_scales_and_skips_non_finite() {
        assert_eq!(sparkline(&[0.0, 1.0, f64::NAN, 7.0], 10), "▁▂ █");
        assert_eq!(sparkline(&[5.0, 5.0], 10), "▄▄");
        assert_eq!(sparkline(&[], 10), "");
        assert_eq!(
            sparkline(&(0..600).map(f64::from).collect::<Vec<_>>(), 60)
                .chars()
                .count(),
            60
        );
    }

    #[test]
    fn utilisation_bar_clamps() {
        assert_eq!(utilisation_bar(0.5, 4), "██░░");
        assert_eq!(utilisation_bar(1.7, 4), "████");
        assert_eq!(utilisation_bar(f64::NAN, 4), "░░░░");
    }
}
