//! Parameter sweeps: one case template expanded over a list of values.

use crate::access::kib_to_bytes;
use crate::{AccessSpec, WorkloadError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Parameters an [`AccessSpec`] can be swept over.
pub const SWEEP_PARAMS: &[&str] = &[
    "block_kib",
    "size_bytes",
    "queue_depth",
    "workers",
    "read_pct",
    "random_pct",
    "burst_ios",
    "burst_delay_ms",
];

/// One swept parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    pub param: String,
    pub values: Vec<f64>,
}

/// Cartesian product of the sweeps, in order (the last sweep varies fastest).
/// No sweeps: one empty assignment.
pub fn expand_sweeps(sweeps: &[Sweep]) -> Vec<BTreeMap<String, f64>> {
    let mut out = vec![BTreeMap::new()];
    for s in sweeps {
        let mut next = Vec::with_capacity(out.len() * s.values.len());
        for base in &out {
            for &v in &s.values {
                let mut m = base.clone();
                m.insert(s.param.clone(), v);
                next.push(m);
            }
        }
        out = next;
    }
    out
}

fn whole(name: &str, v: f64, min: f64, max: f64) -> Result<u32, WorkloadError> {
    if v.is_finite() && v.fract() == 0.0 && v >= min && v <= max {
        Ok(v as u32)
    } else {
        Err(WorkloadError::invalid(
            name,
            format!("must be a whole number in {min}..={max}, got {v}"),
        ))
    }
}

impl AccessSpec {
    /// Sets one sweep parameter (on every line for per-line parameters), then validates.
    pub fn set_param(&mut self, name: &str, value: f64) -> Result<(), WorkloadError> {
        match name {
            "block_kib" => {
                let b = kib_to_bytes(value)?;
                self.lines.iter_mut().for_each(|l| l.size_bytes = b);
            }
            "size_bytes" => {
                let b = whole(name, value, 1.0, crate::MAX_TRANSFER_BYTES as f64)?;
                self.lines.iter_mut().for_each(|l| l.size_bytes = b);
            }
            "queue_depth" => self.outstanding_ios = whole(name, value, 1.0, 65536.0)?,
            "workers" => self.workers = whole(name, value, 1.0, 4096.0)?,
            "read_pct" => self.lines.iter_mut().for_each(|l| l.read_pct = value),
            "random_pct" => self.lines.iter_mut().for_each(|l| l.random_pct = value),
            "burst_ios" => self.burst_ios = whole(name, value, 0.0, 65536.0)?,
            "burst_delay_ms" => self.burst_delay_ms = value,
            other => return Err(WorkloadError::UnknownParam(other.to_string())),
        }
        self.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cartesian_expansion() {
        let sweeps = [
            Sweep {
                param: "block_kib".into(),
                values: vec![4.0, 8.0, 16.0],
            },
            Sweep {
                param: "queue_depth".into(),
                values: vec![1.0, 32.0],
            },
        ];
        let cases = expand_sweeps(&sweeps);
        assert_eq!(cases.len(), 6);
        assert_eq!(cases[1]["block_kib"], 4.0);
        assert_eq!(cases[1]["queue_depth"], 32.0);
        assert_eq!(expand_sweeps(&[]).len(), 1);
    }

    #[test]
    fn set_param_applies_and_validates() {
        let mut s = AccessSpec::simple(4096, 100.0, 0.0, 1);
        s.set_param("block_kib", 512.0).unwrap();
        s.set_param("queue_depth", 48.0).unwrap();
        assert_eq!((s.lines[0].size_bytes, s.outstanding_ios), (512 * 1024, 48));
        assert!(matches!(
            s.set_param("colour", 1.0),
            Err(WorkloadError::UnknownParam(_))
        ));
        assert!(s.set_param("queue_depth", 0.5).is_err());
        assert!(s.set_param("read_pct", 101.0).is_err());
    }
}
