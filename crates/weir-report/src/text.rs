//! Terminal rendering: first the summary (seed tally, seed documents by title, one
//! row per case with its parameters unless its name spells them); then per case a
//! workloads table with a total line, "Weir vs seed", components, timeline
//! sparklines; then, when the case carries them, the application metrics (grouped by
//! source, the whole run and each named window as columns), the user-experience
//! grades (good / fair / poor shares with a bar), the named windows (per volume,
//! service level and total, windows side by side) and the I/O size histogram with the
//! random / sequential split. Tables fit [`TextOptions::width`] by narrowing text
//! columns and leaving out droppable ones.

use crate::app;
use crate::format::{
    fmt_count, fmt_iops, fmt_mbps, fmt_ms, fmt_number, fmt_param, fmt_pct, fmt_ratio, fmt_thousands,
};
use crate::table::{Cell, Column, Style, Table, sanitize};
use crate::{
    CaseReport, Comparison, ComparisonKind, IoSizeHistogram, ScenarioReport, Tally, TimelineSeries,
    UxGrade, WorkloadResult,
};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Options of [`render_text`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextOptions {
    /// ANSI colours (off by default).
    pub color: bool,
    /// One sparkline per timeline series (on by default).
    pub sparklines: bool,
    /// Lines at most this many columns where they can be (tables narrow their text
    /// columns, descriptions wrap); `None`: no limit.
    pub width: Option<usize>,
    /// Only the summary: the header, one line per case and the seed figures.
    pub summary: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            color: false,
            sparklines: true,
            width: None,
            summary: false,
        }
    }
}

/// What the renderers below need of the options.
#[derive(Clone, Copy)]
struct Out {
    color: bool,
    width: usize,
}

/// `text` wrapped at spaces into lines of at most `width` columns.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let need = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if !line.is_empty() && need > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out
}

/// Widest sparkline, in characters; longer series are averaged into this many buckets.
const SPARKLINE_WIDTH: usize = 60;
const INDENT: usize = 2;

/// The line under the title: how many seed predictions Weir matches (calibrations
/// are shown, never counted; targets pass or fail), and how many the run did not
/// measure (e.g. windows after the end of a shortened run).
pub(crate) fn seed_tally(comparisons: &[&Comparison]) -> String {
    Tally::of(comparisons.iter().copied()).line()
}

/// Readable terminal tables for every case of the report: the summary first (the
/// seed tally, one line per case), then each case; with `summary`, the summary and
/// the seed figures only.
pub fn render_text(report: &ScenarioReport, opts: &TextOptions) -> String {
    let o = Out {
        color: opts.color,
        width: opts.width.unwrap_or(usize::MAX).max(20),
    };
    let color = o.color;
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
        let _ = writeln!(
            out,
            "{}",
            wrap(&sanitize(report.description.trim()), o.width)
        );
    }
    let comparisons: Vec<&Comparison> = report
        .cases
        .iter()
        .flat_map(|c| c.comparisons.iter())
        .collect();
    if !comparisons.is_empty() {
        let _ = writeln!(out, "{}", wrap(&seed_tally(&comparisons), o.width));
        let cited: BTreeSet<(&str, &str)> = comparisons
            .iter()
            .filter_map(|c| crate::seed_title(&c.source))
            .collect();
        for (number, title) in cited {
            let _ = writeln!(out, "{}", wrap(&format!("  {number}: {title}"), o.width));
        }
    }
    if report.cases.is_empty() {
        let _ = writeln!(out, "\n(no cases)");
        return out;
    }
    render_summary(&mut out, report, o);
    if opts.summary {
        for kind in ComparisonKind::ALL {
            let rows: Vec<(&str, &Comparison)> = report
                .cases
                .iter()
                .flat_map(|case| {
                    case.comparisons
                        .iter()
                        .filter(move |c| c.kind == kind)
                        .map(move |c| (case.name.as_str(), c))
                })
                .collect();
            if !rows.is_empty() {
                section(
                    &mut out,
                    &format!("{}, every case", kind_title(kind)),
                    color,
                );
                out.push_str(&all_comparisons_table(kind, &rows).render_fit(color, o.width));
            }
        }
        return out;
    }
    let count = report.cases.len();
    for (index, case) in report.cases.iter().enumerate() {
        out.push('\n');
        render_case(&mut out, case, index + 1, count, opts, o);
    }
    out
}

fn section(out: &mut String, title: &str, color: bool) {
    let _ = writeln!(out, "\n{}", Style::Bold.paint(title, color));
}

/// The section title of a kind of comparison.
fn kind_title(kind: ComparisonKind) -> &'static str {
    match kind {
        ComparisonKind::Prediction => "Weir vs seed: predictions",
        ComparisonKind::Calibration => {
            "Calibrations (seed figures a parameter was fitted on; not counted)"
        }
        ComparisonKind::Target => "Targets (configured limits: pass / fail)",
    }
}

/// The columns of a comparison table of one kind (`case`: with a case column).
fn comparison_columns(kind: ComparisonKind, case: bool, source: bool) -> Vec<Column> {
    let mut cols = Vec::new();
    if case {
        cols.push(Column::left("case"));
    }
    cols.push(Column::left("metric"));
    cols.push(Column::right("Weir"));
    match kind {
        ComparisonKind::Target => {
            cols.push(Column::right("limit"));
            cols.push(Column::left(""));
        }
        _ => {
            cols.push(Column::right("seed"));
            cols.push(Column::right("ratio"));
            cols.push(Column::left(""));
        }
    }
    if source {
        if kind == ComparisonKind::Calibration {
            cols.push(Column::left("fitted"));
        }
        cols.push(Column::left("source"));
        cols.push(Column::left("note"));
    }
    cols
}

/// Every case's comparisons of one kind in one table (the `--summary` view).
fn all_comparisons_table(kind: ComparisonKind, rows: &[(&str, &Comparison)]) -> Table {
    let mut table = Table::new(comparison_columns(kind, true, false)).with_indent(INDENT);
    for (case, c) in rows {
        let mut cells = vec![Cell::new(*case)];
        cells.extend(comparison_row(c).into_iter().take(figure_columns(kind)));
        table.add_row(cells);
    }
    table
}

/// The figure columns of a row of this kind (metric … marker), before the texts.
fn figure_columns(kind: ComparisonKind) -> usize {
    if kind == ComparisonKind::Target { 4 } else { 5 }
}

fn render_case(
    out: &mut String,
    case: &CaseReport,
    number: usize,
    count: usize,
    opts: &TextOptions,
    o: Out,
) {
    let color = o.color;
    let heading = format!("━━ Case {number}/{count}: {} ", sanitize(&case.name));
    let rule_len = 78usize.min(o.width).saturating_sub(heading.chars().count());
    let _ = writeln!(
        out,
        "{}",
        Style::Cyan.paint(&format!("{heading}{}", "━".repeat(rule_len)), color)
    );
    if !case.description.trim().is_empty() {
        let _ = writeln!(out, "{}", wrap(&sanitize(case.description.trim()), o.width));
    }
    let mut facts = vec![format!("measured {} s", fmt_number(case.duration_s))];
    if case.warmup_s > 0.0 {
        facts[0].push_str(&format!(
            " after {} s of warm-up (the timeline starts with it)",
            fmt_number(case.warmup_s)
        ));
    }
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
    let _ = writeln!(out, "{}", wrap(&facts.join(" · "), o.width));

    section(out, "Workloads", color);
    if case.workloads.is_empty() && case.total.is_none() {
        let _ = writeln!(out, "  (none)");
    } else {
        out.push_str(&workload_table(case).render_fit(color, o.width));
    }

    for kind in ComparisonKind::ALL {
        let rows: Vec<&Comparison> = case.comparisons.iter().filter(|c| c.kind == kind).collect();
        if rows.is_empty() {
            continue;
        }
        let t = Tally::of(rows.iter().copied());
        let count = match kind {
            ComparisonKind::Prediction => format!(
                " ({} of {} within ±20%{})",
                t.within,
                t.predictions,
                if t.unmeasured > 0 {
                    format!(", {} not measured", t.unmeasured)
                } else {
                    String::new()
                }
            ),
            ComparisonKind::Calibration => String::new(),
            ComparisonKind::Target => format!(
                " ({} of {} pass{})",
                t.passed,
                t.targets,
                if t.targets_unmeasured > 0 {
                    format!(", {} not measured", t.targets_unmeasured)
                } else {
                    String::new()
                }
            ),
        };
        section(out, &format!("{}{count}", kind_title(kind)), color);
        out.push_str(&comparisons_fit(kind, &rows, o));
    }

    if !case.components.is_empty() {
        section(out, "Components", color);
        out.push_str(&component_table(case).render_fit(color, o.width));
    }

    if opts.sparklines && !case.timeline.is_empty() {
        section(out, "Timeline", color);
        out.push_str(&timeline_table(&case.timeline).render_fit(color, o.width));
    }

    render_model_sections(out, case, o);
}

/// The issue-4 fields: application metrics, user-experience grades, named windows and
/// the I/O size histogram (each only when the case carries it).
fn render_model_sections(out: &mut String, case: &CaseReport, o: Out) {
    let color = o.color;
    let columns = app::metric_columns(case);
    let ux = app::ux_rows(case, &columns);
    if !case.model_metrics.is_empty() {
        section(out, "Application metrics", color);
        out.push_str(&metrics_table(case, &columns, !ux.is_empty()).render_fit(color, o.width));
    }
    if !ux.is_empty() {
        section(out, "User experience (█ good  ▓ fair  ░ poor)", color);
        out.push_str(&ux_table(&ux).render_fit(color, o.width));
    }
    if !case.windows.is_empty() {
        section(out, "Windows", color);
        let spans: Vec<String> = case
            .windows
            .iter()
            .map(|w| {
                format!(
                    "{} {}–{} s",
                    sanitize(&w.name),
                    fmt_span(w.start_s),
                    fmt_span(w.end_s)
                )
            })
            .collect();
        let _ = writeln!(out, "{}{}", " ".repeat(INDENT), spans.join(" · "));
        out.push_str(&windows_table(case).render_fit(color, o.width));
    }
    if let Some(sizes) = &case.io_sizes {
        section(out, "I/O sizes", color);
        out.push_str(&size_tables(sizes, o));
    }
}

fn metrics_table(case: &CaseReport, columns: &[String], skip_grades: bool) -> Table {
    let mut header = vec![Column::left("source"), Column::left("metric")];
    header.extend(columns.iter().map(|c| Column::right(app::column_label(c))));
    header.push(Column::left("unit"));
    let mut table = Table::new(header).with_indent(INDENT);
    for (gi, group) in app::metric_groups(case, columns).iter().enumerate() {
        if gi > 0 {
            table.add_separator();
        }
        let mut first = true;
        for row in &group.rows {
            if skip_grades && app::grade_metric(row.name).is_some() {
                continue;
            }
            let source = if first {
                if group.kind.is_empty() || group.kind == group.source {
                    group.source.to_string()
                } else {
                    format!("{} ({})", group.source, group.kind)
                }
            } else {
                String::new()
            };
            first = false;
            let mut cells = vec![
                Cell::styled(source, Style::Bold),
                Cell::new(app::metric_label(row.name)),
            ];
            for value in &row.values {
                cells.push(match value {
                    Some(v) => {
                        let text = app::metric_value(row.name, *v, row.unit);
                        let style = if text == "FAIL" {
                            Style::Red
                        } else {
                            Style::Plain
                        };
                        Cell::styled(text, style)
                    }
                    None => Cell::styled("", Style::Dim),
                });
            }
            cells.push(Cell::styled(app::unit_label(row.unit), Style::Dim));
            table.add_row(cells);
        }
    }
    table
}

fn grade_style(grade: Option<UxGrade>) -> Style {
    match grade {
        Some(UxGrade::Good) => Style::Green,
        Some(UxGrade::Fair) => Style::Yellow,
        Some(UxGrade::Poor) => Style::Red,
        None => Style::Dim,
    }
}

/// `████▓▓░` of good / fair / poor shares, `width` characters (largest remainder).
pub(crate) fn grade_bar(shares: [f64; 3], width: usize) -> String {
    let clean = shares.map(|v| if v.is_finite() && v > 0.0 { v } else { 0.0 });
    let sum: f64 = clean.iter().sum();
    if sum <= 0.0 {
        return "·".repeat(width);
    }
    let exact = clean.map(|v| v / sum * width as f64);
    let mut cells = exact.map(|v| v.floor() as usize);
    // Every present share shows, however small.
    for i in 0..3 {
        if clean[i] > 0.0 && cells[i] == 0 {
            cells[i] = 1;
        }
    }
    while cells.iter().sum::<usize>() > width {
        let Some(largest) = (0..3).filter(|&i| cells[i] > 1).max_by_key(|&i| cells[i]) else {
            break;
        };
        cells[largest] -= 1;
    }
    let mut order = [0usize, 1, 2];
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    let mut next = order.iter().filter(|&&i| clean[i] > 0.0).cycle();
    while cells.iter().sum::<usize>() < width {
        match next.next() {
            Some(&i) => cells[i] += 1,
            None => break,
        }
    }
    format!(
        "{}{}{}",
        "█".repeat(cells[0]),
        "▓".repeat(cells[1]),
        "░".repeat(cells[2])
    )
}

fn ux_table(rows: &[app::UxRow<'_>]) -> Table {
    let mut table = Table::new(vec![
        Column::left("source"),
        Column::left("activity"),
        Column::left("window"),
        Column::right("count"),
        Column::right("mean s"),
        Column::left("grade"),
        Column::left(""),
        Column::right("good"),
        Column::right("fair"),
        Column::right("poor"),
        Column::left("thresholds"),
    ])
    .with_indent(INDENT);
    for r in rows {
        let grade = r.mean_grade();
        let pct = |v: f64| {
            if v.is_finite() {
                format!("{}%", fmt_thousands(v, 1))
            } else {
                "n/a".to_string()
            }
        };
        table.add_row([
            Cell::new(r.source),
            Cell::new(app::activity_label(r.activity)),
            Cell::styled(r.window, Style::Dim),
            Cell::new(if r.count.is_finite() {
                fmt_thousands(r.count, 0)
            } else {
                "n/a".to_string()
            }),
            Cell::new(fmt_number(r.mean_s)),
            Cell::styled(grade.map_or("n/a", UxGrade::label), grade_style(grade)),
            Cell::styled(
                grade_bar([r.good_pct, r.fair_pct, r.poor_pct], 20),
                grade_style(grade),
            ),
            Cell::new(pct(r.good_pct)),
            Cell::new(pct(r.fair_pct)),
            Cell::new(pct(r.poor_pct)),
            Cell::styled(
                app::activity_grading(r.activity).map_or("", |(text, _)| text),
                Style::Dim,
            ),
        ]);
    }
    table
}

fn windows_table(case: &CaseReport) -> Table {
    let with_mbps = case.windows.len() <= 3;
    let mut header = vec![Column::left(""), Column::left("figure")];
    for w in &case.windows {
        header.push(Column::right(format!("{} IOPS", w.name)));
        if with_mbps {
            header.push(Column::right("MB/s"));
        }
        header.push(Column::right("mean ms"));
    }
    let mut table = Table::new(header).with_indent(INDENT);
    let mut last_kind = None;
    for (name, figures) in app::window_pivot(case) {
        let (kind, label) = app::figure_kind(name);
        if last_kind.is_some_and(|k| k != kind) {
            table.add_separator();
        }
        last_kind = Some(kind);
        let style = if kind == "total" {
            Style::Bold
        } else {
            Style::Plain
        };
        let mut cells = vec![
            Cell::styled(if kind == "total" { "" } else { kind }, Style::Dim),
            Cell::styled(label, style),
        ];
        for f in figures {
            match f {
                Some(f) => {
                    cells.push(Cell::styled(fmt_iops(f.iops), style));
                    if with_mbps {
                        cells.push(Cell::styled(fmt_mbps(f.mbps), style));
                    }
                    cells.push(Cell::styled(fmt_ms(app::window_latency_ms(f)), style));
                }
                None => {
                    let n = if with_mbps { 3 } else { 2 };
                    cells.extend((0..n).map(|_| Cell::styled("", Style::Dim)));
                }
            }
        }
        table.add_row(cells);
    }
    table
}

/// `██████` scaled to `max`, `width` characters at most.
fn count_bar(count: u64, max: u64, width: usize) -> String {
    if max == 0 {
        return String::new();
    }
    let filled = (count as f64 / max as f64 * width as f64).round() as usize;
    let filled = if count > 0 { filled.max(1) } else { 0 };
    "█".repeat(filled.min(width))
}

fn size_tables(h: &IoSizeHistogram, o: Out) -> String {
    let color = o.color;
    let buckets = app::size_buckets(h);
    let reads: u64 = buckets.iter().map(|b| b.reads).fold(0, u64::saturating_add);
    let writes: u64 = buckets
        .iter()
        .map(|b| b.writes)
        .fold(0, u64::saturating_add);
    let max = buckets
        .iter()
        .map(|b| b.reads.max(b.writes))
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    if buckets.is_empty() || reads.saturating_add(writes) == 0 {
        let _ = writeln!(out, "  (no transfers recorded)");
    } else {
        let mut table = Table::new(vec![
            Column::left("size"),
            Column::right("reads"),
            Column::right("%"),
            Column::left(""),
            Column::right("writes"),
            Column::right("%"),
            Column::left(""),
        ])
        .with_indent(INDENT);
        for b in &buckets {
            table.add_row([
                Cell::new(b.label.as_str()),
                Cell::new(fmt_count(b.reads)),
                Cell::new(fmt_share(app::pct(b.reads, reads))),
                Cell::styled(count_bar(b.reads, max, 24), Style::Cyan),
                Cell::new(fmt_count(b.writes)),
                Cell::new(fmt_share(app::pct(b.writes, writes))),
                Cell::styled(count_bar(b.writes, max, 24), Style::Yellow),
            ]);
        }
        table.add_separator();
        table.add_row([
            Cell::styled("all", Style::Bold),
            Cell::styled(fmt_count(reads), Style::Bold),
            Cell::styled(
                fmt_share(app::pct(reads, reads.saturating_add(writes))),
                Style::Bold,
            ),
            Cell::new(""),
            Cell::styled(fmt_count(writes), Style::Bold),
            Cell::styled(
                fmt_share(app::pct(writes, reads.saturating_add(writes))),
                Style::Bold,
            ),
            Cell::new(""),
        ]);
        out.push_str(&table.render_fit(color, o.width));
    }
    let split = app::access_split(h);
    if split.iter().any(|(_, s, r)| s.saturating_add(*r) > 0) {
        out.push('\n');
        let mut table = Table::new(vec![
            Column::left("access"),
            Column::right("sequential"),
            Column::right("random"),
            Column::left("(█ sequential ░ random)"),
        ])
        .with_indent(INDENT);
        for (label, seq, random) in split {
            let all = seq.saturating_add(random);
            let seq_pct = app::pct(seq, all);
            let bar = if all == 0 {
                String::new()
            } else {
                let filled = (seq_pct / 100.0 * 30.0).round() as usize;
                format!(
                    "{}{}",
                    "█".repeat(filled.min(30)),
                    "░".repeat(30 - filled.min(30))
                )
            };
            table.add_row([
                Cell::new(label),
                Cell::new(fmt_share(seq_pct)),
                Cell::new(fmt_share(app::pct(random, all))),
                Cell::styled(bar, Style::Cyan),
            ]);
        }
        out.push_str(&table.render_fit(color, o.width));
    }
    out
}

/// A window bound in seconds: whole seconds without decimals.
pub(crate) fn fmt_span(seconds: f64) -> String {
    if seconds.is_finite() && seconds.fract() == 0.0 {
        fmt_param(seconds)
    } else {
        fmt_number(seconds)
    }
}

/// A percentage with one decimal (`n/a` when not defined).
fn fmt_share(pct: f64) -> String {
    if pct.is_finite() {
        format!("{}%", fmt_thousands(pct, 1))
    } else {
        "n/a".to_string()
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
        let column = Column::right(header);
        // In a narrow terminal, the median and p95 give way first.
        columns.push(if matches!(header, "p50 ms" | "p95 ms") {
            column.droppable()
        } else {
            column
        });
    }
    if show_max {
        columns.push(Column::right("max ms").droppable());
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

/// The marker column of a comparison table.
fn mismatch_cell(c: &Comparison) -> Cell {
    if c.kind == ComparisonKind::Target {
        return match c.passes() {
            Some(true) => Cell::styled("pass", Style::Green),
            Some(false) => Cell::styled("FAIL", Style::Red),
            None => Cell::styled("not measured", Style::Yellow),
        };
    }
    // Calibrations are not reproductions: a fit is "fitted", a miss says so.
    let ok = if c.kind == ComparisonKind::Calibration {
        "fitted"
    } else {
        "ok"
    };
    if !c.differs() {
        Cell::styled(ok, Style::Green)
    } else if c.not_measured() {
        Cell::styled("not measured", Style::Yellow)
    } else if c.ratio().is_finite() {
        Cell::styled("!! >20%", Style::Red)
    } else {
        Cell::styled("!! no ratio", Style::Red)
    }
}

/// A comparison table of one kind; when it does not fit the width, the figures
/// stay in columns and each row's fitted parameter, source and note follow it,
/// wrapped.
fn comparisons_fit(kind: ComparisonKind, comparisons: &[&Comparison], o: Out) -> String {
    let full = comparison_table(kind, comparisons).render(o.color);
    if full.lines().all(|l| l.chars().count() <= o.width) {
        return full;
    }
    let mut table = Table::new(comparison_columns(kind, false, false)).with_indent(INDENT);
    for c in comparisons {
        table.add_row(comparison_row(c).into_iter().take(figure_columns(kind)));
    }
    let text = table.render_fit(o.color, o.width);
    let mut lines = text.lines();
    let mut out = String::new();
    for line in lines.by_ref().take(2) {
        out.push_str(line);
        out.push('\n');
    }
    let pad = " ".repeat(INDENT + 4);
    for (line, c) in lines.zip(comparisons) {
        out.push_str(line);
        out.push('\n');
        for (what, text) in [
            ("fitted", c.fitted.as_str()),
            ("source", c.source.as_str()),
            ("note", c.note.as_str()),
        ] {
            if text.is_empty() {
                continue;
            }
            let body = wrap(
                &format!("{what}: {}", sanitize(text)),
                o.width.saturating_sub(pad.len()).max(20),
            );
            for l in body.lines() {
                let _ = writeln!(out, "{pad}{}", Style::Dim.paint(l, o.color));
            }
        }
    }
    out
}

/// The cells of a row: metric, Weir, then seed and ratio (or the target's limit),
/// the marker, then (calibrations) the fitted parameter, the source and the note.
fn comparison_row(c: &Comparison) -> Vec<Cell> {
    let style = if c.differs() {
        Style::Red
    } else {
        Style::Green
    };
    let mut cells = vec![Cell::new(c.metric.as_str()), Cell::new(fmt_number(c.weir))];
    if c.kind == ComparisonKind::Target {
        cells.push(Cell::new(c.condition()));
    } else {
        cells.push(Cell::new(fmt_number(c.seed)));
        cells.push(Cell::styled(fmt_ratio(c.ratio()), style));
    }
    cells.push(mismatch_cell(c));
    if c.kind == ComparisonKind::Calibration {
        cells.push(Cell::new(c.fitted.as_str()));
    }
    cells.push(Cell::styled(c.source.as_str(), Style::Dim));
    cells.push(Cell::new(c.note.as_str()));
    cells
}

fn comparison_table(kind: ComparisonKind, comparisons: &[&Comparison]) -> Table {
    let mut table = Table::new(comparison_columns(kind, false, true)).with_indent(INDENT);
    for c in comparisons {
        table.add_row(comparison_row(c));
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

/// A sparkline of the series (NaN / inf shown as spaces), at most `width` characters,
/// its levels scaled from zero to the largest value.
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
    // From zero (or the lowest value when below it), so that a 3 % dip draws as a
    // 3 % dip, not as a collapse.
    let finite = buckets.iter().copied().filter(|v| v.is_finite());
    let (min, max) = finite.fold((0.0f64, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
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
        Column::right("points").droppable(),
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

/// One line per case: its parameters (for sweeps), headline figures and how many
/// of its seed figures Weir matches.
fn render_summary(out: &mut String, report: &ScenarioReport, o: Out) {
    let keys: BTreeSet<&str> = report
        .cases
        .iter()
        .flat_map(|c| c.params.keys().map(String::as_str))
        .collect();
    // Swept cases named `<case>/<param>=<value>` already spell their parameters:
    // no columns for them (they would crowd the names out of a narrow terminal).
    let named = report
        .cases
        .iter()
        .all(|c| c.params.is_empty() || crate::html::sweep_base(&c.name, &c.params).is_some());
    let title = if keys.is_empty() {
        "Summary".to_string()
    } else {
        format!(
            "Summary (sweep over {})",
            keys.iter()
                .map(|k| sanitize(k))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    section(out, &title, o.color);
    let with_seed = report
        .cases
        .iter()
        .any(|c| c.comparisons.iter().any(Comparison::counts));
    let with_targets = report.cases.iter().any(|c| {
        c.comparisons
            .iter()
            .any(|x| x.kind == ComparisonKind::Target)
    });
    let keys: Vec<&str> = if named {
        Vec::new()
    } else {
        keys.into_iter().collect()
    };
    let mut columns = vec![Column::left("case")];
    columns.extend(keys.iter().map(|k| Column::right(*k)));
    for header in ["IOPS", "MB/s", "mean ms", "p99 ms"] {
        columns.push(Column::right(header));
    }
    if with_seed {
        columns.push(Column::left("predictions ±20%"));
    }
    if with_targets {
        columns.push(Column::left("targets"));
    }
    let mut table = Table::new(columns).with_indent(INDENT);
    for case in &report.cases {
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
        let t = Tally::of(&case.comparisons);
        if with_seed {
            cells.push(if t.predictions == 0 {
                Cell::new("")
            } else {
                let mut text = format!("{}/{}", t.within, t.predictions);
                if t.unmeasured > 0 {
                    let _ = write!(text, " ({} not measured)", t.unmeasured);
                }
                Cell::styled(
                    text,
                    if t.within == t.predictions {
                        Style::Green
                    } else {
                        Style::Red
                    },
                )
            });
        }
        if with_targets {
            cells.push(if t.targets == 0 {
                Cell::new("")
            } else {
                let mut text = format!("{}/{} pass", t.passed, t.targets);
                if t.targets_unmeasured > 0 {
                    let _ = write!(text, " ({} not measured)", t.targets_unmeasured);
                }
                Cell::styled(
                    text,
                    if t.passed == t.targets {
                        Style::Green
                    } else {
                        Style::Red
                    },
                )
            });
        }
        table.add_row(cells);
    }
    out.push_str(&table.render_fit(o.color, o.width));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkline_scales_and_skips_non_finite() {
        assert_eq!(sparkline(&[0.0, 1.0, f64::NAN, 7.0], 10), "▁▂ █");
        assert_eq!(sparkline(&[5.0, 5.0], 10), "██");
        assert_eq!(sparkline(&[0.0, 0.0], 10), "▄▄");
        // From zero: a 3 % dip stays near the top; half is half.
        assert_eq!(sparkline(&[100.0, 97.0, 100.0, 50.0], 10), "███▅");
        assert_eq!(sparkline(&[], 10), "");
        assert_eq!(
            sparkline(&(0..600).map(f64::from).collect::<Vec<_>>(), 60)
                .chars()
                .count(),
            60
        );
    }

    #[test]
    fn grade_bar_fills_the_width_by_share() {
        assert_eq!(grade_bar([50.0, 30.0, 20.0], 10), "█████▓▓▓░░");
        assert_eq!(grade_bar([100.0, 0.0, 0.0], 4), "████");
        assert_eq!(grade_bar([33.3, 33.3, 33.4], 10).chars().count(), 10);
        assert_eq!(grade_bar([f64::NAN, 0.0, 0.0], 3), "···");
        // A tiny but present share still shows.
        assert!(grade_bar([99.0, 0.0, 1.0], 10).ends_with('░'));
    }

    #[test]
    fn utilisation_bar_clamps() {
        assert_eq!(utilisation_bar(0.5, 4), "██░░");
        assert_eq!(utilisation_bar(1.7, 4), "████");
        assert_eq!(utilisation_bar(f64::NAN, 4), "░░░░");
    }
}
