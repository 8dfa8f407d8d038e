//! Iometer access specifications.

use crate::WorkloadError;
use serde::{Deserialize, Serialize};

/// 002: "70 percent of the volume was used as a dataset (to avoid caching effect at
/// the OS host)".
pub const DEFAULT_DATASET_FRACTION: f64 = 0.7;
/// Largest transfer accepted (Iometer's sweeps in 002 stop at 4 MB).
pub const MAX_TRANSFER_BYTES: u32 = 64 << 20;
const MAX_OUTSTANDING: u32 = 1 << 16;
const MAX_WORKERS: u32 = 4096;

/// One line of an Iometer access specification.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferLine {
    pub size_bytes: u32,
    /// Share of all accesses that use this line, % (the lines sum to 100).
    #[serde(default = "hundred")]
    pub access_pct: f64,
    pub read_pct: f64,
    pub random_pct: f64,
}

fn hundred() -> f64 {
    100.0
}

/// An Iometer access specification plus the test setup around it.
///
/// In TOML, a one-line specification can be written flat
/// (`size_bytes` or `block_kib`, `read_pct`, `random_pct`); a mix uses `lines`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawAccessSpec")]
pub struct AccessSpec {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub lines: Vec<TransferLine>,
    /// Offsets are multiples of this; `None`: aligned on each request's own size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alignment_bytes: Option<u32>,
    /// I/Os per burst (0: no bursts, a worker keeps `outstanding_ios` in flight).
    pub burst_ios: u32,
    /// Pause between bursts, ms, counted from the completion of a burst's last I/O.
    pub burst_delay_ms: f64,
    /// Outstanding I/Os per worker (Iometer's "# of outstanding I/Os").
    pub outstanding_ios: u32,
    pub workers: u32,
    /// Ramp-up, s (the simulator uses the scenario's warm-up instead).
    pub ramp_up_s: f64,
    /// Run time, s (the simulator uses the scenario's duration instead).
    pub run_time_s: f64,
    /// Share of the volume the workers address, 0 < x ≤ 1.
    pub dataset_fraction: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccessSpec {
    #[serde(default)]
    name: String,
    #[serde(default)]
    lines: Vec<TransferLine>,
    size_bytes: Option<u32>,
    block_kib: Option<f64>,
    read_pct: Option<f64>,
    random_pct: Option<f64>,
    alignment_bytes: Option<u32>,
    #[serde(default)]
    burst_ios: u32,
    #[serde(default)]
    burst_delay_ms: f64,
    #[serde(default = "one")]
    outstanding_ios: u32,
    #[serde(default = "one")]
    workers: u32,
    #[serde(default)]
    ramp_up_s: f64,
    #[serde(default = "sixty")]
    run_time_s: f64,
    #[serde(default = "dataset_default")]
    dataset_fraction: f64,
}

fn one() -> u32 {
    1
}
fn sixty() -> f64 {
    60.0
}
fn dataset_default() -> f64 {
    DEFAULT_DATASET_FRACTION
}

impl TryFrom<RawAccessSpec> for AccessSpec {
    type Error = WorkloadError;
    fn try_from(raw: RawAccessSpec) -> Result<Self, WorkloadError> {
        let flat = raw.size_bytes.is_some()
            || raw.block_kib.is_some()
            || raw.read_pct.is_some()
            || raw.random_pct.is_some();
        let lines = if flat {
            if !raw.lines.is_empty() {
                return Err(WorkloadError::invalid(
                    "lines",
                    "give either `lines` or the flat `size_bytes`/`block_kib`, `read_pct`, `random_pct`, not both",
                ));
            }
            let size_bytes = match (raw.size_bytes, raw.block_kib) {
                (Some(_), Some(_)) => {
                    return Err(WorkloadError::invalid(
                        "block_kib",
                        "give size_bytes or block_kib, not both",
                    ));
                }
                (Some(b), None) => b,
                (None, Some(k)) => kib_to_bytes(k)?,
                (None, None) => {
                    return Err(WorkloadError::invalid(
                        "size_bytes",
                        "missing (or block_kib)",
                    ));
                }
            };
            let read_pct = raw
                .read_pct
                .ok_or_else(|| WorkloadError::invalid("read_pct", "missing"))?;
            let random_pct = raw
                .random_pct
                .ok_or_else(|| WorkloadError::invalid("random_pct", "missing"))?;
            vec![TransferLine {
                size_bytes,
                access_pct: 100.0,
                read_pct,
                random_pct,
            }]
        } else {
            raw.lines
        };
        let spec = AccessSpec {
            name: raw.name,
            lines,
            alignment_bytes: raw.alignment_bytes,
            burst_ios: raw.burst_ios,
            burst_delay_ms: raw.burst_delay_ms,
            outstanding_ios: raw.outstanding_ios,
            workers: raw.workers,
            ramp_up_s: raw.ramp_up_s,
            run_time_s: raw.run_time_s,
            dataset_fraction: raw.dataset_fraction,
        };
        spec.validate()?;
        Ok(spec)
    }
}

pub(crate) fn kib_to_bytes(kib: f64) -> Result<u32, WorkloadError> {
    let bytes = kib * 1024.0;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes <= MAX_TRANSFER_BYTES as f64)
        || bytes.fract() != 0.0
    {
        return Err(WorkloadError::invalid(
            "block_kib",
            format!("must give a whole number of bytes in 1..={MAX_TRANSFER_BYTES}, got {kib} KiB"),
        ));
    }
    Ok(bytes as u32)
}

fn pct(field: &str, v: f64) -> Result<(), WorkloadError> {
    if v.is_finite() && (0.0..=100.0).contains(&v) {
        Ok(())
    } else {
        Err(WorkloadError::invalid(
            field,
            format!("must be a percentage 0-100, got {v}"),
        ))
    }
}

impl AccessSpec {
    /// A one-line specification with one worker, no bursts, the default dataset share.
    pub fn simple(
        size_bytes: u32,
        read_pct: f64,
        random_pct: f64,
        outstanding_ios: u32,
    ) -> AccessSpec {
        AccessSpec {
            name: String::new(),
            lines: vec![TransferLine {
                size_bytes,
                access_pct: 100.0,
                read_pct,
                random_pct,
            }],
            alignment_bytes: None,
            burst_ios: 0,
            burst_delay_ms: 0.0,
            outstanding_ios,
            workers: 1,
            ramp_up_s: 0.0,
            run_time_s: 60.0,
            dataset_fraction: DEFAULT_DATASET_FRACTION,
        }
    }

    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.lines.is_empty() {
            return Err(WorkloadError::invalid(
                "lines",
                "an access specification needs at least one line",
            ));
        }
        let mut total = 0.0;
        for (i, l) in self.lines.iter().enumerate() {
            let f = |name: &str| format!("lines[{i}].{name}");
            if l.size_bytes == 0 || l.size_bytes > MAX_TRANSFER_BYTES {
                return Err(WorkloadError::invalid(
                    f("size_bytes"),
                    format!("must be 1..={MAX_TRANSFER_BYTES}, got {}", l.size_bytes),
                ));
            }
            pct(&f("access_pct"), l.access_pct)?;
            pct(&f("read_pct"), l.read_pct)?;
            pct(&f("random_pct"), l.random_pct)?;
            total += l.access_pct;
        }
        if (total - 100.0).abs() > 0.01 {
            return Err(WorkloadError::invalid(
                "lines",
                format!("access_pct of the lines must sum to 100, got {total}"),
            ));
        }
        if let Some(a) = self.alignment_bytes
            && (a == 0 || a > MAX_TRANSFER_BYTES)
        {
            return Err(WorkloadError::invalid(
                "alignment_bytes",
                format!("must be 1..={MAX_TRANSFER_BYTES}, got {a}"),
            ));
        }
        if !(self.burst_delay_ms.is_finite() && self.burst_delay_ms >= 0.0) {
            return Err(WorkloadError::invalid(
                "burst_delay_ms",
                format!("must be ≥ 0, got {}", self.burst_delay_ms),
            ));
        }
        if self.outstanding_ios == 0 || self.outstanding_ios > MAX_OUTSTANDING {
            return Err(WorkloadError::invalid(
                "outstanding_ios",
                format!(
                    "must be 1..={MAX_OUTSTANDING}, got {}",
                    self.outstanding_ios
                ),
            ));
        }
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return Err(WorkloadError::invalid(
                "workers",
                format!("must be 1..={MAX_WORKERS}, got {}", self.workers),
            ));
        }
        for (field, v) in [
            ("ramp_up_s", self.ramp_up_s),
            ("run_time_s", self.run_time_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(WorkloadError::invalid(
                    field,
                    format!("must be ≥ 0, got {v}"),
                ));
            }
        }
        if !(self.dataset_fraction.is_finite()
            && self.dataset_fraction > 0.0
            && self.dataset_fraction <= 1.0)
        {
            return Err(WorkloadError::invalid(
                "dataset_fraction",
                format!("must be in (0, 1], got {}", self.dataset_fraction),
            ));
        }
        Ok(())
    }

    /// Largest transfer of the mix.
    pub fn max_size_bytes(&self) -> u32 {
        self.lines.iter().map(|l| l.size_bytes).max().unwrap_or(0)
    }

    /// Share of accesses that are reads, %.
    pub fn read_pct(&self) -> f64 {
        self.lines
            .iter()
            .map(|l| l.access_pct * l.read_pct)
            .sum::<f64>()
            / 100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_and_line_forms_parse_the_same() {
        let flat: AccessSpec =
            toml::from_str("block_kib = 8\nread_pct = 70\nrandom_pct = 100\noutstanding_ios = 48")
                .unwrap();
        let lines: AccessSpec =
            toml::from_str("outstanding_ios = 48\nlines = [{ size_bytes = 8192, read_pct = 70, random_pct = 100 }]").unwrap();
        assert_eq!(flat, lines);
        assert_eq!(flat.dataset_fraction, 0.7);
        assert_eq!(flat.workers, 1);
        assert!((flat.read_pct() - 70.0).abs() < 1e-9);
    }

    #[test]
    fn round_trips_through_toml() {
        let mut s = AccessSpec::simple(65536, 50.0, 100.0, 16);
        s.lines[0].access_pct = 60.0;
        s.lines.push(TransferLine {
            size_bytes: 4096,
            access_pct: 40.0,
            read_pct: 0.0,
            random_pct: 0.0,
        });
        s.burst_ios = 4;
        s.burst_delay_ms = 2.5;
        let text = toml::to_string(&s).unwrap();
        let back: AccessSpec = toml::from_str(&text).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn rejects_bad_values_and_unknown_fields() {
        let e = toml::from_str::<AccessSpec>("block_kib = 8\nread_pct = 170\nrandom_pct = 0")
            .unwrap_err();
        assert!(e.to_string().contains("read_pct"), "{e}");
        let e =
            toml::from_str::<AccessSpec>("block_kib = 8\nread_pct = 70\nrandom_pct = 0\nqueue = 3")
                .unwrap_err();
        assert!(e.to_string().contains("queue"), "{e}");
        let e = toml::from_str::<AccessSpec>(
            "block_kib = 8\nread_pct = 70\nrandom_pct = 0\ndataset_fraction = 0",
        )
        .unwrap_err();
        assert!(e.to_string().contains("dataset_fraction"), "{e}");
        let e = toml::from_str::<AccessSpec>(
            "lines = [{ size_bytes = 8192, access_pct = 50, read_pct = 70, random_pct = 100 }]",
        )
        .unwrap_err();
        assert!(e.to_string().contains("sum to 100"), "{e}");
        assert!(toml::from_str::<AccessSpec>("read_pct = 70\nrandom_pct = 0").is_err());
        assert!(
            toml::from_str::<AccessSpec>("block_kib = 0.1\nread_pct = 70\nrandom_pct = 0").is_err()
        );
    }
}
