//! Virtual desktops: a pool of linked clones of one golden image, through 004's
//! "week in the life" — creation, power-on, initial / Monday / Tuesday login,
//! application launches, steady work, and the "dripping water" of idle desktops —
//! plus a Login VSI-like timed loop (000).
//!
//! # Layout of the pool's volume
//! `[0, image)` is the golden image every clone reads the same way (a
//! [`SharedRegion`]); after it, each desktop owns an equal private area (its delta
//! disk: profile, writes).
//!
//! # Workers
//! `desktops` foreground workers (login, application launches, VSI loop: closed
//! loop at `task_queue_depth`), `desktops` background workers (open loop: dripping
//! water, or the phase's activity after login; closed loop: the [`Work`] after an
//! initial login), `max_concurrent_power_on` power-on
//! slots and `max_concurrent_create` creation slots (each slot runs desktops one
//! after the other: vCenter's "at most 128 at once, the rest queued"). The limits
//! and the login interval are the whole model's: its instances (pools) deal the
//! slots out between them and interleave their logins.
//!
//! # Calibration (every default below, with its source)
//! * Power-on (004 Table 16, section 5.4, Data ONTAP 8.1): 36,085 read + 5,432 write
//!   ops/s for 21 min over 2,500 desktops = 20,900 I/Os per boot, 87 % reads; read
//!   size 569 MB/s ÷ 36,085 = 15.8 KB, write 56 MB/s ÷ 5,432 = 10.3 KB; 323 ops/s per
//!   booting desktop at 128 in flight. A booting desktop issues one I/O at a time with
//!   `boot_think_us = 1100` between them (3.1 ms per I/O at 004's 2 ms controller
//!   latency). Half of the reads are sequential (004 Fig. 30 text). Boot reads replay
//!   one trace of the image (clones boot the same way), in its first `boot_footprint_mib`.
//! * Login activity, per logged-in desktop, from the "for one VM" rows and the
//!   concurrency rows of 004 Tables 11 (initial), 20 (Monday), 15 (Tuesday): the
//!   share of desktops reading / writing in a second and the IOPS of one active
//!   desktop (the initial login's only gives its read / write proportions: its
//!   desktops work in a closed loop, below). Read sizes mean 19–20 KB, writes
//!   12 KB (initial, Monday) or 8 KB (Tuesday): the bucket weights are Weir's (004's
//!   histograms are images), fitted to those means, with 1 MB writes at 0.3 % (004:
//!   "1MB write operations have been recorded during large file-save operations").
//! * Closed-loop work after the initial login ([`Work::of`]): the per-second activity
//!   of Table 11 is what desktops *got* from a saturated controller (CPU 93-95 %,
//!   51-64 ms at ESX against 0.9-5 ms at the controller, Table 10), not what they
//!   asked. After an initial login each desktop runs 3 chains of dependent I/Os with
//!   an exponential 78 ms of its own work between an I/O's completion and the
//!   chain's next (Table 11's read / write proportions and sizes). CALIBRATION on
//!   Table 9's Data ONTAP 8.0.1 row (27 % good, 35 % fair logins); 8.1's login
//!   times, its IOPS and its latency at ESX are then predictions (docs/FIDELITY.md).
//! * Login task: initial = copy the 1.5 MB default profile and ~22 MB of mail files
//!   (issue 4, 004 section 5.2): 23.5 MB read + 23.5 MB written; Monday = profile read
//!   from disk (1.5 MB) + 0.5 MB written; Tuesday = 0.2 MB each way (in guest memory).
//!   `login_base_s = 0.8`: the login's non-storage time (004 Tables 12, 17: 1 s).
//! * Application launches (004 section 6.2, Microsoft Word): first launch after boot
//!   1,471 reads / 29 MB + 64 writes / 0.3 MB; later launches 34 reads / 0.84 MB +
//!   26 writes / 0.17 MB. `apps_per_login = 3` launches follow each login.
//! * Dripping water (004 section 5.7): just under 1 op/s per idle desktop, ~4 KB
//!   writes, now and then a read: 0.9 writes/s, reads in 5 % of seconds.
//! * Login VSI-like loop (000): every `vsi_interval_s` a timed operation of `vsi_reads`
//!   reads; response = `vsi_base_ms` + its I/O time. VSIbase and VSImax: see
//!   [`vsi_summary`].

use crate::model::{
    GIB, KIB, MIB, ModelMetric, NS_PER_S, SharedRegion, SizeDist, check_range, mix,
};
use crate::{Direction, IoGenerator, IoRequest, Issue, Nanos, ScheduleLog, WorkloadError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Which login the desktops do.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoginKind {
    /// First login: profile creation (004 section 5.2).
    Initial,
    /// After a reboot: profile and libraries read from disk (004 section 5.5).
    Monday,
    /// Libraries still in guest memory (004 section 5.3); also steady state.
    Tuesday,
}

/// Activity of one logged-in desktop in one second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Activity {
    /// Chance that a desktop reads in a given second, %.
    pub read_active_pct: f64,
    /// Chance that it writes in a given second, %.
    pub write_active_pct: f64,
    /// Read IOPS of a desktop in a second it reads.
    pub read_iops: f64,
    pub write_iops: f64,
}

impl Activity {
    fn of(kind: LoginKind) -> Activity {
        match kind {
            // 004 Table 11: 550 of 2,500 reading, 1,780 writing; 28 / 6 IOPS per VM.
            LoginKind::Initial => Activity {
                read_active_pct: 22.0,
                write_active_pct: 71.2,
                read_iops: 28.0,
                write_iops: 6.0,
            },
            // 004 Table 20: 283 reading, 1,662 writing; 37 / 3 IOPS per VM.
            LoginKind::Monday => Activity {
                read_active_pct: 11.3,
                write_active_pct: 66.5,
                read_iops: 37.0,
                write_iops: 3.0,
            },
            // 004 Table 15: 92 reading, 1,572 writing; 13 / 2 IOPS per VM.
            LoginKind::Tuesday => Activity {
                read_active_pct: 3.7,
                write_active_pct: 62.9,
                read_iops: 13.0,
                write_iops: 2.0,
            },
        }
    }

    fn dripping() -> Activity {
        Activity {
            read_active_pct: 5.0,
            write_active_pct: 100.0,
            read_iops: 1.0,
            write_iops: 0.9,
        }
    }
}

/// Closed-loop work of a logged-in desktop: its applications as `streams` chains
/// of dependent I/Os, each waiting an exponential `think_ms` (the desktop's own
/// work) after an I/O completes before it issues the next. Reads and writes come
/// in the phase's activity's proportions, sizes from `read_sizes` / `write_sizes`.
/// The per-second [`Activity`] is what 004's tables measured the desktops *got*;
/// this is what they *ask*: when storage is slow they get less, and the queue they
/// build is the latency they see (004's initial login: a saturated controller,
/// 51-64 ms at ESX against 0.9-1.2 ms at the controller).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Work {
    /// Chains of dependent I/Os per desktop (its outstanding I/Os at most); 0: no
    /// closed-loop work, the per-second activity instead.
    pub streams: u32,
    /// Mean time between an I/O's completion and the chain's next I/O, ms.
    #[serde(default)]
    pub think_ms: f64,
}

impl Work {
    /// The default work after each login. Only the initial login has one: its
    /// controller was saturated (004 Table 10: CPU 93-95 %, ESX latency 51-64 ms),
    /// so what its desktops got (Table 11) is not what they asked. CALIBRATION on
    /// 004 Table 9's Data ONTAP 8.0.1 row (27 % good, 35 % fair logins): a grid over
    /// 2-4 streams and 30-130 ms (docs/FIDELITY.md); 8.1's login figures are then
    /// predictions. The Monday and Tuesday logins left their controller below
    /// saturation (Tables 19, 14: 61-73 %, 23 %): their activity is what the
    /// desktops asked.
    fn of(kind: LoginKind) -> Option<Work> {
        match kind {
            LoginKind::Initial => Some(Work {
                streams: 3,
                think_ms: 78.0,
            }),
            LoginKind::Monday | LoginKind::Tuesday => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VdiSpec {
    pub name: String,
    /// Desktops in this pool (one instance of the model).
    pub desktops: u32,
    /// Golden image size, GiB (000: 24 GB master image).
    #[serde(default = "d_image")]
    pub image_gib: f64,
    /// Start of cloning, s on the driver's clock (none: the desktops exist).
    #[serde(default)]
    pub create_at_s: Option<f64>,
    #[serde(default = "d_create_slots")]
    pub max_concurrent_create: u32,
    /// Non-storage time to create one clone, s.
    #[serde(default = "d_create_base")]
    pub create_base_s: f64,
    #[serde(default = "d_create_mib")]
    pub create_write_mib: f64,
    /// Start of the mass power-on, s (none: the desktops are running).
    #[serde(default)]
    pub power_on_at_s: Option<f64>,
    /// vCenter's limit on concurrent power-on operations (004: 128), over all the
    /// model's instances.
    #[serde(default = "d_boot_slots")]
    pub max_concurrent_power_on: u32,
    #[serde(default = "d_boot_ios")]
    pub boot_ios: u32,
    #[serde(default = "d_boot_read_pct")]
    pub boot_read_pct: f64,
    #[serde(default = "d_boot_think")]
    pub boot_think_us: f64,
    #[serde(default = "d_boot_footprint")]
    pub boot_footprint_mib: f64,
    /// Which login, if any.
    #[serde(default)]
    pub login: Option<LoginKind>,
    /// First login, s.
    #[serde(default)]
    pub login_at_s: f64,
    /// Time between two logins of the whole model (all instances), s (004: the last
    /// of 2,500 logins 26 min after the first → 0.624 s; 000: 20 s).
    #[serde(default = "d_login_interval")]
    pub login_interval_s: f64,
    #[serde(default = "d_login_base")]
    pub login_base_s: f64,
    #[serde(default = "d_apps")]
    pub apps_per_login: u32,
    /// Desktops that are already logged in and working at start (steady state).
    #[serde(default)]
    pub working_at_start: bool,
    /// Run the Login VSI-like timed loop after login.
    #[serde(default)]
    pub vsi: bool,
    #[serde(default = "d_vsi_interval")]
    pub vsi_interval_s: f64,
    #[serde(default = "d_vsi_reads")]
    pub vsi_reads: u32,
    #[serde(default = "d_vsi_base")]
    pub vsi_base_ms: f64,
    /// Outstanding I/Os of a foreground task (login, launch).
    #[serde(default = "d_task_qd")]
    pub task_queue_depth: u32,
    /// Share of reads that read the golden image (libraries) rather than the
    /// desktop's own area, %.
    #[serde(default = "d_image_read_pct")]
    pub image_read_pct: f64,
    /// Share of reads that continue the previous one, % (004: ~50 %).
    #[serde(default = "d_seq_pct")]
    pub sequential_read_pct: f64,
    /// Override of the phase's activity (default: 004's tables for `login`).
    #[serde(default)]
    pub activity: Option<Activity>,
    /// Override of the closed-loop work after login (default: [`Work::of`] the
    /// login; `{ streams = 0 }`: none). With work, the activity only gives the
    /// read / write proportions.
    #[serde(default)]
    pub work: Option<Work>,
    #[serde(default = "d_read_sizes")]
    pub read_sizes: SizeDist,
    #[serde(default = "d_write_sizes")]
    pub write_sizes: SizeDist,
    /// Write sizes on Tuesday / steady state (004 Table 15: 8 KB mean).
    #[serde(default = "d_small_write_sizes")]
    pub small_write_sizes: SizeDist,
}

fn d_image() -> f64 {
    24.0
}
fn d_create_slots() -> u32 {
    8
}
fn d_create_base() -> f64 {
    34.0
}
fn d_create_mib() -> f64 {
    16.0
}
fn d_boot_slots() -> u32 {
    128
}
fn d_boot_ios() -> u32 {
    20_900
}
fn d_boot_read_pct() -> f64 {
    87.0
}
fn d_boot_think() -> f64 {
    1100.0
}
fn d_boot_footprint() -> f64 {
    512.0
}
fn d_login_interval() -> f64 {
    0.624
}
fn d_login_base() -> f64 {
    0.8
}
fn d_apps() -> u32 {
    3
}
fn d_vsi_interval() -> f64 {
    60.0
}
fn d_vsi_reads() -> u32 {
    8
}
fn d_vsi_base() -> f64 {
    800.0
}
fn d_task_qd() -> u32 {
    2
}
fn d_image_read_pct() -> f64 {
    50.0
}
fn d_seq_pct() -> f64 {
    50.0
}
const K: u32 = 1024;
fn d_read_sizes() -> SizeDist {
    // Mean ≈ 20 KB (004 Tables 11, 15, 20: 19 KB).
    SizeDist(vec![
        (4 * K, 0.50),
        (8 * K, 0.15),
        (16 * K, 0.12),
        (32 * K, 0.10),
        (64 * K, 0.117),
        (128 * K, 0.01),
        (1024 * K, 0.003),
    ])
}
fn d_write_sizes() -> SizeDist {
    // Mean ≈ 12.7 KB (004 Table 11: 12 KB), 1 MB writes at 0.3 %.
    SizeDist(vec![
        (4 * K, 0.70),
        (8 * K, 0.12),
        (16 * K, 0.08),
        (32 * K, 0.05),
        (64 * K, 0.047),
        (1024 * K, 0.003),
    ])
}
fn d_small_write_sizes() -> SizeDist {
    // Mean ≈ 8.3 KB (004 Table 15: 8 KB), mostly 4 KB.
    SizeDist(vec![
        (4 * K, 0.85),
        (8 * K, 0.05),
        (16 * K, 0.04),
        (32 * K, 0.03),
        (64 * K, 0.029),
        (1024 * K, 0.001),
    ])
}

impl VdiSpec {
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.desktops == 0 || self.desktops > 100_000 {
            return Err(WorkloadError::invalid("desktops", "must be 1-100000"));
        }
        check_range("image_gib", self.image_gib, 0.01, 1e4)?;
        for (f, v) in [
            ("create_at_s", self.create_at_s),
            ("power_on_at_s", self.power_on_at_s),
        ] {
            if let Some(v) = v {
                check_range(f, v, 0.0, 1e7)?;
            }
        }
        if self.max_concurrent_create == 0 || self.max_concurrent_power_on == 0 {
            return Err(WorkloadError::invalid(
                "max_concurrent_power_on",
                "concurrency limits must be at least 1",
            ));
        }
        check_range("create_base_s", self.create_base_s, 0.0, 1e5)?;
        check_range("create_write_mib", self.create_write_mib, 0.0, 1e5)?;
        check_range("boot_read_pct", self.boot_read_pct, 0.0, 100.0)?;
        check_range("boot_think_us", self.boot_think_us, 0.0, 1e7)?;
        check_range("boot_footprint_mib", self.boot_footprint_mib, 1.0, 1e6)?;
        if self.boot_footprint_mib * MIB as f64 > self.image_gib * GIB as f64 {
            return Err(WorkloadError::invalid(
                "boot_footprint_mib",
                "the boot footprint must fit in the image",
            ));
        }
        check_range("login_at_s", self.login_at_s, 0.0, 1e7)?;
        check_range("login_interval_s", self.login_interval_s, 0.0, 1e5)?;
        check_range("login_base_s", self.login_base_s, 0.0, 1e4)?;
        check_range("vsi_interval_s", self.vsi_interval_s, 0.1, 1e5)?;
        check_range("vsi_base_ms", self.vsi_base_ms, 0.0, 1e6)?;
        check_range("image_read_pct", self.image_read_pct, 0.0, 100.0)?;
        check_range("sequential_read_pct", self.sequential_read_pct, 0.0, 100.0)?;
        if self.task_queue_depth == 0 || self.task_queue_depth > 256 {
            return Err(WorkloadError::invalid("task_queue_depth", "must be 1-256"));
        }
        if self.apps_per_login > 100 || self.vsi_reads > 10_000 {
            return Err(WorkloadError::invalid(
                "apps_per_login",
                "apps_per_login ≤ 100, vsi_reads ≤ 10000",
            ));
        }
        if let Some(a) = &self.activity {
            check_range("activity.read_active_pct", a.read_active_pct, 0.0, 100.0)?;
            check_range("activity.write_active_pct", a.write_active_pct, 0.0, 100.0)?;
            check_range("activity.read_iops", a.read_iops, 0.0, 10_000.0)?;
            check_range("activity.write_iops", a.write_iops, 0.0, 10_000.0)?;
        }
        if let Some(w) = &self.work {
            if w.streams > 256 {
                return Err(WorkloadError::invalid("work.streams", "must be 0-256"));
            }
            check_range("work.think_ms", w.think_ms, 0.0, 1e6)?;
        }
        self.read_sizes.validate("read_sizes")?;
        self.write_sizes.validate("write_sizes")?;
        self.small_write_sizes.validate("small_write_sizes")?;
        Ok(())
    }

    fn image_bytes(&self) -> u64 {
        (self.image_gib * GIB as f64) as u64 / MIB * MIB
    }

    /// Image plus at least 64 MiB of private area per desktop.
    pub fn min_volume_bytes(&self) -> u64 {
        self.image_bytes() + self.desktops as u64 * 64 * MIB
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Power {
    Absent,
    Off,
    On,
    /// Its creation or power-on failed: it stays down.
    Failed,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum TaskKind {
    Create,
    Boot,
    Login,
    Launch,
    Vsi,
}

#[derive(Clone, Debug)]
struct Task {
    kind: TaskKind,
    desktop: u32,
    started: Nanos,
    reads_left: u32,
    writes_left: u32,
    in_flight: u32,
    /// Next I/O not before (boot think time).
    not_before: Nanos,
    /// Non-storage time added to the task's duration.
    base_ns: Nanos,
    /// Boot: index in the boot trace.
    step: u64,
    read_sizes_mean: Option<u32>,
    /// One of its I/Os failed: it issues no more and ends as failed.
    failed: bool,
}

#[derive(Clone, Debug)]
struct Desktop {
    power: Power,
    logged_in: bool,
    apps_left: u32,
    first_launch: bool,
    vsi_next: Nanos,
    read_cursor: u64,
    image_cursor: u64,
    write_cursor: u64,
    // Background: this second's pending I/Os.
    bg_second_end: Nanos,
    /// Pending I/Os, latest first (the next one is last).
    bg_pending: Vec<(Nanos, Direction)>,
    /// Time of `bg_pending`'s last entry (`Nanos::MAX`: none): most polls only ask
    /// when the next I/O is due, without touching the vector's memory.
    bg_next_ns: Nanos,
    last_read_sec: u64,
    last_write_sec: u64,
    /// Closed-loop work ([`Work`]): when each idle chain issues its next I/O.
    work_ready: Vec<Nanos>,
    /// Its I/Os in flight.
    work_out: u32,
    /// Its login failed: the user does not try again.
    login_failed: bool,
}

#[derive(Clone, Debug, Default)]
struct Counters {
    reads: u64,
    writes: u64,
    read_bytes: u64,
    write_bytes: u64,
    reading: u64,
    writing: u64,
    /// Reads and writes that completed in the second, and their latencies' sum
    /// (ns): what ESXTOP shows of the desktops (004 Tables 11, 15, 20).
    reads_done: u64,
    read_latency_ns: u64,
    writes_done: u64,
    write_latency_ns: u64,
    /// Reads and writes that failed in the second (not in `*_done`).
    failed: u64,
}

impl std::ops::AddAssign<&Counters> for Counters {
    fn add_assign(&mut self, x: &Counters) {
        self.reads += x.reads;
        self.writes += x.writes;
        self.read_bytes += x.read_bytes;
        self.write_bytes += x.write_bytes;
        self.reading += x.reading;
        self.writing += x.writing;
        self.reads_done += x.reads_done;
        self.failed += x.failed;
        self.read_latency_ns += x.read_latency_ns;
        self.writes_done += x.writes_done;
        self.write_latency_ns += x.write_latency_ns;
    }
}

pub(crate) struct VdiModel {
    spec: VdiSpec,
    instance: u32,
    instances: u32,
    image_bytes: u64,
    private_bytes: u64,
    activity: Activity,
    /// The closed-loop work after login, if any.
    work: Option<Work>,
    desktops: Vec<Desktop>,
    /// Foreground task per desktop.
    tasks: Vec<Option<Task>>,
    boot_slots: Vec<Option<Task>>,
    create_slots: Vec<Option<Task>>,
    rng: ChaCha8Rng,
    image_seed: u64,
    logged_in: u32,
    per_second: Vec<Counters>,
    /// (end, duration s) per finished task kind.
    logins: Vec<(Nanos, f64)>,
    login_starts: Vec<Nanos>,
    launches: Vec<(Nanos, f64)>,
    boots: Vec<(Nanos, Nanos)>,
    creates: Vec<(Nanos, Nanos)>,
    /// (time, sessions logged in (whole model), response ms).
    vsi: Vec<(Nanos, u32, f64)>,
    /// (end, kind) of each task that failed (not in the lists above).
    failed_tasks: Vec<(Nanos, TaskKind)>,
}

fn secs(s: f64) -> Nanos {
    (s * NS_PER_S) as Nanos
}

impl VdiModel {
    pub(crate) fn new(
        spec: &VdiSpec,
        volume_bytes: u64,
        seed: u64,
        instance: u32,
        instances: u32,
    ) -> VdiModel {
        let image_bytes = spec.image_bytes();
        let private_bytes = ((volume_bytes - image_bytes) / spec.desktops as u64) / MIB * MIB;
        let power = if spec.create_at_s.is_some() {
            Power::Absent
        } else if spec.power_on_at_s.is_some() {
            Power::Off
        } else {
            Power::On
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let desktops = (0..spec.desktops)
            .map(|d| Desktop {
                power,
                logged_in: spec.working_at_start,
                apps_left: 0,
                first_launch: true,
                vsi_next: if spec.working_at_start && spec.vsi {
                    rng.random_range(0..secs(spec.vsi_interval_s))
                } else {
                    0
                },
                read_cursor: image_bytes + d as u64 * private_bytes,
                image_cursor: 0,
                write_cursor: 0,
                bg_second_end: 0,
                bg_pending: Vec::new(),
                bg_next_ns: Nanos::MAX,
                last_read_sec: u64::MAX,
                last_write_sec: u64::MAX,
                work_ready: Vec::new(),
                work_out: 0,
                login_failed: false,
            })
            .collect();
        // The model's slots, split over its instances (the first `n % instances` get
        // one more), so that together they run `n` at a time.
        let per_instance =
            |n: u32| (n / instances + u32::from(instance < n % instances)).max(1) as usize;
        let activity = spec
            .activity
            .clone()
            .unwrap_or_else(|| Activity::of(spec.login.unwrap_or(LoginKind::Tuesday)));
        let login = spec.login.unwrap_or(LoginKind::Tuesday);
        let work = spec
            .work
            .clone()
            .or_else(|| Work::of(login))
            .filter(|w| w.streams > 0);
        let mut model = VdiModel {
            instance,
            instances,
            image_bytes,
            private_bytes,
            activity,
            work,
            logged_in: if spec.working_at_start {
                spec.desktops
            } else {
                0
            },
            desktops,
            tasks: vec![None; spec.desktops as usize],
            boot_slots: vec![None; per_instance(spec.max_concurrent_power_on)],
            create_slots: vec![None; per_instance(spec.max_concurrent_create)],
            rng,
            // Every clone of the image (every instance) boots the same trace.
            image_seed: mix(spec.image_gib.to_bits() ^ 0x1A6E),
            per_second: Vec::new(),
            logins: Vec::new(),
            login_starts: Vec::new(),
            launches: Vec::new(),
            boots: Vec::new(),
            creates: Vec::new(),
            vsi: Vec::new(),
            failed_tasks: Vec::new(),
            spec: spec.clone(),
        };
        if spec.working_at_start {
            for d in 0..spec.desktops {
                model.start_work(d, 0);
            }
        }
        model
    }

    /// A desktop begins its closed-loop work (if the spec has one) at `at`: every
    /// chain thinks once before its first I/O.
    fn start_work(&mut self, d: u32, at: Nanos) {
        let Some(w) = &self.work else {
            return;
        };
        let (streams, think_ms) = (w.streams, w.think_ms);
        let ready: Vec<Nanos> = (0..streams).map(|_| at + self.think(think_ms)).collect();
        let dk = &mut self.desktops[d as usize];
        dk.work_ready = ready;
        dk.work_out = 0;
    }

    /// An exponential think time of mean `mean_ms`.
    fn think(&mut self, mean_ms: f64) -> Nanos {
        let u: f64 = self.rng.random();
        (-(1.0 - u).ln() * mean_ms * 1e6) as Nanos
    }

    /// The next I/O of a working desktop's closed-loop work: the idle chain that is
    /// ready first, once its think time is over.
    fn poll_work(&mut self, now: Nanos, d: u32) -> Issue {
        let dk = &mut self.desktops[d as usize];
        let Some((i, &at)) = dk.work_ready.iter().enumerate().min_by_key(|x| *x.1) else {
            return Issue::Blocked;
        };
        if at > now {
            return Issue::At(at);
        }
        dk.work_ready.swap_remove(i);
        dk.work_out += 1;
        let a = &self.activity;
        let reads = a.read_active_pct * a.read_iops;
        let writes = a.write_active_pct * a.write_iops;
        let io = if self.rng.random::<f64>() * (reads + writes) < reads {
            let size = self.spec.read_sizes.sample(&mut self.rng);
            self.read_io(d, size)
        } else {
            let size = self.logged_in_write_size();
            self.write_io(d, size)
        };
        self.note_io(now, d, &io);
        Issue::Io(io)
    }

    /// A working desktop's I/O completed: its chain thinks, then goes on.
    fn work_done(&mut self, now: Nanos, d: u32) {
        let Some(think_ms) = self.work.as_ref().map(|w| w.think_ms) else {
            return;
        };
        if self.desktops[d as usize].work_out == 0 {
            return; // a dripping write issued before the login ended
        }
        let at = now + self.think(think_ms);
        let dk = &mut self.desktops[d as usize];
        dk.work_out -= 1;
        dk.work_ready.push(at);
    }

    /// Write sizes of a logged-in desktop: Tuesday's (and steady state's) are smaller.
    fn logged_in_write_size(&mut self) -> u32 {
        let dist = match self.spec.login {
            Some(LoginKind::Tuesday) | None => &self.spec.small_write_sizes,
            _ => &self.spec.write_sizes,
        };
        dist.sample(&mut self.rng)
    }

    /// When a desktop that is not running may be running: not before the power-on
    /// starts; during it, checked every 2 s (10 s while it is not even created).
    fn next_power_check(&self, now: Nanos, power: Power) -> Nanos {
        let step = if power == Power::Absent { 10 } else { 2 } * 1_000_000_000;
        match self.spec.power_on_at_s {
            Some(p) if power == Power::Off => secs(p).max(now + step),
            _ => now + step,
        }
    }

    fn d(&self) -> u32 {
        self.spec.desktops
    }

    fn counters(&mut self, now: Nanos) -> &mut Counters {
        let s = (now / 1_000_000_000) as usize;
        if s >= self.per_second.len() {
            self.per_second.resize(s + 1, Counters::default());
        }
        &mut self.per_second[s]
    }

    fn note_io(&mut self, now: Nanos, desktop: u32, io: &IoRequest) {
        let sec = now / 1_000_000_000;
        let dk = &mut self.desktops[desktop as usize];
        let (new_reader, new_writer) = match io.dir {
            Direction::Read => {
                let n = dk.last_read_sec != sec;
                dk.last_read_sec = sec;
                (n, false)
            }
            Direction::Write => {
                let n = dk.last_write_sec != sec;
                dk.last_write_sec = sec;
                (false, n)
            }
        };
        let c = self.counters(now);
        match io.dir {
            Direction::Read => {
                c.reads += 1;
                c.read_bytes += io.size_bytes as u64;
            }
            Direction::Write => {
                c.writes += 1;
                c.write_bytes += io.size_bytes as u64;
            }
        }
        c.reading += new_reader as u64;
        c.writing += new_writer as u64;
    }

    fn private_base(&self, desktop: u32) -> u64 {
        self.image_bytes + desktop as u64 * self.private_bytes
    }

    fn read_io(&mut self, desktop: u32, size: u32) -> IoRequest {
        let size = size as u64;
        let seq = self.rng.random::<f64>() * 100.0 < self.spec.sequential_read_pct;
        let image = self.rng.random::<f64>() * 100.0 < self.spec.image_read_pct;
        let (base, len) = if image {
            (0, self.image_bytes)
        } else {
            (self.private_base(desktop), self.private_bytes)
        };
        let dk = &self.desktops[desktop as usize];
        let cursor = if image {
            dk.image_cursor
        } else {
            dk.read_cursor
        };
        let mut off = if seq && cursor >= base && cursor + size <= base + len {
            cursor
        } else {
            base + self.rng.random_range(0..(len - size) / 4096 + 1) * 4096
        };
        if off + size > base + len {
            off = base;
        }
        let dk = &mut self.desktops[desktop as usize];
        if image {
            dk.image_cursor = off + size;
        } else {
            dk.read_cursor = off + size;
        }
        IoRequest {
            offset_bytes: off,
            size_bytes: size as u32,
            dir: Direction::Read,
        }
    }

    fn write_io(&mut self, desktop: u32, size: u32) -> IoRequest {
        let size = size as u64;
        let base = self.private_base(desktop);
        let len = self.private_bytes;
        let seq = self.rng.random::<f64>() < 0.2;
        let dk = &self.desktops[desktop as usize];
        let mut off = if seq && dk.write_cursor >= base && dk.write_cursor + size <= base + len {
            dk.write_cursor
        } else {
            base + self.rng.random_range(0..(len - size) / 4096 + 1) * 4096
        };
        if off + size > base + len {
            off = base;
        }
        self.desktops[desktop as usize].write_cursor = off + size;
        IoRequest {
            offset_bytes: off,
            size_bytes: size as u32,
            dir: Direction::Write,
        }
    }

    /// The `k`-th read of the boot trace: the same for every clone.
    fn boot_read(&self, k: u64, prev_end: u64) -> IoRequest {
        let h = mix(self.image_seed ^ k.wrapping_mul(0x9E37));
        // Size from the read distribution, with the trace's own hash.
        let dist = &self.spec.read_sizes;
        let total: f64 = dist.0.iter().map(|b| b.1).sum();
        let mut x = (h >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut size = dist.0[0].0;
        for (s, w) in &dist.0 {
            size = *s;
            if x < *w {
                break;
            }
            x -= w;
        }
        // Boot reads are ≤ 64 KB mean 15.8 KB: cap the trace's larger sizes at 64 KB.
        let size = size.min(64 * K) as u64;
        let footprint = ((self.spec.boot_footprint_mib * MIB as f64) as u64).max(size * 2);
        let seq = (mix(h) % 100) < self.spec.sequential_read_pct as u64;
        let off = if seq && prev_end + size <= footprint {
            prev_end
        } else {
            (mix(h ^ 0xB007) % ((footprint - size) / 4096 + 1)) * 4096
        };
        IoRequest {
            offset_bytes: off,
            size_bytes: size as u32,
            dir: Direction::Read,
        }
    }

    fn start_task(&self, kind: TaskKind, desktop: u32, now: Nanos) -> Task {
        let (r_bytes, w_bytes, base_s) = match kind {
            TaskKind::Create => (
                0.0,
                self.spec.create_write_mib * MIB as f64,
                self.spec.create_base_s,
            ),
            TaskKind::Boot => (0.0, 0.0, 0.0),
            TaskKind::Login => match self.spec.login.unwrap_or(LoginKind::Tuesday) {
                LoginKind::Initial => (23.5e6, 23.5e6, self.spec.login_base_s),
                LoginKind::Monday => (1.5e6, 0.5e6, self.spec.login_base_s),
                LoginKind::Tuesday => (0.2e6, 0.2e6, self.spec.login_base_s),
            },
            TaskKind::Launch => (0.0, 0.0, 0.5),
            TaskKind::Vsi => (0.0, 0.0, self.spec.vsi_base_ms / 1000.0),
        };
        let mut t = Task {
            kind,
            desktop,
            started: now,
            reads_left: 0,
            writes_left: 0,
            in_flight: 0,
            not_before: now,
            base_ns: secs(base_s),
            step: 0,
            read_sizes_mean: None,
            failed: false,
        };
        match kind {
            TaskKind::Boot => {
                t.reads_left = (self.spec.boot_ios as f64 * self.spec.boot_read_pct / 100.0) as u32;
                t.writes_left = self.spec.boot_ios - t.reads_left;
            }
            TaskKind::Create => {
                t.writes_left = (w_bytes / (64 * KIB) as f64).ceil() as u32;
                t.read_sizes_mean = Some(64 * K);
            }
            TaskKind::Launch => {
                // 004 section 6.2, Microsoft Word: run 1 vs run 2.
                let first = self.desktops[desktop as usize].first_launch;
                if first {
                    t.reads_left = 1471;
                    t.writes_left = 64;
                } else {
                    t.reads_left = 34;
                    t.writes_left = 26;
                }
            }
            TaskKind::Vsi => t.reads_left = self.spec.vsi_reads,
            TaskKind::Login => {
                // Copies in 64 KB chunks (Windows copy engine), reads and writes.
                t.reads_left = (r_bytes / (64 * KIB) as f64).ceil() as u32;
                t.writes_left = (w_bytes / (64 * KIB) as f64).ceil() as u32;
                t.read_sizes_mean = Some(64 * K);
            }
        }
        t
    }

    /// Next I/O of a task, or None when nothing may be issued now.
    fn task_io(&mut self, task: &mut Task, now: Nanos) -> Option<IoRequest> {
        let qd = match task.kind {
            TaskKind::Boot | TaskKind::Vsi => 1,
            _ => self.spec.task_queue_depth,
        };
        if task.in_flight >= qd || now < task.not_before {
            return None;
        }
        let total_left = task.reads_left + task.writes_left;
        if total_left == 0 {
            return None;
        }
        // Interleave reads and writes in proportion.
        let read = task.reads_left > 0
            && (task.writes_left == 0 || self.rng.random_range(0..total_left) < task.reads_left);
        let d = task.desktop;
        let io = if read {
            task.reads_left -= 1;
            match task.kind {
                TaskKind::Boot => {
                    let prev = self.desktops[d as usize].image_cursor;
                    let io = self.boot_read(task.step, prev);
                    task.step += 1;
                    self.desktops[d as usize].image_cursor = io.offset_bytes + io.size_bytes as u64;
                    io
                }
                _ => {
                    let size = match task.read_sizes_mean {
                        Some(s) => s,
                        None => self.spec.read_sizes.sample(&mut self.rng),
                    };
                    self.read_io(d, size)
                }
            }
        } else {
            task.writes_left -= 1;
            let size = match task.read_sizes_mean {
                Some(s) => s,
                None => {
                    if task.kind == TaskKind::Boot {
                        // 004 Table 16: 10.3 KB mean boot writes.
                        self.spec.write_sizes.sample(&mut self.rng).min(64 * K)
                    } else {
                        self.spec.small_write_sizes.sample(&mut self.rng)
                    }
                }
            };
            self.write_io(d, size)
        };
        task.in_flight += 1;
        self.note_io(now, d, &io);
        Some(io)
    }

    fn global_index(&self, desktop: u32) -> u64 {
        desktop as u64 * self.instances as u64 + self.instance as u64
    }

    fn login_time(&self, desktop: u32) -> Option<Nanos> {
        self.spec.login?;
        Some(secs(
            self.spec.login_at_s + self.global_index(desktop) as f64 * self.spec.login_interval_s,
        ))
    }

    fn poll_foreground(&mut self, now: Nanos, d: u32) -> Issue {
        loop {
            if let Some(mut task) = self.tasks[d as usize].take() {
                let io = self.task_io(&mut task, now);
                let done = task.reads_left + task.writes_left + task.in_flight == 0;
                if done {
                    self.finish_task(task, now);
                    continue;
                }
                self.tasks[d as usize] = Some(task);
                return match io {
                    Some(io) => Issue::Io(io),
                    None => Issue::Blocked,
                };
            }
            let dk = &self.desktops[d as usize];
            if dk.power == Power::Failed || (!dk.logged_in && dk.login_failed) {
                return Issue::Blocked;
            }
            if dk.power != Power::On {
                return Issue::At(self.next_power_check(now, dk.power));
            }
            if !dk.logged_in {
                let Some(at) = self.login_time(d) else {
                    return Issue::Blocked;
                };
                if now < at {
                    return Issue::At(at);
                }
                self.login_starts.push(now);
                self.tasks[d as usize] = Some(self.start_task(TaskKind::Login, d, now));
                continue;
            }
            if dk.apps_left > 0 {
                self.desktops[d as usize].apps_left -= 1;
                self.tasks[d as usize] = Some(self.start_task(TaskKind::Launch, d, now));
                continue;
            }
            if self.spec.vsi {
                let at = self.desktops[d as usize].vsi_next;
                if now < at {
                    return Issue::At(at);
                }
                self.tasks[d as usize] = Some(self.start_task(TaskKind::Vsi, d, now));
                continue;
            }
            return Issue::Blocked;
        }
    }

    /// One of `worker`'s I/Os ended (`ok`, or failed): its task or its background
    /// chain goes on.
    fn io_ended(&mut self, now_ns: Nanos, worker: u32, ok: bool) {
        let d = self.d();
        let boot = self.boot_slots.len() as u32;
        let task = if worker < d {
            self.tasks[worker as usize].as_mut()
        } else if worker < 2 * d {
            self.work_done(now_ns, worker - d);
            None
        } else if worker < 2 * d + boot {
            self.boot_slots[(worker - 2 * d) as usize].as_mut()
        } else {
            self.create_slots
                .get_mut((worker - 2 * d - boot) as usize)
                .and_then(|t| t.as_mut())
        };
        if let Some(t) = task {
            t.in_flight = t.in_flight.saturating_sub(1);
            if !ok {
                t.failed = true;
                t.reads_left = 0;
                t.writes_left = 0;
            }
            if t.kind == TaskKind::Boot {
                t.not_before = now_ns + (self.spec.boot_think_us * 1000.0) as Nanos;
            }
        }
    }

    /// A task whose I/O failed ended: counted, and the desktop moves on without
    /// what it gave (no session, no running desktop).
    fn fail_task(&mut self, task: Task, now: Nanos) {
        let d = task.desktop as usize;
        self.failed_tasks.push((now, task.kind));
        match task.kind {
            TaskKind::Login => self.desktops[d].login_failed = true,
            TaskKind::Launch => {}
            TaskKind::Vsi => self.desktops[d].vsi_next = now + secs(self.spec.vsi_interval_s),
            TaskKind::Boot | TaskKind::Create => self.desktops[d].power = Power::Failed,
        }
    }

    fn finish_task(&mut self, task: Task, now: Nanos) {
        if task.failed {
            return self.fail_task(task, now);
        }
        let end = now + task.base_ns;
        let dur_s = (end - task.started) as f64 / NS_PER_S;
        let d = task.desktop as usize;
        match task.kind {
            TaskKind::Login => {
                self.logins.push((end, dur_s));
                self.logged_in += 1;
                let first = self.spec.login != Some(LoginKind::Tuesday);
                let dk = &mut self.desktops[d];
                dk.logged_in = true;
                dk.apps_left = self.spec.apps_per_login;
                dk.first_launch = first;
                dk.vsi_next = end + secs(self.spec.vsi_interval_s);
                self.start_work(task.desktop, end);
            }
            TaskKind::Launch => {
                self.launches.push((end, dur_s));
                self.desktops[d].first_launch = false;
            }
            TaskKind::Vsi => {
                let sessions = self.logged_in * self.instances;
                self.vsi.push((end, sessions, dur_s * 1000.0));
                self.desktops[d].vsi_next = end + secs(self.spec.vsi_interval_s);
            }
            TaskKind::Boot => {
                self.boots.push((task.started, end));
                self.desktops[d].power = Power::On;
            }
            TaskKind::Create => {
                self.creates.push((task.started, end));
                self.desktops[d].power = if self.spec.power_on_at_s.is_some() {
                    Power::Off
                } else {
                    Power::On
                };
            }
        }
    }

    /// A slot worker (power-on or creation): runs its desktops one after the other.
    fn poll_slot(&mut self, now: Nanos, create: bool, slot: u32) -> Issue {
        let (start_s, n_slots) = if create {
            (self.spec.create_at_s, self.create_slots.len() as u32)
        } else {
            (self.spec.power_on_at_s, self.boot_slots.len() as u32)
        };
        let Some(start_s) = start_s else {
            return Issue::Blocked;
        };
        let start = secs(start_s);
        if now < start {
            return Issue::At(start);
        }
        loop {
            let current = if create {
                self.create_slots[slot as usize].take()
            } else {
                self.boot_slots[slot as usize].take()
            };
            let mut task = match current {
                Some(t) => t,
                None => {
                    // Next desktop of this slot: slot, slot + n, … not yet handled.
                    let want = if create { Power::Absent } else { Power::Off };
                    let next = (slot..self.d()).step_by(n_slots as usize).find(|&d| {
                        self.desktops[d as usize].power == want && !self.claimed(d, create)
                    });
                    let Some(d) = next else {
                        if !create && self.desktops.iter().any(|x| x.power == Power::Absent) {
                            // Creation still running: come back later.
                            return Issue::At(now + 1_000_000_000);
                        }
                        return Issue::Blocked;
                    };
                    let mut t = self.start_task(
                        if create {
                            TaskKind::Create
                        } else {
                            TaskKind::Boot
                        },
                        d,
                        now,
                    );
                    if !create {
                        t.not_before = now;
                    }
                    t
                }
            };
            let io = self.task_io(&mut task, now);
            if task.reads_left + task.writes_left + task.in_flight == 0 {
                if task.base_ns > 0 && now < task.started + task.base_ns && task.step != u64::MAX {
                    // Non-storage time of a clone creation: wait it out in the slot.
                    let at = task.started + task.base_ns;
                    task.step = u64::MAX;
                    self.put_slot(create, slot, task);
                    return Issue::At(at);
                }
                let mut task = task;
                if task.step == u64::MAX {
                    task.base_ns = 0;
                }
                self.finish_task(task, now);
                continue;
            }
            let not_before = task.not_before;
            self.put_slot(create, slot, task);
            return match io {
                Some(io) => Issue::Io(io),
                None if now < not_before => Issue::At(not_before),
                None => Issue::Blocked,
            };
        }
    }

    /// The operations that failed: logins, launches and VSI loops that ended in
    /// the window; power-ons and creations over the whole run (as their spans).
    fn failure_metrics(&self, m: &mut Vec<ModelMetric>, from_ns: Nanos, to_ns: Nanos) {
        for (name, kind, windowed) in [
            ("login_failed", TaskKind::Login, true),
            ("app_launch_failed", TaskKind::Launch, true),
            ("vsi_failed", TaskKind::Vsi, true),
            ("power_on_failed", TaskKind::Boot, false),
            ("creation_failed", TaskKind::Create, false),
        ] {
            let n = self
                .failed_tasks
                .iter()
                .filter(|f| f.1 == kind && (!windowed || (from_ns..to_ns).contains(&f.0)))
                .count();
            m.push(ModelMetric::sum(name, n as f64, "operations"));
        }
    }

    fn claimed(&self, d: u32, create: bool) -> bool {
        let slots = if create {
            &self.create_slots
        } else {
            &self.boot_slots
        };
        slots.iter().flatten().any(|t| t.desktop == d)
    }

    fn put_slot(&mut self, create: bool, slot: u32, task: Task) {
        if create {
            self.create_slots[slot as usize] = Some(task);
        } else {
            self.boot_slots[slot as usize] = Some(task);
        }
    }

    fn poll_background(&mut self, now: Nanos, d: u32, outstanding: u32) -> Issue {
        let dk = &self.desktops[d as usize];
        if dk.power == Power::Failed {
            return Issue::Blocked;
        }
        if dk.power != Power::On {
            return Issue::At(self.next_power_check(now, dk.power));
        }
        if dk.logged_in && self.work.is_some() {
            return self.poll_work(now, d);
        }
        loop {
            let dk = &mut self.desktops[d as usize];
            if dk.bg_next_ns != Nanos::MAX {
                let t = dk.bg_next_ns;
                if t > now {
                    return Issue::At(t);
                }
                if outstanding >= 64 {
                    return Issue::Blocked;
                }
                let Some((_, dir)) = dk.bg_pending.pop() else {
                    dk.bg_next_ns = Nanos::MAX;
                    continue;
                };
                dk.bg_next_ns = dk.bg_pending.last().map_or(Nanos::MAX, |p| p.0);
                let io = match dir {
                    Direction::Read => {
                        let s = self.spec.read_sizes.sample(&mut self.rng);
                        self.read_io(d, s)
                    }
                    Direction::Write => {
                        let s = if self.desktops[d as usize].logged_in {
                            self.logged_in_write_size()
                        } else {
                            4 * K
                        };
                        self.write_io(d, s)
                    }
                };
                self.note_io(now, d, &io);
                return Issue::Io(io);
            }
            if dk.bg_second_end > now {
                return Issue::At(dk.bg_second_end);
            }
            // Draw the next second's activity.
            let start = now.max(dk.bg_second_end);
            let end = start + 1_000_000_000;
            let a = if dk.logged_in {
                self.activity.clone()
            } else {
                Activity::dripping()
            };
            let mut pending = std::mem::take(&mut self.desktops[d as usize].bg_pending);
            if self.rng.random::<f64>() * 100.0 < a.read_active_pct {
                let n = poisson_at_least_one(&mut self.rng, a.read_iops);
                for _ in 0..n {
                    pending.push((
                        start + self.rng.random_range(0..1_000_000_000),
                        Direction::Read,
                    ));
                }
            }
            if self.rng.random::<f64>() * 100.0 < a.write_active_pct {
                let n = if dk_logged(&self.desktops[d as usize]) {
                    poisson_at_least_one(&mut self.rng, a.write_iops)
                } else {
                    poisson(&mut self.rng, a.write_iops)
                };
                for _ in 0..n {
                    pending.push((
                        start + self.rng.random_range(0..1_000_000_000),
                        Direction::Write,
                    ));
                }
            }
            pending.sort_unstable_by_key(|p| std::cmp::Reverse(p.0));
            let dk = &mut self.desktops[d as usize];
            dk.bg_next_ns = pending.last().map_or(Nanos::MAX, |p| p.0);
            dk.bg_pending = pending;
            dk.bg_second_end = end;
        }
    }
}

fn dk_logged(d: &Desktop) -> bool {
    d.logged_in
}

fn poisson(rng: &mut ChaCha8Rng, mean: f64) -> u32 {
    if mean <= 0.0 {
        return 0;
    }
    if mean > 30.0 {
        // Normal approximation.
        let u1: f64 = rng.random::<f64>().max(1e-12);
        let u2: f64 = rng.random();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        return (mean + z * mean.sqrt()).round().max(0.0) as u32;
    }
    let l = (-mean).exp();
    let mut k = 0;
    let mut p = 1.0;
    loop {
        p *= rng.random::<f64>();
        if p <= l {
            return k;
        }
        k += 1;
    }
}

/// A desktop counted as "reading in this second" issues at least one read: Poisson
/// conditioned on ≥ 1 keeps the per-active-desktop rate of 004's tables.
fn poisson_at_least_one(rng: &mut ChaCha8Rng, mean: f64) -> u32 {
    if mean <= 0.0 {
        return 0;
    }
    for _ in 0..64 {
        let n = poisson(rng, mean);
        if n > 0 {
            return n;
        }
    }
    1
}

impl IoGenerator for VdiModel {
    fn workers(&self) -> u32 {
        2 * self.d() + self.boot_slots.len() as u32 + self.create_slots.len() as u32
    }

    fn poll(&mut self, now_ns: Nanos, worker: u32, outstanding: u32) -> Issue {
        let d = self.d();
        let boot = self.boot_slots.len() as u32;
        if worker < d {
            self.poll_foreground(now_ns, worker)
        } else if worker < 2 * d {
            self.poll_background(now_ns, worker - d, outstanding)
        } else if worker < 2 * d + boot {
            self.poll_slot(now_ns, false, worker - 2 * d)
        } else if worker < self.workers() {
            self.poll_slot(now_ns, true, worker - 2 * d - boot)
        } else {
            Issue::Blocked
        }
    }

    fn on_complete(&mut self, now_ns: Nanos, worker: u32, req: &IoRequest, lat: Nanos) {
        let c = self.counters(now_ns);
        if req.dir == Direction::Read {
            c.reads_done += 1;
            c.read_latency_ns += lat;
        } else {
            c.writes_done += 1;
            c.write_latency_ns += lat;
        }
        self.io_ended(now_ns, worker, true);
    }

    /// A failed I/O fails the operation it belongs to (a login, an application
    /// launch, a VSI loop, a power-on, a clone creation): it issues nothing more,
    /// and once its I/Os in flight are back it counts as failed (`*_failed`), not
    /// in the durations. A desktop whose login failed does not log in again; one
    /// whose power-on or creation failed stays down. Every failed I/O counts in
    /// `failed_ios`.
    fn on_failure(&mut self, now_ns: Nanos, worker: u32, _req: &IoRequest) {
        self.counters(now_ns).failed += 1;
        self.io_ended(now_ns, worker, false);
    }

    fn metrics(&self, from_ns: Nanos, to_ns: Nanos) -> Vec<ModelMetric> {
        let mut m = Vec::new();
        let a = (from_ns / 1_000_000_000) as usize;
        let b = (to_ns / 1_000_000_000) as usize;
        let seconds = b.saturating_sub(a).max(1) as f64;
        let mut c = Counters::default();
        for x in self.per_second.iter().take(b).skip(a) {
            c += x;
        }
        let per = |x: u64, y: u64| if y > 0 { x as f64 / y as f64 } else { f64::NAN };
        let n = self.d() as f64;
        // 004 Tables 11/15/20 layout (as the desktops issued them).
        m.push(ModelMetric::sum("desktops", n, "VMs"));
        m.push(ModelMetric::sum(
            "read_iops",
            c.reads as f64 / seconds,
            "IOPS",
        ));
        m.push(ModelMetric::sum(
            "write_iops",
            c.writes as f64 / seconds,
            "IOPS",
        ));
        m.push(ModelMetric::sum(
            "read_mbps",
            c.read_bytes as f64 / 1e6 / seconds,
            "MB/s",
        ));
        m.push(ModelMetric::sum(
            "write_mbps",
            c.write_bytes as f64 / 1e6 / seconds,
            "MB/s",
        ));
        m.push(ModelMetric::sum(
            "reading_vms",
            c.reading as f64 / seconds,
            "VMs",
        ));
        m.push(ModelMetric::sum(
            "writing_vms",
            c.writing as f64 / seconds,
            "VMs",
        ));
        m.push(ModelMetric::mean(
            "read_size_kb",
            per(c.read_bytes, c.reads) / 1e3,
            "KB",
            c.reads as f64,
        ));
        m.push(ModelMetric::mean(
            "write_size_kb",
            per(c.write_bytes, c.writes) / 1e3,
            "KB",
            c.writes as f64,
        ));
        m.push(ModelMetric::mean(
            "read_latency_ms",
            per(c.read_latency_ns, c.reads_done) / 1e6,
            "ms",
            c.reads_done as f64,
        ));
        m.push(ModelMetric::mean(
            "write_latency_ms",
            per(c.write_latency_ns, c.writes_done) / 1e6,
            "ms",
            c.writes_done as f64,
        ));
        m.push(ModelMetric::mean(
            "read_iops_per_reading_vm",
            per(c.reads, c.reading),
            "IOPS",
            c.reading as f64,
        ));
        m.push(ModelMetric::mean(
            "write_iops_per_writing_vm",
            per(c.writes, c.writing),
            "IOPS",
            c.writing as f64,
        ));
        m.push(ModelMetric::mean(
            "read_kbps_per_reading_vm",
            per(c.read_bytes, c.reading) / 1e3,
            "KB/s",
            c.reading as f64,
        ));
        m.push(ModelMetric::mean(
            "write_kbps_per_writing_vm",
            per(c.write_bytes, c.writing) / 1e3,
            "KB/s",
            c.writing as f64,
        ));
        m.push(ModelMetric::mean(
            "read_iops_per_vm",
            c.reads as f64 / seconds / n,
            "IOPS",
            n,
        ));
        m.push(ModelMetric::mean(
            "write_iops_per_vm",
            c.writes as f64 / seconds / n,
            "IOPS",
            n,
        ));
        m.push(ModelMetric::mean(
            "reading_vms_pct",
            c.reading as f64 / seconds / n * 100.0,
            "%",
            n,
        ));
        m.push(ModelMetric::mean(
            "writing_vms_pct",
            c.writing as f64 / seconds / n * 100.0,
            "%",
            n,
        ));
        m.push(ModelMetric::sum("failed_ios", c.failed as f64, "I/Os"));
        self.failure_metrics(&mut m, from_ns, to_ns);
        grade(&mut m, "login", &self.logins, from_ns, to_ns, 15.0, 60.0);
        grade(
            &mut m,
            "app_launch",
            &self.launches,
            from_ns,
            to_ns,
            10.0,
            30.0,
        );
        // Power-on and creation: whole run (they are "time to finish" figures).
        span(&mut m, "power_on", &self.boots, self.d());
        span(&mut m, "creation", &self.creates, self.d());
        let samples: Vec<(u32, f64)> = self
            .vsi
            .iter()
            .filter(|s| s.0 >= from_ns && s.0 < to_ns)
            .map(|s| (s.1, s.2))
            .collect();
        if self.spec.vsi {
            let v = vsi_summary(&samples);
            let w = samples.len() as f64;
            m.push(ModelMetric::mean("vsi_samples", w, "samples", 1.0));
            m.push(ModelMetric::mean("vsibase_ms", v.base_ms, "ms", w));
            m.push(ModelMetric::mean(
                "vsimax_threshold_ms",
                v.threshold_ms,
                "ms",
                w,
            ));
            m.push(ModelMetric::mean(
                "vsi_response_mean_ms",
                v.mean_ms,
                "ms",
                w,
            ));
            m.push(ModelMetric::mean(
                "vsimax_reached",
                if v.vsimax.is_some() { 1.0 } else { 0.0 },
                "1 = reached",
                1.0,
            ));
            m.push(ModelMetric::mean(
                "vsimax_sessions",
                v.vsimax.map_or(f64::NAN, |s| s as f64),
                "sessions",
                1.0,
            ));
            m.push(ModelMetric::mean(
                "vsi_sessions_max",
                v.max_sessions as f64,
                "sessions",
                1.0,
            ));
        }
        m
    }

    fn shared_region(&self) -> Option<SharedRegion> {
        Some(SharedRegion {
            offset_bytes: 0,
            len_bytes: self.image_bytes,
            image_id: self.image_seed,
        })
    }

    fn schedule(&self) -> Option<ScheduleLog> {
        let running = |slots: &[Option<Task>]| {
            slots
                .iter()
                .flatten()
                .map(|t| (t.started, Nanos::MAX))
                .collect::<Vec<_>>()
        };
        let mut creates = self.creates.clone();
        creates.extend(running(&self.create_slots));
        let mut power_ons = self.boots.clone();
        power_ons.extend(running(&self.boot_slots));
        Some(ScheduleLog {
            creates,
            power_ons,
            login_starts: self.login_starts.clone(),
        })
    }

    fn clone_of(&self, worker: u32) -> u32 {
        let d = self.d();
        let boot = self.boot_slots.len() as u32;
        if worker < d {
            worker
        } else if worker < 2 * d {
            worker - d
        } else if worker < 2 * d + boot {
            self.boot_slots[(worker - 2 * d) as usize]
                .as_ref()
                .map_or(0, |t| t.desktop)
        } else {
            self.create_slots
                .get((worker - 2 * d - boot) as usize)
                .and_then(|t| t.as_ref())
                .map_or(0, |t| t.desktop)
        }
    }
}

/// Good / fair / poor shares of the durations that ended in the window (004's
/// thresholds: login good ≤ 15 s, fair ≤ 60 s; application good ≤ 10 s, fair ≤ 30 s).
fn grade(
    m: &mut Vec<ModelMetric>,
    what: &str,
    xs: &[(Nanos, f64)],
    from: Nanos,
    to: Nanos,
    good_s: f64,
    fair_s: f64,
) {
    let v: Vec<f64> = xs
        .iter()
        .filter(|x| x.0 >= from && x.0 < to)
        .map(|x| x.1)
        .collect();
    let n = v.len() as f64;
    m.push(ModelMetric::sum(&format!("{what}s"), n, "count"));
    if v.is_empty() {
        return;
    }
    let mean = v.iter().sum::<f64>() / n;
    let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    let max = v.iter().cloned().fold(0.0, f64::max);
    m.push(ModelMetric::mean(
        &format!("{what}_time_mean_s"),
        mean,
        "s",
        n,
    ));
    m.push(ModelMetric::mean(
        &format!("{what}_time_max_s"),
        max,
        "s",
        1.0,
    ));
    m.push(ModelMetric::mean(&format!("{what}_time_sd_s"), sd, "s", n));
    for (label, lo, hi) in [
        ("good", f64::NEG_INFINITY, good_s),
        ("fair", good_s, fair_s),
        ("poor", fair_s, f64::INFINITY),
    ] {
        let g: Vec<f64> = v.iter().cloned().filter(|&x| x > lo && x <= hi).collect();
        m.push(ModelMetric::mean(
            &format!("{what}_{label}_pct"),
            g.len() as f64 / n * 100.0,
            "%",
            n,
        ));
        if !g.is_empty() {
            m.push(ModelMetric::mean(
                &format!("{what}_{label}_mean_s"),
                g.iter().sum::<f64>() / g.len() as f64,
                "s",
                g.len() as f64,
            ));
        }
    }
}

fn span(m: &mut Vec<ModelMetric>, what: &str, xs: &[(Nanos, Nanos)], desktops: u32) {
    if xs.is_empty() {
        return;
    }
    let first = xs.iter().map(|x| x.0).min().unwrap_or(0);
    let last = xs.iter().map(|x| x.1).max().unwrap_or(0);
    m.push(ModelMetric::sum(
        &format!("{what}_done"),
        xs.len() as f64,
        "desktops",
    ));
    // Max over instances would be right; a mean of equal halves is close enough.
    m.push(ModelMetric::mean(
        &format!("{what}_time_s"),
        if xs.len() as u32 == desktops {
            (last - first) as f64 / NS_PER_S
        } else {
            f64::NAN
        },
        "s",
        1.0,
    ));
    let mean = xs.iter().map(|x| (x.1 - x.0) as f64).sum::<f64>() / xs.len() as f64 / NS_PER_S;
    m.push(ModelMetric::mean(
        &format!("{what}_each_mean_s"),
        mean,
        "s",
        xs.len() as f64,
    ));
}

/// Login VSI figures from `(sessions, response ms)` samples in time order.
#[derive(Clone, Debug, PartialEq)]
pub struct VsiSummary {
    pub base_ms: f64,
    pub threshold_ms: f64,
    pub mean_ms: f64,
    /// Sessions at saturation, `None` when not reached.
    pub vsimax: Option<u32>,
    pub max_sessions: u32,
}

/// The rule Weir implements, after Login VSI 4.1's definitions:
/// * **VSIbase** = the mean of the 15 lowest response times among the samples taken
///   while at most the first quarter of the largest session count was logged in
///   (the "little to no load" baseline; all samples when fewer than 15 qualify).
/// * **VSImax threshold** = VSIbase + 1,000 ms.
/// * **VSI index**: samples are grouped in consecutive windows of 12; each window's
///   average drops its highest and lowest 2 % (at least one each when the window
///   has ≥ 10 samples), as Login VSI does with outliers.
/// * **VSImax** = the session count at the end of the first window whose index
///   exceeds the threshold; not reached when none does.
pub fn vsi_summary(samples: &[(u32, f64)]) -> VsiSummary {
    let max_sessions = samples.iter().map(|s| s.0).max().unwrap_or(0);
    if samples.is_empty() {
        return VsiSummary {
            base_ms: f64::NAN,
            threshold_ms: f64::NAN,
            mean_ms: f64::NAN,
            vsimax: None,
            max_sessions,
        };
    }
    let early: Vec<f64> = samples
        .iter()
        .filter(|s| s.0 <= max_sessions.div_ceil(4))
        .map(|s| s.1)
        .collect();
    let mut pool = if early.len() >= 15 {
        early
    } else {
        samples.iter().map(|s| s.1).collect()
    };
    pool.sort_by(f64::total_cmp);
    let k = pool.len().min(15);
    let base = pool[..k].iter().sum::<f64>() / k as f64;
    let threshold = base + 1000.0;
    let mut vsimax = None;
    for w in samples.chunks(12) {
        let mut v: Vec<f64> = w.iter().map(|s| s.1).collect();
        v.sort_by(f64::total_cmp);
        let trim = if v.len() >= 10 {
            ((v.len() as f64 * 0.02).ceil() as usize).max(1)
        } else {
            0
        };
        let kept = &v[trim..v.len() - trim];
        let idx = kept.iter().sum::<f64>() / kept.len() as f64;
        if idx > threshold {
            vsimax = w.last().map(|s| s.0);
            break;
        }
    }
    VsiSummary {
        base_ms: base,
        threshold_ms: threshold,
        mean_ms: samples.iter().map(|s| s.1).sum::<f64>() / samples.len() as f64,
        vsimax,
        max_sessions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelSpec, run_fixed_latency};

    fn spec(extra: &str) -> VdiSpec {
        toml::from_str(&format!("name = \"vdi\"\nimage_gib = 2\n{extra}")).unwrap()
    }

    fn metric(g: &dyn IoGenerator, name: &str, from: Nanos, to: Nanos) -> f64 {
        g.metrics(from, to)
            .into_iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no metric {name}"))
            .value
    }

    fn build(s: &VdiSpec) -> Box<dyn IoGenerator + Send> {
        let bytes = s.min_volume_bytes() * 2;
        ModelSpec::Vdi(Box::new(s.clone()))
            .build(bytes, 7, 0, 1)
            .unwrap()
    }

    const S: Nanos = 1_000_000_000;

    #[test]
    fn monday_login_matches_table_20_per_desktop_activity() {
        let s =
            spec("desktops = 200\nlogin = \"monday\"\nlogin_interval_s = 0.1\napps_per_login = 0");
        let mut g = build(&s);
        run_fixed_latency(g.as_mut(), 2_000_000, 140 * S);
        let (a, b) = (40 * S, 140 * S);
        assert_eq!(metric(g.as_ref(), "logins", 0, b), 200.0);
        // Login: 1.5 MB read + 0.5 MB written in 64 KB chunks at QD 2, 2 ms each.
        let t = metric(g.as_ref(), "login_time_mean_s", 0, b);
        assert!((t - (0.8 + 32.0 / 2.0 * 0.002)).abs() < 0.05, "{t}");
        assert_eq!(metric(g.as_ref(), "login_good_pct", 0, b), 100.0);
        let r = metric(g.as_ref(), "read_iops_per_reading_vm", a, b);
        assert!((r / 37.0 - 1.0).abs() < 0.1, "{r}");
        let rp = metric(g.as_ref(), "reading_vms_pct", a, b);
        assert!((rp - 11.3).abs() < 2.0, "{rp}");
        let wp = metric(g.as_ref(), "writing_vms_pct", a, b);
        assert!((wp - 66.5).abs() < 5.0, "{wp}");
        let rs = metric(g.as_ref(), "read_size_kb", a, b);
        assert!((15.0..25.0).contains(&rs), "{rs}");
    }

    #[test]
    fn phases_order_as_004_initial_above_monday_above_tuesday() {
        let iops = |kind: &str| {
            let s = spec(&format!(
                "desktops = 100\nlogin = \"{kind}\"\nlogin_interval_s = 0.05\napps_per_login = 0"
            ));
            let mut g = build(&s);
            run_fixed_latency(g.as_mut(), 1_000_000, 90 * S);
            metric(g.as_ref(), "read_iops", 30 * S, 90 * S)
                + metric(g.as_ref(), "write_iops", 30 * S, 90 * S)
        };
        let (i, m, t) = (iops("initial"), iops("monday"), iops("tuesday"));
        assert!(i > m && m > t * 2.0, "initial {i} monday {m} tuesday {t}");
    }

    /// The copies of one model split its schedule: 10 power-on slots over 3 pools
    /// are 4 + 3 + 3, together never more than 10 at once; logins interleave so
    /// that the model as a whole logs one desktop in every `login_interval_s`.
    #[test]
    fn copies_of_a_model_share_its_slots_and_login_interval() {
        let s = spec(
            "desktops = 12\npower_on_at_s = 0\nmax_concurrent_power_on = 10\nmax_concurrent_create = 3\nboot_ios = 200\nboot_think_us = 1000\nlogin = \"tuesday\"\nlogin_at_s = 30\nlogin_interval_s = 0.5\napps_per_login = 0",
        );
        let bytes = s.min_volume_bytes() * 2;
        let mut log = ScheduleLog::default();
        let mut slots = Vec::new();
        for i in 0..3 {
            let mut g = ModelSpec::Vdi(Box::new(s.clone()))
                .build(bytes, 7, i, 3)
                .unwrap();
            // Workers: 12 foreground, 12 background, the power-on slots, 1 clone slot.
            slots.push(g.workers() - 2 * 12 - 1);
            run_fixed_latency(g.as_mut(), 2_000_000, 60 * S);
            log.merge(&g.schedule().expect("a VDI model has a schedule"));
        }
        assert_eq!(slots, [4, 3, 3]);
        assert_eq!(log.power_ons.len(), 36);
        assert_eq!(crate::peak_concurrent(&log.power_ons, 0, 60 * S), 10);
        // 36 logins, one every 0.5 s over the three pools: the last 17.5 s after
        // the first, each at its slot of the model-wide sequence.
        let mut starts = log.login_starts.clone();
        starts.sort_unstable();
        assert_eq!(starts.len(), 36);
        for (k, t) in starts.iter().enumerate() {
            assert_eq!(*t, 30 * S + k as Nanos * S / 2, "login {k}");
        }
    }

    #[test]
    fn a_schedule_with_fewer_slots_than_pools_is_refused() {
        let s = spec("desktops = 4\npower_on_at_s = 0\nmax_concurrent_power_on = 2");
        let bytes = s.min_volume_bytes() * 2;
        let m = ModelSpec::Vdi(Box::new(s));
        assert!(m.build(bytes, 7, 0, 2).is_ok());
        let e = m.build(bytes, 7, 0, 3).err().expect("refused").to_string();
        assert!(
            e.contains("max_concurrent_power_on") && e.contains("3 pools"),
            "{e}"
        );
    }

    #[test]
    fn power_on_respects_the_orchestrator_limit_and_clones_boot_the_same_trace() {
        let s = spec(
            "desktops = 20\npower_on_at_s = 1\nmax_concurrent_power_on = 4\nboot_ios = 300\nboot_think_us = 1000",
        );
        let mut g = build(&s);
        let issued = run_fixed_latency(g.as_mut(), 2_000_000, 60 * S);
        // 5 waves × 300 I/Os × (2 ms + 1 ms think) ≈ 4.5 s.
        let t = metric(g.as_ref(), "power_on_time_s", 0, 60 * S);
        assert!((t - 4.5).abs() < 0.3, "{t}");
        assert_eq!(metric(g.as_ref(), "power_on_done", 0, 60 * S), 20.0);
        // Nothing before power-on; boot reads land in the image's boot footprint and
        // repeat (several clones read the same offsets).
        assert!(issued.iter().all(|r| r.0 >= S));
        let image_reads: Vec<u64> = issued
            .iter()
            .filter(|r| r.1.dir == Direction::Read && r.1.offset_bytes < 512 * MIB)
            .map(|r| r.1.offset_bytes)
            .collect();
        let distinct: std::collections::HashSet<u64> = image_reads.iter().copied().collect();
        assert!(image_reads.len() >= 20 * 250);
        assert!(
            distinct.len() * 10 < image_reads.len(),
            "{} of {}",
            distinct.len(),
            image_reads.len()
        );
        assert!(g.shared_region().is_some());
    }

    #[test]
    fn idle_desktops_drip_about_one_4k_write_per_second() {
        let s = spec("desktops = 300");
        let mut g = build(&s);
        let issued = run_fixed_latency(g.as_mut(), 1_000_000, 60 * S);
        let per_desktop = issued.len() as f64 / 60.0 / 300.0;
        assert!((0.8..1.1).contains(&per_desktop), "{per_desktop}");
        let writes = issued
            .iter()
            .filter(|r| r.1.dir == Direction::Write)
            .count();
        assert!(writes as f64 / issued.len() as f64 > 0.9);
    }

    #[test]
    fn login_time_grows_with_storage_latency_initial_login() {
        let s =
            spec("desktops = 10\nlogin = \"initial\"\nlogin_interval_s = 1\napps_per_login = 0");
        let mut fast = build(&s);
        run_fixed_latency(fast.as_mut(), 1_000_000, 120 * S);
        let mut slow = build(&s);
        run_fixed_latency(slow.as_mut(), 60_000_000, 200 * S);
        let f = metric(fast.as_ref(), "login_time_mean_s", 0, 200 * S);
        let sl = metric(slow.as_ref(), "login_time_mean_s", 0, 200 * S);
        // 752 copy I/Os at QD 2: 0.8 + 376 × latency.
        assert!((f - (0.8 + 0.376)).abs() < 0.1, "{f}");
        assert!((sl - (0.8 + 376.0 * 0.06)).abs() < 2.0, "{sl}");
        assert!(metric(slow.as_ref(), "login_fair_pct", 0, 200 * S) == 100.0);
    }

    /// The initial login's desktops work in a closed loop (`Work::of`): each of
    /// their 3 chains waits for its I/O, then thinks 78 ms, so slower storage gets
    /// fewer I/Os from them (an open loop would ask the same at any latency).
    #[test]
    fn initial_login_work_is_a_closed_loop() {
        let s =
            spec("desktops = 40\nlogin = \"initial\"\nlogin_interval_s = 0.05\napps_per_login = 0");
        let per_desktop = |latency_ms: f64| {
            let mut g = build(&s);
            run_fixed_latency(g.as_mut(), (latency_ms * 1e6) as Nanos, 200 * S);
            let (a, b) = (100 * S, 200 * S);
            assert_eq!(metric(g.as_ref(), "logins", 0, b), 40.0);
            let lat = metric(g.as_ref(), "read_latency_ms", a, b);
            assert!((lat - latency_ms).abs() < 1e-6, "{lat}");
            (metric(g.as_ref(), "read_iops", a, b) + metric(g.as_ref(), "write_iops", a, b)) / 40.0
        };
        for latency_ms in [1.0, 100.0] {
            let want = 3.0 / ((78.0 + latency_ms) / 1000.0);
            let got = per_desktop(latency_ms);
            assert!(
                (got / want - 1.0).abs() < 0.08,
                "{latency_ms} ms: {got} IOPS, want {want}"
            );
        }
        // Its reads and writes keep the activity's proportions (Table 11: 22 % × 28
        // reads against 71.2 % × 6 writes).
        let mut g = build(&s);
        run_fixed_latency(g.as_mut(), 1_000_000, 200 * S);
        let (r, w) = (
            metric(g.as_ref(), "read_iops", 100 * S, 200 * S),
            metric(g.as_ref(), "write_iops", 100 * S, 200 * S),
        );
        let share = r / (r + w);
        assert!((share - 616.0 / 1043.2).abs() < 0.03, "{share}");
    }

    /// A working desktop never has more I/Os in flight than its chains, and keeps
    /// them all busy when storage is slow.
    #[test]
    fn a_working_desktop_has_at_most_its_chains_in_flight() {
        let s = spec(
            "desktops = 8\nlogin = \"initial\"\nlogin_interval_s = 0.05\napps_per_login = 0\nimage_read_pct = 0\nwork = { streams = 4, think_ms = 5 }",
        );
        let mut g = build(&s);
        let latency = 200_000_000;
        // Logins take 0.8 s + 376 round trips of 200 ms: all done by 100 s.
        let issued = run_fixed_latency(g.as_mut(), latency, 160 * S);
        assert_eq!(metric(g.as_ref(), "logins", 0, 100 * S), 8.0);
        let private = (s.min_volume_bytes() * 2 - s.image_bytes()) / 8 / MIB * MIB;
        let owner = |off: u64| (off - s.image_bytes()) / private;
        let mut most = 0;
        for d in 0..8 {
            let mine: Vec<Nanos> = issued
                .iter()
                .filter(|r| r.0 > 100 * S && owner(r.1.offset_bytes) == d)
                .map(|r| r.0)
                .collect();
            for (i, t) in mine.iter().enumerate() {
                let in_flight = mine[..=i].iter().filter(|u| **u + latency > *t).count();
                most = most.max(in_flight);
                assert!(in_flight <= 4, "desktop {d}: {in_flight} in flight at {t}");
            }
        }
        assert_eq!(most, 4);
    }

    /// Only the initial login has default work; `streams = 0` turns it off, and
    /// the desktops then ask 004's per-second activity whatever the latency.
    #[test]
    fn work_defaults_and_overrides() {
        let iops = |extra: &str, latency_ms: u64| {
            let s = spec(&format!(
                "desktops = 40\nlogin_interval_s = 0.05\napps_per_login = 0\n{extra}"
            ));
            let mut g = build(&s);
            run_fixed_latency(g.as_mut(), latency_ms * 1_000_000, 160 * S);
            metric(g.as_ref(), "read_iops", 60 * S, 160 * S)
                + metric(g.as_ref(), "write_iops", 60 * S, 160 * S)
        };
        let off = "login = \"initial\"\nwork = { streams = 0 }";
        let (fast, slow) = (iops(off, 1), iops(off, 100));
        assert!(
            (slow / fast - 1.0).abs() < 0.05,
            "open loop: {fast} vs {slow}"
        );
        let (fast, slow) = (
            iops("login = \"initial\"", 1),
            iops("login = \"initial\"", 100),
        );
        assert!(slow < 0.6 * fast, "closed loop: {fast} vs {slow}");
        let (fast, slow) = (
            iops("login = \"monday\"", 1),
            iops("login = \"monday\"", 100),
        );
        assert!((slow / fast - 1.0).abs() < 0.05, "Monday: {fast} vs {slow}");
        for bad in [
            "desktops = 4\nwork = { streams = 300 }",
            "desktops = 4\nwork = { streams = 2, think_ms = -1 }",
        ] {
            assert!(spec(bad).validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn vsi_loop_and_vsimax_rule() {
        let s = spec(
            "desktops = 30\nlogin = \"tuesday\"\nlogin_interval_s = 1\nvsi = true\nvsi_interval_s = 5",
        );
        let mut g = build(&s);
        run_fixed_latency(g.as_mut(), 5_000_000, 200 * S);
        let base = metric(g.as_ref(), "vsibase_ms", 0, 200 * S);
        // 800 ms + 8 reads × 5 ms.
        assert!((base - 840.0).abs() < 5.0, "{base}");
        assert_eq!(metric(g.as_ref(), "vsimax_reached", 0, 200 * S), 0.0);
        // The rule itself: flat then rising by 100 ms per session.
        let flat: Vec<(u32, f64)> = (1..=100).map(|n| (n, 900.0)).collect();
        assert_eq!(vsi_summary(&flat).vsimax, None);
        let rising: Vec<(u32, f64)> = (1..=100)
            .map(|n| {
                (
                    n,
                    if n <= 25 {
                        900.0
                    } else {
                        900.0 + (n - 25) as f64 * 100.0
                    },
                )
            })
            .collect();
        let v = vsi_summary(&rising);
        assert_eq!(v.base_ms, 900.0);
        assert_eq!(v.threshold_ms, 1900.0);
        // Window 37..48 averages (trimmed) above 1,900 ms first.
        assert_eq!(v.vsimax, Some(48));
    }

    #[test]
    fn creation_then_power_on_then_login_in_order() {
        let s = spec(
            "desktops = 16\ncreate_at_s = 0\nmax_concurrent_create = 4\ncreate_base_s = 2\ncreate_write_mib = 1\npower_on_at_s = 20\nmax_concurrent_power_on = 8\nboot_ios = 100\nlogin = \"tuesday\"\nlogin_at_s = 30\nlogin_interval_s = 0.5\napps_per_login = 1",
        );
        let mut g = build(&s);
        run_fixed_latency(g.as_mut(), 1_000_000, 60 * S);
        let m = |n: &str| metric(g.as_ref(), n, 0, 60 * S);
        assert_eq!(m("creation_done"), 16.0);
        // 4 rounds of (2 s + 16 × 64 KB writes at QD 2).
        assert!(
            (m("creation_time_s") - 4.0 * 2.008).abs() < 0.2,
            "{}",
            m("creation_time_s")
        );
        assert_eq!(m("power_on_done"), 16.0);
        assert_eq!(m("logins"), 16.0);
        assert_eq!(m("app_launchs"), 16.0);
    }

    #[test]
    fn bad_specs_are_errors_not_panics() {
        assert!(
            toml::from_str::<VdiSpec>("name = \"v\"\ndesktops = 1\nlogin = \"friday\"").is_err()
        );
        let mut s = spec("desktops = 10");
        s.max_concurrent_power_on = 0;
        assert!(s.validate().is_err());
        let s = spec("desktops = 10");
        assert!(ModelSpec::Vdi(Box::new(s)).build(1 << 30, 1, 0, 1).is_err());
    }
}
