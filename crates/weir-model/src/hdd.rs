//! A rotating disk: seek + rotation + zoned transfer, with command-queue reordering
//! (shortest positioning time first over the drive's queue), sequential streaming
//! with a segment read-ahead, and an optional volatile write cache.
//!
//! Geometry is abstracted to one radial coordinate `x` in `[0, 1]` (0 = outer edge):
//! the media rate falls linearly from `media_rate_outer_mbps` to
//! `media_rate_inner_mbps` (zoned recording, constant bits per inch), so logical bytes
//! map to `x` by inverting the cumulative capacity `F(x) = a·x + b·x²/2`.
//! The rotational position of the platter under the head is `now mod revolution`;
//! the angular position of a byte is the fractional number of tracks its offset
//! represents, which is uniform for random offsets and exact for near neighbours.
//!
//! Units: `*_mbps` fields are megabytes (10^6 bytes) per second, as datasheets use.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, check_between, check_in_range};
use crate::{Completion, Component, DeviceIo, IoDir, Nanos, round_ns};

/// Datasheet-level description of a hard disk drive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HddSpec {
    /// Spindle speed.
    pub rpm: u32,
    /// Single-track seek (read), ms.
    pub track_to_track_seek_ms: f64,
    /// Average seek (read) over uniformly random start/end positions, ms.
    pub average_seek_ms: f64,
    /// Full-stroke seek, ms.
    pub full_stroke_seek_ms: f64,
    /// Extra settle time of a write seek (datasheet average write − average read), ms.
    #[serde(default)]
    pub write_settle_ms: f64,
    /// Sustained media rate at the outer diameter, MB/s.
    pub media_rate_outer_mbps: f64,
    /// Sustained media rate at the inner diameter, MB/s.
    pub media_rate_inner_mbps: f64,
    /// Formatted capacity, bytes.
    pub capacity_bytes: u64,
    /// Firmware command processing per command not overlapped with a previous one, µs.
    pub command_overhead_us: f64,
    /// Commands the drive reorders at once (NCQ 32 on SATA, TCQ up to 64 on SAS).
    pub queue_depth: u32,
    /// Volatile drive write cache ("disk cache" in controller UIs).
    #[serde(default)]
    pub write_cache: bool,
    /// Bytes of write data the drive cache may hold before writes wait for media.
    #[serde(default = "default_write_cache_bytes")]
    pub write_cache_bytes: u64,
    /// Segment read-ahead after a read, bytes (0 disables).
    #[serde(default = "default_read_ahead_bytes")]
    pub read_ahead_bytes: u32,
    /// Host interface payload rate (SAS/SATA 6 Gb/s: 600 MB/s after 8b/10b), MB/s.
    #[serde(default = "default_interface_mbps")]
    pub interface_mbps: f64,
}

fn default_write_cache_bytes() -> u64 {
    16 << 20
}
fn default_read_ahead_bytes() -> u32 {
    512 << 10
}
fn default_interface_mbps() -> f64 {
    600.0
}

impl HddSpec {
    /// Seagate Savvio 15K.3 (ST9300653SS, 300 GB, 2.5" SAS 6 Gb/s), the 15K drive of
    /// the seed's Cisco C240 M3 tests. Datasheet DS1732: 15,000 rpm (2.0 ms average
    /// latency), average seek 2.6 ms read / 3.1 ms write, 64 MB cache.
    /// Sustained rate OD→ID: datasheet class ≈ 202→151 MB/s (value as recalled from
    /// the datasheet; treat as approximate). Track-to-track 0.2 ms and full stroke
    /// 5.5 ms are typical 2.5" 15K values (not on the datasheet; estimated).
    /// Command overhead 50 µs is an estimate for SAS firmware.
    pub fn savvio_15k3() -> Self {
        Self {
            rpm: 15_000,
            track_to_track_seek_ms: 0.2,
            average_seek_ms: 2.6,
            full_stroke_seek_ms: 5.5,
            write_settle_ms: 0.5,
            media_rate_outer_mbps: 202.0,
            media_rate_inner_mbps: 151.0,
            capacity_bytes: 300_000_000_000,
            command_overhead_us: 50.0,
            queue_depth: 64,
            write_cache: false,
            write_cache_bytes: default_write_cache_bytes(),
            read_ahead_bytes: default_read_ahead_bytes(),
            interface_mbps: 600.0,
        }
    }

    /// Seagate Cheetah 15K.7 (ST3600057SS, 600 GB, 3.5" SAS 6 Gb/s), the classic
    /// large-form-factor 15K drive. Datasheet: 15,000 rpm, average seek 3.4 ms read /
    /// 3.9 ms write, track-to-track 0.2 ms, sustained rate 204→122 MB/s, 16 MB cache.
    /// Full stroke 6.6 ms is an estimate for the class.
    pub fn cheetah_15k7() -> Self {
        Self {
            rpm: 15_000,
            track_to_track_seek_ms: 0.2,
            average_seek_ms: 3.4,
            full_stroke_seek_ms: 6.6,
            write_settle_ms: 0.5,
            media_rate_outer_mbps: 204.0,
            media_rate_inner_mbps: 122.0,
            capacity_bytes: 600_000_000_000,
            command_overhead_us: 50.0,
            queue_depth: 64,
            write_cache: false,
            write_cache_bytes: default_write_cache_bytes(),
            read_ahead_bytes: default_read_ahead_bytes(),
            interface_mbps: 600.0,
        }
    }

    /// Seagate Savvio 10K.5 (600 GB, 2.5" SAS 6 Gb/s), the 10K drive of the seed's
    /// tests. Datasheet DS1727: 10,000 rpm (3.0 ms average latency), average seek
    /// ≈ 3.7 ms read / 4.1 ms write (as recalled; approximate); sustained rate
    /// ≈ 204→125 MB/s (approximate). Track-to-track 0.3 ms, full stroke 7.5 ms
    /// estimated for the class.
    pub fn savvio_10k5() -> Self {
        Self {
            rpm: 10_000,
            track_to_track_seek_ms: 0.3,
            average_seek_ms: 3.7,
            full_stroke_seek_ms: 7.5,
            write_settle_ms: 0.4,
            media_rate_outer_mbps: 204.0,
            media_rate_inner_mbps: 125.0,
            capacity_bytes: 600_000_000_000,
            command_overhead_us: 50.0,
            queue_depth: 64,
            write_cache: false,
            write_cache_bytes: default_write_cache_bytes(),
            read_ahead_bytes: default_read_ahead_bytes(),
            interface_mbps: 600.0,
        }
    }

    /// A 7,200 rpm 3.5" SATA nearline drive (Seagate Constellation ES.3 class, 2 TB):
    /// 4.16 ms average latency, average seek 8.5 ms read / 9.5 ms write, sustained
    /// ≈ 175 MB/s OD (ID ≈ half, estimated), NCQ depth 32. Track-to-track 1.0 ms and
    /// full stroke 17 ms are class estimates.
    pub fn sata_7200() -> Self {
        Self {
            rpm: 7_200,
            track_to_track_seek_ms: 1.0,
            average_seek_ms: 8.5,
            full_stroke_seek_ms: 17.0,
            write_settle_ms: 1.0,
            media_rate_outer_mbps: 175.0,
            media_rate_inner_mbps: 90.0,
            capacity_bytes: 2_000_000_000_000,
            command_overhead_us: 100.0,
            queue_depth: 32,
            write_cache: false,
            write_cache_bytes: default_write_cache_bytes(),
            read_ahead_bytes: default_read_ahead_bytes(),
            interface_mbps: 600.0,
        }
    }

    /// Checks physical plausibility; returns the derived seek curve.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.seek_curve().map(|_| ())
    }

    fn seek_curve(&self) -> Result<SeekCurve, ModelError> {
        const W: &str = "HDD spec";
        check_in_range(
            W,
            "rpm",
            self.rpm.into(),
            1..=1_000_000,
            "must be 1-1,000,000",
        )?;
        check_in_range(
            W,
            "queue_depth",
            self.queue_depth.into(),
            1..=256,
            "must be in 1..=256 (SAS TCQ allows at most 256)",
        )?;
        check_in_range(
            W,
            "capacity_bytes",
            self.capacity_bytes,
            1..=u64::MAX,
            "must be > 0",
        )?;
        // Physical ranges, wide enough for any drive and narrow enough that the
        // nanosecond arithmetic cannot overflow.
        const MS: (f64, f64) = (1e-6, 1e4);
        const MBPS: (f64, f64) = (0.1, 1e9);
        let ms = "must be 1e-6-1e4 ms (10 s)";
        let mbps = "must be 0.1-1e9 MB/s";
        check_between(
            W,
            "track_to_track_seek_ms",
            self.track_to_track_seek_ms,
            MS,
            ms,
        )?;
        check_between(W, "average_seek_ms", self.average_seek_ms, MS, ms)?;
        check_between(W, "full_stroke_seek_ms", self.full_stroke_seek_ms, MS, ms)?;
        let settle = "must be 0-1e4 ms (10 s)";
        check_between(
            W,
            "write_settle_ms",
            self.write_settle_ms,
            (0.0, 1e4),
            settle,
        )?;
        check_between(
            W,
            "media_rate_outer_mbps",
            self.media_rate_outer_mbps,
            MBPS,
            mbps,
        )?;
        check_between(
            W,
            "media_rate_inner_mbps",
            self.media_rate_inner_mbps,
            MBPS,
            mbps,
        )?;
        let overhead = "must be 0-1e7 µs (10 s)";
        check_between(
            W,
            "command_overhead_us",
            self.command_overhead_us,
            (0.0, 1e7),
            overhead,
        )?;
        check_between(W, "interface_mbps", self.interface_mbps, MBPS, mbps)?;
        if !(self.track_to_track_seek_ms < self.average_seek_ms
            && self.average_seek_ms < self.full_stroke_seek_ms)
        {
            return Err(ModelError::InvalidField {
                what: W,
                field: "average_seek_ms",
                value: self.average_seek_ms.to_string(),
                reason: "need track_to_track < average < full_stroke",
            });
        }
        SeekCurve::fit(
            self.track_to_track_seek_ms,
            self.average_seek_ms,
            self.full_stroke_seek_ms,
        )
    }
}

/// Seek time as a function of the seek distance `d` (fraction of the full stroke):
/// `t_tt + α·√d` below the knee (acceleration-limited), linear from the knee to
/// `t_full` (coast at maximum velocity). `α` is solved so that the mean over
/// uniformly random start and end positions (density `2(1−d)`) equals the
/// datasheet average seek.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeekCurve {
    t_tt_ns: f64,
    alpha_ns: f64,
    t_knee_ns: f64,
    slope_ns: f64,
}

const SEEK_KNEE: f64 = 0.2;

impl SeekCurve {
    fn fit(t_tt_ms: f64, t_avg_ms: f64, t_full_ms: f64) -> Result<Self, ModelError> {
        let mean = |alpha: f64| -> f64 {
            let c = Self::with_alpha(t_tt_ms, alpha, t_full_ms);
            const N: usize = 4000;
            let mut sum = 0.0;
            for i in 0..N {
                let d = (i as f64 + 0.5) / N as f64;
                sum += 2.0 * (1.0 - d) * c.at_ms(d);
            }
            sum / N as f64
        };
        let e0 = mean(0.0);
        let e1 = mean(1.0);
        let alpha = (t_avg_ms - e0) / (e1 - e0);
        let curve = Self::with_alpha(t_tt_ms, alpha, t_full_ms);
        if !(alpha >= 0.0 && curve.slope_ns >= 0.0) {
            return Err(ModelError::InvalidField {
                what: "HDD spec",
                field: "average_seek_ms",
                value: t_avg_ms.to_string(),
                reason: "inconsistent with track-to-track and full-stroke seek (no monotone √/linear seek curve has this mean)",
            });
        }
        Ok(curve)
    }

    fn with_alpha(t_tt_ms: f64, alpha_ms: f64, t_full_ms: f64) -> Self {
        let t_knee = t_tt_ms + alpha_ms * SEEK_KNEE.sqrt();
        Self {
            t_tt_ns: t_tt_ms * 1e6,
            alpha_ns: alpha_ms * 1e6,
            t_knee_ns: t_knee * 1e6,
            slope_ns: (t_full_ms - t_knee) * 1e6 / (1.0 - SEEK_KNEE),
        }
    }

    fn at_ms(&self, d: f64) -> f64 {
        self.at_ns(d) / 1e6
    }

    /// Seek time in ns for distance `d` in (0, 1].
    pub(crate) fn at_ns(&self, d: f64) -> f64 {
        if d < SEEK_KNEE {
            self.t_tt_ns + self.alpha_ns * d.sqrt()
        } else {
            self.t_knee_ns + self.slope_ns * (d - SEEK_KNEE)
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    io: DeviceIo,
    /// `io.offset_bytes` wrapped to the capacity, and as f64.
    offset: u64,
    offset_f: f64,
    token: u64,
    arrival_ns: Nanos,
    /// Radial position, media rate (bytes/ns), track size and angular position of the
    /// first byte, computed once at submission.
    x: f64,
    rate: f64,
    track_bytes: f64,
    angle: f64,
    /// False for media writes already acknowledged from the drive's write cache.
    report: bool,
    /// Served before every non-urgent command in the queue (NCQ priority).
    urgent: bool,
}

/// Fractional part of a non-negative finite value (cheaper than `f64::fract`, which
/// is a libm call on baseline x86-64).
#[inline]
fn frac(v: f64) -> f64 {
    v - (v as u64) as f64
}

/// Per-drive counters for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DriveStats {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Time the mechanism (or flash channels, averaged) was busy.
    pub busy_ns: Nanos,
}

/// Commands older than this are served before any reordering choice (firmware
/// starvation guard).
const MAX_REORDER_WAIT_NS: Nanos = 500_000_000;

/// A hard disk drive as a pure queueing state machine.
#[derive(Clone, Debug)]
pub struct Hdd {
    spec: HddSpec,
    seek: SeekCurve,
    rev_ns: f64,
    inv_rev_ns: f64,
    /// Media rate at outer edge and its change to the inner edge, bytes/ns.
    rate_outer: f64,
    rate_delta: f64,
    overhead_ns: f64,
    write_settle_ns: f64,
    interface_bytes_per_ns: f64,
    queue: Vec<Pending>,
    backlog: VecDeque<Pending>,
    /// When the operation in service finishes (internal event).
    busy_until: Option<Nanos>,
    head_x: f64,
    last_end_offset: u64,
    /// `last_end_offset as f64` (the SPTF scan compares it with every queued command).
    last_end_f: f64,
    last_done_ns: Nanos,
    last_dir: IoDir,
    /// Media rate where the last command ended, bytes/ns.
    last_rate: f64,
    cached_write_bytes: u64,
    completions: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    seq: u64,
    stats: DriveStats,
}

impl Hdd {
    pub fn new(spec: &HddSpec) -> Result<Self, ModelError> {
        let seek = spec.seek_curve()?;
        let rev_ns = 60e9 / spec.rpm as f64;
        let rate_outer = spec.media_rate_outer_mbps * 1e-3;
        let rate_inner = spec.media_rate_inner_mbps * 1e-3;
        Ok(Self {
            spec: spec.clone(),
            seek,
            rev_ns,
            inv_rev_ns: 1.0 / rev_ns,
            rate_outer,
            rate_delta: rate_inner - rate_outer,
            overhead_ns: spec.command_overhead_us * 1e3,
            write_settle_ns: spec.write_settle_ms * 1e6,
            interface_bytes_per_ns: spec.interface_mbps * 1e-3,
            queue: Vec::with_capacity(spec.queue_depth as usize),
            backlog: VecDeque::new(),
            busy_until: None,
            head_x: 0.0,
            last_end_offset: u64::MAX,
            last_end_f: u64::MAX as f64,
            last_done_ns: 0,
            last_dir: IoDir::Read,
            last_rate: rate_outer,
            cached_write_bytes: 0,
            completions: BinaryHeap::new(),
            seq: 0,
            stats: DriveStats::default(),
        })
    }

    pub fn spec(&self) -> &HddSpec {
        &self.spec
    }

    pub fn stats(&self) -> DriveStats {
        self.stats
    }

    /// Revolution time, ns.
    pub fn revolution_ns(&self) -> f64 {
        self.rev_ns
    }

    /// Radial position (0 outer … 1 inner) of a byte offset.
    fn radial(&self, offset: u64) -> f64 {
        let f = (offset % self.spec.capacity_bytes) as f64 / self.spec.capacity_bytes as f64;
        let a = self.rate_outer;
        let b = self.rate_delta;
        if b.abs() < 1e-12 {
            return f;
        }
        let total = a + b / 2.0;
        let disc = a * a + 2.0 * b * f * total;
        ((-a + disc.max(0.0).sqrt()) / b).clamp(0.0, 1.0)
    }

    /// Media rate at radial position `x`, bytes/ns.
    fn rate_at(&self, x: f64) -> f64 {
        self.rate_outer + self.rate_delta * x
    }

    /// Media transfer time of a request starting at `offset`, ns.
    pub fn media_transfer_ns(&self, offset: u64, size_bytes: u32) -> f64 {
        size_bytes as f64 / self.rate_at(self.radial(offset))
    }

    /// Bytes the segment read-ahead has buffered beyond `last_end_offset` by `t`.
    fn buffered_ahead(&self, t: Nanos) -> u64 {
        if self.last_dir != IoDir::Read || self.last_end_offset == u64::MAX {
            return 0;
        }
        let streamed = t.saturating_sub(self.last_done_ns) as f64 * self.last_rate;
        (streamed as u64).min(self.spec.read_ahead_bytes as u64)
    }

    /// (positioning ns before the media transfer, bytes already in the buffer).
    /// `buffered` = read-ahead bytes available by `start` for a queued command and by
    /// `start + overhead` for one that arrived at an idle drive. `start_f` is `start`
    /// as f64 (converted once per scan, not per command).
    #[inline(always)]
    fn positioning(
        &self,
        p: &Pending,
        (start, start_f): (Nanos, f64),
        buffered: [u64; 2],
    ) -> (f64, u64) {
        let off = p.offset;
        let pipelined = p.arrival_ns < start;
        let overhead = if pipelined { 0.0 } else { self.overhead_ns };
        let continues = off == self.last_end_offset;
        if self.last_end_offset != u64::MAX && p.io.dir == self.last_dir {
            if continues && pipelined {
                // Queued continuation of the stream: the next sectors are under the head.
                return (0.0, 0);
            }
            if p.io.dir == IoDir::Read && off >= self.last_end_offset {
                let buffered = buffered[usize::from(!pipelined)];
                let skip = off - self.last_end_offset;
                if skip < buffered {
                    let in_buffer = (buffered - skip).min(p.io.size_bytes as u64);
                    return (overhead, in_buffer);
                }
            }
        }
        let near = self.last_end_offset != u64::MAX
            && (p.offset_f - self.last_end_f).abs() < p.track_bytes;
        let mut seek = if near {
            0.0
        } else {
            let d = (p.x - self.head_x).abs();
            if d <= 0.0 { 0.0 } else { self.seek.at_ns(d) }
        };
        if p.io.dir == IoDir::Write && seek > 0.0 {
            seek += self.write_settle_ns;
        }
        let target_angle = if continues {
            frac(self.last_done_ns as f64 * self.inv_rev_ns)
        } else {
            p.angle
        };
        let arrive = start_f + overhead + seek;
        let head_angle = frac(arrive * self.inv_rev_ns);
        let mut wait = target_angle - head_angle;
        if wait < 0.0 {
            wait += 1.0;
        }
        (overhead + seek + wait * self.rev_ns, 0)
    }

    fn start_next(&mut self, t: Nanos) {
        while self.queue.len() < self.spec.queue_depth as usize {
            match self.backlog.pop_front() {
                Some(p) => self.queue.push(p),
                None => break,
            }
        }
        if self.queue.is_empty() {
            self.busy_until = None;
            return;
        }
        // Shortest positioning time first (among urgent commands, if any are
        // queued: NCQ priority), with a starvation guard.
        let urgent_only = self.queue.iter().any(|p| p.urgent);
        let mut best = 0;
        let mut best_cost = f64::INFINITY;
        let mut best_pos = (0.0, 0);
        let mut oldest = 0;
        let mut oldest_arrival = Nanos::MAX;
        let t_f = t as f64;
        let buffered = [
            self.buffered_ahead(t),
            self.buffered_ahead(t + self.overhead_ns as Nanos),
        ];
        for (i, p) in self.queue.iter().enumerate() {
            if p.arrival_ns < oldest_arrival {
                oldest_arrival = p.arrival_ns;
                oldest = i;
            }
            if urgent_only && !p.urgent {
                continue;
            }
            let (pos, in_buf) = self.positioning(p, (t, t_f), buffered);
            // Buffered bytes make a request cheaper still.
            let cost = if in_buf == 0 {
                pos
            } else {
                pos - in_buf as f64 / self.interface_bytes_per_ns
            };
            if cost < best_cost {
                best_cost = cost;
                best = i;
                best_pos = (pos, in_buf);
            }
        }
        if t.saturating_sub(oldest_arrival) > MAX_REORDER_WAIT_NS && best != oldest {
            best = oldest;
            best_pos = self.positioning(&self.queue[oldest], (t, t_f), buffered);
        }
        let p = self.queue.swap_remove(best);
        let (pos, in_buf) = best_pos;
        let off = p.offset;
        let x = p.x;
        let media_bytes = p.io.size_bytes as u64 - in_buf;
        let service =
            pos + in_buf as f64 / self.interface_bytes_per_ns + media_bytes as f64 / p.rate;
        let service_ns = round_ns(service.max(1.0));
        let done = t + service_ns;
        self.stats.busy_ns += service_ns;
        match p.io.dir {
            IoDir::Read => {
                self.stats.reads += 1;
                self.stats.read_bytes += p.io.size_bytes as u64;
            }
            IoDir::Write => {
                self.stats.writes += 1;
                self.stats.write_bytes += p.io.size_bytes as u64;
                if !p.report {
                    self.cached_write_bytes = self
                        .cached_write_bytes
                        .saturating_sub(p.io.size_bytes as u64);
                }
            }
        }
        self.head_x = x;
        self.last_rate = p.rate;
        self.last_end_offset = (off + p.io.size_bytes as u64) % self.spec.capacity_bytes;
        self.last_end_f = self.last_end_offset as f64;
        self.last_done_ns = done;
        self.last_dir = p.io.dir;
        self.busy_until = Some(done);
        if p.report {
            self.push_completion(done, p.token);
        }
    }

    /// Runs the mechanism up to `now`: finishes commands and starts the next ones.
    fn catch_up(&mut self, now: Nanos) {
        while let Some(t) = self.busy_until {
            if t > now {
                break;
            }
            self.busy_until = None;
            self.start_next(t);
        }
    }

    fn push_completion(&mut self, at: Nanos, token: u64) {
        self.seq += 1;
        self.completions.push(Reverse((at, self.seq, token)));
    }

    /// Commands waiting or in service.
    pub fn queued(&self) -> usize {
        self.queue.len() + self.backlog.len() + usize::from(self.busy_until.is_some())
    }
}

impl Component for Hdd {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        self.enqueue(now, io, token, false);
    }

    fn submit_urgent(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        self.enqueue(now, io, token, true);
    }

    fn next_event_ns(&self) -> Option<Nanos> {
        let c = self.completions.peek().map(|r| r.0.0);
        match (c, self.busy_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        self.catch_up(now);
        crate::drain_due(&mut self.completions, now, done);
    }

    fn busy_ns(&self) -> Nanos {
        self.stats.busy_ns
    }
}

impl Hdd {
    fn enqueue(&mut self, now: Nanos, io: DeviceIo, token: u64, urgent: bool) {
        // Catch up on commands that finished before `now` (completions stay queued
        // until `advance`), so a late driver cannot start this command in the past.
        self.catch_up(now);
        let offset = io.offset_bytes % self.spec.capacity_bytes;
        let x = self.radial(offset);
        let rate = self.rate_at(x);
        let track_bytes = rate * self.rev_ns;
        let mut p = Pending {
            io,
            offset,
            offset_f: offset as f64,
            token,
            arrival_ns: now,
            x,
            rate,
            track_bytes,
            angle: frac(offset as f64 / track_bytes),
            report: true,
            urgent: false,
        };
        // Cached writes stay queued in the drive, so the cache holds at most a queue's
        // worth of commands (and `write_cache_bytes`).
        if io.dir == IoDir::Write
            && self.spec.write_cache
            && self.cached_write_bytes + io.size_bytes as u64 <= self.spec.write_cache_bytes
            && self.queue.len() + self.backlog.len() < self.spec.queue_depth as usize
        {
            // Acknowledged once the data is in the drive's DRAM; the media write stays
            // queued (it is lost on power failure, which is why RAID tests disable it).
            self.cached_write_bytes += io.size_bytes as u64;
            let ack =
                now as f64 + self.overhead_ns + io.size_bytes as f64 / self.interface_bytes_per_ns;
            self.push_completion(round_ns(ack), token);
            p.report = false;
        }
        p.urgent = urgent;
        if urgent {
            // Past the backlog too: the drive takes it into its queue first.
            self.backlog.push_front(p);
        } else {
            self.backlog.push_back(p);
        }
        if self.busy_until.is_none() {
            self.start_next(now);
        }
    }
}
