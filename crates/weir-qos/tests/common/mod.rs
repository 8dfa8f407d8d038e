//! A deterministic test bench for the scheduler: a toy device with `slots` parallel
//! servers and a fixed service time per request (capacity `slots / service` IOPS,
//! whatever the size), driven like a real driver drives the scheduler: `dispatch`
//! whenever a slot is free, again at `WaitUntil` times, `complete` on completion.
//! Clients are closed-loop (queue depth, optional think time) or open-loop
//! (Poisson arrivals from a seeded generator).
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use weir_qos::{
    ClientId, Dispatch, IoCost, NANOS_PER_SEC, Nanos, Policy, Scheduler, SchedulerConfig, VolumeId,
};

pub const KIB: u32 = 1024;
pub const MS: Nanos = 1_000_000;

#[derive(Clone, Debug)]
pub struct Device {
    pub slots: usize,
    pub service_ns: Nanos,
}

impl Device {
    pub fn capacity_iops(&self) -> f64 {
        self.slots as f64 * NANOS_PER_SEC as f64 / self.service_ns as f64
    }
}

#[derive(Clone, Debug)]
pub enum Load {
    /// `queue_depth` requests outstanding, each reissued `think_ns` after completing.
    Closed { queue_depth: u32, think_ns: Nanos },
    /// Poisson arrivals at `iops`.
    Open { iops: f64 },
}

#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub volume: u32,
    pub client: u32,
    pub size_bytes: u32,
    pub load: Load,
}

impl ClientSpec {
    pub fn flood(volume: u32, client: u32, size_bytes: u32, queue_depth: u32) -> ClientSpec {
        ClientSpec {
            volume,
            client,
            size_bytes,
            load: Load::Closed {
                queue_depth,
                think_ns: 0,
            },
        }
    }
}

#[derive(Copy, Clone, Debug)]
pub struct Release {
    pub at_ns: Nanos,
    pub units: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct VolumeRecord {
    pub releases: Vec<Release>,
    pub latencies_ns: Vec<Nanos>,
}

impl VolumeRecord {
    pub fn units_in(&self, from_ns: Nanos, to_ns: Nanos) -> u64 {
        self.releases
            .iter()
            .filter(|r| r.at_ns >= from_ns && r.at_ns < to_ns)
            .map(|r| r.units)
            .sum()
    }
    pub fn bytes_in(&self, from_ns: Nanos, to_ns: Nanos) -> u64 {
        self.releases
            .iter()
            .filter(|r| r.at_ns >= from_ns && r.at_ns < to_ns)
            .map(|r| r.bytes)
            .sum()
    }
    pub fn ios_in(&self, from_ns: Nanos, to_ns: Nanos) -> u64 {
        self.releases
            .iter()
            .filter(|r| r.at_ns >= from_ns && r.at_ns < to_ns)
            .count() as u64
    }
    /// The most units (or bytes) released in any window `[t, t + window)`.
    pub fn max_in_window(&self, window_ns: Nanos, amount: impl Fn(&Release) -> u64) -> u64 {
        let r = &self.releases;
        let (mut best, mut sum, mut end) = (0, 0, 0);
        for start in 0..r.len() {
            while end < r.len() && r[end].at_ns < r[start].at_ns + window_ns {
                sum += amount(&r[end]);
                end += 1;
            }
            best = best.max(sum);
            sum -= amount(&r[start]);
        }
        best
    }
    pub fn mean_latency_ms(&self) -> f64 {
        if self.latencies_ns.is_empty() {
            return f64::NAN;
        }
        self.latencies_ns.iter().sum::<u64>() as f64 / self.latencies_ns.len() as f64 / 1e6
    }
}

pub struct Outcome {
    pub volumes: std::collections::BTreeMap<u32, VolumeRecord>,
    /// Busy slot-time inside `[from, to)` divided by `slots × (to − from)`.
    pub busy_intervals: Vec<(Nanos, Nanos)>,
    pub device: Device,
    pub scheduler: Scheduler<usize>,
}

impl Outcome {
    pub fn volume(&self, v: u32) -> &VolumeRecord {
        &self.volumes[&v]
    }
    pub fn busy_fraction(&self, from_ns: Nanos, to_ns: Nanos) -> f64 {
        let busy: Nanos = self
            .busy_intervals
            .iter()
            .map(|&(s, e)| e.min(to_ns).saturating_sub(s.max(from_ns)))
            .sum();
        busy as f64 / (self.device.slots as f64 * (to_ns - from_ns) as f64)
    }
}

/// A policy change applied at a given time during the run.
pub struct PolicyChange {
    pub at_ns: Nanos,
    pub volume: u32,
    pub policy: Policy,
}

pub struct Bench {
    pub device: Device,
    pub volumes: Vec<(u32, Policy)>,
    pub clients: Vec<ClientSpec>,
    pub duration_ns: Nanos,
    pub seed: u64,
    pub config: SchedulerConfig,
    pub changes: Vec<PolicyChange>,
}

impl Bench {
    pub fn new(device: Device, duration_ns: Nanos) -> Bench {
        Bench {
            device,
            volumes: Vec::new(),
            clients: Vec::new(),
            duration_ns,
            seed: 1,
            config: SchedulerConfig::default(),
            changes: Vec::new(),
        }
    }

    pub fn volume(mut self, id: u32, policy: Policy) -> Bench {
        self.volumes.push((id, policy));
        self
    }

    pub fn client(mut self, spec: ClientSpec) -> Bench {
        self.clients.push(spec);
        self
    }

    pub fn run(self) -> Outcome {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let mut sched: Scheduler<usize> = Scheduler::new(self.config.clone());
        let mut volumes = std::collections::BTreeMap::new();
        for (id, policy) in &self.volumes {
            sched.add_volume(0, VolumeId(*id), policy.clone());
            volumes.insert(*id, VolumeRecord::default());
        }
        let mut changes: Vec<&PolicyChange> = self.changes.iter().collect();
        changes.sort_by_key(|c| Reverse(c.at_ns));
        // (time, sequence, client index) of the next request a client issues.
        let mut issues: BinaryHeap<Reverse<(Nanos, u64, usize)>> = BinaryHeap::new();
        let mut seq = 0u64;
        for (i, c) in self.clients.iter().enumerate() {
            match c.load {
                Load::Closed { queue_depth, .. } => {
                    for _ in 0..queue_depth {
                        issues.push(Reverse((0, seq, i)));
                        seq += 1;
                    }
                }
                Load::Open { .. } => {
                    issues.push(Reverse((0, seq, i)));
                    seq += 1;
                }
            }
        }
        // (completion time, sequence, client index, enqueued at).
        let mut completions: BinaryHeap<Reverse<(Nanos, u64, usize, Nanos)>> = BinaryHeap::new();
        let mut busy_intervals = Vec::new();
        let mut busy = 0usize;
        let mut now: Nanos = 0;
        let end = self.duration_ns;
        loop {
            let mut wake = None;
            while busy < self.device.slots {
                match sched.dispatch(now) {
                    Dispatch::Io(d) => {
                        let c = &self.clients[d.payload];
                        busy += 1;
                        let done = now + self.device.service_ns;
                        busy_intervals.push((now, done));
                        if let Some(rec) = volumes.get_mut(&c.volume) {
                            let units = d.cost.units(self.config.cost_unit_bytes);
                            rec.releases.push(Release {
                                at_ns: now,
                                units,
                                bytes: d.cost.bytes(),
                            });
                        }
                        completions.push(Reverse((done, seq, d.payload, d.enqueued_at)));
                        seq += 1;
                    }
                    Dispatch::WaitUntil(t) => {
                        assert!(t > now, "WaitUntil({t}) not after now ({now})");
                        wake = Some(t);
                        break;
                    }
                    Dispatch::Idle => break,
                }
            }
            let next = [
                completions.peek().map(|Reverse(c)| c.0),
                issues.peek().map(|Reverse(i)| i.0),
                wake,
                changes.last().map(|c| c.at_ns),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next) = next else { break };
            if next >= end {
                break;
            }
            now = next;
            while let Some(c) = changes.last() {
                if c.at_ns > now {
                    break;
                }
                sched.set_policy(now, VolumeId(c.volume), c.policy.clone());
                changes.pop();
            }
            while let Some(&Reverse((t, _, ci, enqueued_at))) = completions.peek() {
                if t > now {
                    break;
                }
                completions.pop();
                busy -= 1;
                let c = &self.clients[ci];
                let latency = now - enqueued_at;
                sched.complete(
                    now,
                    VolumeId(c.volume),
                    ClientId(c.client),
                    IoCost::read(c.size_bytes),
                    latency,
                );
                volumes
                    .get_mut(&c.volume)
                    .expect("known volume")
                    .latencies_ns
                    .push(latency);
                if let Load::Closed { think_ns, .. } = c.load {
                    issues.push(Reverse((now + think_ns, seq, ci)));
                    seq += 1;
                }
            }
            while let Some(&Reverse((t, _, ci))) = issues.peek() {
                if t > now {
                    break;
                }
                issues.pop();
                let c = &self.clients[ci];
                sched
                    .enqueue(
                        now,
                        VolumeId(c.volume),
                        ClientId(c.client),
                        IoCost::read(c.size_bytes),
                        ci,
                    )
                    .expect("known volume");
                if let Load::Open { iops } = c.load {
                    let u: f64 = rng.random_range(f64::EPSILON..1.0);
                    let gap = (-u.ln() / iops * 1e9).max(1.0) as Nanos;
                    issues.push(Reverse((now + gap, seq, ci)));
                    seq += 1;
                }
            }
        }
        Outcome {
            volumes,
            busy_intervals,
            device: self.device,
            scheduler: sched,
        }
    }
}

/// Drives a scheduler against an infinitely fast device until `until_ns`: every
/// request is released as soon as the scheduler allows. Returns release times.
pub fn drain(
    sched: &mut Scheduler<u32>,
    from_ns: Nanos,
    until_ns: Nanos,
) -> Vec<(Nanos, VolumeId)> {
    let mut now = from_ns;
    let mut out = Vec::new();
    while now < until_ns {
        match sched.dispatch(now) {
            Dispatch::Io(d) => out.push((now, d.volume)),
            Dispatch::WaitUntil(t) => now = t,
            Dispatch::Idle => break,
        }
    }
    out
}
