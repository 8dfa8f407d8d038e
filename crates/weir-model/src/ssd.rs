//! Flash devices: a set of parallel flash channels (each busy for the flash access
//! time of an operation) followed by a shared data path (busy for
//! `max(bytes / bandwidth, slots / IOPS cap)`, where a read takes one slot, a random
//! write one slot per 4 KiB and a sequential write none). A SATA SSD and a PCIe flash card differ
//! only in their numbers. The device bandwidth (not a per-channel one) is the
//! parameter because a large request is striped over all channels.
//!
//! Both stages are FIFO, so an operation's completion time is computed when it is
//! submitted (exact for FIFO servers); the component then releases completions in
//! time order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, check_between, check_in_range};
use crate::hdd::DriveStats;
use crate::{Completion, Component, DeviceIo, IoDir, Nanos, round_ns};

/// Datasheet-level description of a flash device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsdSpec {
    /// Flash access latency of a read, µs (unloaded, small block).
    pub read_latency_us: f64,
    /// Write latency into the device's buffer, µs (unloaded, small block).
    pub write_latency_us: f64,
    /// Independent flash channels (operations in flight inside the device).
    pub channels: u32,
    /// Sequential read bandwidth of the device, MB/s.
    pub read_bandwidth_mbps: f64,
    /// Sequential write bandwidth of the device, MB/s.
    pub write_bandwidth_mbps: f64,
    /// Sustained random 4 KiB read IOPS cap.
    pub read_iops: f64,
    /// Sustained (steady-state, after garbage collection) random 4 KiB write IOPS cap.
    pub write_iops: f64,
    /// Capacity, bytes.
    pub capacity_bytes: u64,
}

impl SsdSpec {
    /// Intel SSD 710 (SATA 3 Gb/s, 25 nm HET MLC, 10 channels), the SSD of the seed's
    /// C240 M3 tests. Product specification: sequential read 270 MB/s, write
    /// 170 MB/s (100 GB model), 4 KiB random read 38,500 IOPS, random write 2,300
    /// IOPS (100 GB; 4,000 with 20 % extra over-provisioning), latency 75 µs read,
    /// 85 µs write.
    pub fn intel_710() -> Self {
        Self {
            read_latency_us: 75.0,
            write_latency_us: 85.0,
            channels: 10,
            read_bandwidth_mbps: 270.0,
            write_bandwidth_mbps: 170.0,
            read_iops: 38_500.0,
            write_iops: 2_300.0,
            capacity_bytes: 100_000_000_000,
        }
    }

    /// Fusion-io ioDrive2 785 GB MLC (PCIe 2.0 x4). Datasheet: read 1.5 GB/s, write
    /// 1.1 GB/s (1 MB), 4 KiB random read 270,000 IOPS, random write 800,000 IOPS
    /// (512 B; 4 KiB writes are bandwidth-bound at ≈ 270,000), access latency 68 µs
    /// read, 15 µs write. Internal parallelism 32 is an estimate (enough to reach the
    /// IOPS cap at the datasheet latency: 270k × 68 µs ≈ 18 in flight).
    pub fn iodrive2() -> Self {
        Self {
            read_latency_us: 68.0,
            write_latency_us: 15.0,
            channels: 32,
            read_bandwidth_mbps: 1_500.0,
            write_bandwidth_mbps: 1_100.0,
            read_iops: 270_000.0,
            write_iops: 270_000.0,
            capacity_bytes: 785_000_000_000,
        }
    }

    /// Texas Memory Systems RamSan-400 (DDR RAM solid-state disk, 4 controllers with
    /// two 4 Gb FC ports each), seed 001's arrays: 400,000 random I/Os per second and
    /// 3,000 MB/s (TMS's ratings), 15 µs access (TMS's figure for its RAM access).
    /// Writes take the read figures (RAM; the model still charges a random write one
    /// slot per 4 KiB, so large random writes are paced by the 4 KiB rate). Channels
    /// 8, one per FC port (enough for the IOPS cap at 15 µs: 400k × 15 µs = 6 in
    /// flight). 128 GB.
    pub fn ramsan_400() -> Self {
        Self {
            read_latency_us: 15.0,
            write_latency_us: 15.0,
            channels: 8,
            read_bandwidth_mbps: 3_000.0,
            write_bandwidth_mbps: 3_000.0,
            read_iops: 400_000.0,
            write_iops: 400_000.0,
            capacity_bytes: 128_000_000_000,
        }
    }

    /// `count` identical devices with requests spread evenly over them (a flash
    /// tier or cache of several cards), as one device: `count` times the channels,
    /// bandwidth, IOPS caps and capacity, the same access latencies. Exact for
    /// the channels; for the data path it assumes perfect striping (a request's
    /// transfer never waits on a busy card while another is idle).
    pub fn striped(&self, count: u32) -> Result<Self, ModelError> {
        check_in_range(
            "SSD spec",
            "count",
            count.into(),
            1..=64,
            "must be in 1..=64",
        )?;
        let n = count as f64;
        let s = Self {
            channels: self.channels.saturating_mul(count),
            read_bandwidth_mbps: self.read_bandwidth_mbps * n,
            write_bandwidth_mbps: self.write_bandwidth_mbps * n,
            read_iops: self.read_iops * n,
            write_iops: self.write_iops * n,
            capacity_bytes: self.capacity_bytes.saturating_mul(count as u64),
            ..self.clone()
        };
        s.validate()?;
        Ok(s)
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        const W: &str = "SSD spec";
        const LATENCY: (f64, f64) = (0.0, 1e7);
        const MBPS: (f64, f64) = (1.0, 1e9);
        const IOPS: (f64, f64) = (1.0, 1e12);
        let latency = "must be 0-1e7 µs (10 s)";
        check_between(W, "read_latency_us", self.read_latency_us, LATENCY, latency)?;
        check_between(
            W,
            "write_latency_us",
            self.write_latency_us,
            LATENCY,
            latency,
        )?;
        let mbps = "must be 1-1e9 MB/s";
        check_between(
            W,
            "read_bandwidth_mbps",
            self.read_bandwidth_mbps,
            MBPS,
            mbps,
        )?;
        check_between(
            W,
            "write_bandwidth_mbps",
            self.write_bandwidth_mbps,
            MBPS,
            mbps,
        )?;
        let iops = "must be 1-1e12 I/Os per second";
        check_between(W, "read_iops", self.read_iops, IOPS, iops)?;
        check_between(W, "write_iops", self.write_iops, IOPS, iops)?;
        check_in_range(
            W,
            "channels",
            self.channels.into(),
            1..=1024,
            "must be in 1..=1024",
        )?;
        check_in_range(
            W,
            "capacity_bytes",
            self.capacity_bytes,
            1..=u64::MAX,
            "must be > 0",
        )?;
        Ok(())
    }
}

/// A flash device as a pure queueing state machine.
#[derive(Clone, Debug)]
pub struct Ssd {
    spec: SsdSpec,
    channel_free_ns: Vec<Nanos>,
    path_free_ns: Nanos,
    /// End of the last write (sequential-write detection).
    last_write_end: u64,
    completions: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    seq: u64,
    channel_busy_ns: u64,
    stats: DriveStats,
}

/// The channel an I/O submitted at `now` takes: the earliest free (ties: the
/// lowest index). A channel already free at `now` serves as well as the
/// earliest: the I/O starts now either way, and since time never goes back,
/// every channel free by now is free for every later submission too, so which
/// one keeps its past free time changes no later start (test
/// `stopping_at_a_free_channel_starts_every_io_when_the_earliest_would`). The
/// scan stops at the first.
fn channel_for(free_ns: &[Nanos], now: Nanos) -> usize {
    let (mut ch, mut earliest) = (0, free_ns[0]);
    if earliest > now {
        for (i, &f) in free_ns.iter().enumerate().skip(1) {
            if f < earliest {
                (ch, earliest) = (i, f);
                if f <= now {
                    break;
                }
            }
        }
    }
    ch
}

impl Ssd {
    pub fn new(spec: &SsdSpec) -> Result<Self, ModelError> {
        spec.validate()?;
        Ok(Self {
            spec: spec.clone(),
            channel_free_ns: vec![0; spec.channels as usize],
            path_free_ns: 0,
            last_write_end: u64::MAX,
            completions: BinaryHeap::new(),
            seq: 0,
            channel_busy_ns: 0,
            stats: DriveStats::default(),
        })
    }

    pub fn spec(&self) -> &SsdSpec {
        &self.spec
    }

    pub fn stats(&self) -> DriveStats {
        DriveStats {
            busy_ns: self.busy_ns(),
            ..self.stats
        }
    }
}

impl Component for Ssd {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        let (latency_us, bw, iops) = match io.dir {
            IoDir::Read => (
                self.spec.read_latency_us,
                self.spec.read_bandwidth_mbps,
                self.spec.read_iops,
            ),
            IoDir::Write => (
                self.spec.write_latency_us,
                self.spec.write_bandwidth_mbps,
                self.spec.write_iops,
            ),
        };
        let ch = channel_for(&self.channel_free_ns, now);
        let access_ns = (latency_us * 1e3).round() as Nanos;
        let start = now.max(self.channel_free_ns[ch]);
        let flash_done = start + access_ns;
        self.channel_free_ns[ch] = flash_done;
        self.channel_busy_ns += access_ns;
        // Shared data path: bandwidth and the sustained IOPS cap (4 KiB-normalised).
        let bytes = io.size_bytes as f64;
        let xfer_ns = bytes / (bw * 1e-3);
        // A read costs one slot of the sustained IOPS cap. A random
        // write costs one slot per 4 KiB: its steady-state cost is garbage collection
        // (write amplification), which grows with the bytes written, whereas a write
        // that continues the previous one fills erase blocks sequentially and only
        // pays the bandwidth.
        let slots = match io.dir {
            IoDir::Write if io.offset_bytes != self.last_write_end => {
                (io.size_bytes as f64 / 4096.0).ceil().max(1.0)
            }
            IoDir::Write => 0.0,
            IoDir::Read => 1.0,
        };
        if io.dir == IoDir::Write {
            self.last_write_end = io.offset_bytes.saturating_add(io.size_bytes as u64);
        }
        let iops_ns = 1e9 / iops * slots;
        let path_ns = round_ns(xfer_ns.max(iops_ns));
        let path_start = flash_done.max(self.path_free_ns);
        let done = path_start + path_ns;
        self.path_free_ns = done;
        match io.dir {
            IoDir::Read => {
                self.stats.reads += 1;
                self.stats.read_bytes += io.size_bytes as u64;
            }
            IoDir::Write => {
                self.stats.writes += 1;
                self.stats.write_bytes += io.size_bytes as u64;
            }
        }
        self.seq += 1;
        self.completions.push(Reverse((done, self.seq, token)));
    }

    fn next_event_ns(&self) -> Option<Nanos> {
        self.completions.peek().map(|r| r.0.0)
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        crate::drain_due(&mut self.completions, now, done);
    }

    fn busy_ns(&self) -> Nanos {
        self.channel_busy_ns / self.spec.channels as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The earliest free channel, by a full scan (what `channel_for` replaced).
    fn earliest(free_ns: &[Nanos]) -> usize {
        (0..free_ns.len()).min_by_key(|&i| free_ns[i]).unwrap()
    }

    #[test]
    fn stopping_at_a_free_channel_starts_every_io_when_the_earliest_would() {
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for channels in [1, 2, 5, 32, 64] {
            let (mut fast, mut full) = (vec![0; channels], vec![0; channels]);
            let mut now = 0;
            let mut waited = 0;
            for _ in 0..20_000 {
                // Bursts (many I/Os at one instant) and gaps, so that channels
                // are sometimes all busy and sometimes mostly free.
                now += [0, 0, 0, 1_000, 50_000][next(5) as usize];
                let access = 20_000 + next(80_000);
                let (a, b) = (channel_for(&fast, now), earliest(&full));
                let (start_a, start_b) = (now.max(fast[a]), now.max(full[b]));
                assert_eq!(start_a, start_b, "{channels} channels at {now}");
                waited += u64::from(start_a > now);
                fast[a] = start_a + access;
                full[b] = start_b + access;
            }
            if channels <= 5 {
                assert!(waited > 100, "{channels} channels: the queue never formed");
            }
        }
    }
}
