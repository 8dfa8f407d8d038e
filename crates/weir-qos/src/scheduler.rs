//! The tag scheduler: reservation first, then shares, never past a limit
//! (mClock, Gulati et al., OSDI 2010), with size-normalised cost and service-level
//! protection under overload.
//!
//! API contract (drivers rely on it; see docs/ARCHITECTURE.md):
//! - `enqueue` queues a request on a volume, tagged with the client it came from.
//! - The driver calls `dispatch(now)` whenever it has room for one more outstanding
//!   request downstream. It gets `Dispatch::Io` (send it now), `Dispatch::WaitUntil(t)`
//!   (requests are queued but every one of them is held back by a limit until `t`;
//!   call again at `t` or when something else happens), or `Dispatch::Idle`.
//! - The driver calls `complete` when a dispatched request finishes, with its latency
//!   as the client saw it (queueing in the scheduler included).
//! - All state is per volume: the clients of one volume share its reservation and
//!   limit; two volumes with the same policy each get the policy's full targets.
//!
//! # Cost of a request
//!
//! A request of `size_bytes` costs `units = max(1, ceil(size_bytes / cost_unit_bytes))`
//! against IOPS figures and `size_bytes` against MB/s figures (MB = 10^6 bytes).
//! `IoKind::Other` costs one unit and no bytes. A figure in MB/s does not apply to a
//! request that moves no data (so a flush is free against a MB/s-only policy).
//! When a policy sets both an IOPS and a MB/s *reservation*, a request advances the
//! reservation tag by the smaller of the two increments (the volume is entitled to
//! whichever figure is more generous for its request sizes); for *limits*, by the
//! larger (whichever is more restrictive). Shares are charged `units / shares`.
//!
//! # Tags
//!
//! Each volume carries three tags for its head request (integers: time tags are
//! nanoseconds in 44.20 fixed point, share tags `units·2^40 / shares`):
//! - **R** (reservation): the time the volume is next owed a request. Advanced by the
//!   reservation increment only when a request is released *by* the reservation rule;
//!   a request released in the weight phase leaves R alone, which is mClock's
//!   "decrease the R tags by 1/r" adjustment: spare-capacity service is not counted
//!   against the reservation.
//! - **L** (limit): the earliest time the volume may release its next request. On a
//!   release, `L ← max(L, now − slack) + limit increment`, where
//!   `slack = max(burst_seconds, 10 ms)`: the limit can lag `now` by at most the
//!   policy's burst allowance, plus 10 ms so that a release delayed by a busy device
//!   does not cost the volume throughput. In any window of `W` seconds a volume is
//!   therefore released at most `rate · (W + slack)` plus one request.
//! - **P** (proportional share): start-time fair queueing in virtual time; every
//!   release (whichever phase) advances P by `units / shares`, so a volume receives
//!   `max(reservation, its share of the capacity)` (mClock's semantics: capacity left
//!   after the reservations is split by shares among the volumes that are not
//!   pinned at their reservation).
//!
//! An idle volume banks no credit: when a volume's queue goes from empty to
//! non-empty, `R ← max(R, now − burst)`, `L ← max(L, now − burst)` and `P ← max(P, v)`, where `v` is the virtual
//! time (the P tag of the last request released by the ordinary share rule). A volume
//! held back by its limit is treated like an idle one for P when it becomes eligible
//! again, so time spent at the limit is not banked as share credit either.
//!
//! # Dispatch
//!
//! 1. Constraint phase: among backlogged volumes that are not limit-held
//!    (`L ≤ now`), the one with the smallest `R ≤ now` is released
//!    ([`Phase::Reservation`]).
//! 2. Weight phase: among volumes that are not limit-held, the smallest P
//!    ([`Phase::Share`]), subject to service-level protection below.
//! 3. If every queued request is limit-held: `WaitUntil(smallest L)`.
//!
//! Volumes with an empty queue appear in no structure, so they never block anyone,
//! and the scheduler is work conserving: if any request is queued and not limit-held,
//! `dispatch` returns `Io`.
//!
//! # Service-level protection under overload
//!
//! A volume is *protectable* when its policy has a latency target and its service
//! level is mission-critical or business-critical (a policy without a service level
//! ranks as non-critical; protecting the lowest level would change nothing). A
//! protectable volume that is backlogged and not held by its own limit (reordering
//! cannot help that one) is **at risk** when either
//! - the exponentially weighted mean (weight 1/8 per completion) of the latencies
//!   reported through [`Scheduler::complete`] is at least
//!   [`RISK_LATENCY_FRACTION`] (50 %) of its latency target, or
//! - its oldest queued request has waited in the scheduler for at least
//!   [`RISK_QUEUE_AGE_FRACTION`] (25 %) of its latency target.
//!
//! In the weight phase, let `ℓ*` be the most important service level that has an
//! at-risk volume. Then only volumes of level `ℓ*` or more important compete (by
//! the ordinary P rule among themselves); less important volumes wait. If no volume
//! at those levels is eligible (all limit-held), everyone competes as usual, so
//! protection never idles the device. When no volume is at risk, the ordinary share
//! rule applies unchanged, so share ratios hold exactly. The levels held back are
//! not starved: 1/[`HELD_BACK_EVERY`] (1/16) of the cost units released while they
//! wait goes to the first of them by P tag (one release in 16 when sizes are equal),
//! so a held-back request waits for its own level's queue at ≈ 1/16 of the device's
//! rate, not for as long as the overload lasts.
//!
//! A release made *because of* protection (the chosen volume is not the one the share
//! rule would have picked) is charged shares from the current virtual time:
//! `P ← min(P, v) + units/shares`. Protection therefore reorders service without
//! leaving the protected volume a share debt to pay back once the overload is over.
//! It never overrides a limit. Reservations are served before it, with one
//! exception: while level `ℓ*` has a volume at risk, the constraint phase runs only
//! when the most-behind due reservation (smallest R) belongs to level `ℓ*` or a more
//! important one; otherwise it is skipped for that decision (an infeasible lower-level
//! reservation must not outrank a higher level's latency target), and any due
//! reservation of the protected levels competes in the weight phase by its P tag.
//! Serving the protected levels' due reservations in R order instead was measured on
//! the mixed-workload scenario and lost (docs/FIDELITY.md).
//!
//! # Cost of a decision
//!
//! Volumes live in indexed binary heaps (one per role: reservation, limit-held,
//! ready per service level, queue-age deadline per protectable level), so
//! `enqueue`, `dispatch` and `complete` are O(log n) in the number of backlogged
//! volumes, with no allocation per request beyond the volume's FIFO.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::fair::{Piece, Queued, VolumeQueue};
use crate::heap::IndexedHeap;
use crate::{ClientId, Nanos, Policy, PolicyError, VolumeId};

/// A protectable volume is at risk when its mean completion latency (EWMA) reaches
/// this fraction of its latency target.
pub const RISK_LATENCY_FRACTION: f64 = 0.5;
/// … or when its oldest queued request has waited this fraction of its target.
pub const RISK_QUEUE_AGE_FRACTION: f64 = 0.25;
/// Weight of one completion in the latency EWMA.
pub const LATENCY_EWMA_WEIGHT: f64 = 1.0 / 8.0;
/// How far a limit tag may lag `now` when the policy sets no larger burst.
pub const LIMIT_SLACK_NS: Nanos = 10_000_000;

/// How far the most-behind backlogged reservation tag may fall behind `now`.
/// Reservations the device cannot meet (their sum above capacity) would otherwise
/// bank an ever-growing debt and later monopolise the reservation phase until
/// caught up. Beyond this lag every reservation tag moves forward *together* (one
/// offset added to all of them), so the volumes keep their relative order: an
/// infeasible set of reservations is cut in proportion to the rates, whatever the
/// order the volumes were declared in, and none banks more than this much debt.
pub const RESERVATION_LAG_NS: Nanos = 100_000_000;

/// Time tags are nanoseconds shifted left by this many bits.
const TAG_SHIFT: u32 = 20;
const TICKS_PER_NS: f64 = (1u64 << TAG_SHIFT) as f64;
/// Share tags: one unit at one share advances P by this much.
const SHARE_SCALE: u128 = 1 << 40;
/// While protection holds lower service levels back, they still get share releases
/// (the first among them by share tag) worth 1/this of the cost units released —
/// one release in 16 when all are the same size, about 6 % of the device: a
/// held-back request waits for its own level's queue at that rate, not for as long
/// as the overload lasts (`mixed-workload-cache`, session 24: without it a
/// non-critical pool's first boot reads waited 208 s, the whole boot storm), while
/// the protected levels keep ≥ 15/16. Counted in cost units, so that a held-back
/// backup's 1 MiB reads take no more of the device than 4 KiB ones would; not in
/// device slots, which the depth controller takes down to 4 exactly when protection
/// acts (one slot would be 25 %).
pub const HELD_BACK_EVERY: u32 = 16;
/// Levels that can be protected (mission-critical, business-critical).
const PROTECTABLE_LEVELS: usize = 2;
const LEVELS: usize = 3;

fn ticks(ns: Nanos) -> u128 {
    (ns as u128) << TAG_SHIFT
}

fn ticks_to_ns_ceil(t: u128) -> Nanos {
    let ns = (t + (1u128 << TAG_SHIFT) - 1) >> TAG_SHIFT;
    u64::try_from(ns).unwrap_or(u64::MAX)
}

fn secs_to_ticks(seconds: f64) -> u128 {
    if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1e9 * TICKS_PER_NS) as u128
    } else {
        0
    }
}

/// What kind of request (its kind and size decide its cost; see the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    Read,
    Write,
    /// Reads its range into a cache (NBD_CMD_CACHE): costs what a read of it costs.
    Cache,
    /// Discards its range: its bytes times `SchedulerConfig::trim_cost_factor`.
    Trim,
    /// Writes zeroes over its range: its bytes times `zero_cost_factor`.
    WriteZeroes,
    /// One operation, no bytes.
    Flush,
    /// Anything else (block status…): one operation, no bytes.
    Other,
}

impl IoKind {
    /// Whether a request of this kind covers a range that can be released in pieces.
    pub fn has_range(self) -> bool {
        !matches!(self, IoKind::Flush | IoKind::Other)
    }
}

/// What a request covers: its kind and byte range on the volume.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IoRange {
    pub kind: IoKind,
    pub offset: u64,
    /// Bytes (ignored for kinds without a range).
    pub length: u32,
}

/// The cost-relevant shape of a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IoCost {
    pub kind: IoKind,
    pub size_bytes: u32,
}

impl IoCost {
    pub fn read(size_bytes: u32) -> IoCost {
        IoCost {
            kind: IoKind::Read,
            size_bytes,
        }
    }
    pub fn write(size_bytes: u32) -> IoCost {
        IoCost {
            kind: IoKind::Write,
            size_bytes,
        }
    }
    pub fn other() -> IoCost {
        IoCost {
            kind: IoKind::Other,
            size_bytes: 0,
        }
    }
    /// Bytes the request covers (0 for `Flush` and `Other`).
    pub fn bytes(&self) -> u64 {
        if self.kind.has_range() {
            self.size_bytes as u64
        } else {
            0
        }
    }
    /// I/Os charged against IOPS figures: `max(1, ceil(bytes / cost_unit_bytes))`;
    /// `cost_unit_bytes` of 0 or `u32::MAX` counts every request as one I/O.
    pub fn units(&self, cost_unit_bytes: u32) -> u64 {
        if cost_unit_bytes == 0 || cost_unit_bytes == u32::MAX {
            return 1;
        }
        self.bytes().div_ceil(cost_unit_bytes as u64).max(1)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// IOPS are counted in units of this many bytes: a request costs
    /// `max(1, ceil(size / cost_unit_bytes))` I/Os against reservations and limits
    /// in IOPS, so one 1 MiB I/O uses the budget of 256 × 4 KiB I/Os (default 4096).
    /// `u32::MAX` counts every request as one I/O whatever its size (what
    /// ESXi 5.0 did, see scenarios/sioc-shares.toml). 0 is treated like `u32::MAX`.
    pub cost_unit_bytes: u32,
    /// A TRIM is charged its length times this (0–1, default 1: QEMU's throttling
    /// counts a discard's bytes as written bytes).
    pub trim_cost_factor: f64,
    /// A WRITE_ZEROES is charged its length times this (0–1, default 1, as QEMU).
    pub zero_cost_factor: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            cost_unit_bytes: 4096,
            trim_cost_factor: 1.0,
            zero_cost_factor: 1.0,
        }
    }
}

/// How long a piece of a large request may take of its volume's limit: requests
/// that would take longer are released in pieces this long, so a limit is never
/// passed by more than one piece (and a small request behind a large one on the
/// same volume waits at most one piece).
pub const PACE_QUANTUM_NS: Nanos = 5_000_000;

impl SchedulerConfig {
    /// A config with only the cost unit set (factors at their defaults).
    pub fn with_cost_unit(cost_unit_bytes: u32) -> SchedulerConfig {
        SchedulerConfig {
            cost_unit_bytes,
            ..SchedulerConfig::default()
        }
    }

    fn factor(&self, kind: IoKind) -> f64 {
        let f = match kind {
            IoKind::Trim => self.trim_cost_factor,
            IoKind::WriteZeroes => self.zero_cost_factor,
            _ => 1.0,
        };
        if f.is_finite() {
            f.clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    /// Bytes a request is charged against MB/s figures: reads, writes and CACHE their
    /// length, TRIM and WRITE_ZEROES their length times the factor, others 0.
    pub fn charged_bytes(&self, cost: IoCost) -> u64 {
        match cost.kind {
            IoKind::Trim | IoKind::WriteZeroes => {
                (cost.bytes() as f64 * self.factor(cost.kind)).ceil() as u64
            }
            _ => cost.bytes(),
        }
    }

    /// I/Os a request is charged against IOPS figures:
    /// `max(1, ceil(charged_bytes / cost_unit_bytes))`.
    pub fn units(&self, cost: IoCost) -> u64 {
        let unit = self.cost_unit_bytes;
        if unit == 0 || unit == u32::MAX {
            return 1;
        }
        self.charged_bytes(cost).div_ceil(unit as u64).max(1)
    }

    /// Bytes every request costs at least against a MB/s *limit*: one cost unit
    /// (4 KiB when requests are counted whole), so that a flood of flushes or
    /// zero-length requests cannot pass a MB/s-only limit for free.
    pub fn min_limit_bytes(&self) -> u64 {
        match self.cost_unit_bytes {
            0 | u32::MAX => 4096,
            u => u as u64,
        }
    }

    /// The longest piece (bytes of the request) of a `kind` request whose charged
    /// bytes are at most `charged` (at least 4 KiB, a multiple of 4 KiB).
    fn piece_length(&self, kind: IoKind, charged: u64) -> u32 {
        let f = self.factor(kind);
        if f <= 0.0 {
            return 0;
        }
        let len = ((charged as f64 / f) as u64) & !4095;
        len.clamp(4096, u32::MAX as u64 & !4095) as u32
    }
}

/// Which rule released a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Released to meet the volume's reservation.
    Reservation,
    /// Released from spare capacity by shares (and service-level priority).
    Share,
}

/// A request released by `dispatch`.
#[derive(Debug)]
pub struct Dispatched<T> {
    pub volume: VolumeId,
    pub client: ClientId,
    /// What this release is charged for: the piece's kind and length.
    pub cost: IoCost,
    /// The part of the request released (the whole of it unless it is paced).
    pub piece: Piece,
    pub enqueued_at: Nanos,
    pub phase: Phase,
    pub payload: T,
}

#[derive(Debug)]
pub enum Dispatch<T> {
    Io(Dispatched<T>),
    WaitUntil(Nanos),
    Idle,
}

/// Counters for one volume since it was added.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VolumeStats {
    pub queued: usize,
    pub dispatched_ios: u64,
    pub dispatched_bytes: u64,
    pub completed_ios: u64,
    pub completed_bytes: u64,
    pub latency_sum_ns: u128,
    pub reservation_dispatches: u64,
    /// Weight-phase releases that service-level protection moved ahead of the
    /// volume the share rule would have picked.
    pub protected_dispatches: u64,
    /// Releases made while protection held the volume's level back: its floor, 1 /
    /// [`HELD_BACK_EVERY`] of the cost released, for the held-back levels together.
    #[serde(default)]
    pub held_back_dispatches: u64,
    /// Cost units released (see [`IoCost::units`]).
    pub dispatched_units: u64,
    /// Bytes charged against a MB/s limit by what was released: each piece's
    /// [`SchedulerConfig::charged_bytes`], at least
    /// [`SchedulerConfig::min_limit_bytes`] (a FLUSH or BLOCK_STATUS 4 KiB), where
    /// `dispatched_bytes` counts only the bytes moved.
    #[serde(default)]
    pub dispatched_charged_bytes: u64,
}

/// Completion counters for one client (host or VM), across all its volumes.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClientStats {
    pub ios: u64,
    pub bytes: u64,
    pub latency_sum_ns: u128,
}

/// Policy figures turned into tag increments.
#[derive(Clone, Debug)]
struct Rates {
    /// Ticks per cost unit / per byte; `None` when the figure is not set.
    reservation_per_unit: Option<f64>,
    reservation_per_byte: Option<f64>,
    limit_per_unit: Option<f64>,
    limit_per_byte: Option<f64>,
    shares: u128,
    /// 0 mission-critical, 1 business-critical, 2 non-critical or none.
    rank: usize,
    /// Queue age (ns) and EWMA latency (ns) at which the volume is at risk; only
    /// for protectable volumes.
    risk_age_ns: Option<u64>,
    risk_latency_ns: Option<f64>,
    /// The latency target, ns, of a protectable volume (see the module docs).
    protected_target_ns: Option<Nanos>,
    burst_ticks: u128,
    limit_slack_ticks: u128,
    /// The most a piece may be charged (bytes) so that it takes at most
    /// `PACE_QUANTUM_NS` of the limit; `None` without a limit (never split).
    piece_charged_bytes: Option<u64>,
}

fn per_unit(rate: Option<f64>) -> Option<f64> {
    rate.filter(|r| r.is_finite() && *r > 0.0)
        .map(|r| 1e9 * TICKS_PER_NS / r)
}

impl Rates {
    fn from_policy(policy: &Policy, config: &SchedulerConfig) -> Rates {
        let rank = policy
            .service_level
            .map_or(LEVELS - 1, |l| l.rank().min(LEVELS - 1));
        let target_ns = policy
            .latency_target_ms
            .filter(|t| t.is_finite() && *t > 0.0 && rank < PROTECTABLE_LEVELS)
            .map(|t| t * 1e6);
        let burst_ticks = secs_to_ticks(policy.burst_seconds);
        let limit_per_unit = per_unit(policy.effective_limit_iops());
        let limit_per_byte = per_unit(policy.limit_mbps.map(|m| m * crate::BYTES_PER_MB));
        let quantum = ticks(PACE_QUANTUM_NS) as f64;
        let unit_bytes = match config.cost_unit_bytes {
            0 | u32::MAX => None,
            u => Some(u as f64),
        };
        // Bytes that take one quantum of each limit (IOPS limits only when requests
        // are counted by size).
        let by_iops = limit_per_unit
            .zip(unit_bytes)
            .map(|(k, unit)| (quantum / k).floor().max(1.0) * unit);
        let by_mbps = limit_per_byte.map(|k| (quantum / k).max(1.0));
        let piece_charged_bytes = match (by_iops, by_mbps) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map(|b| b as u64);
        Rates {
            reservation_per_unit: per_unit(policy.reservation_iops),
            reservation_per_byte: per_unit(
                policy.reservation_mbps.map(|m| m * crate::BYTES_PER_MB),
            ),
            limit_per_unit,
            limit_per_byte,
            piece_charged_bytes,
            shares: policy.shares.get().max(1) as u128,
            rank,
            risk_age_ns: target_ns.map(|t| (t * RISK_QUEUE_AGE_FRACTION) as u64),
            risk_latency_ns: target_ns.map(|t| t * RISK_LATENCY_FRACTION),
            protected_target_ns: target_ns.map(|t| t as Nanos),
            burst_ticks,
            limit_slack_ticks: burst_ticks.max(ticks(LIMIT_SLACK_NS)),
        }
    }

    /// The longest piece of a `kind` request this volume releases at once (0: whole).
    fn max_piece_length(&self, config: &SchedulerConfig, kind: IoKind) -> u32 {
        match self.piece_charged_bytes {
            Some(charged) if kind.has_range() => config.piece_length(kind, charged),
            _ => 0,
        }
    }

    fn has_reservation(&self) -> bool {
        self.reservation_per_unit.is_some() || self.reservation_per_byte.is_some()
    }

    fn has_limit(&self) -> bool {
        self.limit_per_unit.is_some() || self.limit_per_byte.is_some()
    }

    fn increments(
        per_unit: Option<f64>,
        per_byte: Option<f64>,
        units: u64,
        bytes: u64,
    ) -> (Option<f64>, Option<f64>) {
        (
            per_unit.map(|k| k * units as f64),
            per_byte.filter(|_| bytes > 0).map(|k| k * bytes as f64),
        )
    }

    fn reservation_increment(&self, units: u64, bytes: u64) -> u128 {
        match Self::increments(
            self.reservation_per_unit,
            self.reservation_per_byte,
            units,
            bytes,
        ) {
            (Some(a), Some(b)) => a.min(b) as u128,
            (Some(a), None) | (None, Some(a)) => a as u128,
            (None, None) => 0,
        }
    }

    fn limit_increment(&self, units: u64, bytes: u64) -> u128 {
        match Self::increments(self.limit_per_unit, self.limit_per_byte, units, bytes) {
            (Some(a), Some(b)) => a.max(b) as u128,
            (Some(a), None) | (None, Some(a)) => a as u128,
            (None, None) => 0,
        }
    }

    fn share_increment(&self, units: u64) -> u128 {
        // The same quotient in 64 bits when it fits (every request under 2^24 units):
        // a 128-bit division is a library call.
        const _: () = assert!(SHARE_SCALE == 1 << 40);
        if units < 1 << 24 && self.shares <= u64::MAX as u128 {
            return ((units << 40) / self.shares as u64) as u128;
        }
        units as u128 * SHARE_SCALE / self.shares
    }
}

/// The last release that moved a tag: its start tag and cost, so a policy change
/// can retag the queued requests with the new rates.
#[derive(Copy, Clone, Debug, Default)]
struct LastRelease {
    base: u128,
    units: u64,
    bytes: u64,
}

#[derive(Debug)]
struct Volume<T> {
    id: VolumeId,
    policy: Policy,
    rates: Rates,
    queue: VolumeQueue<T>,
    next_r: u128,
    next_l: u128,
    next_p: u128,
    last_r: Option<LastRelease>,
    last_l: Option<LastRelease>,
    last_p: Option<LastRelease>,
    /// Counted in `ewma_at_risk_backlogged` / present in `age_risk_heaps`.
    risk_tracked: bool,
    latency_ewma_ns: Option<f64>,
    ewma_at_risk: bool,
    /// Requests released whole and not completed yet (a volume with requests in
    /// flight is not idle, even while its queue is empty).
    in_flight: u32,
    stats: VolumeStats,
}

/// A small multiplicative hasher for the u32 ids (the default SipHash costs more than
/// the rest of a decision).
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// The per-volume tag scheduler (see the module docs for the rules).
pub struct Scheduler<T> {
    config: SchedulerConfig,
    volumes: Vec<Option<Volume<T>>>,
    free_slots: Vec<u32>,
    index: IdMap<VolumeId, u32>,
    clients: IdMap<ClientId, ClientStats>,
    /// Backlogged, not limit-held volumes with a reservation, by R.
    reservation_heap: IndexedHeap,
    /// Backlogged, limit-held volumes, by L.
    held_heap: IndexedHeap,
    /// Backlogged, not limit-held volumes per service-level rank, by P.
    ready_heaps: [IndexedHeap; LEVELS],
    /// Backlogged, not limit-held protectable volumes per rank, by the time their
    /// head request reaches the at-risk queue age (ns).
    age_risk_heaps: [IndexedHeap; PROTECTABLE_LEVELS],
    /// Backlogged, not limit-held protectable volumes per rank whose latency EWMA is
    /// at risk.
    ewma_at_risk_backlogged: [usize; PROTECTABLE_LEVELS],
    /// Virtual time for shares: P of the last request released by the share rule.
    share_vtime: u128,
    /// Per rank, the virtual time of the latest share release made while protection
    /// held that rank back: its volumes are released from no earlier tag (no credit
    /// for the wait).
    held_back_vtime: [u128; LEVELS],
    /// Cost units the held-back levels may take (see [`HELD_BACK_EVERY`]): each
    /// release made while protection holds levels back adds its units, one of theirs
    /// takes `HELD_BACK_EVERY - 1` times its units; at most one release's worth is
    /// banked.
    held_back_credit: i64,
    /// Added to every stored R tag (see [`RESERVATION_LAG_NS`]).
    r_shift: u128,
    queued: usize,
}

impl<T> Scheduler<T> {
    pub fn new(config: SchedulerConfig) -> Self {
        Scheduler {
            config,
            volumes: Vec::new(),
            free_slots: Vec::new(),
            index: IdMap::default(),
            clients: IdMap::default(),
            reservation_heap: IndexedHeap::default(),
            held_heap: IndexedHeap::default(),
            ready_heaps: Default::default(),
            age_risk_heaps: Default::default(),
            ewma_at_risk_backlogged: [0; PROTECTABLE_LEVELS],
            share_vtime: 0,
            held_back_vtime: [0; LEVELS],
            held_back_credit: 0,
            r_shift: 0,
            queued: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Adds a volume (policy already validated by the caller via `Policy::validate`).
    /// Figures that are not positive and finite are ignored (treated as not set).
    /// Adding a volume that already exists changes its policy (`set_policy`).
    pub fn add_volume(&mut self, now: Nanos, volume: VolumeId, policy: Policy) {
        if self.index.contains_key(&volume) {
            self.set_policy(now, volume, policy);
            return;
        }
        let rates = Rates::from_policy(&policy, &self.config);
        let state = Volume {
            id: volume,
            policy,
            rates,
            queue: VolumeQueue::default(),
            next_r: ticks(now).saturating_sub(self.r_shift),
            next_l: 0,
            next_p: self.share_vtime,
            last_r: None,
            last_l: None,
            last_p: None,
            risk_tracked: false,
            latency_ewma_ns: None,
            ewma_at_risk: false,
            in_flight: 0,
            stats: VolumeStats::default(),
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.volumes[slot as usize] = Some(state);
                slot
            }
            None => {
                self.volumes.push(Some(state));
                (self.volumes.len() - 1) as u32
            }
        };
        let slots = self.volumes.len();
        self.reservation_heap.ensure_slots(slots);
        self.held_heap.ensure_slots(slots);
        for h in self
            .ready_heaps
            .iter_mut()
            .chain(self.age_risk_heaps.iter_mut())
        {
            h.ensure_slots(slots);
        }
        self.index.insert(volume, slot);
    }

    /// Like `add_volume`, but validates the policy and refuses a volume that exists.
    pub fn try_add_volume(
        &mut self,
        now: Nanos,
        volume: VolumeId,
        policy: Policy,
    ) -> Result<(), PolicyError> {
        policy.validate()?;
        if self.index.contains_key(&volume) {
            return Err(PolicyError::VolumeExists(volume.0));
        }
        self.add_volume(now, volume, policy);
        Ok(())
    }

    /// Changes a volume's policy; applies to requests already queued.
    ///
    /// The head request is retagged at once: R and L are recomputed from the last
    /// release's start tag with the new rates (R never earlier than `now − burst`), and
    /// P restarts at the virtual time (any share lead or lag from the old policy is
    /// forgiven). Unknown volumes are ignored.
    pub fn set_policy(&mut self, now: Nanos, volume: VolumeId, policy: Policy) {
        let Some(&slot) = self.index.get(&volume) else {
            return;
        };
        let backlogged = self.volume(slot).is_some_and(|v| !v.queue.is_empty());
        if backlogged {
            self.unplace(slot);
        }
        let now_t = ticks(now);
        let vtime = self.share_vtime;
        let shift = self.r_shift;
        let rates = Rates::from_policy(&policy, &self.config);
        let Some(v) = self.volume_mut(slot) else {
            return;
        };
        v.rates = rates;
        v.policy = policy;
        let floor_r = now_t
            .saturating_sub(v.rates.burst_ticks)
            .saturating_sub(shift);
        v.next_r = match v.last_r {
            Some(last) => {
                (last.base + v.rates.reservation_increment(last.units, last.bytes)).max(floor_r)
            }
            None => v.next_r.max(floor_r),
        };
        if let Some(last) = v.last_l {
            v.next_l = last.base + v.rates.limit_increment(last.units, last.bytes);
        }
        v.next_p = vtime;
        // Re-evaluate the latency flag against the new target.
        v.ewma_at_risk = match (v.latency_ewma_ns, v.rates.risk_latency_ns) {
            (Some(e), Some(limit)) => e >= limit,
            _ => false,
        };
        if backlogged {
            self.place(slot, now);
        }
    }

    /// Removes a volume and returns its queued payloads (the driver fails them).
    pub fn remove_volume(&mut self, volume: VolumeId) -> Vec<T> {
        let Some(slot) = self.index.remove(&volume) else {
            return Vec::new();
        };
        let backlogged = self.volume(slot).is_some_and(|v| !v.queue.is_empty());
        if backlogged {
            self.unplace(slot);
        }
        let Some(v) = self.volumes[slot as usize].take() else {
            return Vec::new();
        };
        self.free_slots.push(slot);
        self.queued -= v.queue.len();
        v.queue.drain().collect()
    }

    /// Queues a request. Unknown volumes are an error the driver reports.
    pub fn enqueue(
        &mut self,
        now: Nanos,
        volume: VolumeId,
        client: ClientId,
        cost: IoCost,
        payload: T,
    ) -> Result<(), crate::PolicyError> {
        let item = Queued {
            kind: cost.kind,
            offset: 0,
            remaining: cost.size_bytes,
            split: None,
            enqueued_at: now,
            payload,
        };
        self.push(now, volume, client, item)
    }

    /// Queues a request for `length` bytes at `offset` of the volume. Under a limit,
    /// a request that would take more than [`PACE_QUANTUM_NS`] of it is released in
    /// pieces ([`Dispatched::piece`]; each piece carries a clone of the payload, the
    /// last one the payload itself), each charged before it is released.
    pub fn enqueue_range(
        &mut self,
        now: Nanos,
        volume: VolumeId,
        client: ClientId,
        range: IoRange,
        payload: T,
    ) -> Result<(), PolicyError>
    where
        T: Clone,
    {
        let item = Queued {
            kind: range.kind,
            offset: range.offset,
            remaining: if range.kind.has_range() {
                range.length
            } else {
                0
            },
            split: Some(T::clone),
            enqueued_at: now,
            payload,
        };
        self.push(now, volume, client, item)
    }

    fn push(
        &mut self,
        now: Nanos,
        volume: VolumeId,
        client: ClientId,
        item: Queued<T>,
    ) -> Result<(), PolicyError> {
        let Some(&slot) = self.index.get(&volume) else {
            return Err(PolicyError::UnknownVolume(volume.0));
        };
        let Some(v) = self.volume_mut(slot) else {
            return Err(PolicyError::UnknownVolume(volume.0));
        };
        let was_idle = v.queue.is_empty();
        v.queue.push_back(client, item);
        self.queued += 1;
        if was_idle {
            self.activate(slot, now);
        }
        Ok(())
    }

    /// Takes out the queued requests of `volume` for which `pred` holds (their
    /// payloads, for the driver to fail or move); the rest stay queued.
    pub fn extract(
        &mut self,
        now: Nanos,
        volume: VolumeId,
        pred: impl FnMut(&T) -> bool,
    ) -> Vec<T> {
        let Some(&slot) = self.index.get(&volume) else {
            return Vec::new();
        };
        let backlogged = self.volume(slot).is_some_and(|v| !v.queue.is_empty());
        if !backlogged {
            return Vec::new();
        }
        self.unplace(slot);
        let Some(v) = self.volume_mut(slot) else {
            return Vec::new();
        };
        let out = v.queue.extract(pred);
        let still = !v.queue.is_empty();
        self.queued -= out.len();
        if still {
            self.refresh(slot, now);
        }
        out
    }

    pub fn dispatch(&mut self, now: Nanos) -> Dispatch<T> {
        if self.queued == 0 {
            return Dispatch::Idle;
        }
        let now_t = ticks(now);
        // Volumes whose limit tag has come due become eligible again.
        while let Some((l, slot)) = self.held_heap.peek() {
            if l > now_t {
                break;
            }
            self.held_heap.pop();
            let vtime = self.share_vtime;
            if let Some(v) = self.volume_mut(slot) {
                // Time spent at the limit is not banked as share credit.
                v.next_p = v.next_p.max(vtime);
            }
            self.refresh(slot, now);
        }
        // Constraint phase — suspended for a volume of a lower service level than one
        // whose latency target is at risk: under overload a higher level's target
        // holds before a lower level is served, reservations included (the at-risk
        // level is then served by the weight phase's protection below).
        let protected_rank = self.protected_rank(now);
        let head = self.reservation_heap.peek();
        if let Some((r, _)) = head {
            // The most-behind reservation lags too far: every R tag moves up together.
            let floor = now_t.saturating_sub(ticks(RESERVATION_LAG_NS));
            self.r_shift += floor.saturating_sub(r + self.r_shift);
        }
        if let Some((r, slot)) = head
            && r + self.r_shift <= now_t
            && protected_rank.is_none_or(|p| self.volume_rank(slot) <= p)
            && let Some(d) = self.release(slot, now, Phase::Reservation, false)
        {
            return Dispatch::Io(d);
        }
        // Weight phase.
        let min_ready = |heaps: &[IndexedHeap]| heaps.iter().filter_map(IndexedHeap::peek).min();
        let global = min_ready(&self.ready_heaps);
        // The levels held back keep 1/HELD_BACK_EVERY of the cost released, so their
        // waits are bounded by their own queues, not by how long the overload lasts.
        let floor = protected_rank
            .filter(|_| self.held_back_credit >= i64::from(HELD_BACK_EVERY - 1))
            .and_then(|rank| min_ready(&self.ready_heaps[rank + 1..]));
        let chosen = match protected_rank {
            Some(rank) => floor
                .or_else(|| min_ready(&self.ready_heaps[..=rank]))
                .or(global),
            None => global,
        };
        match chosen {
            Some((_, slot)) => {
                let protected = floor.is_none() && global.is_some_and(|(_, g)| g != slot);
                let released = self.release(slot, now, Phase::Share, protected);
                if protected_rank.is_some()
                    && let Some(d) = &released
                {
                    self.charge_held_back_credit(slot, self.config.units(d.cost), floor.is_some());
                }
                if let Some(rank) = protected_rank {
                    for held in &mut self.held_back_vtime[rank + 1..] {
                        *held = self.share_vtime;
                    }
                }
                match released {
                    Some(d) => Dispatch::Io(d),
                    None => Dispatch::Idle,
                }
            }
            None => match self.held_heap.peek() {
                Some((l, _)) => Dispatch::WaitUntil(ticks_to_ns_ceil(l).max(now.saturating_add(1))),
                None => Dispatch::Idle,
            },
        }
    }

    pub fn complete(
        &mut self,
        now: Nanos,
        volume: VolumeId,
        client: ClientId,
        cost: IoCost,
        latency_ns: Nanos,
    ) {
        let _ = now;
        let c = self.clients.entry(client).or_default();
        c.ios += 1;
        c.bytes += cost.bytes();
        c.latency_sum_ns += latency_ns as u128;
        let Some(&slot) = self.index.get(&volume) else {
            return;
        };
        let Some(v) = self.volume_mut(slot) else {
            return;
        };
        v.in_flight = v.in_flight.saturating_sub(1);
        v.stats.completed_ios += 1;
        v.stats.completed_bytes += cost.bytes();
        v.stats.latency_sum_ns += latency_ns as u128;
        let sample = latency_ns as f64;
        let ewma = match v.latency_ewma_ns {
            Some(e) => e + (sample - e) * LATENCY_EWMA_WEIGHT,
            None => sample,
        };
        v.latency_ewma_ns = Some(ewma);
        let at_risk = v.rates.risk_latency_ns.is_some_and(|limit| ewma >= limit);
        if at_risk != v.ewma_at_risk {
            v.ewma_at_risk = at_risk;
            let (rank, tracked) = (v.rates.rank, v.risk_tracked);
            if tracked {
                if at_risk {
                    self.ewma_at_risk_backlogged[rank] += 1;
                } else {
                    self.ewma_at_risk_backlogged[rank] -= 1;
                }
            }
        }
    }

    pub fn queued(&self) -> usize {
        self.queued
    }

    pub fn stats(&self, volume: VolumeId) -> Option<VolumeStats> {
        let v = self.volume(*self.index.get(&volume)?)?;
        let mut s = v.stats.clone();
        s.queued = v.queue.len();
        Some(s)
    }

    /// Completion counters of one client, across all volumes (None if it never
    /// completed a request).
    pub fn client_stats(&self, client: ClientId) -> Option<ClientStats> {
        self.clients.get(&client).cloned()
    }

    pub fn policy(&self, volume: VolumeId) -> Option<&Policy> {
        Some(&self.volume(*self.index.get(&volume)?)?.policy)
    }

    /// The volumes, in no particular order.
    pub fn volumes(&self) -> impl Iterator<Item = VolumeId> + '_ {
        self.index.keys().copied()
    }

    /// The latency target (ns) of a protectable volume — mission- or
    /// business-critical with a target — and `None` for every other volume.
    pub fn protected_target_ns(&self, volume: VolumeId) -> Option<Nanos> {
        self.volume(*self.index.get(&volume)?)?
            .rates
            .protected_target_ns
    }

    /// The volume's latency EWMA in ms (None before its first completion).
    pub fn latency_ewma_ms(&self, volume: VolumeId) -> Option<f64> {
        self.volume(*self.index.get(&volume)?)?
            .latency_ewma_ns
            .map(|e| e / 1e6)
    }

    /// Whether the volume is backlogged and at risk of missing its latency target at
    /// `now` (see the module docs).
    pub fn at_risk(&self, now: Nanos, volume: VolumeId) -> bool {
        let Some(v) = self.index.get(&volume).and_then(|&s| self.volume(s)) else {
            return false;
        };
        let Some(oldest) = v.queue.oldest_enqueued_at() else {
            return false;
        };
        v.ewma_at_risk
            || v.rates
                .risk_age_ns
                .is_some_and(|age| now.saturating_sub(oldest) >= age)
    }

    fn volume(&self, slot: u32) -> Option<&Volume<T>> {
        self.volumes.get(slot as usize)?.as_ref()
    }

    fn volume_mut(&mut self, slot: u32) -> Option<&mut Volume<T>> {
        self.volumes.get_mut(slot as usize)?.as_mut()
    }

    /// The most important service level with an at-risk backlogged volume.
    /// The service-level rank of the volume in `slot` (lowest rank if it is gone).
    fn volume_rank(&self, slot: u32) -> usize {
        self.volumes
            .get(slot as usize)
            .and_then(Option::as_ref)
            .map_or(LEVELS - 1, |v| v.rates.rank)
    }

    /// A release of `units` made while protection holds levels back: a held-back
    /// one (`floor`) spends `HELD_BACK_EVERY - 1` times its units of the held-back
    /// levels' credit, any other earns its units, up to one release's worth.
    fn charge_held_back_credit(&mut self, slot: u32, units: u64, floor: bool) {
        let units = i64::try_from(units).unwrap_or(i64::MAX);
        let banked = i64::from(HELD_BACK_EVERY - 1);
        self.held_back_credit = if floor {
            if let Some(v) = self.volume_mut(slot) {
                v.stats.held_back_dispatches += 1;
            }
            self.held_back_credit
                .saturating_sub(units.saturating_mul(banked))
        } else {
            self.held_back_credit.saturating_add(units).min(banked)
        };
    }

    fn protected_rank(&self, now: Nanos) -> Option<usize> {
        (0..PROTECTABLE_LEVELS).find(|&rank| {
            self.ewma_at_risk_backlogged[rank] > 0
                || self.age_risk_heaps[rank]
                    .peek()
                    .is_some_and(|(deadline, _)| deadline <= now as u128)
        })
    }

    /// An idle volume became backlogged: restart its tags (no banked credit).
    fn activate(&mut self, slot: u32, now: Nanos) {
        let vtime = self.share_vtime;
        let now_t = ticks(now);
        let shift = self.r_shift;
        if let Some(v) = self.volume_mut(slot) {
            let floor = now_t.saturating_sub(v.rates.burst_ticks);
            v.next_r = v.next_r.max(floor.saturating_sub(shift));
            // The 10 ms limit slack covers late dispatch calls while backlogged, not
            // idle time: after idling only `burst_seconds` of credit remain.
            v.next_l = v.next_l.max(floor);
            // Share credit is lost only by a volume that was idle: nothing queued
            // and nothing in flight (SFQ(D)). A closed-loop client whose queue
            // empties between a completion and its next request keeps its place.
            if v.in_flight == 0 {
                v.next_p = v.next_p.max(vtime);
            }
        }
        self.place(slot, now);
    }

    /// Puts a backlogged volume into the heaps its tags call for.
    fn place(&mut self, slot: u32, now: Nanos) {
        self.refresh(slot, now);
    }

    /// Updates the heap entries of a backlogged volume after its tags or head changed.
    fn refresh(&mut self, slot: u32, now: Nanos) {
        let Some(v) = self.volumes.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        let Some(oldest) = v.queue.oldest_enqueued_at() else {
            return;
        };
        let rank = v.rates.rank;
        let held = v.rates.has_limit() && v.next_l > ticks(now);
        // Risk is tracked for eligible protectable volumes only: a volume held back by
        // its own limit cannot be helped by reordering.
        match v.rates.risk_age_ns {
            Some(age) if !held => {
                self.age_risk_heaps[rank].set(slot, oldest as u128 + age as u128);
                if !v.risk_tracked && v.ewma_at_risk {
                    self.ewma_at_risk_backlogged[rank] += 1;
                }
                v.risk_tracked = true;
            }
            _ => {
                if v.risk_tracked {
                    self.age_risk_heaps[rank].remove(slot);
                    if v.ewma_at_risk {
                        self.ewma_at_risk_backlogged[rank] -= 1;
                    }
                    v.risk_tracked = false;
                }
            }
        }
        if held {
            self.held_heap.set(slot, v.next_l);
            self.ready_heaps[rank].remove(slot);
            self.reservation_heap.remove(slot);
        } else {
            self.held_heap.remove(slot);
            self.ready_heaps[rank].set(slot, v.next_p);
            if v.rates.has_reservation() {
                self.reservation_heap.set(slot, v.next_r);
            } else {
                self.reservation_heap.remove(slot);
            }
        }
    }

    /// Takes a volume out of every heap (its queue emptied, or its policy changes).
    fn unplace(&mut self, slot: u32) {
        let Some(v) = self.volumes.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        let rank = v.rates.rank;
        if v.risk_tracked {
            self.age_risk_heaps[rank].remove(slot);
            if v.ewma_at_risk {
                self.ewma_at_risk_backlogged[rank] -= 1;
            }
            v.risk_tracked = false;
        }
        self.reservation_heap.remove(slot);
        self.held_heap.remove(slot);
        self.ready_heaps[rank].remove(slot);
    }

    /// Releases the head request of `slot` and advances its tags.
    fn release(
        &mut self,
        slot: u32,
        now: Nanos,
        phase: Phase,
        protected: bool,
    ) -> Option<Dispatched<T>> {
        let now_t = ticks(now);
        let config = &self.config;
        let held_back_vtime = self.held_back_vtime;
        let v = self.volumes.get_mut(slot as usize)?.as_mut()?;
        let held_back = held_back_vtime[v.rates.rank];
        let rates = &v.rates;
        let (client, piece, kind, enqueued_at, payload) = v.queue.take(
            |kind| rates.max_piece_length(config, kind),
            |kind, length| {
                config.units(IoCost {
                    kind,
                    size_bytes: length,
                })
            },
        )?;
        let cost = IoCost {
            kind,
            size_bytes: piece.length,
        };
        let units = config.units(cost);
        let bytes = config.charged_bytes(cost);
        let limit_bytes = if bytes == 0 {
            config.min_limit_bytes()
        } else {
            bytes
        };
        if phase == Phase::Reservation {
            v.last_r = Some(LastRelease {
                base: v.next_r,
                units,
                bytes,
            });
            v.next_r += v.rates.reservation_increment(units, bytes);
            v.stats.reservation_dispatches += 1;
        }
        let l_base = v
            .next_l
            .max(now_t.saturating_sub(v.rates.limit_slack_ticks));
        v.last_l = Some(LastRelease {
            base: l_base,
            units,
            bytes: limit_bytes,
        });
        v.next_l = l_base + v.rates.limit_increment(units, limit_bytes);
        // Protected releases are charged and move the virtual time like any other,
        // so the protected volumes keep their shares among themselves and owe
        // nothing afterwards; a volume protection held back banks no credit for that
        // time (as an idle one banks none): its share releases start no earlier than
        // the virtual time of the last release made while it waited.
        let p_base = match phase {
            Phase::Share => v.next_p.max(held_back),
            _ => v.next_p,
        };
        v.last_p = Some(LastRelease {
            base: p_base,
            units,
            bytes,
        });
        v.next_p = p_base + v.rates.share_increment(units);
        if protected {
            v.stats.protected_dispatches += 1;
        }
        v.stats.dispatched_ios += 1;
        v.stats.dispatched_bytes += cost.bytes();
        v.stats.dispatched_units += units;
        v.stats.dispatched_charged_bytes += limit_bytes;
        let volume = v.id;
        let now_empty = v.queue.is_empty();
        if phase == Phase::Share {
            self.share_vtime = self.share_vtime.max(p_base);
        }
        if piece.last {
            self.queued -= 1;
            v.in_flight += 1;
        }
        if now_empty {
            self.unplace(slot);
        } else {
            self.refresh(slot, now);
        }
        Some(Dispatched {
            volume,
            client,
            cost,
            piece,
            enqueued_at,
            phase,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NANOS_PER_MS, NANOS_PER_SEC, ServiceLevel, Shares};

    const MS: Nanos = NANOS_PER_MS;
    const KIB4: u32 = 4096;

    fn policy(name: &str) -> Policy {
        Policy::best_effort(name)
    }

    fn with_limit(iops: f64) -> Policy {
        Policy {
            limit_iops: Some(iops),
            ..policy("limited")
        }
    }

    fn sched() -> Scheduler<u32> {
        Scheduler::new(SchedulerConfig::default())
    }

    fn fill(s: &mut Scheduler<u32>, now: Nanos, volume: u32, n: u32) {
        for i in 0..n {
            s.enqueue(
                now,
                VolumeId(volume),
                ClientId(volume),
                IoCost::read(KIB4),
                i,
            )
            .unwrap();
        }
    }

    fn io(d: Dispatch<u32>) -> Dispatched<u32> {
        match d {
            Dispatch::Io(d) => d,
            other => panic!("expected Io, got {other:?}"),
        }
    }

    #[test]
    fn the_64_bit_share_increment_is_the_128_bit_quotient() {
        let mut r = Rates::from_policy(&policy("p"), &SchedulerConfig::default());
        for shares in [
            1u128,
            3,
            7,
            200,
            1000,
            4000,
            65_535,
            u32::MAX as u128,
            1 << 70,
        ] {
            r.shares = shares;
            for units in [0, 1, 2, 255, 256, 4097, (1 << 24) - 1, 1 << 24, 1 << 40] {
                let want = units as u128 * SHARE_SCALE / r.shares;
                assert_eq!(
                    r.share_increment(units),
                    want,
                    "{units} units, {shares} shares"
                );
            }
        }
    }

    #[test]
    fn cost_units_round_up_by_cost_unit() {
        assert_eq!(IoCost::read(4096).units(4096), 1);
        assert_eq!(IoCost::read(4097).units(4096), 2);
        assert_eq!(IoCost::write(1 << 20).units(4096), 256);
        assert_eq!(IoCost::read(0).units(4096), 1);
        assert_eq!(IoCost::read(512).units(4096), 1);
        assert_eq!(
            IoCost {
                kind: IoKind::Other,
                size_bytes: 1 << 20
            }
            .units(4096),
            1
        );
        assert_eq!(
            IoCost {
                kind: IoKind::Other,
                size_bytes: 1 << 20
            }
            .bytes(),
            0
        );
        assert_eq!(IoCost::read(1 << 20).units(u32::MAX), 1);
        assert_eq!(IoCost::read(1 << 20).units(0), 1);
    }

    #[test]
    fn increments_take_the_generous_reservation_and_the_strict_limit() {
        let p = Policy {
            reservation_iops: Some(1000.0),
            reservation_mbps: Some(8.192),
            limit_iops: Some(2000.0),
            limit_mbps: Some(16.384),
            ..policy("both")
        };
        let c = SchedulerConfig::default();
        let r = Rates::from_policy(&p, &c);
        let ns = |t: u128| t as f64 / TICKS_PER_NS;
        // 4 KiB: reservation IOPS 1 ms, bandwidth 0.5 ms → the smaller, 0.5 ms;
        // limit: IOPS 0.5 ms, bandwidth 0.25 ms → the larger, 0.5 ms.
        assert!((ns(r.reservation_increment(1, 4096)) - 500_000.0).abs() < 1.0);
        assert!((ns(r.limit_increment(1, 4096)) - 500_000.0).abs() < 1.0);
        // 64 KiB: IOPS 16 ms, bandwidth 8 ms → reservation 8 ms; limit IOPS 8 ms, bw 4 ms → 8 ms.
        assert!((ns(r.reservation_increment(16, 65536)) - 8_000_000.0).abs() < 1.0);
        assert!((ns(r.limit_increment(16, 65536)) - 8_000_000.0).abs() < 1.0);
        // No data moved: the MB/s figures do not apply.
        assert!((ns(r.reservation_increment(1, 0)) - 1_000_000.0).abs() < 1.0);
        let bw_only = Rates::from_policy(
            &Policy {
                limit_mbps: Some(10.0),
                ..policy("bw")
            },
            &c,
        );
        // (The scheduler charges a request that moves no data one cost unit of bytes
        // against a MB/s limit: see `min_limit_bytes`.)
        assert_eq!(bw_only.limit_increment(1, 0), 0);
        // Shares: units / shares.
        let low = Rates::from_policy(
            &Policy {
                shares: Shares::LOW,
                ..policy("low")
            },
            &c,
        );
        let high = Rates::from_policy(
            &Policy {
                shares: Shares::HIGH,
                ..policy("high")
            },
            &c,
        );
        assert!(low.share_increment(1).abs_diff(4 * high.share_increment(1)) < 4);
        assert!(
            low.share_increment(256)
                .abs_diff(256 * low.share_increment(1))
                < 256
        );
    }

    #[test]
    fn reservation_phase_comes_first_then_shares() {
        let mut s = sched();
        s.add_volume(
            0,
            VolumeId(1),
            Policy {
                reservation_iops: Some(100.0),
                shares: Shares::new(200).unwrap(),
                ..policy("r")
            },
        );
        s.add_volume(
            0,
            VolumeId(2),
            Policy {
                shares: Shares::new(4000).unwrap(),
                ..policy("s")
            },
        );
        fill(&mut s, 0, 2, 50);
        fill(&mut s, 0, 1, 50);
        let first = io(s.dispatch(0));
        assert_eq!(
            (first.volume, first.phase),
            (VolumeId(1), Phase::Reservation)
        );
        // Its next reservation tag is 10 ms away; volume 2's 20× shares win the weight phase.
        let mut counts = [0; 3];
        for _ in 0..20 {
            let d = io(s.dispatch(1));
            assert_eq!(d.phase, Phase::Share);
            counts[d.volume.0 as usize] += 1;
        }
        assert_eq!(counts, [0, 0, 20]);
        let d = io(s.dispatch(10 * MS));
        assert_eq!((d.volume, d.phase), (VolumeId(1), Phase::Reservation));
        assert_eq!(s.stats(VolumeId(1)).unwrap().reservation_dispatches, 2);
    }

    #[test]
    fn weight_phase_service_does_not_delay_the_reservation() {
        let mut s = sched();
        s.add_volume(
            0,
            VolumeId(1),
            Policy {
                reservation_iops: Some(100.0),
                ..policy("r")
            },
        );
        fill(&mut s, 0, 1, 100);
        assert_eq!(io(s.dispatch(0)).phase, Phase::Reservation);
        for _ in 0..20 {
            assert_eq!(io(s.dispatch(MS)).phase, Phase::Share);
        }
        // Twenty spare-capacity releases later the reservation is still owed at 10 ms.
        assert_eq!(io(s.dispatch(10 * MS)).phase, Phase::Reservation);
    }

    #[test]
    fn limit_holds_requests_and_reports_when_to_come_back() {
        let mut s = sched();
        s.add_volume(0, VolumeId(1), with_limit(100.0));
        fill(&mut s, 0, 1, 3);
        io(s.dispatch(0));
        assert!(matches!(s.dispatch(0), Dispatch::WaitUntil(t) if t == 10 * MS));
        assert!(matches!(s.dispatch(9 * MS), Dispatch::WaitUntil(t) if t == 10 * MS));
        io(s.dispatch(10 * MS));
        io(s.dispatch(20 * MS));
        assert!(matches!(s.dispatch(20 * MS), Dispatch::Idle));
        assert_eq!(s.queued(), 0);
    }

    #[test]
    fn a_limit_held_volume_never_blocks_others() {
        let mut s = sched();
        s.add_volume(
            0,
            VolumeId(1),
            Policy {
                shares: Shares::new(4000).unwrap(),
                ..with_limit(100.0)
            },
        );
        s.add_volume(
            0,
            VolumeId(2),
            Policy {
                shares: Shares::new(200).unwrap(),
                ..policy("b")
            },
        );
        fill(&mut s, 0, 1, 10);
        fill(&mut s, 0, 2, 10);
        assert_eq!(io(s.dispatch(0)).volume, VolumeId(1));
        for _ in 0..10 {
            assert_eq!(io(s.dispatch(MS)).volume, VolumeId(2));
        }
        assert!(matches!(s.dispatch(MS), Dispatch::WaitUntil(t) if t == 10 * MS));
    }

    #[test]
    fn shares_split_releases_in_ratio_and_by_size() {
        let mut s = sched();
        s.add_volume(
            0,
            VolumeId(1),
            Policy {
                shares: Shares::HIGH,
                ..policy("a")
            },
        );
        s.add_volume(
            0,
            VolumeId(2),
            Policy {
                shares: Shares::NORMAL,
                ..policy("b")
            },
        );
        s.add_volume(
            0,
            VolumeId(3),
            Policy {
                shares: Shares::NORMAL,
                ..policy("c")
            },
        );
        fill(&mut s, 0, 1, 1000);
        fill(&mut s, 0, 2, 1000);
        // Volume 3 issues 16 KiB requests: 4 units each.
        for i in 0..1000 {
            s.enqueue(0, VolumeId(3), ClientId(3), IoCost::read(16384), i)
                .unwrap();
        }
        let mut units = [0u64; 4];
        for _ in 0..900 {
            let d = io(s.dispatch(0));
            units[d.volume.0 as usize] += d.cost.units(4096);
        }
        let total: u64 = units.iter().sum();
        for (v, expected) in [(1, 0.5), (2, 0.25), (3, 0.25)] {
            let got = units[v] as f64 / total as f64;
            assert!(
                (got - expected).abs() < 0.01,
                "volume {v}: {got} of units, expected {expected}"
            );
        }
    }

    #[test]
    fn an_idle_volume_banks_no_credit() {
        let mut s = sched();
        s.add_volume(0, VolumeId(1), with_limit(100.0));
        fill(&mut s, 0, 1, 1);
        io(s.dispatch(0));
        // Five idle seconds later, only one request goes at once; the next waits 10 ms.
        fill(&mut s, 5 * NANOS_PER_SEC, 1, 5);
        io(s.dispatch(5 * NANOS_PER_SEC));
        assert!(
            matches!(s.dispatch(5 * NANOS_PER_SEC), Dispatch::WaitUntil(t) if t == 5 * NANOS_PER_SEC + 10 * MS)
        );
        // Same for shares: a volume idle while another ran does not get to catch up.
        let mut s = sched();
        s.add_volume(0, VolumeId(1), policy("a"));
        s.add_volume(0, VolumeId(2), policy("b"));
        fill(&mut s, 0, 1, 200);
        for _ in 0..100 {
            io(s.dispatch(0));
        }
        fill(&mut s, 0, 2, 100);
        let mut counts = [0u32; 3];
        for _ in 0..100 {
            counts[io(s.dispatch(0)).volume.0 as usize] += 1;
        }
        assert!(counts[1].abs_diff(counts[2]) <= 1, "{counts:?}");
    }

    #[test]
    fn burst_seconds_allow_a_bounded_burst_after_idling() {
        let mut s = sched();
        s.add_volume(
            0,
            VolumeId(1),
            Policy {
                burst_seconds: 0.1,
                ..with_limit(100.0)
            },
        );
        fill(&mut s, 10 * NANOS_PER_SEC, 1, 30);
        let now = 10 * NANOS_PER_SEC;
        let mut immediate = 0;
        while let Dispatch::Io(_) = s.dispatch(now) {
            immediate += 1;
        }
        // 0.1 s × 100 IOPS of credit, plus the request the tag allows at `now`.
        assert_eq!(immediate, 11);
    }

    #[test]
    fn the_limit_keeps_at_most_ten_ms_of_lag() {
        let mut s = sched();
        s.add_volume(0, VolumeId(1), with_limit(1000.0));
        fill(&mut s, 0, 1, 100);
        io(s.dispatch(0));
        // The driver comes back late (device busy): 10 ms of lag are kept, the rest lost.
        let late = 50 * MS;
        let mut immediate = 0;
        while let Dispatch::Io(_) = s.dispatch(late) {
            immediate += 1;
        }
        assert_eq!(immediate, 11);
    }

    #[test]
    fn set_policy_retags_queued_requests() {
        let mut s = sched();
        s.add_volume(0, VolumeId(1), with_limit(16.0));
        fill(&mut s, 0, 1, 20);
        io(s.dispatch(0));
        assert!(matches!(s.dispatch(0), Dispatch::WaitUntil(t) if t == 62_500_000));
        s.set_policy(MS, VolumeId(1), with_limit(1000.0));
        // The head is now due 1 ms after the last release, not 62.5 ms.
        io(s.dispatch(MS));
        io(s.dispatch(2 * MS));
        assert!(matches!(s.dispatch(2 * MS), Dispatch::WaitUntil(t) if t == 3 * MS));
        // And the other way: back to a tight limit holds the queue at once.
        s.set_policy(2 * MS, VolumeId(1), with_limit(16.0));
        assert!(matches!(s.dispatch(3 * MS), Dispatch::WaitUntil(t) if t == 2 * MS + 62_500_000));
        // Removing the limit releases everything.
        s.set_policy(3 * MS, VolumeId(1), policy("free"));
        let mut n = 0;
        while let Dispatch::Io(_) = s.dispatch(3 * MS) {
            n += 1;
        }
        assert_eq!(n, 17);
    }

    #[test]
    fn remove_volume_returns_payloads_and_unknown_volumes_are_errors() {
        let mut s = sched();
        s.add_volume(0, VolumeId(1), policy("a"));
        s.add_volume(0, VolumeId(2), with_limit(100.0));
        fill(&mut s, 0, 1, 3);
        fill(&mut s, 0, 2, 2);
        assert_eq!(s.queued(), 5);
        assert_eq!(s.remove_volume(VolumeId(1)), vec![0, 1, 2]);
        assert_eq!(s.queued(), 2);
        assert!(s.remove_volume(VolumeId(1)).is_empty());
        let err = s
            .enqueue(0, VolumeId(1), ClientId(1), IoCost::read(KIB4), 9)
            .unwrap_err();
        assert_eq!(err, PolicyError::UnknownVolume(1));
        assert_eq!(err.to_string(), "no volume 1");
        assert!(s.stats(VolumeId(1)).is_none());
        // The slot is reused cleanly.
        s.add_volume(0, VolumeId(3), policy("c"));
        fill(&mut s, 0, 3, 1);
        let d = io(s.dispatch(0));
        assert!(d.volume == VolumeId(2) || d.volume == VolumeId(3));
        assert!(matches!(
            s.try_add_volume(0, VolumeId(3), policy("c")),
            Err(PolicyError::VolumeExists(3))
        ));
        assert!(
            s.try_add_volume(
                0,
                VolumeId(4),
                Policy {
                    limit_iops: Some(1.0),
                    ..policy("bad")
                }
            )
            .is_err()
        );
    }

    #[test]
    fn stats_count_per_volume_and_per_client() {
        let mut s = sched();
        s.add_volume(0, VolumeId(1), policy("a"));
        s.enqueue(0, VolumeId(1), ClientId(7), IoCost::read(8192), 0)
            .unwrap();
        s.enqueue(0, VolumeId(1), ClientId(8), IoCost::other(), 1)
            .unwrap();
        assert_eq!(s.stats(VolumeId(1)).unwrap().queued, 2);
        let a = io(s.dispatch(0));
        let b = io(s.dispatch(0));
        s.complete(2 * MS, a.volume, a.client, a.cost, 2 * MS);
        s.complete(3 * MS, b.volume, b.client, b.cost, 3 * MS);
        let st = s.stats(VolumeId(1)).unwrap();
        assert_eq!(
            (
                st.queued,
                st.dispatched_ios,
                st.dispatched_bytes,
                st.completed_ios,
                st.completed_bytes,
                st.dispatched_units,
                st.dispatched_charged_bytes
            ),
            (0, 2, 8192, 2, 8192, 3, 8192 + 4096)
        );
        assert_eq!(st.latency_sum_ns, 5 * MS as u128);
        assert_eq!(
            s.client_stats(ClientId(7)),
            Some(ClientStats {
                ios: 1,
                bytes: 8192,
                latency_sum_ns: 2 * MS as u128
            })
        );
        assert_eq!(
            s.client_stats(ClientId(8)),
            Some(ClientStats {
                ios: 1,
                bytes: 0,
                latency_sum_ns: 3 * MS as u128
            })
        );
        assert_eq!(s.client_stats(ClientId(9)), None);
        assert!((s.latency_ewma_ms(VolumeId(1)).unwrap() - 2.125).abs() < 1e-9);
    }

    fn critical(target_ms: f64) -> Policy {
        Policy {
            service_level: Some(ServiceLevel::MissionCritical),
            latency_target_ms: Some(target_ms),
            ..policy("mc")
        }
    }

    #[test]
    fn protection_by_queue_age_serves_the_critical_volume_first() {
        let mut s = sched();
        let low = Shares::new(200).unwrap();
        let high = Shares::new(4000).unwrap();
        s.add_volume(
            0,
            VolumeId(1),
            Policy {
                shares: low,
                ..critical(10.0)
            },
        );
        s.add_volume(
            0,
            VolumeId(2),
            Policy {
                service_level: Some(ServiceLevel::NonCritical),
                shares: high,
                ..policy("nc")
            },
        );
        fill(&mut s, 0, 2, 100);
        for _ in 0..10 {
            assert_eq!(io(s.dispatch(0)).volume, VolumeId(2));
        }
        fill(&mut s, MS, 1, 5);
        // Fresh volume 1 starts at the virtual time and gets one request; then its
        // 200 shares against 4000 put it 20 requests of volume 2 behind.
        assert_eq!(io(s.dispatch(2 * MS)).volume, VolumeId(1));
        assert!(!s.at_risk(2 * MS, VolumeId(1)));
        for _ in 0..5 {
            assert_eq!(io(s.dispatch(2 * MS)).volume, VolumeId(2));
        }
        // At 3.5 ms its head has waited 2.5 ms = 25 % of its 10 ms target: it goes first.
        let t = 3 * MS + MS / 2;
        assert!(s.at_risk(t, VolumeId(1)));
        for _ in 0..4 {
            let d = io(s.dispatch(t));
            assert_eq!((d.volume, d.phase), (VolumeId(1), Phase::Share));
        }
        assert_eq!(s.stats(VolumeId(1)).unwrap().protected_dispatches, 4);
        assert_eq!(s.stats(VolumeId(2)).unwrap().protected_dispatches, 0);
        assert_eq!(io(s.dispatch(t)).volume, VolumeId(2));
    }

    /// Volume 1 mission-critical (10 ms target), 2 business-critical (20 ms), 3
    /// best-effort (non-critical).
    fn three_levels() -> Scheduler<u32> {
        let mut s = sched();
        let business = Policy {
            service_level: Some(ServiceLevel::BusinessCritical),
            latency_target_ms: Some(20.0),
            ..policy("bc")
        };
        s.add_volume(0, VolumeId(1), critical(10.0));
        s.add_volume(0, VolumeId(2), business);
        s.add_volume(0, VolumeId(3), policy("nc"));
        s
    }

    #[test]
    fn protection_by_latency_ewma_and_levels_in_order() {
        let mut s = three_levels();
        // Completions at 12 ms put the business-critical volume at risk (≥ 10 ms).
        for _ in 0..4 {
            s.complete(0, VolumeId(2), ClientId(2), IoCost::read(KIB4), 12 * MS);
        }
        fill(&mut s, 0, 3, 10);
        fill(&mut s, 0, 2, 4);
        assert!(s.at_risk(0, VolumeId(2)));
        let order: Vec<u32> = (0..6).map(|_| io(s.dispatch(0)).volume.0).collect();
        assert_eq!(order, [2, 2, 2, 2, 3, 3]);
        // Now both critical levels are at risk: mission-critical goes before business.
        for _ in 0..4 {
            s.complete(0, VolumeId(1), ClientId(1), IoCost::read(KIB4), 9 * MS);
        }
        fill(&mut s, 0, 2, 3);
        fill(&mut s, 0, 1, 3);
        let order: Vec<u32> = (0..8).map(|_| io(s.dispatch(0)).volume.0).collect();
        assert_eq!(order, [1, 1, 1, 2, 2, 2, 3, 3]);
        // Fast completions clear the risk: ordinary shares again.
        for _ in 0..40 {
            s.complete(0, VolumeId(2), ClientId(2), IoCost::read(KIB4), MS);
        }
        assert!(!s.at_risk(0, VolumeId(2)));
    }

    /// Found in `mixed-workload` (session 23): the VDI pool on business-critical
    /// `VDT-C` waited 72 s for its first boot reads while `VDT-B`, of the same level,
    /// was served. A protected release charged its share tag from the virtual time,
    /// which only unprotected releases move; with a non-critical volume backlogged
    /// (held back, so it pinned the virtual time) every protected release landed at
    /// the same tag, and a protected volume whose tag was one request further on
    /// never came first.
    #[test]
    fn protection_keeps_shares_within_the_protected_levels_and_banks_no_credit() {
        let mut s = sched();
        let business = |shares: u32| Policy {
            service_level: Some(ServiceLevel::BusinessCritical),
            latency_target_ms: Some(20.0),
            shares: Shares::new(shares).unwrap(),
            ..policy("bc")
        };
        s.add_volume(0, VolumeId(1), business(2000));
        s.add_volume(0, VolumeId(2), business(200));
        s.add_volume(0, VolumeId(3), policy("nc"));
        fill(&mut s, 0, 3, 1000);
        fill(&mut s, 0, 2, 1000);
        fill(&mut s, 0, 1, 1000);
        // Volume 1's completions at 12 ms put its level at risk (≥ half its target).
        for _ in 0..4 {
            s.complete(0, VolumeId(1), ClientId(1), IoCost::read(KIB4), 12 * MS);
        }
        assert!(s.at_risk(0, VolumeId(1)));
        let mut got = [0u32; 4];
        for _ in 0..330 {
            got[io(s.dispatch(0)).volume.0 as usize] += 1;
        }
        // Within the protected level, shares 2000 : 200; the non-critical waits but
        // for one release in 16 (HELD_BACK_EVERY).
        assert_eq!(got[3], 330 / 16, "{got:?}");
        assert!((28..=32).contains(&got[2]), "{got:?}");
        // The risk clears: the non-critical volume gets its share again, and no more
        // than its share for the time it waited (it banked no credit).
        for _ in 0..40 {
            s.complete(0, VolumeId(1), ClientId(1), IoCost::read(KIB4), MS);
        }
        assert!(!s.at_risk(0, VolumeId(1)));
        let mut got = [0u32; 4];
        for _ in 0..320 {
            got[io(s.dispatch(0)).volume.0 as usize] += 1;
        }
        // Shares 2000 : 200 : 1000.
        assert!((95..=105).contains(&got[3]), "{got:?}");
        assert!((190..=210).contains(&got[1]), "{got:?}");
    }

    /// While a higher level is at risk, the levels held back get one release in
    /// [`HELD_BACK_EVERY`], the first of them by share tag.
    #[test]
    fn held_back_levels_keep_one_release_in_sixteen() {
        let mut s = three_levels();
        for _ in 0..4 {
            s.complete(0, VolumeId(1), ClientId(1), IoCost::read(KIB4), 9 * MS);
        }
        fill(&mut s, 0, 1, 1000);
        fill(&mut s, 0, 2, 100);
        fill(&mut s, 0, 3, 100);
        assert!(s.at_risk(0, VolumeId(1)));
        let order: Vec<u32> = (0..64).map(|_| io(s.dispatch(0)).volume.0).collect();
        let held_back: Vec<(usize, u32)> = order
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 1)
            .map(|(i, v)| (i, *v))
            .collect();
        // Every 16th release; business and non-critical alternate by share tag.
        assert_eq!(held_back, [(15, 2), (31, 3), (47, 2), (63, 3)], "{order:?}");
        for v in [2, 3] {
            assert_eq!(s.stats(VolumeId(v)).unwrap().held_back_dispatches, 2);
        }
        assert_eq!(s.stats(VolumeId(1)).unwrap().held_back_dispatches, 0);
        // The risk clears: no more floor, ordinary shares (equal here).
        for _ in 0..40 {
            s.complete(0, VolumeId(1), ClientId(1), IoCost::read(KIB4), MS);
        }
        let mut got = [0u32; 4];
        for _ in 0..90 {
            got[io(s.dispatch(MS)).volume.0 as usize] += 1;
        }
        assert!(got[1..].iter().all(|g| (29..=31).contains(g)), "{got:?}");
    }

    /// The floor is counted in cost units: a held-back volume's 64 KiB reads (16 units
    /// each) beside protected 4 KiB reads get 1/16 of the units, not of the releases.
    #[test]
    fn the_held_back_floor_is_counted_in_cost_units() {
        let mut s = sched();
        s.add_volume(0, VolumeId(1), critical(10.0));
        s.add_volume(0, VolumeId(2), policy("nc"));
        for _ in 0..4 {
            s.complete(0, VolumeId(1), ClientId(1), IoCost::read(KIB4), 9 * MS);
        }
        fill(&mut s, 0, 1, 5000);
        for i in 0..100 {
            s.enqueue(0, VolumeId(2), ClientId(2), IoCost::read(16 * KIB4), i)
                .unwrap();
        }
        let mut units = [0u64; 3];
        for _ in 0..4000 {
            let d = io(s.dispatch(0));
            units[d.volume.0 as usize] += s.config().units(d.cost);
        }
        let share = units[2] as f64 / (units[1] + units[2]) as f64;
        assert!(
            (0.055..=0.07).contains(&share),
            "held-back share of the units {share:.3}: {units:?}"
        );
    }

    #[test]
    fn protection_never_overrides_a_limit() {
        let mut s = sched();
        s.add_volume(
            0,
            VolumeId(1),
            Policy {
                limit_iops: Some(100.0),
                ..critical(10.0)
            },
        );
        s.add_volume(0, VolumeId(2), policy("nc"));
        for _ in 0..4 {
            s.complete(0, VolumeId(1), ClientId(1), IoCost::read(KIB4), 9 * MS);
        }
        fill(&mut s, 0, 1, 5);
        fill(&mut s, 0, 2, 5);
        assert_eq!(io(s.dispatch(0)).volume, VolumeId(1));
        // Held by its limit; the non-critical volume is served meanwhile.
        for _ in 0..5 {
            assert_eq!(io(s.dispatch(MS)).volume, VolumeId(2));
        }
        assert_eq!(io(s.dispatch(10 * MS)).volume, VolumeId(1));
    }

    #[test]
    fn idle_when_empty_and_invalid_figures_are_ignored() {
        let mut s = sched();
        assert!(matches!(s.dispatch(0), Dispatch::Idle));
        // Not validated: a NaN limit is treated as no limit rather than a panic.
        s.add_volume(
            0,
            VolumeId(1),
            Policy {
                limit_iops: Some(f64::NAN),
                reservation_mbps: Some(-3.0),
                ..policy("bad")
            },
        );
        fill(&mut s, 0, 1, 3);
        for _ in 0..3 {
            io(s.dispatch(0));
        }
        assert!(matches!(s.dispatch(0), Dispatch::Idle));
        // Completions for unknown volumes only count for the client.
        s.complete(0, VolumeId(99), ClientId(1), IoCost::read(KIB4), MS);
        assert_eq!(s.client_stats(ClientId(1)).unwrap().ios, 1);
    }
}
