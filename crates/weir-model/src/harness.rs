//! A tiny closed-loop driver for components (used by tests, the bench binary, and
//! handy for quick calibration checks): keeps `queue_depth` requests outstanding
//! until `total_ios` have completed, on a virtual clock.

use crate::{Completion, Component, DeviceIo, Nanos};

/// SplitMix64: a small deterministic generator for synthetic offsets.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n.max(1) as u128) >> 64) as u64
    }
}

/// Outcome of a closed-loop run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClosedLoopResult {
    pub completed: u64,
    pub bytes: u64,
    /// Virtual time from the first submission to the last completion.
    pub elapsed_ns: Nanos,
    pub mean_latency_ns: f64,
    pub max_latency_ns: Nanos,
    /// Every completion in order (token = request index).
    pub completions: Vec<Completion>,
}

impl ClosedLoopResult {
    pub fn iops(&self) -> f64 {
        self.completed as f64 * 1e9 / self.elapsed_ns.max(1) as f64
    }
    /// Megabytes (10^6) per second.
    pub fn mbps(&self) -> f64 {
        self.bytes as f64 * 1e3 / self.elapsed_ns.max(1) as f64
    }

    /// IOPS over the completions after the first `skip_fraction` of them (steady
    /// state, e.g. once a write-back cache has filled).
    pub fn steady_iops(&self, skip_fraction: f64) -> f64 {
        let n = self.completions.len();
        let skip = ((n as f64 * skip_fraction.clamp(0.0, 1.0)) as usize).min(n.saturating_sub(2));
        if n < 2 {
            return self.iops();
        }
        let t0 = self.completions[skip].at_ns;
        let t1 = self.completions[n - 1].at_ns;
        (n - 1 - skip) as f64 * 1e9 / (t1 - t0).max(1) as f64
    }
}

/// Runs `total_ios` requests from `next_io(index)` with `queue_depth` outstanding.
/// Stops early (returning what completed) if the component stalls with requests
/// outstanding, which would be a model bug.
pub fn run_closed_loop<C: Component + ?Sized>(
    component: &mut C,
    queue_depth: u32,
    total_ios: u64,
    mut next_io: impl FnMut(u64) -> DeviceIo,
) -> ClosedLoopResult {
    let mut submitted_at: Vec<Nanos> = Vec::with_capacity(total_ios as usize);
    let mut sizes: Vec<u32> = Vec::with_capacity(total_ios as usize);
    let mut res = ClosedLoopResult::default();
    let mut done = Vec::new();
    let mut lat_sum = 0.0;
    let mut issued = 0u64;
    let submit =
        |c: &mut C, now: Nanos, i: u64, at: &mut Vec<Nanos>, sz: &mut Vec<u32>, io: DeviceIo| {
            at.push(now);
            sz.push(io.size_bytes);
            c.submit(now, io, i);
        };
    while issued < total_ios.min(queue_depth.max(1) as u64) {
        let io = next_io(issued);
        submit(component, 0, issued, &mut submitted_at, &mut sizes, io);
        issued += 1;
    }
    while res.completed < issued {
        let Some(t) = component.next_event_ns() else {
            break;
        };
        done.clear();
        component.advance(t, &mut done);
        for c in done.iter() {
            let i = c.token as usize;
            let lat = c.at_ns - submitted_at[i];
            lat_sum += lat as f64;
            res.max_latency_ns = res.max_latency_ns.max(lat);
            res.completed += 1;
            res.bytes += sizes[i] as u64;
            res.elapsed_ns = res.elapsed_ns.max(c.at_ns);
            res.completions.push(*c);
            if issued < total_ios {
                let io = next_io(issued);
                submit(
                    component,
                    c.at_ns,
                    issued,
                    &mut submitted_at,
                    &mut sizes,
                    io,
                );
                issued += 1;
            }
        }
    }
    res.mean_latency_ns = lat_sum / res.completed.max(1) as f64;
    res
}
