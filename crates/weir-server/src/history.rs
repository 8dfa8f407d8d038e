//! History: an embedded round-robin time-series store in `<data_dir>/history`
//! (docs/HISTORY.md), fed once a second by [`crate::sampler`].
//!
//! Three tiers, each a ring of rows at a fixed step: 1 s for an hour, 1 min for a
//! day, 1 h for 30 days. A row holds its time and one 32-byte [`Sample`] per
//! volume slot. Slots come in segments of [`SEGMENT_SLOTS`]; each (tier, segment)
//! is one fixed-size file, created sparse at its full length, so the store is
//! bounded by construction: [`bytes_for_volumes`] (47 MB per 256 volumes, at most
//! [`MAX_SLOTS`] volumes recorded).
//!
//! Writes: one `pwrite` of a whole row per segment per second. The coarse tiers
//! are computed from the tier below when a period ends (a minute from the 60 one-
//! second rows, an hour from the 60 one-minute rows), so nothing lives only in
//! memory: after a restart the periods the server missed are aggregated from what
//! the finer tier still holds. A row whose stored time is not the one its
//! position stands for (an hour-old second, a gap while the server was down) is
//! not data.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Volume slots per segment file.
pub const SEGMENT_SLOTS: usize = 256;
/// Most volumes recorded (16 segments); later volumes have no history (warned).
pub const MAX_SLOTS: usize = 4096;
/// Bytes of one sample (8 × f32).
pub const RECORD_BYTES: usize = 32;
const HEADER_BYTES: u64 = 64;
const ROW_BYTES: usize = 8 + SEGMENT_SLOTS * RECORD_BYTES;
const MAGIC: &[u8; 8] = b"WEIRRRD1";

/// One resolution: a ring of `rows` rows, `step_s` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tier {
    pub name: &'static str,
    pub step_s: u64,
    pub rows: u64,
}

impl Tier {
    /// How far back the tier reaches, seconds.
    pub fn span_s(&self) -> u64 {
        self.step_s * self.rows
    }
}

/// 1 s for an hour, 1 min for a day, 1 h for 30 days.
pub const TIERS: [Tier; 3] = [
    Tier {
        name: "1s",
        step_s: 1,
        rows: 3600,
    },
    Tier {
        name: "1m",
        step_s: 60,
        rows: 1440,
    },
    Tier {
        name: "1h",
        step_s: 3600,
        rows: 720,
    },
];

/// The bytes the store takes on disk at most for `volumes` volumes.
pub fn bytes_for_volumes(volumes: usize) -> u64 {
    let segments = volumes.clamp(1, MAX_SLOTS).div_ceil(SEGMENT_SLOTS) as u64;
    let per_segment: u64 = TIERS
        .iter()
        .map(|t| HEADER_BYTES + t.rows * ROW_BYTES as u64)
        .sum();
    segments * per_segment
}

/// One volume over one step. Coarser tiers and downsampled answers average every
/// field but `p99_ms`, which is the worst of the period's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Requests completed per second.
    pub iops: f32,
    /// MB (10^6 bytes) read and written per second.
    pub mbps: f32,
    /// Latency percentiles of the requests completed in the step, ms (QoS
    /// queueing included; interpolated in the latency histogram's buckets).
    pub p50_ms: f32,
    pub p99_ms: f32,
    /// Requests waiting in the QoS scheduler (mean of 5 looks a second).
    pub queued: f32,
    /// Fraction of the step during which requests waited in the scheduler (0-1).
    pub throttled: f32,
    /// 1 when the volume got its reservation (IOPS at least the reservation, or
    /// nothing waited: it asked for less) or has none; 0 when not.
    pub reservation_met: f32,
    /// 1 when p99 latency was within the policy's latency target (or the volume
    /// had no I/O or no target); 0 when not.
    pub target_met: f32,
}

impl Sample {
    fn to_bytes(self) -> [u8; RECORD_BYTES] {
        let mut out = [0u8; RECORD_BYTES];
        for (i, v) in self.fields().iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    fn from_bytes(b: &[u8]) -> Sample {
        let f = |i: usize| {
            let v = f32::from_le_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]]);
            if v.is_finite() { v } else { 0.0 }
        };
        Sample {
            iops: f(0),
            mbps: f(1),
            p50_ms: f(2),
            p99_ms: f(3),
            queued: f(4),
            throttled: f(5),
            reservation_met: f(6),
            target_met: f(7),
        }
    }

    fn fields(&self) -> [f32; 8] {
        [
            self.iops,
            self.mbps,
            self.p50_ms,
            self.p99_ms,
            self.queued,
            self.throttled,
            self.reservation_met,
            self.target_met,
        ]
    }
}

/// Averages samples (the worst p99).
#[derive(Clone, Copy, Debug, Default)]
struct Acc {
    sum: [f64; 8],
    p99_max: f32,
    n: u32,
}

impl Acc {
    fn add(&mut self, s: &Sample) {
        for (a, v) in self.sum.iter_mut().zip(s.fields()) {
            *a += f64::from(v);
        }
        self.p99_max = self.p99_max.max(s.p99_ms);
        self.n += 1;
    }

    fn mean(&self) -> Option<Sample> {
        if self.n == 0 {
            return None;
        }
        let m = |i: usize| (self.sum[i] / f64::from(self.n)) as f32;
        Some(Sample {
            iops: m(0),
            mbps: m(1),
            p50_ms: m(2),
            p99_ms: self.p99_max,
            queued: m(4),
            throttled: m(5),
            reservation_met: m(6),
            target_met: m(7),
        })
    }
}

/// One point of a series: unix time (seconds, the start of its step) and the sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub t: u64,
    #[serde(flatten)]
    pub sample: Sample,
}

/// A volume's history (`GET /v1/volumes/{name}/history?since=S&step=S`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub volume: String,
    /// The tier the points come from (`1s`, `1m`, `1h`).
    pub tier: String,
    /// Seconds between points (the tier's step, or the coarser step asked for).
    pub step_s: u64,
    pub from: u64,
    pub to: u64,
    /// Steps without data (server down, volume not yet created) have no point.
    pub points: Vec<Point>,
}

/// Which volume has which slot, since when (`slots.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SlotMap {
    volumes: BTreeMap<String, SlotEntry>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct SlotEntry {
    slot: usize,
    /// Unix time the volume got the slot: older rows are another volume's.
    since: u64,
}

impl SlotMap {
    /// What a damaged or hand-edited `slots.json` may hold and the store cannot:
    /// a slot out of range (it would size the ring files by it) or one another
    /// volume holds. Such entries are dropped, with a warning.
    fn sanitized(mut self) -> SlotMap {
        let mut held = vec![false; MAX_SLOTS];
        let before = self.volumes.len();
        self.volumes
            .retain(|_, e| e.slot < MAX_SLOTS && !std::mem::replace(&mut held[e.slot], true));
        if self.volumes.len() != before {
            tracing::warn!(
                "history: slots.json: {} entries out of range or sharing a slot dropped",
                before - self.volumes.len()
            );
        }
        self
    }

    /// The slots no volume holds, lowest first (one pass: the sampler asks every
    /// second, and with every slot taken it asked once per volume left over).
    fn free_slots(&self) -> Vec<usize> {
        let mut used = vec![false; MAX_SLOTS];
        for e in self.volumes.values() {
            if let Some(u) = used.get_mut(e.slot) {
                *u = true;
            }
        }
        (0..MAX_SLOTS).filter(|&s| !used[s]).collect()
    }

    fn segments(&self) -> usize {
        self.volumes
            .values()
            .map(|e| e.slot / SEGMENT_SLOTS + 1)
            .max()
            .unwrap_or(0)
    }
}

/// One segment's three ring files.
struct Segment {
    files: Vec<File>,
}

struct Inner {
    slots: SlotMap,
    segments: Vec<Segment>,
    /// Per coarse tier: the start of the next period to aggregate.
    pending: [u64; 2],
    warned_full: bool,
}

/// The store (see the module documentation).
pub struct History {
    dir: PathBuf,
    inner: Mutex<Inner>,
}

impl History {
    /// Opens (creating) `<data_dir>/history`.
    pub fn open(data_dir: &Path) -> io::Result<History> {
        let dir = data_dir.join("history");
        crate::store::create_dirs(&dir)?;
        // Volume names and their I/O are the owner's (an older version made the
        // directory 0755 and its files 0644).
        private(&std::fs::File::open(&dir)?, crate::store::DIR_MODE)?;
        let slots: SlotMap = match std::fs::read(dir.join("slots.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!("history: slots.json unreadable ({e}); starting afresh");
                SlotMap::default()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => SlotMap::default(),
            Err(e) => return Err(e),
        }
        .sanitized();
        let mut segments = Vec::new();
        for s in 0..slots.segments() {
            segments.push(open_segment(&dir, s)?);
        }
        let pending = [1, 2].map(|level| initial_pending(&segments, level));
        Ok(History {
            dir,
            inner: Mutex::new(Inner {
                slots,
                segments,
                pending,
                warned_full: false,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the samples of second `t` (unix time) for every volume there is:
    /// volumes absent from `samples` lose their slot. Then aggregates the coarse
    /// periods that ended.
    pub fn record(&self, t: u64, samples: &[(String, Sample)]) -> io::Result<()> {
        let mut inner = self.lock();
        self.assign_slots(&mut inner, t, samples)?;
        let mut rows = vec![vec![0u8; ROW_BYTES]; inner.segments.len()];
        for row in &mut rows {
            row[..8].copy_from_slice(&t.to_le_bytes());
        }
        for (name, sample) in samples {
            if let Some(e) = inner.slots.volumes.get(name) {
                let (seg, off) = (
                    e.slot / SEGMENT_SLOTS,
                    8 + (e.slot % SEGMENT_SLOTS) * RECORD_BYTES,
                );
                rows[seg][off..off + RECORD_BYTES].copy_from_slice(&sample.to_bytes());
            }
        }
        for (seg, row) in inner.segments.iter().zip(&rows) {
            seg.files[0].write_all_at(row, row_offset(&TIERS[0], t))?;
        }
        aggregate_ended(&mut inner, t)
    }

    fn assign_slots(
        &self,
        inner: &mut Inner,
        t: u64,
        samples: &[(String, Sample)],
    ) -> io::Result<()> {
        let present: std::collections::BTreeSet<&str> =
            samples.iter().map(|(n, _)| n.as_str()).collect();
        let before = inner.slots.volumes.len();
        inner
            .slots
            .volumes
            .retain(|name, _| present.contains(name.as_str()));
        let mut changed = inner.slots.volumes.len() != before;
        let mut free = inner.slots.free_slots().into_iter();
        for (name, _) in samples {
            if inner.slots.volumes.contains_key(name) {
                continue;
            }
            let Some(slot) = free.next() else {
                if !inner.warned_full {
                    tracing::warn!(
                        "history: more than {MAX_SLOTS} volumes; {name:?} and later ones are not recorded"
                    );
                    inner.warned_full = true;
                }
                continue;
            };
            inner
                .slots
                .volumes
                .insert(name.clone(), SlotEntry { slot, since: t });
            changed = true;
        }
        while inner.segments.len() < inner.slots.segments() {
            let s = open_segment(&self.dir, inner.segments.len())?;
            inner.segments.push(s);
        }
        if changed {
            write_atomically(
                &self.dir.join("slots.json"),
                &serde_json::to_vec(&inner.slots)?,
            )?;
        }
        Ok(())
    }

    /// The volume's points from `now - since_s` to `now`, from the finest tier
    /// that reaches that far, averaged over `step_s` when it is coarser. `None`:
    /// the volume has no history.
    pub fn series(
        &self,
        name: &str,
        now: u64,
        since_s: u64,
        step_s: u64,
    ) -> io::Result<Option<Series>> {
        let since_s = since_s.clamp(1, TIERS[2].span_s());
        let chosen = TIERS
            .iter()
            .position(|t| t.span_s() >= since_s)
            .unwrap_or(2);
        let inner = self.lock();
        let Some(entry) = inner.slots.volumes.get(name).copied() else {
            return Ok(None);
        };
        let Some(seg) = inner.segments.get(entry.slot / SEGMENT_SLOTS) else {
            return Ok(None);
        };
        let (from, to) = (now.saturating_sub(since_s), now);
        // The tier whose span covers the window; while it holds nothing yet (its
        // first step has not ended: an hour for `--since 31d`), the finer ones.
        let mut found = (chosen, Vec::new());
        for i in (0..=chosen).rev() {
            let tier = TIERS[i];
            let start = from.max(now.saturating_sub(tier.span_s()));
            let points = read_points(&seg.files[i], &tier, &entry, start, to)?;
            if !points.is_empty() {
                found = (i, points);
                break;
            }
        }
        drop(inner);
        let (i, points) = found;
        let step_s = step_s.max(TIERS[i].step_s);
        Ok(Some(Series {
            volume: name.to_string(),
            tier: TIERS[i].name.to_string(),
            step_s,
            from,
            to,
            points: downsample(points, step_s),
        }))
    }
}

/// A volume's points of one tier from `from` to `to` (none before it got its slot).
fn read_points(
    file: &File,
    tier: &Tier,
    entry: &SlotEntry,
    from: u64,
    to: u64,
) -> io::Result<Vec<Point>> {
    let mut points = Vec::new();
    let mut t = from - from % tier.step_s;
    while t <= to {
        if t >= entry.since - entry.since % tier.step_s
            && let Some(sample) = read_sample(file, tier, t, entry.slot % SEGMENT_SLOTS)?
        {
            points.push(Point { t, sample });
        }
        t += tier.step_s;
    }
    Ok(points)
}

/// Averages points into buckets of `step_s` (each at its bucket's start).
fn downsample(points: Vec<Point>, step_s: u64) -> Vec<Point> {
    if points.windows(2).all(|w| w[1].t - w[0].t >= step_s) {
        return points;
    }
    let mut out: Vec<Point> = Vec::new();
    let mut acc = Acc::default();
    let mut bucket = None;
    for p in points {
        let b = p.t - p.t % step_s;
        if bucket != Some(b) {
            if let (Some(t), Some(sample)) = (bucket, acc.mean()) {
                out.push(Point { t, sample });
            }
            acc = Acc::default();
            bucket = Some(b);
        }
        acc.add(&p.sample);
    }
    if let (Some(t), Some(sample)) = (bucket, acc.mean()) {
        out.push(Point { t, sample });
    }
    out
}

/// Writes the coarse rows of the periods that ended before `t` (catching up after
/// a restart as far as the finer tier reaches).
fn aggregate_ended(inner: &mut Inner, t: u64) -> io::Result<()> {
    for level in 1..TIERS.len() {
        let (tier, source) = (TIERS[level], TIERS[level - 1]);
        let reach = t.saturating_sub(source.span_s());
        let mut p = match inner.pending[level - 1] {
            0 => t - t % tier.step_s,
            p => p.max(next_period(reach, tier.step_s)),
        };
        while p + tier.step_s <= t {
            for seg in &inner.segments {
                let row = aggregate_period(&seg.files[level - 1], &source, p, tier.step_s)?;
                seg.files[level].write_all_at(&row, row_offset(&tier, p))?;
            }
            p += tier.step_s;
        }
        inner.pending[level - 1] = p;
    }
    Ok(())
}

/// One coarse row for `[p, p + step)` from the rows of `source` in it.
fn aggregate_period(file: &File, source: &Tier, p: u64, step: u64) -> io::Result<Vec<u8>> {
    let mut accs = vec![Acc::default(); SEGMENT_SLOTS];
    let mut row = vec![0u8; ROW_BYTES];
    let mut t = p;
    while t < p + step {
        file.read_exact_at(&mut row, row_offset(source, t))?;
        if u64::from_le_bytes(row[..8].try_into().unwrap_or_default()) == t {
            for (slot, acc) in accs.iter_mut().enumerate() {
                let off = 8 + slot * RECORD_BYTES;
                acc.add(&Sample::from_bytes(&row[off..off + RECORD_BYTES]));
            }
        }
        t += source.step_s;
    }
    let mut out = vec![0u8; ROW_BYTES];
    if accs[0].n > 0 {
        out[..8].copy_from_slice(&p.to_le_bytes());
    }
    for (slot, acc) in accs.iter().enumerate() {
        if let Some(s) = acc.mean() {
            let off = 8 + slot * RECORD_BYTES;
            out[off..off + RECORD_BYTES].copy_from_slice(&s.to_bytes());
        }
    }
    Ok(out)
}

fn next_period(t: u64, step: u64) -> u64 {
    t.div_ceil(step) * step
}

fn row_offset(tier: &Tier, t: u64) -> u64 {
    HEADER_BYTES + (t / tier.step_s % tier.rows) * ROW_BYTES as u64
}

/// The sample of `slot` at `t`, if the row there is `t`'s.
fn read_sample(file: &File, tier: &Tier, t: u64, slot: usize) -> io::Result<Option<Sample>> {
    let base = row_offset(tier, t);
    let mut stamp = [0u8; 8];
    file.read_exact_at(&mut stamp, base)?;
    if u64::from_le_bytes(stamp) != t {
        return Ok(None);
    }
    let mut rec = [0u8; RECORD_BYTES];
    file.read_exact_at(&mut rec, base + 8 + (slot * RECORD_BYTES) as u64)?;
    Ok(Some(Sample::from_bytes(&rec)))
}

/// The first coarse period of tier `level` not yet aggregated: after its last
/// row, else from the first row of the tier below (0: none, start with the
/// current period).
fn initial_pending(segments: &[Segment], level: usize) -> u64 {
    let step = TIERS[level].step_s;
    if let Some(last) = row_times(segments, level).max() {
        return last + step;
    }
    row_times(segments, level - 1)
        .min()
        .map_or(0, |t| t - t % step)
}

/// The row times in tier `level` of the first segment (all segments are written
/// together).
fn row_times(segments: &[Segment], level: usize) -> impl Iterator<Item = u64> + '_ {
    let file = segments.first().map(|s| &s.files[level]);
    (0..TIERS[level].rows)
        .filter_map(move |r| {
            let mut stamp = [0u8; 8];
            file?
                .read_exact_at(&mut stamp, HEADER_BYTES + r * ROW_BYTES as u64)
                .ok()?;
            Some(u64::from_le_bytes(stamp))
        })
        .filter(|&t| t > 0)
}

fn open_segment(dir: &Path, segment: usize) -> io::Result<Segment> {
    let files = TIERS
        .iter()
        .map(|tier| open_ring(&dir.join(format!("{}-{segment}.ring", tier.name)), tier))
        .collect::<io::Result<Vec<_>>>()?;
    Ok(Segment { files })
}

fn header(tier: &Tier) -> [u8; HEADER_BYTES as usize] {
    let mut h = [0u8; HEADER_BYTES as usize];
    h[..8].copy_from_slice(MAGIC);
    for (i, v) in [
        tier.step_s,
        tier.rows,
        SEGMENT_SLOTS as u64,
        RECORD_BYTES as u64,
    ]
    .into_iter()
    .enumerate()
    {
        h[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
    }
    h
}

/// Opens a ring file, (re)creating it when it is missing or of another shape.
fn open_ring(path: &Path, tier: &Tier) -> io::Result<File> {
    let len = HEADER_BYTES + tier.rows * ROW_BYTES as u64;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(crate::store::FILE_MODE)
        .open(path)?;
    private(&file, crate::store::FILE_MODE)?;
    let want = header(tier);
    let mut have = [0u8; HEADER_BYTES as usize];
    let fits =
        file.metadata()?.len() == len && file.read_exact_at(&mut have, 0).is_ok() && have == want;
    if !fits {
        if file.metadata()?.len() > 0 {
            tracing::warn!(
                "history: {} has another layout; starting it afresh",
                path.display()
            );
        }
        file.set_len(0)?;
        file.set_len(len)?;
        file.write_all_at(&want, 0)?;
    }
    Ok(file)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(crate::store::FILE_MODE)
        .open(&tmp)?;
    private(&f, crate::store::FILE_MODE)?;
    f.write_all(bytes)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// Takes away what `mode` does not give others (a file or directory an older
/// version created more open).
fn private(file: &File, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let have = file.metadata()?.permissions().mode();
    if have & 0o077 & !mode != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(iops: f32) -> Sample {
        Sample {
            iops,
            p99_ms: iops / 10.0,
            target_met: 1.0,
            ..Sample::default()
        }
    }

    #[test]
    fn samples_round_trip_and_survive_reopening() {
        let dir = weir_testkit::TempDir::new("history-reopen");
        let t0 = 1_700_000_000u64;
        {
            let h = History::open(dir.path()).unwrap();
            for i in 0..120 {
                let v = vec![
                    ("a".to_string(), sample(i as f32)),
                    ("b".to_string(), sample(1.0)),
                ];
                h.record(t0 + i, &v).unwrap();
            }
        }
        let h = History::open(dir.path()).unwrap();
        let s = h.series("a", t0 + 119, 3600, 1).unwrap().unwrap();
        assert_eq!(s.tier, "1s");
        assert_eq!(s.points.len(), 120);
        assert_eq!(
            s.points[7],
            Point {
                t: t0 + 7,
                sample: sample(7.0)
            }
        );
        // Downsampled to 60 s: means, the worst p99.
        let s = h.series("a", t0 + 119, 3600, 60).unwrap().unwrap();
        let first = s.points.iter().find(|p| p.t == t0 - t0 % 60 + 60).unwrap();
        assert!(first.sample.iops > 0.0);
        assert!(h.series("zzz", t0, 60, 1).unwrap().is_none());
        // 30 days asked two minutes in: the hour tier holds nothing yet, so the
        // finest tier that does answers (it said "no history yet").
        let s = h.series("a", t0 + 119, 30 * 86_400, 1).unwrap().unwrap();
        assert_eq!(s.tier, "1m", "{s:?}");
        assert!(!s.points.is_empty());
        assert_eq!(s.from, t0 + 119 - 30 * 86_400, "the window asked for");
    }

    #[test]
    fn minutes_are_aggregated_from_seconds_even_across_a_restart() {
        let dir = weir_testkit::TempDir::new("history-minutes");
        let t0 = 1_700_000_020u64; // 20 s before a minute boundary
        let v = |x: f32| vec![("a".to_string(), sample(x))];
        {
            let h = History::open(dir.path()).unwrap();
            for i in 0..50 {
                h.record(t0 + i, &v(10.0)).unwrap();
            }
        }
        // Down from t0+50 to t0+100; the minute [t0+20, t0+80) ends while down.
        let h = History::open(dir.path()).unwrap();
        h.record(t0 + 100, &v(10.0)).unwrap();
        let s = h.series("a", t0 + 100, 86_400, 60).unwrap().unwrap();
        assert_eq!(s.tier, "1m");
        let minute = t0 + 20;
        assert_eq!(minute % 60, 0);
        let p = s
            .points
            .iter()
            .find(|p| p.t == minute)
            .expect("the minute while down");
        assert_eq!(p.sample.iops, 10.0);
        assert_eq!(p.sample.p99_ms, 1.0);
    }

    #[test]
    fn slots_are_reused_without_the_old_volume_s_history() {
        let dir = weir_testkit::TempDir::new("history-slots");
        let h = History::open(dir.path()).unwrap();
        let t0 = 1_700_000_000u64;
        h.record(t0, &[("old".to_string(), sample(5.0))]).unwrap();
        h.record(t0 + 1, &[]).unwrap();
        h.record(t0 + 2, &[("new".to_string(), sample(6.0))])
            .unwrap();
        let s = h.series("new", t0 + 2, 60, 1).unwrap().unwrap();
        assert_eq!(s.points.len(), 1, "{:?}", s.points);
        assert!(h.series("old", t0 + 2, 60, 1).unwrap().is_none());
    }

    #[test]
    fn the_store_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = weir_testkit::TempDir::new("history-mode");
        let h = History::open(dir.path()).unwrap();
        h.record(1_700_000_000, &[("a".to_string(), sample(1.0))])
            .unwrap();
        drop(h);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let store = dir.path().join("history");
        // An older version's modes are tightened on the next start.
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ring = std::fs::read_dir(&store)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "ring"))
            .unwrap();
        std::fs::set_permissions(&ring, std::fs::Permissions::from_mode(0o644)).unwrap();
        let h = History::open(dir.path()).unwrap();
        h.record(1_700_000_001, &[("b".to_string(), sample(1.0))])
            .unwrap();
        assert_eq!(mode(&store), 0o700);
        for e in std::fs::read_dir(&store).unwrap() {
            let p = e.unwrap().path();
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }

    #[test]
    fn free_slots_are_the_gaps_and_none_when_full() {
        let mut map = SlotMap::default();
        for s in (0..MAX_SLOTS).filter(|&s| s != 7 && s != 4000) {
            map.volumes
                .insert(format!("v{s}"), SlotEntry { slot: s, since: 0 });
        }
        assert_eq!(map.free_slots(), vec![7, 4000]);
        map.volumes
            .insert("a".into(), SlotEntry { slot: 7, since: 0 });
        map.volumes.insert(
            "b".into(),
            SlotEntry {
                slot: 4000,
                since: 0,
            },
        );
        assert!(map.free_slots().is_empty());
        // A slot out of range (a hand-edited slots.json) is ignored, not a panic.
        map.volumes.insert(
            "c".into(),
            SlotEntry {
                slot: MAX_SLOTS + 5,
                since: 0,
            },
        );
        assert!(map.free_slots().is_empty());
        map.volumes
            .insert("d".into(), SlotEntry { slot: 7, since: 0 });
        let map = map.sanitized();
        assert_eq!(
            map.volumes.len(),
            MAX_SLOTS,
            "c (out of range) and one of a / d dropped"
        );
        assert!(map.volumes.values().all(|e| e.slot < MAX_SLOTS));
    }

    #[test]
    fn the_size_is_bounded_by_construction() {
        let dir = weir_testkit::TempDir::new("history-size");
        let h = History::open(dir.path()).unwrap();
        let names: Vec<(String, Sample)> =
            (0..300).map(|i| (format!("v{i}"), sample(1.0))).collect();
        h.record(1_700_000_000, &names).unwrap();
        let total: u64 = std::fs::read_dir(dir.path().join("history"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        let rings = bytes_for_volumes(300);
        assert!(
            total >= rings && total < rings + 64 * 1024,
            "{total} vs {rings}"
        );
        assert_eq!(bytes_for_volumes(1000), bytes_for_volumes(1024));
        assert!(
            bytes_for_volumes(1000) < 190_000_000,
            "{}",
            bytes_for_volumes(1000)
        );
    }
}
