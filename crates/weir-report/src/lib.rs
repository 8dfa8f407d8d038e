//! # weir-report — renders results; computes none
//!
//! The document model below is what `weir sim --json` prints (and later `weir load`).
//! Producers (the simulator, the load generator) fill it in; this crate renders it as
//! terminal tables, JSON, or a self-contained HTML page with charts.
//!
//! * [`render_text`] — a summary first (the tally: seed predictions within ±20 % and
//!   those a shortened run did not measure, calibrations shown but not counted,
//!   targets passed — see [`Tally`]; the seed documents by title, one row per case),
//!   then terminal tables per case (workloads with a total line, predictions,
//!   calibrations and targets in tables of their own, predictions with a
//!   `!! >20%` marker, components, timeline sparklines scaled from zero); fitted to
//!   a width ([`TextOptions::width`]) or the summary alone ([`TextOptions::summary`]).
//! * [`render_json`] / [`parse_json`] — pretty, deterministic JSON; non-finite numbers
//!   are written as `null` and read back as NaN.
//! * [`render_html`] — one self-contained page (inline CSS and SVG, no scripts): paired
//!   Weir-vs-seed bars, line charts over time (warm-up shaded), utilisation bars,
//!   sweep charts with the seeds' figures (see the grouping rule in the `html` module
//!   docs), the cases side by side when there is no sweep.
//! * [`Table`] — a generic aligned terminal table for other crates (`weir volume list`),
//!   with the number formatters [`fmt_iops`], [`fmt_mbps`], [`fmt_ms`], [`fmt_pct`]…
//! * [`UxGrade`] — good / fair / poor grades of the VDI study's thresholds.
//!
//! Every renderer accepts any report: empty cases, NaN / infinite figures and
//! one-point series render as `n/a`, placeholders or markers, never a panic.

use serde::{Deserialize, Serialize};

mod app;
mod format;
mod html;
mod json;
mod nan;
mod svg;
mod table;
mod text;
mod ux;

pub use format::{
    fmt_count, fmt_iops, fmt_mbps, fmt_ms, fmt_number, fmt_param, fmt_pct, fmt_ratio, fmt_thousands,
};
pub use html::render_html;
pub use json::{parse_json, render_json};
pub use table::{Align, Cell, Column, Style, Table};
pub use text::{TextOptions, render_text};
pub use ux::UxGrade;

/// Weir and seed figures that differ by more than this fraction are flagged.
pub const MISMATCH_THRESHOLD: f64 = 0.20;

/// One run of one scenario file.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ScenarioReport {
    pub scenario: String,
    #[serde(default)]
    pub description: String,
    pub seed: u64,
    pub cases: Vec<CaseReport>,
}

/// One case: one configuration of the architecture and workloads.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CaseReport {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Swept parameters of this case (e.g. `block_kib`, `queue_depth`), for sweep charts.
    #[serde(default, deserialize_with = "nan::map_f64_or_null")]
    pub params: std::collections::BTreeMap<String, f64>,
    /// Simulated (or wall) seconds measured, after ramp-up.
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub duration_s: f64,
    /// Simulated seconds run before measuring (ramp-up); the timeline starts with
    /// them, the figures leave them out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warmup_s: f64,
    pub workloads: Vec<WorkloadResult>,
    /// Totals over all workloads of the case.
    pub total: Option<WorkloadResult>,
    /// Weir's figure beside the source document's.
    #[serde(default)]
    pub comparisons: Vec<Comparison>,
    /// Utilisation and counters of components (disks, links, controller, hosts).
    #[serde(default)]
    pub components: Vec<ComponentResult>,
    /// Per-second series (throughput and latency over time).
    #[serde(default)]
    pub timeline: Vec<TimelineSeries>,
    /// Simulated I/Os processed (for throughput accounting).
    #[serde(default)]
    pub events: u64,
    /// What the application models' users experienced (orders per minute, RPC
    /// latency, login and application-launch times with their grades, VSIbase /
    /// VSImax, per-desktop averages in the layout of 004's tables 11/15/20), over
    /// the whole measured interval and over each named window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_metrics: Vec<ModelMetricResult>,
    /// Named windows of the run (e.g. "pre-storm", "storm"), with the figures of each
    /// volume, service level and the total inside them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowResult>,
    /// Transfer sizes completed, in 004's buckets, and the random / sequential split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_sizes: Option<IoSizeHistogram>,
}

/// One figure of one application model (all the instances of a `[[vm]]` combined).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ModelMetricResult {
    /// The `[[vm]]` (base name) running the model, e.g. "sql".
    pub source: String,
    /// Model kind: "vdi", "oltp", "exchange".
    #[serde(default)]
    pub kind: String,
    /// Window name; empty for the whole measured interval.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub window: String,
    /// e.g. "opm", "rpc_latency_mean_ms", "login_good_pct", "vsimax_sessions".
    pub name: String,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub value: f64,
    #[serde(default)]
    pub unit: String,
}

/// A named interval of the run and what each volume / service level did in it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WindowResult {
    pub name: String,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub start_s: f64,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub end_s: f64,
    /// Per volume ("volume:<name>"), per service level ("level:<name>") and "total":
    /// IOPS, MB/s and mean latency inside the window.
    pub figures: Vec<WorkloadResult>,
    /// The simulated components' busy fractions inside the window (name and
    /// utilisation; the other fields zero).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentResult>,
}

/// Completed transfers by size bucket (004's histogram buckets: each holds the sizes
/// from the previous bucket's bound, exclusive, up to its own, inclusive).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct IoSizeHistogram {
    pub bucket_bytes: Vec<u64>,
    pub reads: Vec<u64>,
    pub writes: Vec<u64>,
    pub sequential_reads: u64,
    pub random_reads: u64,
    pub sequential_writes: u64,
    pub random_writes: u64,
}

impl IoSizeHistogram {
    /// 004's buckets (upper bounds): 4 KiB to 1 MiB by powers of two, then "larger".
    pub const SEED_BUCKET_BYTES: [u64; 10] = [
        4096,
        8192,
        16384,
        32768,
        65536,
        131072,
        262144,
        524288,
        1048576,
        u64::MAX,
    ];

    /// An empty histogram over [`IoSizeHistogram::SEED_BUCKET_BYTES`].
    pub fn with_seed_buckets() -> IoSizeHistogram {
        let buckets = Self::SEED_BUCKET_BYTES.len();
        IoSizeHistogram {
            bucket_bytes: Self::SEED_BUCKET_BYTES.to_vec(),
            reads: vec![0; buckets],
            writes: vec![0; buckets],
            ..IoSizeHistogram::default()
        }
    }

    /// Counts one transfer of `size_bytes`: in the first bucket whose bound holds it
    /// (the last bucket when none does), as a read or a write, sequential or random.
    /// A histogram without buckets counts only the access pattern.
    ///
    /// `#[inline]`: called per I/O by the simulator and the load engine, it compiles
    /// in their crates at their opt-level (weir-report itself builds at opt-level 1).
    #[inline]
    pub fn record(&mut self, size_bytes: u64, read: bool, sequential: bool) {
        match (read, sequential) {
            (true, true) => self.sequential_reads += 1,
            (true, false) => self.random_reads += 1,
            (false, true) => self.sequential_writes += 1,
            (false, false) => self.random_writes += 1,
        }
        let Some(last) = self.bucket_bytes.len().checked_sub(1) else {
            return;
        };
        let bucket = self
            .bucket_bytes
            .iter()
            .position(|&bound| size_bytes <= bound)
            .unwrap_or(last);
        let counts = if read {
            &mut self.reads
        } else {
            &mut self.writes
        };
        if let Some(count) = counts.get_mut(bucket) {
            *count += 1;
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WorkloadResult {
    pub name: String,
    /// Volume / VM / host it ran on, when the producer knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub iops: f64,
    /// MB/s, MB = 10^6 bytes.
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub mbps: f64,
    pub latency_ms: LatencySummary,
    #[serde(default, deserialize_with = "nan::f64_or_null")]
    pub read_iops: f64,
    #[serde(default, deserialize_with = "nan::f64_or_null")]
    pub write_iops: f64,
    #[serde(default)]
    pub ios: u64,
    #[serde(default)]
    pub errors: u64,
}

/// What a producer counted for one workload (or a volume, or the total) over the
/// measured time; [`WorkloadResult::from_counts`] turns it into figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoCounts {
    pub ios: u64,
    pub reads: u64,
    pub writes: u64,
    /// Bytes read and written.
    pub bytes: u64,
    pub errors: u64,
}

impl WorkloadResult {
    /// The one rule by which the simulator and `weir load` turn counts into figures:
    /// rates per second of `duration_s` (NaN when it is not positive: no time was
    /// measured); latencies from `latency` only when there is a sample — with none,
    /// every latency figure is NaN (`null` in JSON, `n/a` in the text), never 0 ms.
    pub fn from_counts(
        name: String,
        duration_s: f64,
        counts: IoCounts,
        latency: impl FnOnce() -> LatencySummary,
    ) -> WorkloadResult {
        let d = if duration_s > 0.0 {
            duration_s
        } else {
            f64::NAN
        };
        let latency_ms = if counts.ios == 0 {
            LatencySummary {
                mean: f64::NAN,
                p50: f64::NAN,
                p95: f64::NAN,
                p99: f64::NAN,
                max: f64::NAN,
            }
        } else {
            latency()
        };
        WorkloadResult {
            name,
            volume: None,
            host: None,
            iops: counts.ios as f64 / d,
            mbps: counts.bytes as f64 / 1e6 / d,
            latency_ms,
            read_iops: counts.reads as f64 / d,
            write_iops: counts.writes as f64 / d,
            ios: counts.ios,
            errors: counts.errors,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub mean: f64,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub p50: f64,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub p95: f64,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub p99: f64,
    #[serde(default, deserialize_with = "nan::f64_or_null")]
    pub max: f64,
}

/// What a comparison is: only predictions are counted as Weir reproducing a seed.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ComparisonKind {
    /// A seed measurement Weir did not use (reports written before kinds existed
    /// read back as predictions, which is how they were counted then).
    #[default]
    Prediction,
    /// A seed measurement a parameter was fitted on: shown, never counted.
    Calibration,
    /// A configured limit or threshold: pass / fail, no ratio.
    Target,
}

impl ComparisonKind {
    pub const ALL: [ComparisonKind; 3] = [
        ComparisonKind::Prediction,
        ComparisonKind::Calibration,
        ComparisonKind::Target,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ComparisonKind::Prediction => "prediction",
            ComparisonKind::Calibration => "calibration",
            ComparisonKind::Target => "target",
        }
    }
}

/// A figure Weir computed beside the one a seed document reports (predictions,
/// calibrations) or beside a configured limit (targets).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Comparison {
    /// What is compared, e.g. "VM A (High) MB/s".
    pub metric: String,
    #[serde(default)]
    pub kind: ComparisonKind,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub weir: f64,
    /// The seed's measurement; NaN (`null`) for targets.
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub seed: f64,
    /// Targets: Weir's figure passes when at most this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_most: Option<f64>,
    /// Targets: Weir's figure passes when at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_least: Option<f64>,
    /// Calibrations: the parameter fitted on the seed figure.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fitted: String,
    /// Where the seed figure comes from, e.g. "003 usage model 2, table" (the
    /// renderers cite the document by title: [`seed_title`]).
    pub source: String,
    /// The compared figure as the scenario names it (`total.mbps`, `vm-1.iops`), so
    /// that charts of that figure can carry the seed's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expr: String,
    /// Why they differ when they do (which model term is missing).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// How a set of comparisons came out, by kind: the header of every report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub predictions: usize,
    /// Predictions within ±20 % of the seed.
    pub within: usize,
    /// Predictions this run did not measure.
    pub unmeasured: usize,
    pub calibrations: usize,
    pub targets: usize,
    pub passed: usize,
    /// Targets this run did not measure.
    pub targets_unmeasured: usize,
}

impl Tally {
    pub fn of<'a>(comparisons: impl IntoIterator<Item = &'a Comparison>) -> Tally {
        let mut t = Tally::default();
        for c in comparisons {
            match c.kind {
                ComparisonKind::Prediction => {
                    t.predictions += 1;
                    t.within += usize::from(!c.differs());
                    t.unmeasured += usize::from(c.not_measured());
                }
                ComparisonKind::Calibration => t.calibrations += 1,
                ComparisonKind::Target => {
                    t.targets += 1;
                    t.passed += usize::from(c.passes() == Some(true));
                    t.targets_unmeasured += usize::from(c.not_measured());
                }
            }
        }
        t
    }

    pub fn is_empty(&self) -> bool {
        self.predictions + self.calibrations + self.targets == 0
    }

    /// The header line: predictions counted against the seeds (only when there are
    /// any), calibrations shown as not counted, targets as pass / fail.
    pub fn line(&self) -> String {
        let mut parts = Vec::new();
        if self.predictions > 0 {
            let mut p = format!(
                "Weir vs seed, predictions: {} of {} within ±20%",
                self.within, self.predictions
            );
            if self.unmeasured > 0 {
                p.push_str(&format!(
                    ", {} not measured in this run (run it longer: windows or phases after its end)",
                    self.unmeasured
                ));
            }
            parts.push(p);
        } else {
            parts.push("no seed predictions".to_string());
        }
        if self.calibrations > 0 {
            parts.push(format!(
                "{} calibration{} (seed figures a parameter was fitted on: shown, not counted)",
                self.calibrations,
                if self.calibrations == 1 { "" } else { "s" }
            ));
        }
        if self.targets > 0 {
            let mut t = format!("targets: {} of {} pass", self.passed, self.targets);
            if self.targets_unmeasured > 0 {
                t.push_str(&format!(", {} not measured", self.targets_unmeasured));
            }
            parts.push(t);
        }
        parts.join("; ")
    }
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// The seed documents the scenarios quote, by the number their sources start with,
/// with the titles the reports cite them by.
pub const SEED_DOCUMENTS: [(&str, &str); 5] = [
    (
        "000",
        "Fusion-io Virtualization Reference Architecture: Deploying Server and Desktop Virtualization on Fusion ioControl Hybrid Storage, Cisco UCS and VMware (Principled Technologies)",
    ),
    (
        "001",
        "Lab Review: 8Gbps FC SAN Bolsters VOE (openBench Labs, QLogic 2500 Series HBAs)",
    ),
    (
        "002",
        "Cisco UCS C-Series I/O Characterization (white paper, May 2013)",
    ),
    (
        "003",
        "Intel Cloud Builders Guide: Storage I/O Control: 10Gb Intel Ethernet with VMware vSphere 5.0 SIOC",
    ),
    (
        "004",
        "NetApp and VMware View 5,000-Seat Performance Report (NetApp TR-3949, August 2011)",
    ),
];

/// The title of the seed document a comparison's `source` starts with (`"003 usage
/// model 2"` → 003's title), if it names one.
pub fn seed_title(source: &str) -> Option<(&'static str, &'static str)> {
    let number: String = source.chars().take_while(char::is_ascii_digit).collect();
    SEED_DOCUMENTS.iter().copied().find(|(n, _)| *n == number)
}

/// `source` with its leading seed number spelled out as the document's title:
/// `"003 usage model 2, summary table"` → `"Storage I/O Control: … (003): usage model
/// 2, summary table"`. Sources that name no seed are returned as they are.
pub fn cite_source(source: &str) -> String {
    match seed_title(source) {
        Some((number, title)) => {
            let rest = source[number.len()..].trim_start_matches([':', ',', ' ']);
            if rest.is_empty() {
                format!("{title} ({number})")
            } else {
                format!("{title} ({number}): {rest}")
            }
        }
        None => source.to_string(),
    }
}

impl Comparison {
    /// Not measured: the figure could not be taken in this run (e.g. its window
    /// starts after a shortened run ends).
    pub fn not_measured(&self) -> bool {
        !self.weir.is_finite()
    }

    /// Counted in the header: a prediction.
    pub fn counts(&self) -> bool {
        self.kind == ComparisonKind::Prediction
    }

    /// weir / seed (NaN when the seed figure is 0, and for targets).
    pub fn ratio(&self) -> f64 {
        if self.seed == 0.0 || self.kind == ComparisonKind::Target {
            f64::NAN
        } else {
            self.weir / self.seed
        }
    }

    /// Targets: whether Weir's figure is within `at_least` ..= `at_most` (`None`:
    /// not a target, or not measured).
    pub fn passes(&self) -> Option<bool> {
        if self.kind != ComparisonKind::Target || !self.weir.is_finite() {
            return None;
        }
        Some(
            self.at_most.is_none_or(|hi| self.weir <= hi)
                && self.at_least.is_none_or(|lo| self.weir >= lo),
        )
    }

    /// A target's condition, e.g. "≤ 10", "≥ 1,500", "1.95 – 2.05".
    pub fn condition(&self) -> String {
        match (self.at_least, self.at_most) {
            (Some(lo), Some(hi)) => format!("{} – {}", fmt_number(lo), fmt_number(hi)),
            (None, Some(hi)) => format!("≤ {}", fmt_number(hi)),
            (Some(lo), None) => format!("≥ {}", fmt_number(lo)),
            (None, None) => String::new(),
        }
    }

    /// True when the row is off: a prediction or calibration more than
    /// [`MISMATCH_THRESHOLD`] away from the seed (relative to the seed), or when the
    /// two cannot be compared (a non-finite figure, or a zero seed figure beside a
    /// non-zero Weir figure); a target that fails or was not measured.
    pub fn differs(&self) -> bool {
        if self.kind == ComparisonKind::Target {
            return self.passes() != Some(true);
        }
        if !self.weir.is_finite() || !self.seed.is_finite() {
            return true;
        }
        if self.seed == 0.0 {
            return self.weir != 0.0;
        }
        (self.weir / self.seed - 1.0).abs() > MISMATCH_THRESHOLD
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ComponentResult {
    /// e.g. "disk 3", "link host-1", "controller".
    pub name: String,
    pub kind: String,
    /// Busy fraction 0..1 over the measured interval.
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub utilisation: f64,
    #[serde(default)]
    pub ios: u64,
    #[serde(default, deserialize_with = "nan::f64_or_null")]
    pub mbps: f64,
}

impl ScenarioReport {
    /// True when any case carries swept parameters (a sweep scenario).
    pub fn is_sweep(&self) -> bool {
        self.cases.iter().any(|c| !c.params.is_empty())
    }
}

impl CaseReport {
    /// The figure that stands for the whole case: `total`, or the only workload.
    pub fn headline(&self) -> Option<&WorkloadResult> {
        self.total.as_ref().or(match self.workloads.as_slice() {
            [only] => Some(only),
            _ => None,
        })
    }
}

/// A series sampled once per interval, for charts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TimelineSeries {
    /// e.g. "VM A MB/s", "total latency p99 ms".
    pub name: String,
    pub unit: String,
    #[serde(deserialize_with = "nan::f64_or_null")]
    pub interval_s: f64,
    #[serde(deserialize_with = "nan::vec_f64_or_null")]
    pub values: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_become_figures_by_one_rule() {
        let lat = || LatencySummary {
            mean: 2.0,
            p50: 1.5,
            p95: 4.0,
            p99: 6.0,
            max: 9.0,
        };
        let counts = IoCounts {
            ios: 10,
            reads: 7,
            writes: 3,
            bytes: 10 * 4096,
            errors: 1,
        };
        let r = WorkloadResult::from_counts("vm".into(), 2.0, counts, lat);
        assert_eq!(
            (r.iops, r.read_iops, r.write_iops, r.ios),
            (5.0, 3.5, 1.5, 10)
        );
        assert!((r.mbps - 0.02048).abs() < 1e-12);
        assert_eq!((r.latency_ms.mean, r.errors), (2.0, 1));
        // No sample: no latency (not 0 ms), zero rates; the closure is not asked.
        let idle = WorkloadResult::from_counts("idle".into(), 2.0, IoCounts::default(), || {
            panic!("no latency without a sample")
        });
        assert_eq!((idle.iops, idle.mbps), (0.0, 0.0));
        let l = idle.latency_ms;
        assert!(
            [l.mean, l.p50, l.p95, l.p99, l.max]
                .iter()
                .all(|x| x.is_nan())
        );
        // No measured time: no rates.
        let none = WorkloadResult::from_counts("x".into(), 0.0, counts, lat);
        assert!(none.iops.is_nan() && none.mbps.is_nan() && none.read_iops.is_nan());
    }
}
