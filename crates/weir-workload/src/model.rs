//! Shared pieces of the application models (VDI, OLTP, Exchange): the model
//! specification enum read from scenario TOML, size distributions, per-second
//! bookkeeping and the metrics a model reports.

use crate::{IoGenerator, Nanos, WorkloadError};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

pub use crate::exchange::ExchangeSpec;
pub use crate::oltp::OltpSpec;
pub use crate::vdi::{LoginKind, VdiSpec};

pub(crate) const NS_PER_S: f64 = 1e9;
pub(crate) const KIB: u64 = 1024;
pub(crate) const MIB: u64 = 1024 * 1024;
pub(crate) const GIB: u64 = 1024 * 1024 * 1024;

/// A figure a model computes about what its users experienced (orders per minute,
/// RPC latency, login times, VSImax…), over a window of the driver's clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelMetric {
    pub name: String,
    pub value: f64,
    pub unit: String,
    /// How instances of one model combine: `true` adds them (counts, rates such as
    /// orders per minute), `false` averages them weighted by `weight`.
    pub additive: bool,
    /// Weight for averaging (e.g. the number of samples behind `value`).
    pub weight: f64,
}

impl ModelMetric {
    pub(crate) fn sum(name: &str, value: f64, unit: &str) -> ModelMetric {
        ModelMetric {
            name: name.into(),
            value,
            unit: unit.into(),
            additive: true,
            weight: 1.0,
        }
    }
    pub(crate) fn mean(name: &str, value: f64, unit: &str, weight: f64) -> ModelMetric {
        ModelMetric {
            name: name.into(),
            value,
            unit: unit.into(),
            additive: false,
            weight,
        }
    }

    /// Combines the same metric of several instances (sum or weighted mean).
    pub fn combine(parts: &[ModelMetric]) -> Option<ModelMetric> {
        let first = parts.first()?;
        let mut out = first.clone();
        if first.additive {
            out.value = parts.iter().map(|m| m.value).sum();
            out.weight = parts.iter().map(|m| m.weight).sum();
        } else {
            let w: f64 = parts
                .iter()
                .filter(|m| m.value.is_finite())
                .map(|m| m.weight)
                .sum();
            out.weight = w;
            out.value = if w > 0.0 {
                parts
                    .iter()
                    .filter(|m| m.value.is_finite())
                    .map(|m| m.value * m.weight)
                    .sum::<f64>()
                    / w
            } else {
                f64::NAN
            };
        }
        Some(out)
    }
}

/// A byte range of a volume that every worker (every clone of a golden image) reads
/// the same way: one cached copy can serve them all.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SharedRegion {
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// Identifies the image (clones of the same image share blocks across volumes).
    pub image_id: u64,
}

/// An application model, as written in a scenario's `[[model]]` table:
/// `kind = "vdi" | "oltp" | "exchange"` plus the model's fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelSpec {
    Vdi(Box<VdiSpec>),
    Oltp(OltpSpec),
    Exchange(ExchangeSpec),
}

impl ModelSpec {
    pub fn name(&self) -> &str {
        match self {
            ModelSpec::Vdi(s) => &s.name,
            ModelSpec::Oltp(s) => &s.name,
            ModelSpec::Exchange(s) => &s.name,
        }
    }

    pub fn validate(&self) -> Result<(), WorkloadError> {
        match self {
            ModelSpec::Vdi(s) => s.validate(),
            ModelSpec::Oltp(s) => s.validate(),
            ModelSpec::Exchange(s) => s.validate(),
        }
    }

    /// Most requests the model can have in flight at once (for drivers that size
    /// their tables).
    pub fn max_outstanding(&self) -> u64 {
        match self {
            ModelSpec::Vdi(s) => s.desktops as u64 * (s.task_queue_depth as u64 + 64),
            ModelSpec::Oltp(s) => s.max_outstanding(),
            ModelSpec::Exchange(s) => s.mailboxes as u64 * 4,
        }
    }

    /// The model's data region, `[0, bytes)` of its volume, when it has one a cache
    /// can be pre-warmed with: the OLTP database (not its log), the Exchange database.
    /// Desktops have none (their image is read on a schedule, not resident by default).
    pub fn data_bytes(&self) -> Option<u64> {
        match self {
            ModelSpec::Vdi(_) => None,
            ModelSpec::Oltp(s) => Some(s.database_bytes()),
            ModelSpec::Exchange(s) => Some(s.db_bytes()),
        }
    }

    /// Bytes of volume the model needs.
    pub fn min_volume_bytes(&self) -> u64 {
        match self {
            ModelSpec::Vdi(s) => s.min_volume_bytes(),
            ModelSpec::Oltp(s) => s.min_volume_bytes(),
            ModelSpec::Exchange(s) => s.min_volume_bytes(),
        }
    }

    /// A generator for one instance of the model on a volume of `volume_bytes`.
    /// `instance` of `instances`: the copies of one model (every VM running it)
    /// split its schedule — logins interleave, the power-on and clone slots are
    /// dealt out — so that together they run it once.
    pub fn build(
        &self,
        volume_bytes: u64,
        seed: u64,
        instance: u32,
        instances: u32,
    ) -> Result<Box<dyn IoGenerator + Send>, WorkloadError> {
        self.validate()?;
        if volume_bytes < self.min_volume_bytes() {
            return Err(WorkloadError::invalid(
                self.name(),
                format!(
                    "needs a volume of at least {:.2} GiB, got {:.2} GiB",
                    self.min_volume_bytes() as f64 / GIB as f64,
                    volume_bytes as f64 / GIB as f64
                ),
            ));
        }
        let instances = instances.max(1);
        let instance = instance.min(instances - 1);
        if let ModelSpec::Vdi(s) = self {
            for (field, slots, scheduled) in [
                (
                    "max_concurrent_create",
                    s.max_concurrent_create,
                    s.create_at_s.is_some(),
                ),
                (
                    "max_concurrent_power_on",
                    s.max_concurrent_power_on,
                    s.power_on_at_s.is_some(),
                ),
            ] {
                if scheduled && slots < instances {
                    return Err(WorkloadError::invalid(
                        field,
                        format!(
                            "{slots} at a time cannot be split over the model's {instances} pools (every [[vm]] running it, `count` times each): at least one each"
                        ),
                    ));
                }
            }
        }
        Ok(match self {
            ModelSpec::Vdi(s) => Box::new(crate::vdi::VdiModel::new(
                s,
                volume_bytes,
                seed,
                instance,
                instances,
            )),
            ModelSpec::Oltp(s) => Box::new(crate::oltp::OltpModel::new(s, volume_bytes, seed)),
            ModelSpec::Exchange(s) => {
                Box::new(crate::exchange::ExchangeModel::new(s, volume_bytes, seed))
            }
        })
    }
}

/// A distribution of transfer sizes: `(size_bytes, weight)` buckets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SizeDist(pub Vec<(u32, f64)>);

impl SizeDist {
    pub fn validate(&self, field: &str) -> Result<(), WorkloadError> {
        if self.0.is_empty() {
            return Err(WorkloadError::invalid(field, "needs at least one bucket"));
        }
        for (size, w) in &self.0 {
            if *size == 0 || *size > crate::MAX_TRANSFER_BYTES || !size.is_multiple_of(512) {
                return Err(WorkloadError::invalid(
                    field,
                    format!("size {size} must be a multiple of 512 up to 64 MiB"),
                ));
            }
            if !(w.is_finite() && *w >= 0.0) {
                return Err(WorkloadError::invalid(
                    field,
                    format!("weight {w} must be ≥ 0"),
                ));
            }
        }
        if self.0.iter().map(|b| b.1).sum::<f64>() <= 0.0 {
            return Err(WorkloadError::invalid(field, "weights sum to 0"));
        }
        Ok(())
    }

    pub fn mean_bytes(&self) -> f64 {
        let w: f64 = self.0.iter().map(|b| b.1).sum();
        self.0.iter().map(|b| b.0 as f64 * b.1).sum::<f64>() / w
    }

    pub fn max_bytes(&self) -> u32 {
        self.0.iter().map(|b| b.0).max().unwrap_or(4096)
    }

    pub(crate) fn sample(&self, rng: &mut ChaCha8Rng) -> u32 {
        let total: f64 = self.0.iter().map(|b| b.1).sum();
        let mut x = rng.random::<f64>() * total;
        for (size, w) in &self.0 {
            if x < *w {
                return *size;
            }
            x -= w;
        }
        self.0.last().map(|b| b.0).unwrap_or(4096)
    }
}

/// Exponential inter-arrival time (Poisson process) of `rate_per_s`, ns.
pub(crate) fn exp_gap_ns(rng: &mut ChaCha8Rng, rate_per_s: f64) -> Nanos {
    if rate_per_s <= 0.0 {
        return Nanos::MAX / 4;
    }
    let u: f64 = rng.random::<f64>().max(1e-12);
    ((-u.ln() / rate_per_s) * NS_PER_S) as Nanos
}

/// Per-second counters of completed events: count, sum, max.
#[derive(Clone, Debug, Default)]
pub(crate) struct PerSecond {
    buckets: Vec<(u64, f64, f64)>,
}

impl PerSecond {
    pub(crate) fn record(&mut self, now_ns: Nanos, value: f64) {
        let s = (now_ns / 1_000_000_000) as usize;
        if s >= self.buckets.len() {
            self.buckets.resize(s + 1, (0, 0.0, 0.0));
        }
        let b = &mut self.buckets[s];
        b.0 += 1;
        b.1 += value;
        b.2 = b.2.max(value);
    }

    /// (count, sum, max) over the seconds that start in `[from, to)`.
    pub(crate) fn window(&self, from_ns: Nanos, to_ns: Nanos) -> (u64, f64, f64) {
        let a = (from_ns / 1_000_000_000) as usize;
        let b = to_ns.div_ceil(1_000_000_000) as usize;
        let mut out = (0, 0.0, 0.0f64);
        for x in self.buckets.iter().take(b).skip(a) {
            out.0 += x.0;
            out.1 += x.1;
            out.2 = out.2.max(x.2);
        }
        out
    }
}

pub(crate) fn window_s(from_ns: Nanos, to_ns: Nanos) -> f64 {
    (to_ns.saturating_sub(from_ns)) as f64 / NS_PER_S
}

/// A tiny deterministic hash (for traces every clone replays identically).
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(crate) fn check_range(field: &str, v: f64, lo: f64, hi: f64) -> Result<(), WorkloadError> {
    if v.is_finite() && v >= lo && v <= hi {
        Ok(())
    } else {
        Err(WorkloadError::invalid(
            field,
            format!("must be in [{lo}, {hi}], got {v}"),
        ))
    }
}

/// Drives a generator against storage of a fixed latency (tests).
#[cfg(test)]
pub(crate) fn run_fixed_latency(
    g: &mut dyn IoGenerator,
    latency_ns: Nanos,
    end_ns: Nanos,
) -> Vec<(Nanos, crate::IoRequest)> {
    use crate::Issue;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let workers = g.workers();
    let mut issued = Vec::new();
    // (time, seq, worker, completion?) ; requests kept aside by seq.
    let mut heap: BinaryHeap<Reverse<(Nanos, u64, u32, bool)>> = BinaryHeap::new();
    let mut reqs = std::collections::HashMap::new();
    let mut wake = vec![None::<Nanos>; workers as usize];
    let mut outstanding = vec![0u32; workers as usize];
    let mut seq = 0u64;
    for w in 0..workers {
        heap.push(Reverse((0, seq, w, false)));
        seq += 1;
    }
    while let Some(Reverse((now, s, w, completion))) = heap.pop() {
        if now > end_ns {
            break;
        }
        if completion {
            let r = reqs.remove(&s).expect("request");
            outstanding[w as usize] -= 1;
            g.on_complete(now, w, &r, latency_ns);
        } else if wake[w as usize].is_some_and(|t| t != now) {
            continue;
        }
        loop {
            match g.poll(now, w, outstanding[w as usize]) {
                Issue::Io(r) => {
                    outstanding[w as usize] += 1;
                    issued.push((now, r));
                    reqs.insert(seq, r);
                    heap.push(Reverse((now + latency_ns, seq, w, true)));
                    seq += 1;
                }
                Issue::At(t) => {
                    let t = t.max(now + 1);
                    if wake[w as usize] != Some(t) {
                        wake[w as usize] = Some(t);
                        heap.push(Reverse((t, seq, w, false)));
                        seq += 1;
                    }
                    break;
                }
                Issue::Blocked => break,
            }
        }
    }
    issued
}
