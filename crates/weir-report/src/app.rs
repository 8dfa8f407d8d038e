//! What the text and HTML renderers share about the issue-4 fields: application-model
//! metrics grouped by source with windows as columns, user-experience grade shares,
//! named-window figures pivoted per volume / service level / total, and the I/O size
//! histogram's bucket labels and random / sequential shares. Pure data shaping.

use crate::format::{fmt_number, fmt_thousands};
use crate::{CaseReport, IoSizeHistogram, ModelMetricResult, UxGrade, WorkloadResult};

/// Column label of metrics measured over the whole interval (empty window name).
pub(crate) const WHOLE_RUN: &str = "whole run";

/// The metric columns of a case: the whole run (when any metric has it), then the
/// case's windows in order, then any other window the metrics name.
pub(crate) fn metric_columns(case: &CaseReport) -> Vec<String> {
    let mut columns: Vec<String> = Vec::new();
    if case.model_metrics.iter().any(|m| m.window.is_empty()) {
        columns.push(String::new());
    }
    let named = case
        .windows
        .iter()
        .map(|w| w.name.as_str())
        .filter(|name| case.model_metrics.iter().any(|m| m.window == *name));
    let extra = case.model_metrics.iter().map(|m| m.window.as_str());
    for name in named.chain(extra) {
        if !name.is_empty() && !columns.iter().any(|c| c == name) {
            columns.push(name.to_string());
        }
    }
    columns
}

/// The label of a metric column.
pub(crate) fn column_label(window: &str) -> &str {
    if window.is_empty() { WHOLE_RUN } else { window }
}

/// One row of the metrics table: a metric of one source, one value per column.
pub(crate) struct MetricRow<'a> {
    pub name: &'a str,
    pub unit: &'a str,
    pub values: Vec<Option<f64>>,
}

/// All metrics of one source (`[[vm]]` base name).
pub(crate) struct MetricGroup<'a> {
    pub source: &'a str,
    pub kind: &'a str,
    pub rows: Vec<MetricRow<'a>>,
}

/// Metrics grouped by source (first-appearance order), one row per metric name, one
/// value per entry of `columns` (see [`metric_columns`]).
pub(crate) fn metric_groups<'a>(case: &'a CaseReport, columns: &[String]) -> Vec<MetricGroup<'a>> {
    let mut groups: Vec<MetricGroup<'a>> = Vec::new();
    for m in &case.model_metrics {
        let Some(column) = columns.iter().position(|c| *c == m.window) else {
            continue;
        };
        let group = match groups.iter().position(|g| g.source == m.source) {
            Some(i) => &mut groups[i],
            None => {
                groups.push(MetricGroup {
                    source: &m.source,
                    kind: &m.kind,
                    rows: Vec::new(),
                });
                let last = groups.len() - 1;
                &mut groups[last]
            }
        };
        let row = match group.rows.iter().position(|r| r.name == m.name) {
            Some(i) => &mut group.rows[i],
            None => {
                group.rows.push(MetricRow {
                    name: &m.name,
                    unit: &m.unit,
                    values: vec![None; columns.len()],
                });
                let last = group.rows.len() - 1;
                &mut group.rows[last]
            }
        };
        row.values[column] = Some(m.value);
    }
    groups
}

/// A readable label for a model metric name (`opm` → `orders per minute`); unknown
/// names have their underscores replaced by spaces.
pub(crate) fn metric_label(name: &str) -> String {
    let known = match name {
        "opm" => "orders per minute",
        "orders" => "orders",
        "order_latency_mean_ms" => "order latency, mean",
        "order_latency_max_ms" => "order latency, max",
        "rpc_latency_mean_ms" => "RPC latency, mean",
        "rpc_latency_max_ms" => "RPC latency, max",
        "rpcs_per_s" => "RPCs per second",
        "rpc_pass" => "RPC latency < 50 ms, none failed",
        "desktops" => "desktops",
        "read_iops" => "read IOPS",
        "write_iops" => "write IOPS",
        "read_mbps" => "read MB/s",
        "write_mbps" => "write MB/s",
        "reading_vms" => "desktops reading (per s)",
        "writing_vms" => "desktops writing (per s)",
        "reading_vms_pct" => "desktops reading",
        "writing_vms_pct" => "desktops writing",
        "read_size_kb" => "read size, mean",
        "write_size_kb" => "write size, mean",
        "read_iops_per_reading_vm" => "read IOPS per reading desktop",
        "write_iops_per_writing_vm" => "write IOPS per writing desktop",
        "read_kbps_per_reading_vm" => "read KB/s per reading desktop",
        "write_kbps_per_writing_vm" => "write KB/s per writing desktop",
        "read_iops_per_vm" => "read IOPS per desktop",
        "write_iops_per_vm" => "write IOPS per desktop",
        "logins" => "logins",
        "login_time_mean_s" => "login time, mean",
        "login_time_max_s" => "login time, max",
        "login_time_sd_s" => "login time, std dev",
        "app_launchs" | "app_launches" => "application launches",
        "app_launch_time_mean_s" => "application launch, mean",
        "app_launch_time_max_s" => "application launch, max",
        "app_launch_time_sd_s" => "application launch, std dev",
        "power_on_done" => "desktops powered on",
        "power_on_time_s" => "power-on, all desktops",
        "power_on_each_mean_s" => "power-on per desktop, mean",
        "creation_done" => "desktops created",
        "creation_time_s" => "creation, all desktops",
        "creation_each_mean_s" => "creation per desktop, mean",
        "create_peak_concurrent" => "clone creations at once, most (whole model)",
        "power_on_peak_concurrent" => "power-ons at once, most (whole model)",
        "logins_started" => "logins started (whole model)",
        "login_window_s" => "first to last login start (whole model)",
        "vsi_samples" => "VSI samples",
        "vsibase_ms" => "VSIbase",
        "vsimax_threshold_ms" => "VSImax threshold",
        "vsi_response_mean_ms" => "VSI response, mean",
        "vsimax_reached" => "VSImax reached",
        "vsimax_sessions" => "VSImax",
        "vsi_sessions_max" => "sessions, most",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    if let Some((what, grade)) = grade_metric(name) {
        return format!("{} {grade}", activity_label(what));
    }
    if let Some(stem) = name.strip_suffix("_mean_s")
        && let Some((what, grade)) = [UxGrade::Good, UxGrade::Fair, UxGrade::Poor]
            .into_iter()
            .find_map(|g| {
                stem.strip_suffix(g.label())?
                    .strip_suffix('_')
                    .map(|w| (w, g))
            })
    {
        return format!("{} time, mean of {grade}", activity_label(what));
    }
    name.replace('_', " ")
}

/// A metric value in its unit: percentages with one decimal and `%`, flags (units
/// starting `1 = `) as words, whole numbers without decimals, others as
/// [`fmt_number`]. The unit is shown separately by [`unit_label`].
pub(crate) fn metric_value(name: &str, value: f64, unit: &str) -> String {
    if !value.is_finite() {
        return fmt_number(value);
    }
    if unit == "%" {
        return format!("{}%", fmt_thousands(value, 1));
    }
    if let Some(flag) = unit.strip_prefix("1 = ") {
        let word = flag.split_whitespace().next().unwrap_or("yes");
        let (yes, no) = match word {
            "pass" => ("pass", "FAIL"),
            _ if name == "vsimax_reached" => ("reached", "not reached"),
            _ => ("yes", "no"),
        };
        return if value == 1.0 {
            yes.to_string()
        } else if value == 0.0 {
            no.to_string()
        } else {
            // A mean over several instances: the share that passed.
            format!("{}% {yes}", fmt_thousands(value * 100.0, 0))
        };
    }
    if value.fract() == 0.0 && value.abs() < 1e15 {
        return fmt_thousands(value, 0);
    }
    fmt_number(value)
}

/// The unit column: empty for percentages and flags (their values say it).
pub(crate) fn unit_label(unit: &str) -> &str {
    if unit == "%" || unit.starts_with("1 = ") || unit == "count" {
        ""
    } else {
        unit
    }
}

/// `login_good_pct` → `("login", Good)`.
pub(crate) fn grade_metric(name: &str) -> Option<(&str, UxGrade)> {
    let stem = name.strip_suffix("_pct")?;
    [UxGrade::Good, UxGrade::Fair, UxGrade::Poor]
        .into_iter()
        .find_map(|g| {
            stem.strip_suffix(g.label())
                .and_then(|s| s.strip_suffix('_'))
                .map(|what| (what, g))
        })
}

/// `login` → `login`, `app_launch` → `application launch`.
pub(crate) fn activity_label(what: &str) -> String {
    match what {
        "app_launch" => "application launch".to_string(),
        other => other.replace('_', " "),
    }
}

/// A grade function of [`UxGrade`] (`login`, `app_load`).
pub(crate) type GradeFn = fn(f64) -> Option<UxGrade>;

/// The threshold rule behind an activity's grades, as text, and its grade function.
pub(crate) fn activity_grading(what: &str) -> Option<(&'static str, GradeFn)> {
    if what.contains("login") {
        Some(("good ≤ 15 s, fair ≤ 60 s", UxGrade::login))
    } else if what.contains("app") || what.contains("launch") {
        Some(("good ≤ 10 s, fair ≤ 30 s", UxGrade::app_load))
    } else {
        None
    }
}

/// Good / fair / poor shares of one activity of one source in one column.
pub(crate) struct UxRow<'a> {
    pub source: &'a str,
    pub activity: &'a str,
    pub window: &'a str,
    /// Percentages (NaN when absent).
    pub good_pct: f64,
    pub fair_pct: f64,
    pub poor_pct: f64,
    /// How many were graded (NaN when not reported).
    pub count: f64,
    pub mean_s: f64,
}

impl UxRow<'_> {
    /// The grade of the mean time, when the activity has thresholds.
    pub fn mean_grade(&self) -> Option<UxGrade> {
        activity_grading(self.activity).and_then(|(_, f)| f(self.mean_s))
    }
}

/// Every (source, activity, column) that reports grade shares, in table order.
pub(crate) fn ux_rows<'a>(case: &'a CaseReport, columns: &'a [String]) -> Vec<UxRow<'a>> {
    let mut rows: Vec<UxRow<'a>> = Vec::new();
    let find = |source: &str, window: &str, name: &str| -> f64 {
        case.model_metrics
            .iter()
            .find(|m| m.source == source && m.window == window && m.name == name)
            .map_or(f64::NAN, |m| m.value)
    };
    let mut activities: Vec<(&'a str, &'a str)> = Vec::new();
    for m in &case.model_metrics {
        if let Some((what, _)) = grade_metric(&m.name)
            && !activities.contains(&(m.source.as_str(), what))
        {
            activities.push((m.source.as_str(), what));
        }
    }
    for (source, what) in activities {
        for window in columns {
            let has_any = case.model_metrics.iter().any(|m| {
                m.source == source
                    && m.window == *window
                    && grade_metric(&m.name).is_some_and(|(w, _)| w == what)
            });
            if !has_any {
                continue;
            }
            let count = {
                let plural = find(source, window, &format!("{what}s"));
                if plural.is_nan() {
                    find(source, window, &format!("{what}es"))
                } else {
                    plural
                }
            };
            let row = UxRow {
                source,
                activity: what,
                window: column_label(window),
                good_pct: find(source, window, &format!("{what}_good_pct")),
                fair_pct: find(source, window, &format!("{what}_fair_pct")),
                poor_pct: find(source, window, &format!("{what}_poor_pct")),
                count,
                mean_s: find(source, window, &format!("{what}_time_mean_s")),
            };
            // A window holding every graded event repeats the whole-run row.
            let repeats_whole = !window.is_empty()
                && rows.iter().any(|r| {
                    r.source == source
                        && r.activity == what
                        && r.window == WHOLE_RUN
                        && same(r.count, row.count)
                        && same(r.good_pct, row.good_pct)
                        && same(r.fair_pct, row.fair_pct)
                        && same(r.poor_pct, row.poor_pct)
                        && same(r.mean_s, row.mean_s)
                });
            if !repeats_whole {
                rows.push(row);
            }
        }
    }
    rows
}

/// Equal, or both NaN.
fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Metrics shown as headline tiles, in this order, per source.
pub(crate) const KEY_METRICS: [&str; 8] = [
    "opm",
    "rpc_latency_mean_ms",
    "login_time_mean_s",
    "app_launch_time_mean_s",
    "vsimax_sessions",
    "vsibase_ms",
    "power_on_time_s",
    "creation_time_s",
];

/// The value of `name` for `source` in `window`, if reported.
pub(crate) fn metric<'a>(
    case: &'a CaseReport,
    source: &str,
    window: &str,
    name: &str,
) -> Option<&'a ModelMetricResult> {
    case.model_metrics
        .iter()
        .find(|m| m.source == source && m.window == window && m.name == name)
}

/// How a figure of a named window is labelled: `volume:db` → `("volume", "db")`,
/// `level:mission-critical` → `("level", …)`, `total` → `("total", "total")`.
pub(crate) fn figure_kind(name: &str) -> (&str, &str) {
    if name == "total" {
        return ("total", "total");
    }
    match name.split_once(':') {
        Some((kind, rest)) if !kind.is_empty() => (kind, rest),
        _ => ("", name),
    }
}

/// A figure name and its figure in each window (see [`window_pivot`]).
pub(crate) type PivotRow<'a> = (&'a str, Vec<Option<&'a WorkloadResult>>);

/// The figures of all windows pivoted: one entry per figure name (first-appearance
/// order, total last), one optional figure per window.
pub(crate) fn window_pivot(case: &CaseReport) -> Vec<PivotRow<'_>> {
    let mut rows: Vec<PivotRow<'_>> = Vec::new();
    for (wi, window) in case.windows.iter().enumerate() {
        for f in &window.figures {
            let index = match rows.iter().position(|(n, _)| *n == f.name) {
                Some(i) => i,
                None => {
                    rows.push((&f.name, vec![None; case.windows.len()]));
                    rows.len() - 1
                }
            };
            rows[index].1[wi].get_or_insert(f);
        }
    }
    // Stable: volumes, then levels, then others, then the total.
    let rank = |name: &str| match figure_kind(name).0 {
        "volume" => 0,
        "level" => 1,
        "total" => 3,
        _ => 2,
    };
    rows.sort_by_key(|(name, _)| rank(name));
    rows
}

/// The mean latency of a window figure; NaN (shown `n/a`, no bar) when nothing
/// completed in the window, where producers write 0.
pub(crate) fn window_latency_ms(f: &WorkloadResult) -> f64 {
    if f.ios == 0 && f.iops == 0.0 && f.latency_ms.mean == 0.0 {
        f64::NAN
    } else {
        f.latency_ms.mean
    }
}

/// `4096` → `4 KiB`, `1048576` → `1 MiB`, `1000` → `1,000 B`.
pub(crate) fn size_label(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", fmt_thousands((bytes / size) as f64, 0));
        }
    }
    format!("{} B", fmt_thousands(bytes as f64, 0))
}

/// One bucket of the size histogram.
pub(crate) struct SizeBucket {
    pub label: String,
    /// For chart axes: `4–8K`, `>1M`.
    pub short_label: String,
    pub reads: u64,
    pub writes: u64,
}

/// Buckets labelled by their range: `≤ 4 KiB`, `4–8 KiB` … `> 1 MiB` (an upper bound
/// of `u64::MAX` is open), with short chart labels (`4–8K`). Lengths that disagree are
/// padded with zeros.
pub(crate) fn size_buckets(h: &IoSizeHistogram) -> Vec<SizeBucket> {
    let n = h.bucket_bytes.len().max(h.reads.len()).max(h.writes.len());
    (0..n)
        .map(|i| {
            let upper = h.bucket_bytes.get(i).copied();
            let lower = i
                .checked_sub(1)
                .and_then(|p| h.bucket_bytes.get(p).copied());
            SizeBucket {
                label: range_label(lower, upper, i, false),
                short_label: range_label(lower, upper, i, true),
                reads: h.reads.get(i).copied().unwrap_or(0),
                writes: h.writes.get(i).copied().unwrap_or(0),
            }
        })
        .collect()
}

/// `4 KiB` / `4K`.
fn bound_label(bytes: u64, short: bool) -> String {
    let text = size_label(bytes);
    if !short {
        return text;
    }
    text.replace(" KiB", "K")
        .replace(" MiB", "M")
        .replace(" GiB", "G")
        .replace(" B", "B")
}

fn range_label(lower: Option<u64>, upper: Option<u64>, index: usize, short: bool) -> String {
    let gap = if short { "" } else { " " };
    match (lower, upper) {
        (_, None) => format!("bucket {}", index + 1),
        (Some(lo), Some(u64::MAX)) => format!(">{gap}{}", bound_label(lo, short)),
        (None, Some(u64::MAX)) => "any".to_string(),
        (None, Some(hi)) => format!("≤{gap}{}", bound_label(hi, short)),
        (Some(lo), Some(hi)) => {
            let (lo, hi) = (bound_label(lo, short), bound_label(hi, short));
            let unit = |t: &str| -> (String, String) {
                let split = t
                    .find(|c: char| !(c.is_ascii_digit() || c == ','))
                    .unwrap_or(t.len());
                (t[..split].to_string(), t[split..].to_string())
            };
            let ((lo_n, lo_u), (hi_n, hi_u)) = (unit(&lo), unit(&hi));
            if lo_u == hi_u && !lo_n.is_empty() {
                format!("{lo_n}–{hi_n}{hi_u}")
            } else {
                format!("{lo}–{hi}")
            }
        }
    }
}

/// `part / whole` as a percentage, NaN when `whole` is zero.
pub(crate) fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        f64::NAN
    } else {
        part as f64 / whole as f64 * 100.0
    }
}

/// (label, sequential, random) for reads, writes and all I/Os.
pub(crate) fn access_split(h: &IoSizeHistogram) -> [(&'static str, u64, u64); 3] {
    [
        ("reads", h.sequential_reads, h.random_reads),
        ("writes", h.sequential_writes, h.random_writes),
        (
            "all",
            h.sequential_reads.saturating_add(h.sequential_writes),
            h.random_reads.saturating_add(h.random_writes),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels_read_like_the_study() {
        let h = IoSizeHistogram {
            bucket_bytes: vec![4096, 8192, 1 << 20, u64::MAX],
            reads: vec![1, 2, 3, 4],
            writes: vec![5, 6],
            ..Default::default()
        };
        let labels: Vec<String> = size_buckets(&h).into_iter().map(|b| b.label).collect();
        assert_eq!(labels, ["≤ 4 KiB", "4–8 KiB", "8 KiB–1 MiB", "> 1 MiB"]);
        let short: Vec<String> = size_buckets(&h)
            .into_iter()
            .map(|b| b.short_label)
            .collect();
        assert_eq!(short, ["≤4K", "4–8K", "8K–1M", ">1M"]);
        assert_eq!(size_buckets(&h)[3].writes, 0);
        assert_eq!(size_label(1000), "1,000 B");
    }

    #[test]
    fn grade_metrics_and_flags() {
        assert_eq!(
            grade_metric("login_good_pct"),
            Some(("login", UxGrade::Good))
        );
        assert_eq!(
            grade_metric("app_launch_poor_pct"),
            Some(("app_launch", UxGrade::Poor))
        );
        assert_eq!(grade_metric("reading_vms_pct"), None);
        assert_eq!(metric_value("rpc_pass", 1.0, "1 = pass (< 50 ms)"), "pass");
        assert_eq!(metric_value("rpc_pass", 0.0, "1 = pass (< 50 ms)"), "FAIL");
        assert_eq!(
            metric_value("rpc_pass", 0.75, "1 = pass (< 50 ms)"),
            "75% pass"
        );
        assert_eq!(
            metric_value("vsimax_reached", 0.0, "1 = reached"),
            "not reached"
        );
        assert_eq!(metric_value("opm", 12000.0, "orders/min"), "12,000");
        assert_eq!(metric_value("x", 37.26, "%"), "37.3%");
        assert_eq!(metric_value("x", f64::NAN, "ms"), "n/a");
        assert_eq!(metric_label("login_fair_pct"), "login fair");
        assert_eq!(metric_label("some_new_metric"), "some new metric");
        assert_eq!(
            metric_label("app_launch_good_mean_s"),
            "application launch time, mean of good"
        );
    }
}
