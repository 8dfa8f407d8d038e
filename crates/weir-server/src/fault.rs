//! Fault injection: a backend layer that fails or delays chosen I/Os of a pool's
//! volumes, for tests and drills (nbdkit's `error` and `delay` filters; the
//! simulator's seeded injectors). Configured per pool:
//!
//! ```toml
//! [[pools.faults]]
//! kind = "eio"          # "eio" or "enospc" (the I/O fails with that error), or
//!                       # "latency" (it completes latency_ms later)
//! ops = ["write"]       # read, write, flush, trim, zero, cache, block_status
//!                       # (absent: every operation)
//! every = 100           # the 100th, 200th, … matching I/O of each volume, or
//! # rate = 0.01         # each matching I/O with this probability (seeded:
//! # seed = 7            # the same I/Os fail on every run of the same sequence)
//! # latency_ms = 250    # kind = "latency": the added delay
//! ```
//!
//! A fault is the error of one backend call: the request that made it fails
//! (the NBD error matching the errno) and nothing else does. A layer with a
//! rule on reads or writes sends them through the blocking path (no page-cache
//! fast path or `sendfile`), so that every I/O is counted once.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir_nbd::Extent;

use crate::backend::Backend;

/// What a fault does to the I/O it hits.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    /// Fails with `EIO` (NBD `EIO`).
    Eio,
    /// Fails with `ENOSPC` (NBD `ENOSPC`).
    Enospc,
    /// Completes `latency_ms` later.
    Latency,
}

/// A backend operation a rule applies to.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultOp {
    Read,
    Write,
    Flush,
    Trim,
    Zero,
    Cache,
    BlockStatus,
}

/// Longest injected latency.
pub const MAX_LATENCY_MS: f64 = 60_000.0;

/// One `[[pools.faults]]` rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    pub kind: FaultKind,
    /// Operations it applies to (empty: all).
    #[serde(default)]
    pub ops: Vec<FaultOp>,
    /// Probability (0-1] that a matching I/O is hit.
    #[serde(default)]
    pub rate: Option<f64>,
    /// Every n-th matching I/O (per volume) is hit.
    #[serde(default)]
    pub every: Option<u64>,
    /// The delay of a `latency` fault, milliseconds.
    #[serde(default)]
    pub latency_ms: Option<f64>,
    /// Seed of the `rate` draws.
    #[serde(default)]
    pub seed: u64,
}

impl FaultRule {
    /// Checks the rule; an error names the field.
    pub fn validate(&self) -> Result<(), String> {
        match (self.rate, self.every) {
            (Some(r), None) if r.is_finite() && r > 0.0 && r <= 1.0 => {}
            (Some(r), None) => return Err(format!("rate: must be above 0 and at most 1, got {r}")),
            (None, Some(n)) if n >= 1 => {}
            (None, Some(_)) => return Err("every: must be at least 1".into()),
            _ => return Err("set exactly one of rate and every".into()),
        }
        match (self.kind, self.latency_ms) {
            (FaultKind::Latency, Some(ms))
                if ms.is_finite() && ms > 0.0 && ms <= MAX_LATENCY_MS =>
            {
                Ok(())
            }
            (FaultKind::Latency, Some(ms)) => Err(format!(
                "latency_ms: must be above 0 and at most {MAX_LATENCY_MS}, got {ms}"
            )),
            (FaultKind::Latency, None) => Err("latency_ms: required for kind = \"latency\"".into()),
            (_, Some(_)) => Err("latency_ms: only for kind = \"latency\"".into()),
            (_, None) => Ok(()),
        }
    }

    fn applies_to(&self, op: FaultOp) -> bool {
        self.ops.is_empty() || self.ops.contains(&op)
    }

    /// Whether the `n`-th matching I/O (from 1) is hit.
    fn hits(&self, n: u64) -> bool {
        match (self.every, self.rate) {
            (Some(every), _) => n.is_multiple_of(every),
            (None, Some(rate)) => {
                let draw = splitmix64(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                ((draw >> 11) as f64 / (1u64 << 53) as f64) < rate
            }
            (None, None) => false,
        }
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

struct Armed {
    rule: FaultRule,
    /// Matching I/Os seen so far.
    seen: AtomicU64,
}

/// The fault layer over a volume's backend.
pub struct FaultLayer {
    inner: Arc<dyn Backend>,
    rules: Vec<Armed>,
}

/// `inner` behind a fault layer with `rules`, or `inner` itself without rules.
pub fn wrap(inner: Arc<dyn Backend>, rules: &[FaultRule]) -> Arc<dyn Backend> {
    if rules.is_empty() {
        return inner;
    }
    Arc::new(FaultLayer {
        inner,
        rules: rules
            .iter()
            .map(|r| Armed {
                rule: r.clone(),
                seen: AtomicU64::new(0),
            })
            .collect(),
    })
}

impl FaultLayer {
    fn touches(&self, op: FaultOp) -> bool {
        self.rules.iter().any(|a| a.rule.applies_to(op))
    }

    /// Counts the I/O against every rule for `op`; the first rule that hits it
    /// decides (an error, or a delay before the I/O is done).
    fn inject(&self, op: FaultOp) -> io::Result<()> {
        let mut fault = None;
        for a in self.rules.iter().filter(|a| a.rule.applies_to(op)) {
            let n = a.seen.fetch_add(1, Ordering::Relaxed) + 1;
            if fault.is_none() && a.rule.hits(n) {
                fault = Some(&a.rule);
            }
        }
        match fault.map(|r| (r.kind, r.latency_ms)) {
            None => Ok(()),
            Some((FaultKind::Eio, _)) => Err(io::Error::from_raw_os_error(libc::EIO)),
            Some((FaultKind::Enospc, _)) => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some((FaultKind::Latency, ms)) => {
                std::thread::sleep(Duration::from_secs_f64(ms.unwrap_or(0.0) / 1e3));
                Ok(())
            }
        }
    }
}

impl Backend for FaultLayer {
    fn ownership(&self) -> crate::backend::Ownership {
        self.inner.ownership()
    }
    fn confirm_ownership(&self) -> crate::backend::Ownership {
        self.inner.confirm_ownership()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inject(FaultOp::Read)?;
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inject(FaultOp::Write)?;
        self.inner.write(offset, data)
    }
    fn flush(&self) -> io::Result<()> {
        self.inject(FaultOp::Flush)?;
        self.inner.flush()
    }
    fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        if self.touches(FaultOp::Read) {
            return Ok(false);
        }
        self.inner.read_nowait(offset, buf)
    }
    fn write_nowait(&self, offset: u64, data: &[u8]) -> io::Result<bool> {
        if self.touches(FaultOp::Write) {
            return Ok(false);
        }
        self.inner.write_nowait(offset, data)
    }
    fn cached_source(&self, offset: u64, length: u64) -> Option<RawFd> {
        if self.touches(FaultOp::Read) {
            return None;
        }
        self.inner.cached_source(offset, length)
    }
    fn trim(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inject(FaultOp::Trim)?;
        self.inner.trim(offset, length)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_punch: bool,
        fast_only: bool,
    ) -> io::Result<()> {
        self.inject(FaultOp::Zero)?;
        self.inner
            .write_zeroes(offset, length, may_punch, fast_only)
    }
    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        self.inject(FaultOp::BlockStatus)?;
        self.inner.block_status(offset, length)
    }
    fn cache(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inject(FaultOp::Cache)?;
        self.inner.cache(offset, length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A backend that records the reads and writes that reach it.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(&'static str, u64)>>);

    impl Backend for Recorder {
        fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            buf.fill(1);
            self.0.lock().unwrap().push(("read", offset));
            Ok(())
        }
        fn write(&self, offset: u64, _data: &[u8]) -> io::Result<()> {
            self.0.lock().unwrap().push(("write", offset));
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn read_nowait(&self, _offset: u64, _buf: &mut [u8]) -> io::Result<bool> {
            Ok(true)
        }
        fn trim(&self, _offset: u64, _length: u64) -> io::Result<()> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> io::Result<()> {
            Ok(())
        }
        fn block_status(&self, _offset: u64, length: u64) -> io::Result<Vec<Extent>> {
            Ok(vec![Extent {
                length: length as u32,
                flags: 0,
            }])
        }
        fn cache(&self, _offset: u64, _length: u64) -> io::Result<()> {
            Ok(())
        }
    }

    fn rule(kind: FaultKind, ops: &[FaultOp]) -> FaultRule {
        FaultRule {
            kind,
            ops: ops.to_vec(),
            rate: None,
            every: Some(3),
            latency_ms: None,
            seed: 0,
        }
    }

    #[test]
    fn every_nth_matching_io_fails_with_its_errno_and_nothing_else_does() {
        let inner = Arc::new(Recorder::default());
        let layer = wrap(inner.clone(), &[rule(FaultKind::Enospc, &[FaultOp::Write])]);
        let results: Vec<_> = (0..9).map(|i| layer.write(i, b"x")).collect();
        let failed: Vec<u64> = (0..9).filter(|&i| results[i as usize].is_err()).collect();
        assert_eq!(failed, [2, 5, 8]);
        let e = results[2].as_ref().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        // Failed writes never reached the backend; reads are not touched and keep
        // their fast path.
        assert_eq!(inner.0.lock().unwrap().len(), 6);
        let mut buf = [0u8; 4];
        for _ in 0..6 {
            layer.read(0, &mut buf).unwrap();
        }
        assert!(
            layer.read_nowait(0, &mut buf).unwrap(),
            "reads keep their fast path"
        );
        assert!(
            !layer.write_nowait(0, b"x").unwrap(),
            "writes take the counted path"
        );
    }

    #[test]
    fn rate_draws_are_seeded_and_near_the_rate() {
        let mut r = rule(FaultKind::Eio, &[]);
        r.every = None;
        r.rate = Some(0.1);
        r.seed = 42;
        let hits: Vec<u64> = (1..=10_000).filter(|&n| r.hits(n)).collect();
        assert!((900..=1100).contains(&hits.len()), "{}", hits.len());
        let again: Vec<u64> = (1..=10_000).filter(|&n| r.hits(n)).collect();
        assert_eq!(hits, again);
        r.seed = 43;
        assert_ne!(
            hits,
            (1..=10_000).filter(|&n| r.hits(n)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn latency_delays_only_the_hit_io() {
        let mut r = rule(FaultKind::Latency, &[FaultOp::Read]);
        r.every = Some(2);
        r.latency_ms = Some(50.0);
        let layer = wrap(Arc::new(Recorder::default()), &[r]);
        let mut buf = [0u8; 4];
        let times: Vec<Duration> = (0..4)
            .map(|_| {
                let t = std::time::Instant::now();
                layer.read(0, &mut buf).unwrap();
                t.elapsed()
            })
            .collect();
        assert!(times[1] >= Duration::from_millis(50) && times[3] >= Duration::from_millis(50));
        assert!(times[0] < Duration::from_millis(50) && times[2] < Duration::from_millis(50));
        assert_eq!(buf, [1; 4], "the delayed read still reads");
    }

    #[test]
    fn rules_are_validated() {
        let mut r = rule(FaultKind::Eio, &[]);
        assert!(r.validate().is_ok());
        r.rate = Some(0.5);
        assert!(r.validate().unwrap_err().contains("exactly one"));
        r.every = None;
        r.rate = Some(1.5);
        assert!(r.validate().unwrap_err().starts_with("rate"));
        r.rate = Some(0.5);
        r.latency_ms = Some(3.0);
        assert!(r.validate().unwrap_err().starts_with("latency_ms"));
        r.kind = FaultKind::Latency;
        assert!(r.validate().is_ok());
        r.latency_ms = None;
        assert!(r.validate().unwrap_err().contains("required"));
        r.every = Some(0);
        r.rate = None;
        assert!(r.validate().unwrap_err().starts_with("every"));
    }
}
