//! Exclusive-writer leases (`weir:exclusive=TOKEN`): what keeps a write-through
//! cache in front of a volume coherent — in the spirit of RBD's exclusive lock
//! (`rbd map --exclusive`), which librbd's client cache relies on.
//!
//! A client (a caching gateway) selects the metadata context
//! `weir:exclusive=TOKEN` on each of its connections to a volume. The lease is
//! granted when nobody else holds it and no other open connection has written
//! the volume, and is held while at least one connection with that token is
//! open. While it is held, every other connection's WRITE, TRIM and
//! WRITE_ZEROES is refused with EPERM; a connection that has written blocks a
//! grant until it closes.
//!
//! Time, so that a holder that lost its lease without noticing cannot serve a
//! stale hit: the holder serves hits only for [`LEASE_FRESH`] after sending a
//! request that the server answered (the server held the lease when it
//! answered). When the lease ends (its last connection closed, or the server
//! restarted while holding it), other writes to the volume wait until
//! [`LEASE_GRACE`] (twice that) has passed. Held leases are recorded in
//! `data_dir/leases` (written and fsynced at each grant and release), so a
//! server that crashed and restarted still waits out the grace.
//!
//! An operator can break a lease (`weir volume break-lease`, like `rbd lock
//! remove` with blocklisting): the holder's connections are closed, its token is
//! refused from then on (its cache reads through), and the grace starts.
//!
//! Logging stays bounded: grants and releases (one per connection cycle of a
//! client) are debug lines; a break (an operator's call) and a lease found at
//! start (one per volume) are logged at warn/info.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a holder may serve cached data after a request the server
/// answered was sent.
pub const LEASE_FRESH: Duration = Duration::from_millis(1000);
/// How long other writers wait after a lease ended (over [`LEASE_FRESH`], with
/// a margin for the two hosts' clock rates and scheduling).
pub const LEASE_GRACE: Duration = Duration::from_millis(2000);

/// Who holds a volume's lease.
#[derive(Debug)]
struct Holder {
    token: String,
    /// Its open connections.
    connections: u32,
    /// The address of the connection that took it (for the refusal message).
    peer: String,
    /// Set when the lease is broken: its connections close.
    revoke: tokio::sync::watch::Sender<bool>,
}

/// A broken lease: who held it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BrokenLease {
    pub volume: String,
    /// The holder's address and connections (`None`: nobody held it).
    pub holder: Option<String>,
    pub connections: u32,
}

/// Tokens of broken leases remembered (refused if asked again).
const MAX_BLOCKED_TOKENS: usize = 4096;

#[derive(Debug, Default)]
struct VolumeLease {
    /// Tells this entry from one of a later volume of the same name (the
    /// volume was deleted and created again): shares and marks of the old one
    /// change nothing on it.
    epoch: u64,
    holder: Option<Holder>,
    /// Open connections without the lease that have written.
    writers: u32,
    /// Other writes wait until then (a lease ended).
    grace_until: Option<Instant>,
}

#[derive(Debug, Default)]
struct Table {
    volumes: HashMap<String, VolumeLease>,
    /// Tokens of broken leases, oldest first.
    blocked: std::collections::VecDeque<String>,
    /// The last entry's epoch.
    epochs: u64,
}

impl Table {
    fn entry(&mut self, volume: &str) -> &mut VolumeLease {
        let epochs = &mut self.epochs;
        self.volumes.entry(volume.to_string()).or_insert_with(|| {
            *epochs += 1;
            VolumeLease {
                epoch: *epochs,
                ..VolumeLease::default()
            }
        })
    }

    /// `volume`'s entry, if it is still the one of `epoch`.
    fn current(&mut self, volume: &str, epoch: u64) -> Option<&mut VolumeLease> {
        self.volumes.get_mut(volume).filter(|l| l.epoch == epoch)
    }

    /// Volumes to record: held, or still in their grace.
    fn recorded(&self, now: Instant) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .volumes
            .iter()
            .filter(|(_, l)| l.holder.is_some() || l.grace_until.is_some_and(|g| g > now))
            .map(|(n, _)| n.as_str())
            .collect();
        v.sort_unstable();
        v
    }
}

/// Why a write was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// The server's leases.
#[derive(Debug)]
pub struct Leases {
    table: Mutex<Table>,
    /// `data_dir/leases` (`None`: not recorded, in tests).
    path: Option<PathBuf>,
    grace: Duration,
}

impl Leases {
    /// Opens the record in `data_dir`: volumes a previous run held leases on
    /// start in their grace.
    pub fn open(data_dir: &Path) -> io::Result<Arc<Leases>> {
        let path = data_dir.join("leases");
        let now = Instant::now();
        let mut table = Table::default();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for volume in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    tracing::info!(
                        volume,
                        "a lease was held when the server stopped: other writes wait {} ms",
                        LEASE_GRACE.as_millis()
                    );
                    table.entry(volume).grace_until = Some(now + LEASE_GRACE);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
        Ok(Arc::new(Leases {
            table: Mutex::new(table),
            path: Some(path),
            grace: LEASE_GRACE,
        }))
    }

    /// Leases that are not recorded, with grace `grace` (tests).
    pub fn in_memory(grace: Duration) -> Arc<Leases> {
        Arc::new(Leases {
            table: Mutex::new(Table::default()),
            path: None,
            grace,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `token` would be granted on `volume` now.
    pub fn available(&self, volume: &str, token: &str) -> bool {
        let t = self.lock();
        if t.blocked.iter().any(|b| b == token) {
            return false;
        }
        match t.volumes.get(volume) {
            None => true,
            Some(l) => Self::grantable(l, token),
        }
    }

    fn grantable(l: &VolumeLease, token: &str) -> bool {
        match &l.holder {
            Some(h) => h.token == token,
            None => l.writers == 0,
        }
    }

    /// Takes the lease for one connection from `peer` (`None`: not grantable now).
    pub fn acquire(self: &Arc<Self>, volume: &str, token: &str, peer: &str) -> Option<LeaseHeld> {
        let mut t = self.lock();
        if t.blocked.iter().any(|b| b == token) {
            return None;
        }
        let l = t.entry(volume);
        if !Self::grantable(l, token) {
            return None;
        }
        let first = match &mut l.holder {
            Some(h) => {
                h.connections += 1;
                false
            }
            None => {
                l.holder = Some(Holder {
                    token: token.to_string(),
                    connections: 1,
                    peer: peer.to_string(),
                    revoke: tokio::sync::watch::Sender::new(false),
                });
                true
            }
        };
        let revoked = l.holder.as_ref().map(|h| h.revoke.subscribe());
        let epoch = l.epoch;
        if first {
            tracing::debug!(volume, peer, "exclusive lease granted");
            self.record(&t);
        }
        Some(LeaseHeld {
            leases: self.clone(),
            volume: volume.to_string(),
            epoch,
            token: token.to_string(),
            revoked: revoked.expect("held"),
        })
    }

    fn release(&self, volume: &str, epoch: u64, token: &str) {
        let mut t = self.lock();
        let grace = self.grace;
        // The volume was deleted meanwhile: nothing left to release.
        let Some(l) = t.current(volume, epoch) else {
            return;
        };
        // A broken lease was released then.
        let Some(h) = l.holder.as_mut().filter(|h| h.token == token) else {
            return;
        };
        h.connections -= 1;
        if h.connections > 0 {
            return;
        }
        tracing::debug!(volume, peer = %h.peer, "exclusive lease released");
        l.holder = None;
        l.grace_until = Some(Instant::now() + grace);
        self.record(&t);
    }

    /// Breaks `volume`'s lease: its connections are told to close, its token is
    /// refused from now on, and others' writes wait out the grace.
    pub fn break_lease(&self, volume: &str) -> BrokenLease {
        let mut t = self.lock();
        let grace = self.grace;
        let l = t.entry(volume);
        let Some(h) = l.holder.take() else {
            return BrokenLease {
                volume: volume.to_string(),
                holder: None,
                connections: 0,
            };
        };
        l.grace_until = Some(Instant::now() + grace);
        h.revoke.send_replace(true);
        tracing::warn!(volume, peer = %h.peer, "exclusive lease broken");
        if t.blocked.len() >= MAX_BLOCKED_TOKENS {
            t.blocked.pop_front();
        }
        t.blocked.push_back(h.token);
        self.record(&t);
        BrokenLease {
            volume: volume.to_string(),
            holder: Some(h.peer),
            connections: h.connections,
        }
    }

    /// A connection without the lease is about to write `volume`: refused while
    /// someone holds the lease; otherwise the connection counts as a writer
    /// (once, through `mark`) and the write may have to wait until the instant
    /// returned (a lease ended less than the grace ago).
    pub fn foreign_write(
        self: &Arc<Self>,
        volume: &str,
        mark: &mut Option<WriterMark>,
    ) -> Result<Option<Instant>, Refused> {
        let mut t = self.lock();
        let l = t.entry(volume);
        if let Some(h) = &l.holder {
            return Err(Refused(format!(
                "volume {volume:?} is held exclusively by the caching client at {} ({} \
                 connection(s), weir:exclusive lease): its writes go through that client",
                h.peer, h.connections
            )));
        }
        if mark.is_none() {
            l.writers += 1;
            *mark = Some(WriterMark {
                leases: self.clone(),
                volume: volume.to_string(),
                epoch: l.epoch,
            });
        }
        let now = Instant::now();
        Ok(l.grace_until.filter(|&g| g > now))
    }

    /// `volume` was deleted: its holder's connections are told to close (as at a
    /// break, but its token stays usable) and whatever the volume's lease,
    /// writers and grace were, a new volume of that name starts without them.
    pub fn volume_deleted(&self, volume: &str) {
        let mut t = self.lock();
        let Some(l) = t.volumes.remove(volume) else {
            return;
        };
        if let Some(h) = l.holder {
            h.revoke.send_replace(true);
            tracing::debug!(volume, peer = %h.peer, "exclusive lease ended: volume deleted");
        }
        self.record(&t);
    }

    /// Writes `data_dir/leases` (best effort: a failure is logged; the grace
    /// after a crash then relies on the holder's freshness alone).
    fn record(&self, t: &Table) {
        let Some(path) = &self.path else { return };
        let text: String = t
            .recorded(Instant::now())
            .iter()
            .map(|v| format!("{v}\n"))
            .collect();
        let tmp = path.with_extension("tmp");
        let r = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            if let Some(dir) = path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok::<(), io::Error>(())
        })();
        if let Err(e) = r {
            tracing::warn!("recording leases in {}: {e}", path.display());
        }
    }

    /// Volumes with a lease held now (tests).
    pub fn held(&self) -> HashSet<String> {
        self.holders().into_iter().map(|(v, _, _)| v).collect()
    }

    /// Each held lease: volume, holder's address, its connections (sorted).
    pub fn holders(&self) -> Vec<(String, String, u32)> {
        let mut v: Vec<(String, String, u32)> = self
            .lock()
            .volumes
            .iter()
            .filter_map(|(n, l)| {
                let h = l.holder.as_ref()?;
                Some((n.clone(), h.peer.clone(), h.connections))
            })
            .collect();
        v.sort();
        v
    }

    /// `weir_volume_exclusive_lease_connections` (Prometheus text).
    pub fn render_prometheus(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::from(
            "# HELP weir_volume_exclusive_lease_connections Connections of the client holding \
             the volume's exclusive lease (weir:exclusive; others' writes are refused).\n\
             # TYPE weir_volume_exclusive_lease_connections gauge\n",
        );
        for (volume, peer, n) in self.holders() {
            let _ = writeln!(
                out,
                "weir_volume_exclusive_lease_connections{{volume=\"{}\",holder=\"{}\"}} {n}",
                crate::metrics::escape(&volume),
                crate::metrics::escape(&peer)
            );
        }
        out
    }
}

/// One connection's share of a held lease (released on drop).
#[derive(Debug)]
pub struct LeaseHeld {
    leases: Arc<Leases>,
    volume: String,
    epoch: u64,
    token: String,
    revoked: tokio::sync::watch::Receiver<bool>,
}

impl LeaseHeld {
    /// Whether the lease was broken (the connection must close).
    pub fn is_revoked(&self) -> bool {
        *self.revoked.borrow()
    }

    /// Waits until the lease is broken.
    pub async fn revoked(&self) {
        let mut rx = self.revoked.clone();
        let _ = rx.wait_for(|&b| b).await;
    }
}

impl Drop for LeaseHeld {
    fn drop(&mut self) {
        self.leases.release(&self.volume, self.epoch, &self.token);
    }
}

/// A connection without the lease that has written (blocks grants until drop).
#[derive(Debug)]
pub struct WriterMark {
    leases: Arc<Leases>,
    volume: String,
    epoch: u64,
}

impl Drop for WriterMark {
    fn drop(&mut self) {
        let mut t = self.leases.lock();
        if let Some(l) = t.current(&self.volume, self.epoch) {
            l.writers = l.writers.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_excludes_other_writers_and_is_shared_by_its_token() {
        let leases = Leases::in_memory(Duration::from_millis(50));
        let a1 = leases.acquire("x", "a", "p").expect("free");
        let a2 = leases.acquire("x", "a", "p").expect("same token");
        assert!(!leases.available("x", "b"));
        assert!(leases.acquire("x", "b", "p").is_none());
        let mut mark = None;
        assert!(leases.foreign_write("x", &mut mark).is_err());
        assert!(mark.is_none());
        // Other volumes are not affected.
        assert_eq!(leases.foreign_write("y", &mut mark), Ok(None));
        drop(mark);
        drop(a1);
        assert!(leases.held().contains("x"), "one connection still holds it");
        drop(a2);
        assert!(leases.held().is_empty());
        // The grace: a write right after the release waits.
        let mut mark = None;
        let wait = leases.foreign_write("x", &mut mark).unwrap();
        assert!(wait.is_some_and(|w| w > Instant::now()));
        // A writer blocks a new grant until its connection closes.
        assert!(!leases.available("x", "a"));
        assert!(leases.acquire("x", "a", "p").is_none());
        drop(mark);
        assert!(leases.acquire("x", "a", "p").is_some());
    }

    #[test]
    fn a_broken_lease_closes_its_holder_and_refuses_its_token() {
        let leases = Leases::in_memory(Duration::from_millis(50));
        let held = leases.acquire("x", "a", "10.0.0.1").unwrap();
        assert!(!held.is_revoked());
        let b = leases.break_lease("x");
        assert_eq!(b.holder.as_deref(), Some("10.0.0.1"));
        assert_eq!(b.connections, 1);
        assert!(held.is_revoked());
        assert!(leases.held().is_empty());
        // Its token is refused from now on; others wait out the grace.
        assert!(!leases.available("x", "a"));
        assert!(leases.acquire("x", "a", "10.0.0.1").is_none());
        let wait = leases.foreign_write("x", &mut None).unwrap();
        assert!(wait.is_some());
        // The holder's late release changes nothing; another token may take it.
        drop(held);
        assert!(leases.acquire("x", "b", "10.0.0.2").is_some());
        assert_eq!(leases.break_lease("y").holder, None);
    }

    #[test]
    fn a_deleted_volume_leaves_nothing_to_a_new_one_of_its_name() {
        let leases = Leases::in_memory(Duration::from_millis(50));
        let held = leases.acquire("x", "a", "10.0.0.1").unwrap();
        let mut old_writer = None;
        leases.foreign_write("y", &mut old_writer).unwrap();
        leases.volume_deleted("x");
        leases.volume_deleted("y");
        // The holder's connections close; others may write the new volume at once.
        assert!(held.is_revoked());
        assert_eq!(leases.foreign_write("x", &mut None), Ok(None));
        // The old connections' ends change nothing on the new volumes.
        let mut new_writer = None;
        leases.foreign_write("y", &mut new_writer).unwrap();
        drop(old_writer);
        assert!(
            !leases.available("y", "b"),
            "the new volume's writer still counts"
        );
        let new_holder = leases.acquire("x", "b", "10.0.0.2").unwrap();
        drop(held);
        assert!(leases.held().contains("x"), "the new lease stands");
        // The old token is not blocked.
        drop(new_holder);
        assert!(leases.available("z", "a"));
    }

    #[test]
    fn held_leases_are_recorded_and_a_restart_waits_out_the_grace() {
        let dir = weir_testkit::TempDir::new("leases");
        let leases = Leases::open(dir.path()).unwrap();
        let held = leases.acquire("vol", "t", "p").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("leases")).unwrap(),
            "vol\n"
        );
        // The server dies with the lease held: the next one starts in grace.
        std::mem::forget(held);
        let again = Leases::open(dir.path()).unwrap();
        let mut mark = None;
        let wait = again.foreign_write("vol", &mut mark).unwrap();
        assert!(wait.is_some_and(|w| w > Instant::now() + LEASE_GRACE / 2));
        assert_eq!(again.foreign_write("other", &mut None), Ok(None));
    }
}
