//! Asynchronous replication of thin volumes to any NBD target (another
//! `weir serve`, nbdkit, qemu-nbd): `weir volume replicate NAME --to
//! nbd://HOST:PORT/EXPORT (--every 5m | --once)`, or `[[replications]]` in the
//! configuration. Design and measurements: docs/THIN.md, "Replication".
//!
//! A cycle:
//! 1. connects to the target (no snapshot is taken while it is unreachable) and
//!    checks it is writable and at least the volume's size;
//! 2. takes a snapshot `repl-<n>` of the volume (or resumes the snapshot of an
//!    unfinished cycle), recorded as the cycle in progress in the same catalog
//!    write;
//! 3. lists the grains that may differ from the last replicated snapshot: those
//!    the layers above both snapshots' common layer store or zero-mark (for the
//!    usual chain, exactly the layer the cycle's snapshot froze), or every grain
//!    of the volume for the first cycle;
//! 4. reads them from the snapshot's layers (immutable: what is shipped is one
//!    point in time, never a torn state) on the blocking pool and writes them
//!    to the target, [`MAX_IN_FLIGHT`] requests in flight over one connection:
//!    runs of stored grains as WRITEs of up to [`WRITE_BYTES`], runs of grains
//!    that read as zeroes as WRITE_ZEROES (the target may deallocate them);
//!    every [`CHECKPOINT_BYTES`] or [`CHECKPOINT_INTERVAL`], a FLUSH, after
//!    which the offset below which every write has completed is recorded;
//! 5. FLUSHes the target; only then is the snapshot recorded as the last
//!    replicated one (the lag, RPO, is measured from the moment it was taken),
//!    the previous one released, and the layer it leaves merged with its child
//!    ([`weir_thin::commit_into`]: cost proportional to what the cycle shipped).
//!
//! An interrupted cycle (target down, connection lost, server stopped or
//! killed) keeps its snapshot and its recorded offset: the next attempt ships
//! the same snapshot from that offset (writes are idempotent). Failed cycles
//! are retried after 1, 2, 4 … 60 s.
//!
//! The store's lock is held only for catalog changes (steps 2 and 5 and the
//! checkpoints, on the blocking pool because a catalog write syncs), never
//! across network I/O; one cycle at a time per volume.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, OwnedMutexGuard, mpsc};
use tokio::task::JoinHandle;
use weir_nbd::consts::{FLAG_READ_ONLY, FLAG_SEND_FLUSH, FLAG_SEND_WRITE_ZEROES};
use weir_nbd::{ClientConfig, ClientExport, Completion, ReplyData};
use weir_thin::{Entry, GrainCache, Layer};

use crate::nbd_client::NbdClient;
use crate::server::ServerState;
use crate::store::{StoreError, VolumeStore};
use crate::thin::SnapshotRecord;

/// Names of replication snapshots: `repl-1`, `repl-2`, … (listed with the
/// volume's snapshots and exported read-only, like any snapshot: `VOL@repl-7`
/// is what the target holds once that cycle finished).
pub const SNAPSHOT_PREFIX: &str = "repl-";
/// NBD's registered port.
pub const DEFAULT_PORT: u16 = 10809;
/// Requests in flight to the target.
pub const MAX_IN_FLIGHT: usize = 16;
/// Largest WRITE (runs of stored grains up to this; less if the target says so).
pub const WRITE_BYTES: u64 = 1 << 20;
/// Largest WRITE_ZEROES (runs of zero grains up to this).
pub const ZERO_BYTES: u64 = 256 << 20;
/// Pieces read ahead of the network (each at most [`WRITE_BYTES`] of data).
pub const READ_AHEAD: usize = 8;
/// A checkpoint (FLUSH, then the cursor recorded) after this much shipped…
pub const CHECKPOINT_BYTES: u64 = 256 << 20;
/// … or this long.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);
/// A target that answers nothing for this long while requests wait has failed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_RETRY: Duration = Duration::from_secs(60);

pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// An `nbd://HOST[:PORT]/EXPORT` target (NBD URI spec, TCP only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUrl {
    pub host: String,
    pub port: u16,
    pub export: String,
}

impl NbdUrl {
    pub fn parse(text: &str) -> Result<NbdUrl, String> {
        let t = text.trim();
        let Some((scheme, rest)) = t.split_once("://") else {
            return Err(format!(
                "{text:?} is not an NBD URL: expected nbd://HOST[:PORT]/EXPORT"
            ));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "nbd" => {}
            "nbds" | "nbd+unix" | "nbds+unix" | "nbd+vsock" => {
                return Err(format!(
                    "{text:?}: only plain nbd:// over TCP is supported (not {scheme}://)"
                ));
            }
            _ => {
                return Err(format!(
                    "{text:?}: the scheme must be nbd://, not {scheme}://"
                ));
            }
        }
        if rest.contains(['?', '#']) {
            return Err(format!("{text:?}: query and fragment are not supported"));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{text:?}: unclosed '[' in the host"))?;
            match after {
                "" => (h, None),
                p => (
                    h,
                    Some(p.strip_prefix(':').ok_or_else(|| {
                        format!("{text:?}: expected :PORT after the IPv6 address")
                    })?),
                ),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(format!("{text:?}: no host"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| format!("{text:?}: port {p:?} is not 1-65535"))?,
        };
        let export = percent_decode(path).ok_or_else(|| format!("{text:?}: bad %-escape"))?;
        Ok(NbdUrl {
            host: host.to_string(),
            port,
            export,
        })
    }
}

impl fmt::Display for NbdUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(f, "nbd://{host}:{}/", self.port)?;
        for b in self.export.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~@:+".contains(&b) {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "%{b:02X}")?;
            }
        }
        Ok(())
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Longest interval accepted (30 days).
pub const MAX_EVERY_SECONDS: u64 = 30 * 86_400;

/// Parses an interval: `"30s"`, `"5m"`, `"1h30m"`, `"2d"`, or a number of
/// seconds; 1 s to 30 days.
pub fn parse_every(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let bad = || {
        format!(
            "interval {text:?}: expected a duration like \"30s\", \"5m\", \"1h30m\" or a number of seconds"
        )
    };
    if t.is_empty() {
        return Err(bad());
    }
    let mut total: u64 = 0;
    if let Ok(n) = t.parse::<u64>() {
        total = n;
    } else {
        let mut number = String::new();
        for c in t.chars() {
            if c.is_ascii_digit() {
                number.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                ' ' if number.is_empty() => continue,
                _ => return Err(bad()),
            };
            let n: u64 = number.parse().map_err(|_| bad())?;
            total = n
                .checked_mul(unit)
                .and_then(|v| v.checked_add(total))
                .ok_or_else(bad)?;
            number.clear();
        }
        if !number.is_empty() {
            return Err(bad());
        }
    }
    if !(1..=MAX_EVERY_SECONDS).contains(&total) {
        return Err(format!(
            "interval {text:?}: must be between 1 s and 30 days"
        ));
    }
    Ok(total)
}

/// `90` → `"1m30s"`.
pub fn format_every(seconds: u64) -> String {
    let mut out = String::new();
    let mut left = seconds;
    for (unit, name) in [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")] {
        if left >= unit {
            out.push_str(&format!("{}{name}", left / unit));
            left %= unit;
        }
    }
    if out.is_empty() { "0s".into() } else { out }
}

/// A replication, as the catalog keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationRecord {
    pub volume: String,
    /// `nbd://host:port/export`.
    pub target: String,
    /// Seconds between cycles; `None`: cycles only on request (`--once`).
    #[serde(default)]
    pub every_seconds: Option<u64>,
    pub created_unix_ms: u64,
    /// The next snapshot is `repl-<next_seq>`.
    pub next_seq: u64,
    /// The newest snapshot entirely on the target (flushed).
    #[serde(default)]
    pub last: Option<ReplicatedPoint>,
    /// The snapshot of a cycle that has not finished.
    #[serde(default)]
    pub pending: Option<PendingCycle>,
    /// The target may be written over: it was found without data before the
    /// first copy, or the operator said so (`overwrite`). Until then a first
    /// full copy looks for data there and refuses to destroy it.
    #[serde(default)]
    pub target_checked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicatedPoint {
    pub snapshot: String,
    /// When the snapshot was taken (just before: the lag is never understated).
    pub taken_unix_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCycle {
    pub snapshot: String,
    pub taken_unix_ms: u64,
    /// Everything below this offset is on the target (written, then flushed).
    #[serde(default)]
    pub cursor_bytes: u64,
}

/// What the store hands a cycle: the snapshot to ship and what changed.
pub struct CyclePlan {
    pub volume: String,
    pub target: NbdUrl,
    pub snapshot: SnapshotRecord,
    pub taken_unix_ms: u64,
    /// The snapshot of an interrupted cycle, shipped again from `cursor_bytes`.
    pub resumed: bool,
    pub cursor_bytes: u64,
    /// The last replicated snapshot's export name (`None`: a full copy).
    pub base: Option<String>,
    /// The snapshot's layers, top first.
    pub chain: Vec<Arc<Layer>>,
    pub changed: Changed,
}

/// Which grains a cycle ships.
pub enum Changed {
    /// Every grain (the first cycle, or no common layer with the last one).
    Full,
    /// Those these layers store or zero-mark, and any past the old size.
    Layers {
        layers: Vec<Arc<Layer>>,
        old_size_bytes: u64,
    },
}

/// A frozen `child` to merge up into `parent` (which only it reads through).
pub struct Collapse {
    pub parent: u64,
    pub child: u64,
    pub parent_is_base: bool,
    pub parent_layer: Arc<Layer>,
    pub child_layer: Arc<Layer>,
    pub cache: Option<Arc<GrainCache>>,
}

/// `POST /v1/volumes/{name}/replication`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicationRequest {
    /// `nbd://HOST[:PORT]/EXPORT`.
    pub to: String,
    /// Seconds between cycles (absent: keep an existing replication's, or run
    /// only on request).
    #[serde(default)]
    pub every_seconds: Option<u64>,
    /// Run a cycle now.
    #[serde(default)]
    pub once: bool,
    /// A target that holds data may be written over (its first full copy
    /// otherwise refuses; see [`ReplicationRecord::target_checked`]).
    #[serde(default)]
    pub overwrite: bool,
}

/// One finished cycle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CycleReport {
    /// Cycles are numbered from 1 since the server started.
    pub number: u64,
    /// What the target now holds (`volume@repl-<n>`).
    pub snapshot: String,
    /// Every grain of the volume, not only the changed ones.
    pub full: bool,
    /// The snapshot of an interrupted cycle, from this offset on.
    pub resumed_from_bytes: Option<u64>,
    /// Bytes of the grains that were listed as changed.
    pub changed_bytes: u64,
    /// Bytes written with WRITE.
    pub shipped_bytes: u64,
    /// Bytes zeroed with WRITE_ZEROES (or written as zeroes).
    pub zeroed_bytes: u64,
    pub requests: u64,
    /// From the connection to the target's final FLUSH.
    pub seconds: f64,
    /// Merging the released snapshot's layer (local).
    pub merge_seconds: f64,
    pub finished_unix_ms: u64,
}

/// A cycle in progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CycleProgress {
    pub snapshot: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// A replication now (`GET /v1/volumes/{name}/replication`, in volume stats).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicationStatus {
    pub volume: String,
    pub target: String,
    pub every_seconds: Option<u64>,
    /// `idle`, `running`, `retrying` (the last cycle failed), `not-started`
    /// (the server's replication tasks are not running).
    pub state: String,
    /// The newest snapshot entirely on the target, as an export name.
    pub last_snapshot: Option<String>,
    pub last_replicated_unix_ms: Option<u64>,
    /// Now minus when the last replicated snapshot was taken (since the
    /// replication was set up, when none has been): what a failover now loses.
    pub lag_seconds: f64,
    /// The snapshot of an unfinished cycle and how far it is on the target.
    pub pending_snapshot: Option<String>,
    pub pending_cursor_bytes: u64,
    pub progress: Option<CycleProgress>,
    pub next_cycle_unix_ms: Option<u64>,
    pub cycles_started: u64,
    pub cycles_ok: u64,
    pub cycles_failed: u64,
    pub last_error: Option<String>,
    /// The cycle the last error ended (0: none).
    pub last_error_cycle: u64,
    pub last_cycle: Option<CycleReport>,
    /// Since the server started.
    pub shipped_bytes: u64,
    pub zeroed_bytes: u64,
}

#[derive(Default)]
struct Live {
    state: &'static str,
    last_error: Option<String>,
    last_error_cycle: u64,
    last_cycle: Option<CycleReport>,
    next_cycle_unix_ms: Option<u64>,
    progress_snapshot: Option<String>,
    failures: u32,
}

/// One replicated volume's task and counters.
struct Job {
    volume: String,
    /// Run a cycle now.
    wake: Notify,
    /// Recompute when the next cycle is due (the interval changed).
    reschedule: Notify,
    /// Held for a cycle's whole duration, including its blocking parts (which
    /// outlive an aborted task): stop and shutdown wait for it.
    busy: Arc<tokio::sync::Mutex<()>>,
    task: Mutex<Option<JoinHandle<()>>>,
    live: Mutex<Live>,
    cycles_started: AtomicU64,
    cycles_ok: AtomicU64,
    cycles_failed: AtomicU64,
    shipped: AtomicU64,
    zeroed: AtomicU64,
    done: AtomicU64,
    total: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Job {
    fn new(volume: &str) -> Job {
        Job {
            volume: volume.to_string(),
            wake: Notify::new(),
            reschedule: Notify::new(),
            busy: Arc::new(tokio::sync::Mutex::new(())),
            task: Mutex::new(None),
            live: Mutex::new(Live {
                state: "idle",
                ..Live::default()
            }),
            cycles_started: AtomicU64::new(0),
            cycles_ok: AtomicU64::new(0),
            cycles_failed: AtomicU64::new(0),
            shipped: AtomicU64::new(0),
            zeroed: AtomicU64::new(0),
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }
}

struct Running {
    runtime: tokio::runtime::Handle,
    state: Weak<ServerState>,
}

/// The server's replications: one tokio task per replicated volume.
#[derive(Default)]
pub struct Replicator {
    jobs: Mutex<BTreeMap<String, Arc<Job>>>,
    running: OnceLock<Running>,
}

impl Replicator {
    /// Starts a task per replication in the catalog (the server's `run`).
    pub fn start(&self, state: &Arc<ServerState>) {
        let _ = self.running.set(Running {
            runtime: tokio::runtime::Handle::current(),
            state: Arc::downgrade(state),
        });
        for r in state.store().replications() {
            self.job(&r.volume);
        }
    }

    /// Stops every task; waits for cycles' blocking parts (reads, catalog
    /// writes, merges) to end. Interrupted cycles resume at the next start.
    pub async fn shutdown(&self) {
        let jobs: Vec<Arc<Job>> = lock(&self.jobs).values().cloned().collect();
        for j in &jobs {
            if let Some(t) = lock(&j.task).take() {
                t.abort();
            }
        }
        for j in &jobs {
            let _ = j.busy.lock().await;
        }
    }

    /// The job of `volume`, created (and its task started, if the server runs).
    fn job(&self, volume: &str) -> Arc<Job> {
        let mut jobs = lock(&self.jobs);
        let job = jobs
            .entry(volume.to_string())
            .or_insert_with(|| Arc::new(Job::new(volume)))
            .clone();
        drop(jobs);
        if let Some(r) = self.running.get()
            && let Some(state) = r.state.upgrade()
        {
            let mut task = lock(&job.task);
            if task.is_none() {
                *task = Some(r.runtime.spawn(run_job(state, job.clone())));
            }
        }
        job
    }

    /// Creates or updates the replication of `volume` (`once`: a cycle now).
    /// Returns its status and whether it is new.
    pub fn put(
        &self,
        s: &ServerState,
        volume: &str,
        req: &ReplicationRequest,
    ) -> Result<(ReplicationStatus, bool), StoreError> {
        let to = NbdUrl::parse(&req.to).map_err(StoreError::Invalid)?;
        if let Some(e) = req.every_seconds
            && !(1..=MAX_EVERY_SECONDS).contains(&e)
        {
            return Err(StoreError::Invalid(format!(
                "every_seconds must be 1-{MAX_EVERY_SECONDS}, got {e}"
            )));
        }
        if req.every_seconds.is_none() && !req.once {
            return Err(StoreError::Invalid(
                "give an interval (every_seconds, --every) or ask for one cycle (once, --once)"
                    .into(),
            ));
        }
        if onto_itself(s, &to, volume) {
            return Err(StoreError::Invalid(format!(
                "{to} is this server's own volume {volume:?}: a volume cannot replicate onto \
                 itself (each cycle would write its snapshot over the writes made since)"
            )));
        }
        let (_, created) =
            s.store()
                .put_replication(volume, &to, req.every_seconds, req.overwrite)?;
        let job = self.job(volume);
        // The status before the wake-up: a cycle numbered after its
        // `cycles_started` starts after this request (what `--once` waits for).
        let status = self.status(s, volume)?;
        if req.once {
            job.wake.notify_one();
        } else {
            job.reschedule.notify_one();
        }
        Ok((status, created))
    }

    /// Ends the replication of `volume` (a cycle in progress is abandoned) and
    /// merges away the layers its snapshots leave. Blocks: call it off the
    /// async runtime (the admin API's handlers run on the blocking pool).
    pub fn stop(&self, s: &ServerState, volume: &str) -> Result<ReplicationStatus, StoreError> {
        let status = self.status(s, volume)?;
        let job = lock(&self.jobs).remove(volume);
        let _busy = job.as_ref().map(|j| {
            if let Some(t) = lock(&j.task).take() {
                t.abort();
            }
            j.busy.clone().blocking_lock_owned()
        });
        s.store().remove_replication(volume)?;
        if let Err(e) = collapse_all(s, volume) {
            tracing::warn!("volume {volume:?}: merging layers after the replication stopped: {e}");
        }
        Ok(status)
    }

    pub fn status(&self, s: &ServerState, volume: &str) -> Result<ReplicationStatus, StoreError> {
        let rec = s
            .store()
            .replication(volume)
            .ok_or_else(|| StoreError::NotFound(format!("volume {volume:?} is not replicated")))?;
        let job = lock(&self.jobs).get(volume).cloned();
        Ok(self.status_of(&rec, job.as_deref()))
    }

    pub fn list(&self, s: &ServerState) -> Vec<ReplicationStatus> {
        let recs = s.store().replications();
        let jobs = lock(&self.jobs).clone();
        recs.iter()
            .map(|r| self.status_of(r, jobs.get(&r.volume).map(|j| &**j)))
            .collect()
    }

    fn status_of(&self, rec: &ReplicationRecord, job: Option<&Job>) -> ReplicationStatus {
        let now = now_unix_ms();
        let since = rec
            .last
            .as_ref()
            .map_or(rec.created_unix_ms, |l| l.taken_unix_ms);
        let export = |name: &str| format!("{}@{name}", rec.volume);
        let mut st = ReplicationStatus {
            volume: rec.volume.clone(),
            target: rec.target.clone(),
            every_seconds: rec.every_seconds,
            state: "not-started".into(),
            last_snapshot: rec.last.as_ref().map(|l| export(&l.snapshot)),
            last_replicated_unix_ms: rec.last.as_ref().map(|l| l.taken_unix_ms),
            lag_seconds: now.saturating_sub(since) as f64 / 1e3,
            pending_snapshot: rec.pending.as_ref().map(|p| export(&p.snapshot)),
            pending_cursor_bytes: rec.pending.as_ref().map_or(0, |p| p.cursor_bytes),
            progress: None,
            next_cycle_unix_ms: None,
            cycles_started: 0,
            cycles_ok: 0,
            cycles_failed: 0,
            last_error: None,
            last_error_cycle: 0,
            last_cycle: None,
            shipped_bytes: 0,
            zeroed_bytes: 0,
        };
        if let Some(j) = job {
            let live = lock(&j.live);
            if lock(&j.task).is_some() {
                st.state = live.state.into();
            }
            st.next_cycle_unix_ms = live.next_cycle_unix_ms;
            st.last_error = live.last_error.clone();
            st.last_error_cycle = live.last_error_cycle;
            st.last_cycle = live.last_cycle.clone();
            st.progress = live.progress_snapshot.as_ref().map(|s| CycleProgress {
                snapshot: s.clone(),
                done_bytes: j.done.load(Ordering::Relaxed),
                total_bytes: j.total.load(Ordering::Relaxed),
            });
            st.cycles_started = j.cycles_started.load(Ordering::Relaxed);
            st.cycles_ok = j.cycles_ok.load(Ordering::Relaxed);
            st.cycles_failed = j.cycles_failed.load(Ordering::Relaxed);
            st.shipped_bytes = j.shipped.load(Ordering::Relaxed);
            st.zeroed_bytes = j.zeroed.load(Ordering::Relaxed);
        }
        st
    }

    /// Prometheus text: lag, bytes shipped and cycles per replicated volume.
    pub fn prometheus(&self, s: &ServerState) -> String {
        use std::fmt::Write as _;
        let all = self.list(s);
        if all.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        type Get = fn(&ReplicationStatus) -> String;
        let series: [(&str, &str, &str, Get); 5] = [
            (
                "weir_volume_replication_lag_seconds",
                "gauge",
                "Age of the newest snapshot entirely on the replication target (the RPO now; since the replication was set up while none is).",
                |r| format!("{:.3}", r.lag_seconds),
            ),
            (
                "weir_volume_replication_shipped_bytes_total",
                "counter",
                "Bytes written to the replication target with WRITE since the server started.",
                |r| r.shipped_bytes.to_string(),
            ),
            (
                "weir_volume_replication_zeroed_bytes_total",
                "counter",
                "Bytes zeroed on the replication target (WRITE_ZEROES) since the server started.",
                |r| r.zeroed_bytes.to_string(),
            ),
            (
                "weir_volume_replication_last_cycle_seconds",
                "gauge",
                "Duration of the last finished replication cycle (connect to final FLUSH).",
                |r| {
                    r.last_cycle
                        .as_ref()
                        .map_or("0".into(), |c| format!("{:.3}", c.seconds))
                },
            ),
            (
                "weir_volume_replication_running",
                "gauge",
                "1 while a replication cycle runs.",
                |r| u8::from(r.state == "running").to_string(),
            ),
        ];
        for (name, kind, help, get) in series {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for r in &all {
                let _ = writeln!(out, "{name}{{volume=\"{}\"}} {}", r.volume, get(r));
            }
        }
        let name = "weir_volume_replication_cycles_total";
        let _ = writeln!(out, "# HELP {name} Replication cycles finished, by result.");
        let _ = writeln!(out, "# TYPE {name} counter");
        for r in &all {
            for (result, n) in [("ok", r.cycles_ok), ("failed", r.cycles_failed)] {
                let _ = writeln!(
                    out,
                    "{name}{{volume=\"{}\",result=\"{result}\"}} {n}",
                    r.volume
                );
            }
        }
        out
    }
}

/// Merges every collapsible layer of `volume`'s chain (blocking).
fn collapse_all(s: &ServerState, volume: &str) -> Result<f64, String> {
    let started = Instant::now();
    loop {
        let next = s
            .store()
            .replication_collapse_next(volume)
            .map_err(|e| e.to_string())?;
        let Some(c) = next else {
            return Ok(started.elapsed().as_secs_f64());
        };
        weir_thin::commit_into(
            &c.parent_layer,
            &c.child_layer,
            c.parent_is_base,
            c.cache.as_deref(),
        )
        .map_err(|e| format!("merging layer {} into {}: {e}", c.child, c.parent))?;
        if !s
            .store()
            .replication_relabel(&c)
            .map_err(|e| e.to_string())?
        {
            return Ok(started.elapsed().as_secs_f64());
        }
    }
}

/// Runs `f` on the blocking pool with the store locked, keeping the cycle's
/// `busy` guard alive until it returns.
async fn with_store<T: Send + 'static>(
    state: &Arc<ServerState>,
    guard: &Arc<OwnedMutexGuard<()>>,
    f: impl FnOnce(&mut VolumeStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, String> {
    let state = state.clone();
    let guard = guard.clone();
    tokio::task::spawn_blocking(move || {
        let _busy = guard;
        f(&mut state.store()).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("catalog task failed: {e}"))?
}

/// Runs `f` on the blocking pool with the store locked (outside a cycle).
async fn read_store<T: Send + 'static>(
    state: &Arc<ServerState>,
    f: impl FnOnce(&mut VolumeStore) -> Option<T> + Send + 'static,
) -> Option<T> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || f(&mut state.store()))
        .await
        .ok()
        .flatten()
}

/// Runs `f` on the blocking pool, keeping the cycle's `busy` guard alive.
async fn blocking<T: Send + 'static>(
    guard: &Arc<OwnedMutexGuard<()>>,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let guard = guard.clone();
    tokio::task::spawn_blocking(move || {
        let _busy = guard;
        f()
    })
    .await
    .map_err(|e| format!("blocking task failed: {e}"))?
}

fn retry_delay(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(6)).min(MAX_RETRY)
}

/// A replicated volume's task: waits until a cycle is due (the interval after
/// the last replicated snapshot, a request, a retry, an unfinished cycle), runs
/// it, repeats; ends when the replication is gone.
async fn run_job(state: Arc<ServerState>, job: Arc<Job>) {
    let mut retry_at: Option<Instant> = None;
    loop {
        // Off the runtime's threads: the store's lock may be held by a long
        // operation (a flatten, a merge-down).
        let v = job.volume.clone();
        let rec = read_store(&state, move |s| {
            let rec = s.replication(&v)?;
            if s.volume(&v).is_err() {
                // The volume was deleted (before any cycle named a snapshot of it).
                let _ = s.remove_replication(&v);
                return None;
            }
            Some(rec)
        })
        .await;
        let Some(rec) = rec else {
            return;
        };
        let now = now_unix_ms();
        let due_ms: Option<u64> = match retry_at {
            Some(t) => Some(now + t.saturating_duration_since(Instant::now()).as_millis() as u64),
            None if rec.pending.is_some() => Some(now),
            None => rec.every_seconds.map(|e| {
                rec.last
                    .as_ref()
                    .map_or(now, |l| l.taken_unix_ms + e * 1000)
            }),
        };
        {
            let mut live = lock(&job.live);
            live.next_cycle_unix_ms = due_ms;
            live.state = if retry_at.is_some() {
                "retrying"
            } else {
                "idle"
            };
        }
        let woken = match due_ms {
            Some(d) if d <= now => true,
            Some(d) => tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(d - now)) => true,
                _ = job.wake.notified() => true,
                _ = job.reschedule.notified() => false,
            },
            None => tokio::select! {
                _ = job.wake.notified() => true,
                _ = job.reschedule.notified() => false,
            },
        };
        if !woken {
            continue;
        }
        let guard = Arc::new(job.busy.clone().lock_owned().await);
        let number = job.cycles_started.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut live = lock(&job.live);
            live.state = "running";
            live.next_cycle_unix_ms = None;
        }
        let result = cycle(&state, &job, number, &guard).await;
        drop(guard);
        let mut live = lock(&job.live);
        live.progress_snapshot = None;
        match result {
            Ok(report) => {
                tracing::info!(
                    volume = %job.volume,
                    snapshot = %report.snapshot,
                    shipped = report.shipped_bytes,
                    zeroed = report.zeroed_bytes,
                    seconds = report.seconds,
                    "replication cycle done"
                );
                job.cycles_ok.fetch_add(1, Ordering::Relaxed);
                live.last_cycle = Some(report);
                live.failures = 0;
                retry_at = None;
            }
            Err(e) => {
                job.cycles_failed.fetch_add(1, Ordering::Relaxed);
                live.failures += 1;
                let delay = retry_delay(live.failures);
                tracing::warn!(
                    "volume {:?}: replication cycle {number} failed (retry in {} s): {e}",
                    job.volume,
                    delay.as_secs()
                );
                live.last_error = Some(e);
                live.last_error_cycle = number;
                retry_at = Some(Instant::now() + delay);
            }
        }
    }
}

/// One cycle (the module's doc, steps 1-5).
async fn cycle(
    state: &Arc<ServerState>,
    job: &Arc<Job>,
    number: u64,
    guard: &Arc<OwnedMutexGuard<()>>,
) -> Result<CycleReport, String> {
    let started = Instant::now();
    let volume = job.volume.clone();
    let rec = {
        let v = volume.clone();
        read_store(state, move |s| s.replication(&v))
            .await
            .ok_or("the replication was removed")?
    };
    let target = NbdUrl::parse(&rec.target)?;
    let (mut client, export) = connect(&target).await?;
    let plan = {
        let v = volume.clone();
        with_store(state, guard, move |s| s.replication_begin(&v)).await?
    };
    let snapshot = plan.snapshot.export_name();
    let size = plan.snapshot.size_bytes;
    check_export(&export, &target, &volume, size)?;
    let grain = plan
        .chain
        .first()
        .map_or(weir_thin::GRAIN_BYTES, |l| l.grain_bytes());
    let cursor = plan.cursor_bytes.min(size) / grain * grain;
    let full = matches!(plan.changed, Changed::Full);
    let CyclePlan {
        chain,
        changed,
        resumed,
        ..
    } = plan;
    if full && !resumed && !rec.target_checked && rec.last.is_none() {
        check_target_holds_no_data(&mut client, &export, &target, size).await?;
        let v = volume.clone();
        with_store(state, guard, move |s| s.replication_target_checked(&v)).await?;
    }
    let (set, changed_grains) = {
        let from = cursor / grain;
        blocking(guard, move || {
            Ok(changed_grains(&changed, size, grain, from))
        })
        .await?
    };
    let changed_bytes = (changed_grains * grain).min(size.saturating_sub(cursor));
    job.done.store(0, Ordering::Relaxed);
    job.total.store(changed_bytes, Ordering::Relaxed);
    lock(&job.live).progress_snapshot = Some(snapshot.clone());

    let (tx, rx) = mpsc::channel(READ_AHEAD);
    let producer = {
        let guard = guard.clone();
        tokio::task::spawn_blocking(move || {
            let _busy = guard;
            produce(&chain, set.as_ref(), size, grain, cursor, &tx)
        })
    };
    let opts = ShipOptions {
        max_write: export
            .block_size
            .map_or(WRITE_BYTES, |b| u64::from(b.max_payload_bytes))
            .clamp(4096, WRITE_BYTES),
        write_zeroes: export.transmission_flags & FLAG_SEND_WRITE_ZEROES != 0,
        flush: export.transmission_flags & FLAG_SEND_FLUSH != 0,
        start: cursor,
    };
    let shipped = ship(
        &mut client,
        rx,
        &opts,
        job,
        state,
        guard,
        &snapshot,
        &target,
    )
    .await;
    let read = producer
        .await
        .map_err(|e| format!("reading the snapshot failed: {e}"))?;
    let stats = shipped?;
    read?;
    final_flush(&mut client, &target, opts.flush).await?;
    let _ = client.disconnect().await;
    let seconds = started.elapsed().as_secs_f64();
    let merge_seconds = record_finish(state, guard, &volume, &snapshot).await?;
    Ok(CycleReport {
        number,
        snapshot,
        full,
        resumed_from_bytes: resumed.then_some(cursor),
        changed_bytes,
        shipped_bytes: stats.shipped,
        zeroed_bytes: stats.zeroed,
        requests: stats.requests,
        seconds,
        merge_seconds,
        finished_unix_ms: now_unix_ms(),
    })
}

/// A target the copy can go to: writable and at least the snapshot's size.
fn check_export(
    export: &ClientExport,
    target: &NbdUrl,
    volume: &str,
    size: u64,
) -> Result<(), String> {
    if export.transmission_flags & FLAG_READ_ONLY != 0 {
        return Err(format!("target {target} is read-only"));
    }
    if export.size_bytes < size {
        return Err(format!(
            "target {target} is {} bytes, smaller than volume {volume:?} ({size} bytes): \
             grow the target's export to at least the volume's size",
            export.size_bytes
        ));
    }
    Ok(())
}

/// The FLUSH that makes the cycle durable on the target, where it takes one.
async fn final_flush(client: &mut NbdClient, target: &NbdUrl, flush: bool) -> Result<(), String> {
    if !flush {
        tracing::warn!("target {target} does not accept FLUSH: durability is up to it");
        return Ok(());
    }
    client
        .flush()
        .await
        .map_err(|e| format!("target {target}: {e:#}"))?
        .map_err(|e| format!("target {target} failed the final FLUSH: {e}"))
}

/// Records the cycle's snapshot as replicated and merges the one it replaces
/// (the merge's seconds; its failure is only a warning).
async fn record_finish(
    state: &Arc<ServerState>,
    guard: &Arc<OwnedMutexGuard<()>>,
    volume: &str,
    snapshot: &str,
) -> Result<f64, String> {
    let (v, name) = (volume.to_string(), plan_snapshot_name(snapshot));
    with_store(state, guard, move |s| s.replication_finish(&v, &name)).await?;
    let (state2, v) = (state.clone(), volume.to_string());
    Ok(blocking(guard, move || collapse_all(&state2, &v))
        .await
        .unwrap_or_else(|e| {
            tracing::warn!("volume {volume:?}: merging the released snapshot: {e}");
            0.0
        }))
}

/// Before a replication's first full copy: refuses a target that holds data
/// (a mistyped URL must not zero somebody's disk). Reads its first and last MiB
/// (partition tables, file system and LVM labels live there) and 64 KiB at 62
/// points between (about 5 MiB whatever the size); then, where the target
/// says which of its extents may hold data (`base:allocation`), the first
/// 64 KiB of each of those, up to [`EXTENT_CHECK_BYTES`]. Data that is both
/// away from the samples and in an extent the target reports as zero, or past
/// the budget, can still be missed.
async fn check_target_holds_no_data(
    client: &mut NbdClient,
    export: &ClientExport,
    target: &NbdUrl,
    size: u64,
) -> Result<(), String> {
    let mut ranges: Vec<(u64, u64)> = vec![(0, 1 << 20), (size.saturating_sub(1 << 20), 1 << 20)];
    ranges.extend((1..=62).map(|k| (size / 63 * k / PROBE_PIECE * PROBE_PIECE, PROBE_PIECE)));
    for (start, length) in ranges {
        read_zeros(client, target, start, (start + length).min(size)).await?;
    }
    check_allocated_extents(client, export, target, size).await
}

/// The target's reads are this long while it is probed.
const PROBE_PIECE: u64 = 64 << 10;
/// What the extent walk reads at most: 1,024 data extents' first 64 KiB.
const EXTENT_CHECK_BYTES: u64 = 64 << 20;
/// BLOCK_STATUS requests the walk makes at most (a server may answer each with
/// one short extent).
const EXTENT_CHECK_REQUESTS: u32 = 100_000;

/// Reads `start..end` of the target; a non-zero byte refuses it.
async fn read_zeros(
    client: &mut NbdClient,
    target: &NbdUrl,
    start: u64,
    end: u64,
) -> Result<(), String> {
    let mut at = start;
    while at < end {
        let n = (end - at).min(PROBE_PIECE) as u32;
        let data = client
            .read(at, n)
            .await
            .map_err(|e| format!("target {target}: {e:#}"))?
            .map_err(|e| format!("target {target}: reading it before the first copy: {e}"))?;
        if let Some(i) = data.iter().position(|&b| b != 0) {
            return Err(format!(
                "target {target} holds data (a non-zero byte at offset {}): the first \
                 replication would write over all of it. If that is intended, say so: \
                 weir volume replicate VOLUME --to {target} --overwrite, or overwrite = true \
                 in [[replications]]",
                at + i as u64
            ));
        }
        at += u64::from(n);
    }
    Ok(())
}

/// Walks the target's `base:allocation` extents and reads the start of each
/// that is not reported as reading zeros. A target without the context (or
/// without structured replies) is left to the samples.
async fn check_allocated_extents(
    client: &mut NbdClient,
    export: &ClientExport,
    target: &NbdUrl,
    size: u64,
) -> Result<(), String> {
    let Some(context) = export
        .meta_contexts
        .iter()
        .find(|(_, name)| name == weir_nbd::consts::BASE_ALLOCATION)
        .map(|(id, _)| *id)
    else {
        return Ok(());
    };
    let (mut at, mut budget, mut requests) = (0u64, EXTENT_CHECK_BYTES, 0u32);
    while at < size && budget > 0 && requests < EXTENT_CHECK_REQUESTS {
        requests += 1;
        let h = client
            .session()
            .block_status(at, (size - at).min(1 << 30) as u32, false);
        let extents = match client.wait(h).await {
            Ok(Ok(ReplyData::BlockStatus(lists))) => lists
                .into_iter()
                .find(|(id, _)| *id == context)
                .map(|(_, e)| e)
                .unwrap_or_default(),
            // Not answered: the samples stand.
            Ok(_) | Err(_) => break,
        };
        if extents.is_empty() {
            break;
        }
        for e in extents {
            let end = (at + u64::from(e.length)).min(size);
            if e.flags & weir_nbd::consts::STATE_ZERO == 0 && budget > 0 {
                let n = (end - at).min(PROBE_PIECE).min(budget);
                read_zeros(client, target, at, at + n).await?;
                budget -= n;
            }
            at = end;
            if at >= size {
                break;
            }
        }
    }
    if at < size {
        tracing::info!(
            "target {target}: extents checked for data up to offset {at} of {size} (the rest \
             by samples only)"
        );
    }
    Ok(())
}

/// Whether `to` names `volume` on this very server: the same export on our NBD
/// port at a loopback address, our listening address, or (listening on every
/// address) one of this machine's (one a socket can be bound to).
fn onto_itself(s: &ServerState, to: &NbdUrl, volume: &str) -> bool {
    let Some((nbd, _)) = s.addrs.get() else {
        return false;
    };
    if to.export != volume || to.port != nbd.port() {
        return false;
    }
    let Ok(addrs) = std::net::ToSocketAddrs::to_socket_addrs(&(to.host.as_str(), to.port)) else {
        return false;
    };
    let local = |ip: std::net::IpAddr| std::net::UdpSocket::bind((ip, 0)).is_ok();
    addrs.into_iter().any(|a| {
        let ip = a.ip().to_canonical();
        ip.is_loopback() || ip == nbd.ip() || (nbd.ip().is_unspecified() && local(ip))
    })
}

/// `volume@repl-3` → `repl-3`.
fn plan_snapshot_name(export: &str) -> String {
    export
        .split_once('@')
        .map_or(export, |(_, n)| n)
        .to_string()
}

/// Connects to the target (each address its host resolves to, in turn), asking
/// for structured replies and `base:allocation` (the check before a first copy
/// walks the extents; one connection, as a target may take only one: qemu-nbd's
/// default).
async fn connect(url: &NbdUrl) -> Result<(NbdClient, ClientExport), String> {
    let config = ClientConfig::go(url.export.clone());
    let addrs: Vec<std::net::SocketAddr> = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::lookup_host((url.host.as_str(), url.port)),
    )
    .await
    .map_err(|_| format!("resolving {}: timed out", url.host))?
    .map_err(|e| format!("resolving {}: {e}", url.host))?
    .collect();
    let mut last = format!("{} resolves to no address", url.host);
    for a in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, NbdClient::connect(a, config.clone())).await {
            Ok(Ok(c)) => return Ok(c),
            Ok(Err(e)) => last = format!("{e:#}"),
            Err(_) => last = format!("connecting to {a}: timed out"),
        }
    }
    Err(format!("target {url}: {last}"))
}

/// A set of grains (one bit each: 2 MiB for 1 TiB of 64 KiB grains).
pub struct GrainSet {
    words: Vec<u64>,
}

impl GrainSet {
    fn new(grains: u64) -> GrainSet {
        GrainSet {
            words: vec![0; grains.div_ceil(64) as usize],
        }
    }
    fn insert(&mut self, g: u64) -> bool {
        let (w, b) = ((g / 64) as usize, g % 64);
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] |= 1 << b;
        !was
    }
    /// The first member at or after `g`.
    fn next(&self, g: u64) -> Option<u64> {
        let mut w = (g / 64) as usize;
        let mut word = *self.words.get(w)? & (!0u64 << (g % 64));
        loop {
            if word != 0 {
                return Some(w as u64 * 64 + word.trailing_zeros() as u64);
            }
            w += 1;
            word = *self.words.get(w)?;
        }
    }
}

/// The grains to ship (`None`: all) and how many there are from grain `from`.
fn changed_grains(changed: &Changed, size: u64, grain: u64, from: u64) -> (Option<GrainSet>, u64) {
    let grains = size.div_ceil(grain);
    match changed {
        Changed::Full => (None, grains.saturating_sub(from)),
        Changed::Layers {
            layers,
            old_size_bytes,
        } => {
            let mut set = GrainSet::new(grains);
            let mut n = 0;
            for l in layers {
                for (g, _) in l.map().iter() {
                    if g < grains && set.insert(g) && g >= from {
                        n += 1;
                    }
                }
            }
            // Grown since: the target's bytes past the old end are unknown.
            for g in old_size_bytes.div_ceil(grain)..grains {
                if set.insert(g) && g >= from {
                    n += 1;
                }
            }
            (Some(set), n)
        }
    }
}

/// What the reader sends the network side: a run of data, or of zeroes.
enum Piece {
    Data { offset: u64, data: Vec<u8> },
    Zero { offset: u64, length: u64 },
}

/// Where grain `g` is in `chain` (top first): a layer's slot, or nowhere (zeroes).
fn resolve(chain: &[Arc<Layer>], g: u64) -> Option<(usize, u32)> {
    for (i, l) in chain.iter().enumerate() {
        match l.map().get(g) {
            Entry::Unmapped => continue,
            Entry::Zero => return None,
            Entry::Slot(s) => return Some((i, s)),
        }
    }
    None
}

/// Reads the grains to ship, in order from byte `start`, and sends them as
/// pieces (runs of stored grains up to [`WRITE_BYTES`], runs of zero grains up
/// to [`ZERO_BYTES`]). Stops quietly when the receiver is gone.
fn produce(
    chain: &[Arc<Layer>],
    set: Option<&GrainSet>,
    size: u64,
    grain: u64,
    start: u64,
    tx: &mpsc::Sender<Piece>,
) -> Result<(), String> {
    let grains = size.div_ceil(grain);
    let max_data = (WRITE_BYTES / grain).max(1);
    let max_zero = (ZERO_BYTES / grain).max(1);
    let mut data: Vec<(usize, u32)> = Vec::new();
    let mut data_start = 0;
    let (mut zero_start, mut zeroes) = (0u64, 0u64);
    let send = |p: Piece| tx.blocking_send(p).is_ok();
    let flush_data = |data: &mut Vec<(usize, u32)>, first: u64| -> Result<bool, String> {
        if data.is_empty() {
            return Ok(true);
        }
        let offset = first * grain;
        let len = (data.len() as u64 * grain).min(size - offset) as usize;
        let mut buf = vec![0u8; len];
        for (k, &(i, s)) in data.iter().enumerate() {
            let at = k * grain as usize;
            let end = (at + grain as usize).min(len);
            chain[i].read_slot(s, 0, &mut buf[at..end]).map_err(|e| {
                format!(
                    "reading grain {} of layer {}: {e}",
                    first + k as u64,
                    chain[i].id
                )
            })?;
        }
        data.clear();
        Ok(send(Piece::Data { offset, data: buf }))
    };
    let flush_zero = |zero_start: u64, zeroes: &mut u64| -> bool {
        if *zeroes == 0 {
            return true;
        }
        let offset = zero_start * grain;
        let length = (*zeroes * grain).min(size - offset);
        *zeroes = 0;
        send(Piece::Zero { offset, length })
    };
    let mut g = start / grain;
    loop {
        let next = match set {
            None => (g < grains).then_some(g),
            Some(s) => s.next(g).filter(|&n| n < grains),
        };
        let Some(n) = next else {
            break;
        };
        g = n;
        match resolve(chain, g) {
            Some(at) => {
                if !flush_zero(zero_start, &mut zeroes) {
                    return Ok(());
                }
                if !data.is_empty()
                    && (data_start + data.len() as u64 != g || data.len() as u64 == max_data)
                    && !flush_data(&mut data, data_start)?
                {
                    return Ok(());
                }
                if data.is_empty() {
                    data_start = g;
                }
                data.push(at);
            }
            None => {
                if !flush_data(&mut data, data_start)? {
                    return Ok(());
                }
                if zeroes > 0
                    && (zero_start + zeroes != g || zeroes == max_zero)
                    && !flush_zero(zero_start, &mut zeroes)
                {
                    return Ok(());
                }
                if zeroes == 0 {
                    zero_start = g;
                }
                zeroes += 1;
            }
        }
        g += 1;
    }
    if flush_data(&mut data, data_start)? {
        flush_zero(zero_start, &mut zeroes);
    }
    Ok(())
}

struct ShipOptions {
    /// Largest WRITE the target takes (and this side sends).
    max_write: u64,
    /// The target takes WRITE_ZEROES (else zeroes are written as data).
    write_zeroes: bool,
    /// The target takes FLUSH (else no checkpoints).
    flush: bool,
    /// Byte the cycle starts at (a resumed cycle's cursor).
    start: u64,
}

#[derive(Default)]
struct ShipStats {
    shipped: u64,
    zeroed: u64,
    requests: u64,
}

/// A request in flight.
struct Req {
    offset: u64,
    length: u64,
    zero: bool,
}

/// What [`ship`] keeps between events: the requests in flight by handle and their
/// start offsets (the lowest is the cursor a checkpoint records: everything below
/// it is written), the checkpoint's FLUSH in flight, and the bytes since the last.
struct Shipper<'a> {
    opts: &'a ShipOptions,
    zero_buf: Vec<u8>,
    inflight: HashMap<u64, Req>,
    starts: BTreeSet<u64>,
    /// The end of the last piece queued.
    queued_end: u64,
    producer_done: bool,
    /// The checkpoint's FLUSH: its handle and the cursor it will record.
    checkpoint: Option<(u64, u64)>,
    saved_cursor: u64,
    since_bytes: u64,
    since: Instant,
    stats: ShipStats,
}

impl<'a> Shipper<'a> {
    fn new(opts: &'a ShipOptions) -> Self {
        Shipper {
            opts,
            zero_buf: vec![0u8; opts.max_write as usize],
            inflight: HashMap::new(),
            starts: BTreeSet::new(),
            queued_end: opts.start,
            producer_done: false,
            checkpoint: None,
            saved_cursor: opts.start,
            since_bytes: 0,
            since: Instant::now(),
            stats: ShipStats::default(),
        }
    }

    /// Room for another piece from the producer.
    fn room(&self) -> bool {
        !self.producer_done && self.inflight.len() < MAX_IN_FLIGHT
    }

    fn push(&mut self, handle: u64, offset: u64, length: u64, zero: bool) {
        self.inflight.insert(
            handle,
            Req {
                offset,
                length,
                zero,
            },
        );
        self.starts.insert(offset);
    }

    /// Queues a piece's requests (WRITEs of at most `max_write`, or one
    /// WRITE_ZEROES when the target takes it).
    fn queue(&mut self, client: &mut NbdClient, piece: Piece) {
        let max_write = self.opts.max_write;
        self.queued_end = match piece {
            Piece::Data { offset, data } => {
                for (k, chunk) in data.chunks(max_write as usize).enumerate() {
                    let at = offset + (k as u64) * max_write;
                    let h = client.session().write(at, chunk, false);
                    self.push(h, at, chunk.len() as u64, false);
                }
                offset + data.len() as u64
            }
            Piece::Zero { offset, length } if self.opts.write_zeroes => {
                let h = client.session().write_zeroes(offset, length as u32, false);
                self.push(h, offset, length, true);
                offset + length
            }
            Piece::Zero { offset, length } => {
                let mut at = offset;
                while at < offset + length {
                    let n = (offset + length - at).min(max_write);
                    let h = client
                        .session()
                        .write(at, &self.zero_buf[..n as usize], false);
                    self.push(h, at, n, true);
                    at += n;
                }
                offset + length
            }
        };
    }

    /// Queues the pieces the producer has ready, as far as there is room.
    fn take_ready(&mut self, client: &mut NbdClient, rx: &mut mpsc::Receiver<Piece>) {
        while self.room() {
            match rx.try_recv() {
                Ok(p) => self.queue(client, p),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => self.producer_done = true,
            }
        }
    }

    /// Sends a checkpoint's FLUSH when the cursor moved and enough bytes or time
    /// passed since the last (one at a time; none if the target takes no FLUSH).
    fn maybe_checkpoint(&mut self, client: &mut NbdClient) {
        let cursor = self.starts.first().copied().unwrap_or(self.queued_end);
        if self.opts.flush
            && self.checkpoint.is_none()
            && cursor > self.saved_cursor
            && (self.since_bytes >= CHECKPOINT_BYTES || self.since.elapsed() >= CHECKPOINT_INTERVAL)
        {
            self.checkpoint = Some((client.session().flush(), cursor));
            self.since_bytes = 0;
            self.since = Instant::now();
        }
    }

    /// The cursor to record if `handle` is the checkpoint's FLUSH.
    fn checkpoint_done(&mut self, handle: u64) -> Option<u64> {
        let (h, at) = self.checkpoint?;
        (h == handle).then(|| {
            self.checkpoint = None;
            at
        })
    }

    /// A WRITE or zeroing completed: counted, or its error described.
    fn write_done(&mut self, done: Completion, job: &Job) -> Result<(), String> {
        let Some(req) = self.inflight.remove(&done.handle) else {
            return Err(format!("a reply to unknown request {}", done.handle));
        };
        self.starts.remove(&req.offset);
        done.result.map_err(|e| {
            format!(
                "{} of {} bytes at offset {} failed: {e}",
                if req.zero { "zeroing" } else { "WRITE" },
                req.length,
                req.offset
            )
        })?;
        self.stats.requests += 1;
        self.since_bytes += req.length;
        job.done.fetch_add(req.length, Ordering::Relaxed);
        if req.zero {
            self.stats.zeroed += req.length;
            job.zeroed.fetch_add(req.length, Ordering::Relaxed);
        } else {
            self.stats.shipped += req.length;
            job.shipped.fetch_add(req.length, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Writes the pieces from `rx` to the target, [`MAX_IN_FLIGHT`] requests in
/// flight, with checkpoints; returns when every piece is written (not yet
/// flushed).
#[allow(clippy::too_many_arguments)]
async fn ship(
    client: &mut NbdClient,
    mut rx: mpsc::Receiver<Piece>,
    opts: &ShipOptions,
    job: &Job,
    state: &Arc<ServerState>,
    guard: &Arc<OwnedMutexGuard<()>>,
    snapshot: &str,
    target: &NbdUrl,
) -> Result<ShipStats, String> {
    let mut sh = Shipper::new(opts);
    let name = plan_snapshot_name(snapshot);
    let fail = |what: String| format!("target {target}: {what}");
    loop {
        sh.take_ready(client, &mut rx);
        sh.maybe_checkpoint(client);
        client.send().await.map_err(|e| fail(format!("{e:#}")))?;
        if sh.inflight.is_empty() && sh.checkpoint.is_none() {
            if sh.producer_done {
                return Ok(sh.stats);
            }
            match rx.recv().await {
                Some(p) => sh.queue(client, p),
                None => sh.producer_done = true,
            }
            continue;
        }
        enum Event {
            Done(anyhow::Result<Completion>),
            Piece(Option<Piece>),
            Idle,
        }
        let room = sh.room();
        let event = tokio::select! {
            biased;
            c = client.next_completion() => Event::Done(c),
            p = rx.recv(), if room => Event::Piece(p),
            _ = tokio::time::sleep(IDLE_TIMEOUT) => Event::Idle,
        };
        let done = match event {
            Event::Piece(Some(p)) => {
                sh.queue(client, p);
                continue;
            }
            Event::Piece(None) => {
                sh.producer_done = true;
                continue;
            }
            Event::Idle => {
                return Err(fail(format!(
                    "no answer for {} s with {} requests in flight",
                    IDLE_TIMEOUT.as_secs(),
                    sh.inflight.len() + usize::from(sh.checkpoint.is_some())
                )));
            }
            Event::Done(c) => c.map_err(|e| fail(format!("{e:#}")))?,
        };
        if let Some(at) = sh.checkpoint_done(done.handle) {
            done.result
                .map_err(|e| fail(format!("FLUSH failed: {e}")))?;
            let (v, n) = (job.volume.clone(), name.clone());
            match with_store(state, guard, move |s| s.replication_checkpoint(&v, &n, at)).await {
                Ok(()) => sh.saved_cursor = at,
                Err(e) => tracing::warn!(
                    "volume {:?}: recording the cycle's progress: {e}",
                    job.volume
                ),
            }
            continue;
        }
        sh.write_done(done, job).map_err(fail)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_print() {
        let u = NbdUrl::parse("nbd://dr-site:10900/db").unwrap();
        assert_eq!(
            u,
            NbdUrl {
                host: "dr-site".into(),
                port: 10900,
                export: "db".into()
            }
        );
        assert_eq!(u.to_string(), "nbd://dr-site:10900/db");
        let u = NbdUrl::parse("nbd://127.0.0.1").unwrap();
        assert_eq!((u.port, u.export.as_str()), (DEFAULT_PORT, ""));
        assert_eq!(u.to_string(), "nbd://127.0.0.1:10809/");
        let u = NbdUrl::parse("NBD://[::1]:7/a%20b@s").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.export.as_str()),
            ("::1", 7, "a b@s")
        );
        assert_eq!(u.to_string(), "nbd://[::1]:7/a%20b@s");
        assert_eq!(NbdUrl::parse(&u.to_string()).unwrap(), u);
        for bad in [
            "db",
            "http://x/y",
            "nbd+unix:///db?socket=/s",
            "nbd://:10/x",
            "nbd://h:0/x",
            "nbd://h:99999/x",
            "nbd://[::1/x",
            "nbd://h/x?tls=on",
        ] {
            assert!(NbdUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(
            NbdUrl::parse("nbds://h/x")
                .unwrap_err()
                .contains("only plain nbd://")
        );
    }

    #[test]
    fn intervals_parse_and_print() {
        assert_eq!(parse_every("5m"), Ok(300));
        assert_eq!(parse_every("30s"), Ok(30));
        assert_eq!(parse_every("1h30m"), Ok(5400));
        assert_eq!(parse_every("90"), Ok(90));
        assert_eq!(parse_every("2d"), Ok(172_800));
        for bad in ["", "0", "5x", "m", "5m3", "31d", "-5m"] {
            assert!(parse_every(bad).is_err(), "{bad}");
        }
        assert_eq!(format_every(5400), "1h30m");
        assert_eq!(format_every(86_401), "1d1s");
    }

    #[test]
    fn grain_sets_iterate_in_order() {
        let mut s = GrainSet::new(300);
        for g in [3, 64, 65, 299] {
            assert!(s.insert(g));
        }
        assert!(!s.insert(64));
        let mut got = Vec::new();
        let mut at = 0;
        while let Some(g) = s.next(at) {
            got.push(g);
            at = g + 1;
        }
        assert_eq!(got, [3, 64, 65, 299]);
        assert_eq!(s.next(300), None);
    }

    #[test]
    fn retries_back_off_to_a_minute() {
        let d: Vec<u64> = (1..=9).map(|f| retry_delay(f).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    /// The reader's pieces: runs of stored grains, runs of zeroes, a partial
    /// last grain, resumption from a byte.
    #[test]
    fn pieces_cover_exactly_what_changed() {
        let dir = weir_testkit::TempDir::new("repl-pieces");
        const G: u64 = 4096;
        let size = 10 * G - 100;
        let base = Arc::new(Layer::open(dir.path(), 1, 10, G).unwrap());
        let v = weir_thin::ThinVolume::new(
            weir_thin::Chain {
                layers: vec![base.clone()],
            },
            size,
            true,
            None,
        );
        v.write(0, &vec![1u8; (3 * G) as usize], false).unwrap();
        v.write(5 * G, &vec![2u8; G as usize], false).unwrap();
        v.write(9 * G, &[3u8; 50], false).unwrap();
        let chain = vec![base];
        let collect = |set: Option<&GrainSet>, start: u64| {
            let (tx, mut rx) = mpsc::channel(1000);
            produce(&chain, set, size, G, start, &tx).unwrap();
            drop(tx);
            let mut out = Vec::new();
            while let Ok(p) = rx.try_recv() {
                out.push(match p {
                    Piece::Data { offset, data } => (offset, data.len() as u64, data[0]),
                    Piece::Zero { offset, length } => (offset, length, 0xFF),
                });
            }
            out
        };
        assert_eq!(
            collect(None, 0),
            vec![
                (0, 3 * G, 1),
                (3 * G, 2 * G, 0xFF),
                (5 * G, G, 2),
                (6 * G, 3 * G, 0xFF),
                (9 * G, G - 100, 3),
            ]
        );
        assert_eq!(collect(None, 5 * G)[0], (5 * G, G, 2));
        let mut set = GrainSet::new(10);
        for g in [1, 2, 4, 9] {
            set.insert(g);
        }
        assert_eq!(
            collect(Some(&set), 0),
            vec![(G, 2 * G, 1), (4 * G, G, 0xFF), (9 * G, G - 100, 3)]
        );
    }
}
