//! The client hosts the server remembers — a QoS client id and I/O counters per
//! address — bounded whatever the number of addresses clients come from (one
//! IPv6 client may use a whole /64).
//!
//! A host with an open connection is always remembered (the connection caps bound
//! those). Of the others, the [`REMEMBERED_IDLE_HOSTS`] most recently active are
//! kept; beyond them the least recently active is forgotten: its counters are added
//! to those of `host="other"` (so the per-host series still sum to the total) and
//! its client id is not given again.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use weir_qos::ClientId;

use crate::metrics::{CounterSnapshot, IoCounters};

/// Hosts without an open connection whose figures are kept apart.
pub const REMEMBERED_IDLE_HOSTS: usize = 1024;

/// The label of the forgotten hosts' summed counters.
pub const OTHER_HOSTS: &str = "other";

struct Entry {
    id: ClientId,
    counters: Arc<IoCounters>,
    sessions: usize,
    /// Tick of its last session's end while it has none (its key in `idle`).
    idle_since: Option<u64>,
}

struct Inner {
    hosts: BTreeMap<IpAddr, Entry>,
    /// Hosts without a session, by the tick their last one ended (oldest first).
    idle: BTreeMap<u64, IpAddr>,
    tick: u64,
    last_id: u32,
    max_idle: usize,
    other: IoCounters,
    forgotten: u64,
}

/// Every host remembered, and the sum of those forgotten.
pub struct HostTable {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for HostTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = lock(&self.inner);
        f.debug_struct("HostTable")
            .field("remembered", &t.hosts.len())
            .field("forgotten", &t.forgotten)
            .finish()
    }
}

impl Default for HostTable {
    fn default() -> Self {
        HostTable::new(REMEMBERED_IDLE_HOSTS)
    }
}

/// A session's hold on its host: the host stays remembered while held.
pub struct HostSession {
    pub id: ClientId,
    pub counters: Arc<IoCounters>,
    host: IpAddr,
    table: Arc<Mutex<Inner>>,
}

impl Drop for HostSession {
    fn drop(&mut self) {
        lock(&self.table).release(self.host);
    }
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn attach(&mut self, host: IpAddr) -> (ClientId, Arc<IoCounters>) {
        if !self.hosts.contains_key(&host) {
            // Ids are never given twice (until 2^32 hosts have come and gone).
            self.last_id = self.last_id.checked_add(1).unwrap_or(1);
            let entry = Entry {
                id: ClientId(self.last_id),
                counters: Arc::default(),
                sessions: 0,
                idle_since: None,
            };
            self.hosts.insert(host, entry);
        }
        let e = self.hosts.get_mut(&host).expect("inserted above");
        if let Some(t) = e.idle_since.take() {
            self.idle.remove(&t);
        }
        e.sessions += 1;
        (e.id, e.counters.clone())
    }

    fn release(&mut self, host: IpAddr) {
        let Some(e) = self.hosts.get_mut(&host) else {
            debug_assert!(false, "a session's host is remembered");
            return;
        };
        debug_assert!(e.sessions > 0 && e.idle_since.is_none());
        e.sessions -= 1;
        if e.sessions > 0 {
            return;
        }
        self.tick += 1;
        e.idle_since = Some(self.tick);
        self.idle.insert(self.tick, host);
        while self.idle.len() > self.max_idle {
            let (_, oldest) = self.idle.pop_first().expect("longer than max_idle");
            let gone = self
                .hosts
                .remove(&oldest)
                .expect("idle hosts are remembered");
            self.other.add(&gone.counters.snapshot());
            self.forgotten += 1;
        }
        debug_assert!(self.idle.len() <= self.max_idle);
    }
}

impl HostTable {
    /// A table that keeps at most `max_idle` hosts without a connection.
    pub fn new(max_idle: usize) -> HostTable {
        HostTable {
            inner: Arc::new(Mutex::new(Inner {
                hosts: BTreeMap::new(),
                idle: BTreeMap::new(),
                tick: 0,
                last_id: 0,
                max_idle,
                other: IoCounters::default(),
                forgotten: 0,
            })),
        }
    }

    /// A new session of `host`: its client id and counters, held until dropped.
    pub fn attach(&self, host: IpAddr) -> HostSession {
        let (id, counters) = lock(&self.inner).attach(host);
        HostSession {
            id,
            counters,
            host,
            table: self.inner.clone(),
        }
    }

    /// Every host remembered (its address as text), then [`OTHER_HOSTS`] once a
    /// host has been forgotten.
    pub fn snapshots(&self) -> Vec<(String, CounterSnapshot)> {
        let t = lock(&self.inner);
        let mut v: Vec<_> = t
            .hosts
            .iter()
            .map(|(ip, e)| (ip.to_string(), e.counters.snapshot()))
            .collect();
        if t.forgotten > 0 {
            v.push((OTHER_HOSTS.to_string(), t.other.snapshot()));
        }
        v
    }

    /// Hosts remembered now.
    pub fn len(&self) -> usize {
        lock(&self.inner).hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hosts forgotten since start.
    pub fn forgotten(&self) -> u64 {
        lock(&self.inner).forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::OpKind;

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn ids_are_stable_while_remembered_and_never_reused() {
        let t = HostTable::new(2);
        let a = t.attach(ip(1));
        let a2 = t.attach(ip(1));
        assert_eq!(a.id, a2.id);
        let b = t.attach(ip(2));
        assert_ne!(a.id, b.id);
        drop((a, a2, b));
        let a = t.attach(ip(1));
        assert_eq!(a.id, ClientId(1), "remembered while idle");
        drop(a);
        for n in 3..6 {
            drop(t.attach(ip(n)));
        }
        // ip(1) is forgotten now; it comes back with a new id.
        let a = t.attach(ip(1));
        assert_eq!(a.id, ClientId(6));
    }

    #[test]
    fn connected_hosts_stay_and_idle_ones_are_bounded_and_summed() {
        let t = HostTable::new(3);
        let held: Vec<_> = (0..10).map(|n| t.attach(ip(n))).collect();
        for s in &held {
            s.counters.record(OpKind::Read, 4096, 1_000, true);
        }
        for n in 10..1000 {
            let s = t.attach(ip(n));
            s.counters.record(OpKind::Write, 512, 1_000, true);
        }
        // 10 connected + the 3 most recent idle ones.
        assert_eq!(t.len(), 13);
        assert_eq!(t.forgotten(), 987);
        let rows = t.snapshots();
        assert_eq!(rows.len(), 14);
        let other = &rows.last().unwrap();
        assert_eq!(other.0, OTHER_HOSTS);
        assert_eq!(other.1.write_ios, 987);
        let reads: u64 = rows.iter().map(|(_, s)| s.read_ios).sum();
        let writes: u64 = rows.iter().map(|(_, s)| s.write_ios).sum();
        assert_eq!((reads, writes), (10, 990));
        let names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&ip(999).to_string().as_str()));
        assert!(!names.contains(&ip(996).to_string().as_str()));
        drop(held);
        assert_eq!(t.len(), 3, "the ten leave; only three idle hosts stay");
        assert_eq!(t.forgotten(), 997);
    }
}
