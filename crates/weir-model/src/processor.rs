//! A processor that does per-request work: a storage controller's CPUs, a software
//! iSCSI target or initiator, a hypervisor's storage stack. `cores` parallel
//! servers fed from one FIFO queue; a request holds one core for its fixed cost
//! (`read_us` or `write_us`: protocol, locking, interrupts, cache lookups) plus its
//! bytes at `mbps` (what one core copies, checksums or encrypts per second).
//!
//! The same queue serves as an "ideal" device (a memory-speed array, a flash
//! device's channels): parallel servers with a fixed and a per-byte time and no
//! seeks, caches or reordering.
//!
//! Presets are processors whose costs came from a measurement. Each says which
//! measurement it was fitted on: a figure a preset was fitted on is a
//! *calibration* in docs/FIDELITY.md and never counts as reproduced.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, check_in_range, check_non_negative};
use crate::{Completion, Component, DeviceIo, IoDir, Nanos, round_ns};

const MAX_FIXED_US: f64 = 1e7;
const MIN_MBPS: f64 = 1e-3;
const MAX_MBPS: f64 = 1e9;

/// Cores, and what one request costs on one of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSpec {
    /// Requests served at once (cores, threads, channels): 1-100,000.
    pub cores: u32,
    /// Fixed cost of a read, µs of one core.
    #[serde(default)]
    pub read_us: f64,
    /// Fixed cost of a write, µs of one core.
    #[serde(default)]
    pub write_us: f64,
    /// Payload one core moves per second, MB (10^6 B); 0: bytes cost nothing.
    #[serde(default)]
    pub mbps: f64,
}

/// The named processors: (name, what it stands for and where its figures come from).
pub const PROCESSOR_PRESETS: &[(&str, &str)] = &[
    (
        "esxi5-sw-iscsi",
        "ESXi 5.0's software iSCSI initiator, one session per host (one 10 GbE NIC, MTU \
         1,500, no port binding) on a Xeon 5680: its receive path runs on one core. \
         CALIBRATION: 657 MB/s, the two VMs' 329 + 328 MB/s of seed 003's usage model 1 \
         (one host, shares 1:1, SIOC off, 1 MB sequential reads)",
    ),
    (
        "ms-iscsi-target",
        "Microsoft iSCSI Software Target (Windows Storage Server 2008 R2, dual Xeon 5670, \
         MTU 1,500) serving reads from its file cache. CALIBRATION: 788 MB/s, the two VMs' \
         393 + 395 MB/s of seed 003's usage model 2 (two hosts, shares 1:1, SIOC off, \
         1 MB sequential reads)",
    ),
    (
        "fas3270-ontap-8.1",
        "A NetApp FAS3270 controller's 4 CPUs under Data ONTAP 8.1 serving NFS: a fixed \
         cost per read and per write. CALIBRATION on seed 004's 8.1 controller CPU: \
         Table 14 (Tuesday login: 760 reads + 3,900 writes/s at 23 %) and Table 16 \
         (power-on: 36,085 reads + 5,432 writes/s at 97 %), two equations for the two \
         costs: 74.2 µs per read, 221.4 µs per write",
    ),
    (
        "fas3270-ontap-8.0.1",
        "The same controller under Data ONTAP 8.0.1 (no deduplication-aware RAM cache: \
         more reads go to Flash Cache and disk, each dearer). CALIBRATION on seed 004's \
         8.0.1 controller CPU: Table 14 (860 reads + 3,794 writes/s at 27 %) and Table 16 \
         (19,938 reads + 4,916 writes/s at 95 %): 127.5 µs per read, 255.8 µs per write",
    ),
    (
        "iocontrol-n5-150-sp",
        "Fusion ioControl n5-150, seed 000's appliance: its storage processors as they \
         serve hits from the flash tier, 8 at a time, 320 µs each plus the bytes at \
         400 MB/s (≈ 25,000 IOPS). CALIBRATION on seed 000's boot storm (bursts over \
         20,000 IOPS for about five minutes), not a rating: NexGen rated the n5-150 \
         at 150,000 IOPS (4 KiB, 50/50), and with that 000's storm would not have \
         contended (docs/FIDELITY.md)",
    ),
];

impl ProcessorSpec {
    /// A named processor ([`PROCESSOR_PRESETS`]).
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        let one_core = |mbps: f64| ProcessorSpec {
            cores: 1,
            read_us: 0.0,
            write_us: 0.0,
            mbps,
        };
        // 004: "all four physical CPUs" of the FAS3270.
        let per_op = |read_us: f64, write_us: f64| ProcessorSpec {
            cores: 4,
            read_us,
            write_us,
            mbps: 0.0,
        };
        match name {
            "esxi5-sw-iscsi" => Ok(one_core(657.0)),
            "ms-iscsi-target" => Ok(one_core(788.0)),
            "fas3270-ontap-8.1" => Ok(per_op(74.2, 221.4)),
            "fas3270-ontap-8.0.1" => Ok(per_op(127.5, 255.8)),
            "iocontrol-n5-150-sp" => Ok(ProcessorSpec {
                cores: 8,
                read_us: 320.0,
                write_us: 320.0,
                mbps: 400.0,
            }),
            _ => Err(ModelError::UnknownPreset {
                kind: "processor",
                name: name.to_string(),
                known: PROCESSOR_PRESETS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        check_in_range(
            "processor",
            "cores",
            self.cores as u64,
            1..=100_000,
            "must be 1-100000",
        )?;
        check_non_negative("processor", "read_us", self.read_us)?;
        check_non_negative("processor", "write_us", self.write_us)?;
        check_non_negative("processor", "mbps", self.mbps)?;
        // Bounded so that a request's service time stays far inside `Nanos`: at most
        // 10 s fixed, and at least 1 kB/s (a 4 GiB request: ≈ 50 days).
        for (field, us) in [("read_us", self.read_us), ("write_us", self.write_us)] {
            if us > MAX_FIXED_US {
                return Err(ModelError::InvalidField {
                    what: "processor",
                    field,
                    value: format!("{us:?}"),
                    reason: "must be at most 10000000 (10 s)",
                });
            }
        }
        if self.mbps != 0.0 && !(MIN_MBPS..=MAX_MBPS).contains(&self.mbps) {
            return Err(ModelError::InvalidField {
                what: "processor",
                field: "mbps",
                value: format!("{:?}", self.mbps),
                reason: "must be 0 (no cost per byte) or 0.001-1000000000",
            });
        }
        if self.read_us == 0.0 && self.write_us == 0.0 && self.mbps == 0.0 {
            return Err(ModelError::InvalidField {
                what: "processor",
                field: "read_us, write_us, mbps",
                value: "0".into(),
                reason: "a processor needs a cost: read_us, write_us or mbps > 0",
            });
        }
        Ok(())
    }
}

/// A processor as a pure queueing state machine (FIFO over parallel cores).
#[derive(Clone, Debug)]
pub struct Processor {
    spec: ProcessorSpec,
    /// Fixed cost of a [read, write] and the cost of one byte, ns of one core.
    fixed_ns: [f64; 2],
    ns_per_byte: f64,
    /// Waiting for a core: (token, request).
    queue: VecDeque<(u64, DeviceIo)>,
    /// In service: (finish time, token), sorted by finish time.
    running: VecDeque<(Nanos, u64)>,
    busy_ns: u128,
}

impl Processor {
    pub fn new(spec: &ProcessorSpec) -> Result<Self, ModelError> {
        spec.validate()?;
        Ok(Processor {
            spec: spec.clone(),
            fixed_ns: [spec.read_us * 1e3, spec.write_us * 1e3],
            ns_per_byte: if spec.mbps > 0.0 {
                1e3 / spec.mbps
            } else {
                0.0
            },
            queue: VecDeque::new(),
            running: VecDeque::new(),
            busy_ns: 0,
        })
    }

    pub fn spec(&self) -> &ProcessorSpec {
        &self.spec
    }

    /// Requests waiting for a core.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// What `io` costs on one core, ns (at least 1, so every request takes time).
    fn service_ns(&self, io: &DeviceIo) -> Nanos {
        let fixed = self.fixed_ns[(io.dir == IoDir::Write) as usize];
        round_ns(fixed + io.size_bytes as f64 * self.ns_per_byte).max(1)
    }

    /// Starts `io` on a core. Its whole service is counted busy at once, so busy
    /// time read mid-service runs ahead by at most one service per core.
    fn start(&mut self, at: Nanos, token: u64, io: &DeviceIo) {
        let service = self.service_ns(io);
        self.busy_ns += service as u128;
        let finish = at + service;
        let pos = self.running.partition_point(|&(f, _)| f <= finish);
        self.running.insert(pos, (finish, token));
    }
}

impl Component for Processor {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        if (self.running.len() as u32) < self.spec.cores {
            self.start(now, token, &io);
        } else {
            self.queue.push_back((token, io));
        }
    }
    fn next_event_ns(&self) -> Option<Nanos> {
        self.running.front().map(|&(f, _)| f)
    }
    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        while let Some(&(finish, token)) = self.running.front() {
            if finish > now {
                break;
            }
            self.running.pop_front();
            done.push(Completion {
                token,
                at_ns: finish,
            });
            if let Some((t, io)) = self.queue.pop_front() {
                self.start(finish, t, &io);
            }
        }
        debug_assert!(self.running.len() as u32 <= self.spec.cores);
        debug_assert!(self.queue.is_empty() || self.running.len() as u32 == self.spec.cores);
    }
    fn busy_ns(&self) -> Nanos {
        (self.busy_ns / self.spec.cores as u128) as Nanos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(dir: IoDir, size_bytes: u32) -> DeviceIo {
        DeviceIo {
            offset_bytes: 0,
            size_bytes,
            dir,
        }
    }

    fn drain(p: &mut Processor) -> Vec<Completion> {
        let mut done = Vec::new();
        while let Some(t) = p.next_event_ns() {
            p.advance(t, &mut done);
        }
        done
    }

    #[test]
    fn requests_queue_for_the_cores_in_order() {
        let mut p = Processor::new(&ProcessorSpec {
            cores: 2,
            read_us: 1000.0,
            write_us: 3000.0,
            mbps: 0.0,
        })
        .unwrap();
        p.submit(0, io(IoDir::Write, 4096), 0);
        p.submit(0, io(IoDir::Read, 4096), 1);
        p.submit(0, io(IoDir::Read, 4096), 2);
        assert_eq!(p.queued(), 1);
        let done = drain(&mut p);
        let at: Vec<(u64, Nanos)> = done.iter().map(|c| (c.token, c.at_ns)).collect();
        // The read frees its core at 1 ms; the queued read takes it until 2 ms.
        assert_eq!(at, vec![(1, 1_000_000), (2, 2_000_000), (0, 3_000_000)]);
        // 5 ms of work on 2 cores.
        assert_eq!(p.busy_ns(), 2_500_000);
    }

    #[test]
    fn bytes_cost_at_the_core_rate() {
        // One core moving 500 MB/s: 1 MB takes 2 ms, so 10 of them take 20 ms.
        let mut p = Processor::new(&ProcessorSpec {
            cores: 1,
            read_us: 0.0,
            write_us: 0.0,
            mbps: 500.0,
        })
        .unwrap();
        for t in 0..10 {
            p.submit(0, io(IoDir::Read, 1_000_000), t);
        }
        let done = drain(&mut p);
        assert_eq!(done.len(), 10);
        assert_eq!(done[9].at_ns, 20_000_000);
    }

    #[test]
    fn specs_without_a_cost_or_core_are_refused() {
        let bad = [
            (0, 1.0, 0.0, 0.0),
            (1, 0.0, 0.0, 0.0),
            (1, -1.0, 0.0, 0.0),
            (1, 0.0, f64::NAN, 0.0),
            (1, 0.0, 0.0, f64::INFINITY),
            (200_000, 1.0, 1.0, 0.0),
            (1, 2e7, 0.0, 0.0),
            (1, 0.0, 1e300, 0.0),
            (1, 0.0, 0.0, 1e-300),
            (1, 0.0, 0.0, 1e12),
        ];
        for (cores, read_us, write_us, mbps) in bad {
            let spec = ProcessorSpec {
                cores,
                read_us,
                write_us,
                mbps,
            };
            assert!(Processor::new(&spec).is_err(), "{spec:?}");
        }
    }

    /// The FAS3270 presets give back the controller CPU they were fitted on (004
    /// Tables 14 and 16), so a typo in a cost cannot hide.
    #[test]
    fn the_controller_presets_reproduce_their_calibration() {
        let busy = |preset: &str, reads: f64, writes: f64| {
            let s = ProcessorSpec::preset(preset).unwrap();
            (reads * s.read_us + writes * s.write_us) / 1e6 / s.cores as f64
        };
        let fitted = [
            ("fas3270-ontap-8.1", 760.0, 3_900.0, 0.23),
            ("fas3270-ontap-8.1", 36_085.0, 5_432.0, 0.97),
            ("fas3270-ontap-8.0.1", 860.0, 3_794.0, 0.27),
            ("fas3270-ontap-8.0.1", 19_938.0, 4_916.0, 0.95),
        ];
        for (preset, reads, writes, cpu) in fitted {
            let b = busy(preset, reads, writes);
            assert!((b - cpu).abs() < 0.002, "{preset}: {b} vs {cpu}");
        }
    }

    #[test]
    fn every_preset_builds_and_unknown_names_list_them() {
        for (name, _) in PROCESSOR_PRESETS {
            Processor::new(&ProcessorSpec::preset(name).unwrap()).unwrap();
        }
        let e = ProcessorSpec::preset("pentium").unwrap_err().to_string();
        assert!(
            e.contains("esxi5-sw-iscsi") && e.contains("ms-iscsi-target"),
            "{e}"
        );
    }
}
