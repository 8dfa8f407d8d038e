//! Bounds on connections, whatever clients do: a global and a per-host cap on
//! NBD connections (a client over a cap is told why, with `NBD_REP_ERR_POLICY`,
//! and disconnected), room in the open-files limit for every connection the
//! caps admit, budgets for request and reply data per host and in total (on top
//! of each connection's, see `session`), the accept loop's back-off on errors
//! (`EMFILE` …), and warnings at a bounded rate.
//!
//! Refusing cleanly takes a descriptor for a moment (the greeting, then one
//! answer to the client's first option, within [`REFUSAL_TIME`]); at most
//! [`MAX_REFUSING`] connections are being refused at once, and
//! [`MAX_REFUSING_PER_HOST`] of one host, so that a flood of idle connections
//! from some hosts cannot take the refusals another host's client is owed; and
//! [`REFUSING_RESERVED_FOR_NEW_HOSTS`] more are kept for hosts that have no
//! connection and no refusal in progress (a well-behaved client arriving
//! while other hosts flood). Beyond those, a connection is closed at once
//! (`proto.md` allows a hard disconnect against a denial of service).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use crate::budget::Budget;
use weir_nbd::ServerHandshake;

/// Default `max_connections`: NBD connections the server keeps at once.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1024;
/// Default `max_connections_per_host`.
pub const DEFAULT_MAX_CONNECTIONS_PER_HOST: u32 = 256;
/// Default `max_buffered_mib`: READ/WRITE data all connections may hold at once
/// (payloads read, replies not yet written).
pub const DEFAULT_MAX_BUFFERED_MIB: u32 = 2048;
/// Default `max_buffered_mib_per_host`.
pub const DEFAULT_MAX_BUFFERED_MIB_PER_HOST: u32 = 512;
/// The unit data budgets count in.
pub const DATA_UNIT_BYTES: usize = 4096;
/// Connections being refused at once (each holds a descriptor meanwhile).
pub const MAX_REFUSING: usize = 32;
/// … of which one host may hold this many.
pub const MAX_REFUSING_PER_HOST: usize = 2;
/// … and this many more for hosts with no connection and no refusal in progress.
pub const REFUSING_RESERVED_FOR_NEW_HOSTS: usize = 16;
/// Longest a refusal waits for the client's options (a client sends its flags
/// and first option as soon as it has the greeting).
pub const REFUSAL_TIME: Duration = Duration::from_millis(500);
/// Descriptors kept free beyond the connections and the volume store's share: the
/// refusals in progress, a few admin API connections, replication and upstream
/// connections, files opened for a moment (metadata, history).
pub const SPARE_FDS: u64 = (MAX_REFUSING + REFUSING_RESERVED_FOR_NEW_HOSTS) as u64 + 64;
/// The admin API's connections when descriptors are short (taken from the spare).
pub const MIN_ADMIN_CONNECTIONS: usize = 8;
/// One warning per kind at most this often (the rest are counted in the next).
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// A host's connections and its data budget.
struct HostEntry {
    connections: usize,
    data: Budget,
    /// The host's share of `data` for each pool its connections use ([`Slot::pool_budget`]).
    pools: HashMap<String, Budget>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_host: HashMap<IpAddr, HostEntry>,
    refusing: usize,
    refusing_per_host: HashMap<IpAddr, usize>,
}

/// The connection caps and data budgets, and the counts against them.
pub struct ConnectionLimits {
    max_total: usize,
    max_per_host: usize,
    /// Bytes each host's budget starts with.
    host_data_bytes: usize,
    /// Data of every connection.
    data: Budget,
    counts: Mutex<Counts>,
    refused: AtomicU64,
}

/// `max_buffered_mib` and `max_buffered_mib_per_host`, in bytes.
#[derive(Copy, Clone, Debug)]
pub struct DataBudgets {
    pub total_bytes: usize,
    pub per_host_bytes: usize,
}

/// What to do with a new connection.
pub enum Admission {
    /// Serve it; the slot is given back when dropped.
    Admitted(Slot),
    /// Tell the client why it is refused ([`refuse`]), then close.
    Refuse(RefusalSlot, String),
    /// Close it at once (too many refusals in progress).
    Close,
}

/// A connection counted against the caps until dropped.
pub struct Slot {
    limits: Arc<ConnectionLimits>,
    host: IpAddr,
    host_data: Budget,
}

impl Slot {
    /// The data budgets this connection draws from: its host's, and the total.
    pub fn data_budgets(&self) -> (Budget, Budget) {
        (self.host_data.clone(), self.limits.data.clone())
    }

    /// The share of the host's data budget that its requests to one pool may
    /// hold: 1 / [`POOL_SHARE`] of it. A pool whose device stopped answering
    /// keeps queueing the writes its clients send; without a share they held the
    /// host's whole budget, and the host's requests to every other pool waited
    /// behind them (a hypervisor host has VMs on several datastores).
    pub fn pool_budget(&self, pool: &str) -> Budget {
        let whole = self.host_data.whole();
        let mut c = self.limits.counts();
        let e = c
            .per_host
            .get_mut(&self.host)
            .expect("a slot's host is counted");
        e.pools
            .entry(pool.to_string())
            .or_insert_with(|| Budget::new((whole / POOL_SHARE).max(1)))
            .clone()
    }
}

/// A host's requests to one pool may hold at most 1 / `POOL_SHARE` of its data
/// budget ([`Slot::pool_budget`]).
pub const POOL_SHARE: usize = 2;

/// A refusal in progress, counted until dropped.
pub struct RefusalSlot {
    limits: Arc<ConnectionLimits>,
    host: IpAddr,
}

fn decrement(map: &mut HashMap<IpAddr, usize>, host: IpAddr) {
    if let Some(n) = map.get_mut(&host) {
        *n -= 1;
        if *n == 0 {
            map.remove(&host);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.limits.counts();
        c.total -= 1;
        if let Some(e) = c.per_host.get_mut(&self.host) {
            e.connections -= 1;
            if e.connections == 0 {
                c.per_host.remove(&self.host);
            }
        }
    }
}

impl Drop for RefusalSlot {
    fn drop(&mut self) {
        let mut c = self.limits.counts();
        c.refusing -= 1;
        decrement(&mut c.refusing_per_host, self.host);
    }
}

impl ConnectionLimits {
    pub fn new(max_total: usize, max_per_host: usize, data: DataBudgets) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            max_total: max_total.max(1),
            max_per_host: max_per_host.max(1),
            host_data_bytes: data.per_host_bytes,
            data: Budget::new(data.total_bytes / DATA_UNIT_BYTES),
            counts: Mutex::new(Counts::default()),
            refused: AtomicU64::new(0),
        })
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn max_total(&self) -> usize {
        self.max_total
    }
    pub fn max_per_host(&self) -> usize {
        self.max_per_host
    }
    /// Connections admitted and not yet closed.
    pub fn open(&self) -> usize {
        self.counts().total
    }
    /// Connections refused or closed at once since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Prometheus text: connections open, the cap in effect, refusals.
    pub fn render_prometheus(&self) -> String {
        format!(
            "# HELP weir_connections NBD connections open now.\n\
             # TYPE weir_connections gauge\n\
             weir_connections {}\n\
             # HELP weir_connections_max The connection cap in effect (max_connections, \
             fitted to the open-files limit).\n\
             # TYPE weir_connections_max gauge\n\
             weir_connections_max {}\n\
             # HELP weir_connections_refused_total Connections turned away over a cap.\n\
             # TYPE weir_connections_refused_total counter\n\
             weir_connections_refused_total {}\n",
            self.open(),
            self.max_total,
            self.refused()
        ) + &self.render_per_host()
    }

    /// `weir_host_connections{host}`: connections open now, per client address.
    fn render_per_host(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::from(
            "# HELP weir_host_connections NBD connections open now, per client address.\n\
             # TYPE weir_host_connections gauge\n",
        );
        let counts = self.counts();
        let mut hosts: Vec<_> = counts.per_host.iter().collect();
        hosts.sort_by_key(|(h, _)| **h);
        for (host, e) in hosts {
            let _ = writeln!(
                out,
                "weir_host_connections{{host=\"{host}\"}} {}",
                e.connections
            );
        }
        out
    }

    /// Admits a connection from `host` (canonical) or says how to turn it away.
    pub fn admit(self: &Arc<Self>, host: IpAddr) -> Admission {
        let mut c = self.counts();
        let of_host = c.per_host.get(&host).map_or(0, |e| e.connections);
        let reason = if of_host >= self.max_per_host {
            format!(
                "too many connections from {host} (max_connections_per_host = {})",
                self.max_per_host
            )
        } else if c.total >= self.max_total {
            format!(
                "the server is at its connection limit (max_connections = {}); try again later",
                self.max_total
            )
        } else {
            c.total += 1;
            let bytes = self.host_data_bytes;
            let e = c.per_host.entry(host).or_insert_with(|| HostEntry {
                connections: 0,
                data: Budget::new(bytes / DATA_UNIT_BYTES),
                pools: HashMap::new(),
            });
            e.connections += 1;
            let host_data = e.data.clone();
            return Admission::Admitted(Slot {
                limits: self.clone(),
                host,
                host_data,
            });
        };
        self.refused.fetch_add(1, Ordering::Relaxed);
        let refusing_here = c.refusing_per_host.get(&host).copied().unwrap_or(0);
        let new_host = of_host == 0 && refusing_here == 0;
        let most = MAX_REFUSING
            + if new_host {
                REFUSING_RESERVED_FOR_NEW_HOSTS
            } else {
                0
            };
        if c.refusing >= most || refusing_here >= MAX_REFUSING_PER_HOST {
            return Admission::Close;
        }
        c.refusing += 1;
        *c.refusing_per_host.entry(host).or_default() += 1;
        Admission::Refuse(
            RefusalSlot {
                limits: self.clone(),
                host,
            },
            reason,
        )
    }
}

/// Turns a client away: the greeting, then `NBD_REP_ERR_POLICY` with `reason` to
/// every option (`NBD_OPT_ABORT` acknowledged) until the client leaves or
/// [`REFUSAL_TIME`] is up.
pub async fn refuse(mut stream: TcpStream, reason: String, _slot: RefusalSlot) {
    let mut hs = ServerHandshake::new();
    hs.refuse(reason);
    // No catalog: a refused client is shown no export.
    let none: Vec<weir_nbd::ExportDescription> = Vec::new();
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        let mut buf = [0u8; 1024];
        stream.write_all(&hs.take_output()).await?;
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            let event = hs.input(&buf[..n], &none);
            stream.write_all(&hs.take_output()).await?;
            if !matches!(event, Ok(None)) || hs.is_finished() {
                return Ok::<(), io::Error>(());
            }
        }
    })
    .await;
}

/// Exponential back-off of the accept loop after errors: without it, a full
/// descriptor table (`EMFILE`) makes `accept` fail at once, forever, and the loop
/// spins a CPU.
#[derive(Debug)]
pub struct AcceptBackoff {
    next: Duration,
}

/// First pause after a failed `accept`.
pub const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between tries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff { next: BACKOFF_MIN }
    }
}

impl AcceptBackoff {
    /// An `accept` failed: how long to pause before the next (doubling up to
    /// [`BACKOFF_MAX`]).
    pub fn failed(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        pause
    }
    pub fn succeeded(&mut self) {
        self.next = BACKOFF_MIN;
    }
}

/// A warning written at most once per period; the ones in between are counted
/// and reported with the next.
#[derive(Debug)]
pub struct RateLimited {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    pub const fn new(every: Duration) -> RateLimited {
        RateLimited {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)`: write the line now, noting `n` suppressed since the last one.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.every)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// `" (n more in the last 10 s)"`, or nothing.
pub fn suppressed_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more like it in the last {} s)", WARN_EVERY.as_secs())
    }
}

fn nofile_limit() -> Option<(u64, u64)> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0)
        .then_some((l.rlim_cur, l.rlim_max))
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// How the open-files limit is shared: NBD connections (`max_connections`), the
/// admin API's, and the volume store's room to grow (snapshots, clones, volumes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdPlan {
    pub connections: u64,
    pub admin_connections: usize,
    /// Descriptors the volume store may open beyond those it holds or has
    /// reserved (`u64::MAX`: the limit is unknown).
    pub store_room: u64,
}

/// Where the kernel stops any process's open-files limit (`fs.nr_open`).
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

/// The connection caps that fit the open-files limit: raises the soft limit to
/// the hard one (at most `fs.nr_open`): snapshots and clones hold files too, so
/// the room is taken whole, as a server that may need it. `reserved`: descriptors
/// already promised (thin layers not yet written) count as open. Then NBD gets
/// `wanted` or what fits, the admin API what is left of its cap, at least
/// [`MIN_ADMIN_CONNECTIONS`] (from the spare), and the volume store the rest.
pub fn fit_to_fd_limit(wanted: u64, admin_cap: usize, reserved: u64) -> FdPlan {
    let admin_cap = admin_cap.max(MIN_ADMIN_CONNECTIONS);
    let Some((soft, hard)) = nofile_limit() else {
        return FdPlan {
            connections: wanted,
            admin_connections: admin_cap,
            store_room: u64::MAX,
        };
    };
    let target = hard.min(nr_open());
    if target > soft {
        let l = libc::rlimit {
            rlim_cur: target,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads the struct we pass.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) };
    }
    let soft = nofile_limit().map_or(soft, |l| l.0);
    let open = open_fds() + reserved;
    let room = soft.saturating_sub(open + SPARE_FDS);
    let connections = wanted.min(room.max(1));
    if connections < wanted {
        tracing::warn!(
            "max_connections lowered from {wanted} to {connections}: the open-files limit is \
             {soft} ({open} open now or held for thin layers, {SPARE_FDS} kept spare); raise it (ulimit -n) to serve more"
        );
    }
    let left = room.saturating_sub(connections);
    let admin_connections = usize::try_from(left)
        .unwrap_or(usize::MAX)
        .clamp(MIN_ADMIN_CONNECTIONS, admin_cap);
    if admin_connections < admin_cap {
        tracing::warn!(
            "admin API connections lowered from {admin_cap} to {admin_connections}: the \
             open-files limit is {soft}; raise it (ulimit -n) to allow more"
        );
    }
    FdPlan {
        connections,
        admin_connections,
        store_room: left.saturating_sub(admin_connections as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: DataBudgets = DataBudgets {
        total_bytes: 1 << 30,
        per_host_bytes: 1 << 28,
    };

    fn host(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn caps_per_host_and_in_total_with_slots_given_back() {
        let limits = ConnectionLimits::new(3, 2, DATA);
        let a1 = limits.admit(host(1));
        let a2 = limits.admit(host(1));
        assert!(matches!(a1, Admission::Admitted(_)));
        assert!(matches!(a2, Admission::Admitted(_)));
        let Admission::Refuse(r, why) = limits.admit(host(1)) else {
            panic!("third connection of one host admitted")
        };
        assert!(why.contains("max_connections_per_host = 2"), "{why}");
        let b1 = limits.admit(host(2));
        assert!(matches!(b1, Admission::Admitted(_)));
        let Admission::Refuse(_r2, why) = limits.admit(host(3)) else {
            panic!("over the total")
        };
        assert!(why.contains("max_connections = 3"), "{why}");
        assert_eq!((limits.open(), limits.refused()), (3, 2));
        drop(a1);
        drop(r);
        assert_eq!(limits.open(), 2);
        assert!(matches!(limits.admit(host(3)), Admission::Admitted(_)));
    }

    #[test]
    fn a_host_shares_one_data_budget_across_its_connections() {
        let limits = ConnectionLimits::new(8, 8, DATA);
        let slot = |h| match limits.admit(h) {
            Admission::Admitted(s) => s,
            _ => panic!("refused"),
        };
        let (a, b, c) = (slot(host(1)), slot(host(1)), slot(host(2)));
        let (ha, ga) = a.data_budgets();
        let (hb, gb) = b.data_budgets();
        let (hc, _) = c.data_budgets();
        let _held = ha.try_take(10).unwrap();
        assert_eq!(
            hb.free(),
            (1 << 28) / DATA_UNIT_BYTES - 10,
            "one budget per host"
        );
        assert_eq!(hc.free(), (1 << 28) / DATA_UNIT_BYTES);
        let _g = ga.try_take(5).unwrap();
        assert_eq!(
            gb.free(),
            (1 << 30) / DATA_UNIT_BYTES - 5,
            "one for the server"
        );
        drop((a, b));
        // A host that comes back starts with a fresh budget.
        let (h2, _) = slot(host(1)).data_budgets();
        assert_eq!(h2.free(), (1 << 28) / DATA_UNIT_BYTES);
    }

    #[test]
    fn refusals_in_progress_are_bounded_per_host_and_in_total() {
        let limits = ConnectionLimits::new(1, 1, DATA);
        let _slot = limits.admit(host(0));
        let mut held = Vec::new();
        for _ in 0..MAX_REFUSING_PER_HOST {
            let Admission::Refuse(r, _) = limits.admit(host(1)) else {
                panic!()
            };
            held.push(r);
        }
        assert!(matches!(limits.admit(host(1)), Admission::Close));
        // Other hosts still get their clean refusals …
        for i in 0..(MAX_REFUSING - MAX_REFUSING_PER_HOST) {
            let h = host(2 + (i / MAX_REFUSING_PER_HOST) as u8);
            let Admission::Refuse(r, _) = limits.admit(h) else {
                panic!("refusal {i}")
            };
            held.push(r);
        }
        // … until MAX_REFUSING are in progress; a host already being refused
        // gets no more, a new one may use the reserve.
        assert!(matches!(limits.admit(host(2)), Admission::Close));
        for i in 0..REFUSING_RESERVED_FOR_NEW_HOSTS {
            let Admission::Refuse(r, _) = limits.admit(host(100 + i as u8)) else {
                panic!("reserved refusal {i}")
            };
            held.push(r);
        }
        assert!(matches!(limits.admit(host(200)), Admission::Close));
        // One normal refusal ends: the host it belonged to (one still in
        // progress, so not new) gets the freed place.
        held.truncate(MAX_REFUSING - 1);
        let last =
            host(2 + ((MAX_REFUSING - MAX_REFUSING_PER_HOST - 1) / MAX_REFUSING_PER_HOST) as u8);
        assert!(matches!(limits.admit(last), Admission::Refuse(..)));
    }

    #[test]
    fn backoff_doubles_to_its_ceiling_and_resets() {
        let mut b = AcceptBackoff::default();
        let pauses: Vec<_> = (0..10).map(|_| b.failed()).collect();
        assert_eq!(pauses[0], BACKOFF_MIN);
        assert_eq!(pauses[1], BACKOFF_MIN * 2);
        assert_eq!(*pauses.last().unwrap(), BACKOFF_MAX);
        b.succeeded();
        assert_eq!(b.failed(), BACKOFF_MIN);
    }

    #[test]
    fn rate_limited_warnings_count_what_they_hold_back() {
        let mut r = RateLimited::new(Duration::from_secs(10));
        let t = Instant::now();
        assert_eq!(r.allow(t), Some(0));
        for i in 1..1000 {
            assert_eq!(r.allow(t + Duration::from_millis(i)), None);
        }
        assert_eq!(r.allow(t + Duration::from_secs(10)), Some(999));
        assert_eq!(r.allow(t + Duration::from_secs(11)), None);
    }
}
