//! A Ceph-like RADOS cluster behind RBD gateways, as one queueing state machine.
//!
//! An RBD image is striped over objects (`object_kib`, 4 MiB by default); an object
//! maps to a placement group by hash, and a placement group to `replicas` distinct
//! OSDs (its acting set; the first is the primary) by a fixed pseudo-random choice,
//! as CRUSH does on a flat map. Each OSD is a NIC (a [`Link`]), an op queue, an
//! op-thread pool on `cores_per_osd` cores (FIFO, `cpu_us_per_op + size ×
//! cpu_us_per_kib` per op) and one drive (weir-model's HDD or SSD, with its own
//! queue). A request split at object boundaries (as librbd splits it) runs per piece:
//!
//! ```text
//! read : primary NIC (request) → primary CPU → primary drive → primary NIC (data) → done
//! write: primary NIC (data) → primary CPU ─┬→ primary drive ────────────────────────┐
//!                                          └→ replica NIC (data) → replica CPU →    │
//!                                             replica drive → ack (one NIC latency) ┴→ ack → done
//! ```
//!
//! **The op queue serves clients in turn.** Ops wait in one FIFO per client and
//! `op_threads` threads take them round robin across the clients (Ceph 16's `wpq`
//! within a priority: `SubQueue::pop`; `mclock_scheduler` is per client too), so a
//! client with many ops queued is served as often as one with a few, not in
//! proportion — what makes windows alone unable to divide a cluster between gateways
//! (docs/QOS.md). A client is whoever submits ([`Component::submit_from`]: the
//! simulator's host, one gateway); a replica's sub-op is queued as coming from its
//! primary OSD. A read holds its thread through the drive read (BlueStore reads in
//! the op thread); a write's thread is free once its CPU is spent (the transaction
//! goes to BlueStore's queue). Threads per OSD default to Ceph 16's
//! `osd_op_num_shards_hdd` × `osd_op_num_threads_per_shard_hdd` = 5 × 1 on HDD OSDs
//! and the `_ssd` ones, 8 × 2 = 16, on SSD OSDs.
//!
//! A write is acknowledged once every copy is durable. BlueStore defers small writes
//! (`deferred_write_kib`, 64 KiB on HDD OSDs and off on SSD ones by default, as
//! `bluestore_prefer_deferred_size_hdd`/`_ssd` in Ceph 16): such a copy is durable
//! once it is in the OSD's write-ahead log (an append in a 1 GiB region at the start
//! of the drive), and the in-place writes follow in the background, 64 at a time
//! (`bluestore_deferred_batch_ops_hdd`), taking drive time; a batch not yet full
//! waits for more writes.
//!
//! Where the numbers come from. CPU: Ceph's hardware recommendations (docs
//! `start/hardware-recommendations`, 2020-2022) size OSD CPU at "1 core per
//! 1000-3000 IOPS" and "1 core per 200-500 MB/s", before replication: the defaults
//! take the geometric middles, 580 µs per op and 2.8 µs per KiB (1 core per ≈ 350
//! MB/s), charged on every OSD an op touches, with 2 cores per OSD (the "2 cores per
//! NVMe OSD" rule that M. Nelson's "Ceph OSD CPU Scaling" (ceph.io, 2022) discusses).
//! These are defaults from published sizing rules, not fitted to a measurement;
//! scenarios may set their own.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::array::{Drive, DriveRef, DriveSpec};
use crate::error::{ModelError, check_between};
use crate::link::{Link, LinkSpec};
use crate::{Completion, Component, DeviceIo, IoDir, Nanos, round_ns};

/// A link given by preset name (`10gbe`, `1gbe`, …) or as a table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LinkRef {
    Preset(String),
    Custom(LinkSpec),
}

impl LinkRef {
    pub fn resolve(&self) -> Result<LinkSpec, ModelError> {
        match self {
            LinkRef::Preset(n) => LinkSpec::preset(n),
            LinkRef::Custom(l) => Ok(l.clone()),
        }
    }
}

/// A RADOS pool on `osds` OSDs, as `[array] ceph = { … }` describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CephSpec {
    /// OSDs, one drive each.
    pub osds: u32,
    /// Copies of each object (the pool's `size`).
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// Each OSD's drive: a preset name (`sas-15k`, `sata-7200`, `sata-ssd`,
    /// `pcie-flash`, …) or a table.
    pub drive: DriveRef,
    /// RBD object size, KiB.
    #[serde(default = "default_object_kib")]
    pub object_kib: u32,
    /// Placement groups of the pool.
    #[serde(default = "default_pgs")]
    pub pgs: u32,
    /// Each OSD's network port.
    #[serde(default = "default_network")]
    pub network: LinkRef,
    /// Cores each OSD's op threads use.
    #[serde(default = "default_cores")]
    pub cores_per_osd: u32,
    /// CPU an OSD spends on one op (each copy of a write counts), µs.
    #[serde(default = "default_cpu_us_per_op")]
    pub cpu_us_per_op: f64,
    /// CPU an OSD spends per KiB it reads or writes, µs.
    #[serde(default = "default_cpu_us_per_kib")]
    pub cpu_us_per_kib: f64,
    /// Writes up to this size go to the write-ahead log first (0: none). Default: 64
    /// on HDD OSDs, 0 on SSD OSDs.
    #[serde(default)]
    pub deferred_write_kib: Option<u32>,
    /// Op threads per OSD, taking queued ops from the clients in turn. Default: 5
    /// on HDD OSDs, 16 on SSD OSDs (Ceph 16's shards × threads per shard).
    #[serde(default)]
    pub op_threads: Option<u32>,
}

fn default_replicas() -> u32 {
    3
}
fn default_object_kib() -> u32 {
    4096
}
fn default_pgs() -> u32 {
    128
}
fn default_network() -> LinkRef {
    LinkRef::Preset("10gbe".into())
}
fn default_cores() -> u32 {
    2
}
fn default_cpu_us_per_op() -> f64 {
    580.0
}
fn default_cpu_us_per_kib() -> f64 {
    2.8
}

/// The write-ahead log region at the start of each OSD's drive.
const WAL_BYTES: u64 = 1 << 30;
const MAX_OSDS: u32 = 4096;
const MAX_REPLICAS: u32 = 8;
/// A drive token for a deferred write's in-place copy (nobody waits for it).
const BACKGROUND: u64 = u64::MAX;
/// Replica sub-ops are queued as the client `PEER_CLIENT - primary OSD`.
const PEER_CLIENT: u32 = u32::MAX;
/// Deferred writes are applied in place in batches of this many
/// (`bluestore_deferred_batch_ops_hdd`, 64 in Ceph 16), so the drive can sort them.
const DEFERRED_BATCH: usize = 64;

/// What happens next to a piece (event kinds).
const AT_PRIMARY: u8 = 1;
const PRIMARY_CPU_DONE: u8 = 2;
const AT_REPLICA: u8 = 3;
const REPLICA_CPU_DONE: u8 = 4;
const COPY_DURABLE: u8 = 5;
const PIECE_DONE: u8 = 6;
const DRIVE_WAKE: u8 = 7;

/// One object's share of a request.
#[derive(Clone, Copy, Debug)]
struct Piece {
    op: u32,
    /// Who submitted it (the op queue's client).
    client: u32,
    pg: u32,
    dir: IoDir,
    /// Byte offset within the object.
    offset: u64,
    object: u64,
    size: u32,
    /// Copies not yet durable (writes).
    pending: u32,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    token: u64,
    pieces_left: u32,
}

/// An OSD's op queue: one FIFO of `(piece, role)` per client, the clients with ops
/// queued in turn order, and the threads busy.
#[derive(Default)]
struct OpQueue {
    fifos: HashMap<u32, VecDeque<(u32, u32)>>,
    turn: VecDeque<u32>,
    busy: u32,
}

impl OpQueue {
    fn push(&mut self, client: u32, op: (u32, u32)) {
        let fifo = self.fifos.entry(client).or_default();
        if fifo.is_empty() {
            self.turn.push_back(client);
        }
        fifo.push_back(op);
    }

    /// The next client's oldest op; that client goes to the back of the turn.
    fn pop(&mut self) -> Option<(u32, u32)> {
        let client = self.turn.pop_front()?;
        let fifo = self
            .fifos
            .get_mut(&client)
            .expect("a client in turn has ops");
        let op = fifo.pop_front().expect("a client in turn has ops");
        if fifo.is_empty() {
            self.fifos.remove(&client);
        } else {
            self.turn.push_back(client);
        }
        Some(op)
    }
}

/// One OSD: its port, its op queue, its cores (when each is next free) and its drive.
struct Osd {
    nic: Link,
    queue: OpQueue,
    cores_free: Vec<Nanos>,
    cpu_busy_ns: Nanos,
    drive: Drive,
    /// When this drive's next event is already scheduled (avoids duplicate wakes).
    wake_at: Option<Nanos>,
    wal_head: u64,
    /// Deferred writes logged but not yet applied in place.
    deferred: Vec<DeviceIo>,
}

/// Per-OSD counters for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OsdStats {
    pub cpu_busy_ns: Nanos,
    pub drive_busy_ns: Nanos,
    pub drive_ios: u64,
    pub drive_bytes: u64,
}

/// The cluster as a [`Component`].
pub struct CephCluster {
    spec: CephSpec,
    osds: Vec<Osd>,
    /// `pgs × replicas` OSD indexes: each placement group's acting set.
    acting: Vec<u32>,
    object_bytes: u64,
    /// Object slots on each drive after its WAL region.
    slots: u64,
    deferred_bytes: u32,
    op_threads: u32,
    cpu_ns_per_op: f64,
    cpu_ns_per_byte: f64,
    ops: Vec<Op>,
    free_ops: Vec<u32>,
    pieces: Vec<Piece>,
    free_pieces: Vec<u32>,
    /// (time, sequence, piece << 32 | kind << 16 | role).
    events: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    seq: u64,
    drive_done: Vec<Completion>,
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

impl CephSpec {
    pub fn validate(&self) -> Result<DriveSpec, ModelError> {
        let invalid = |field, value: String, reason| ModelError::InvalidField {
            what: "ceph spec",
            field,
            value,
            reason,
        };
        if !(1..=MAX_OSDS).contains(&self.osds) {
            return Err(invalid("osds", self.osds.to_string(), "must be 1-4096"));
        }
        if !(1..=MAX_REPLICAS.min(self.osds)).contains(&self.replicas) {
            return Err(invalid(
                "replicas",
                self.replicas.to_string(),
                "must be 1-8 and at most the number of OSDs",
            ));
        }
        if !(4..=1 << 20).contains(&self.object_kib) || !self.object_kib.is_power_of_two() {
            return Err(invalid(
                "object_kib",
                self.object_kib.to_string(),
                "must be a power of two, 4-1048576",
            ));
        }
        if !(1..=1 << 16).contains(&self.pgs) {
            return Err(invalid("pgs", self.pgs.to_string(), "must be 1-65536"));
        }
        if !(1..=256).contains(&self.cores_per_osd) {
            return Err(invalid(
                "cores_per_osd",
                self.cores_per_osd.to_string(),
                "must be 1-256",
            ));
        }
        if let Some(t) = self.op_threads
            && !(1..=1024).contains(&t)
        {
            return Err(invalid("op_threads", t.to_string(), "must be 1-1024"));
        }
        let op = "must be 0-1e7 µs (10 s)";
        check_between(
            "ceph spec",
            "cpu_us_per_op",
            self.cpu_us_per_op,
            (0.0, 1e7),
            op,
        )?;
        let kib = "must be 0-1e3 µs (1 MB/s or faster)";
        check_between(
            "ceph spec",
            "cpu_us_per_kib",
            self.cpu_us_per_kib,
            (0.0, 1e3),
            kib,
        )?;
        self.network.resolve()?.validate()?;
        let drive = self.drive.spec()?;
        drive.validate()?;
        if drive.capacity_bytes() < WAL_BYTES + ((self.object_kib as u64) << 10) {
            return Err(invalid(
                "drive",
                drive.capacity_bytes().to_string(),
                "too small for the 1 GiB write-ahead log and one object",
            ));
        }
        Ok(drive)
    }

    /// Bytes the pool holds: every drive's object space over the copies.
    pub fn capacity_bytes(&self) -> Result<u64, ModelError> {
        let drive = self.validate()?;
        let per_drive = drive.capacity_bytes() - WAL_BYTES;
        Ok(per_drive * self.osds as u64 / self.replicas as u64)
    }
}

impl CephCluster {
    pub fn new(spec: &CephSpec) -> Result<Self, ModelError> {
        let drive_spec = spec.validate()?;
        let link = spec.network.resolve()?;
        let mut osds = Vec::with_capacity(spec.osds as usize);
        for _ in 0..spec.osds {
            osds.push(Osd {
                nic: Link::new(&link)?,
                queue: OpQueue::default(),
                cores_free: vec![0; spec.cores_per_osd as usize],
                cpu_busy_ns: 0,
                drive: Drive::new(&drive_spec)?,
                wake_at: None,
                wal_head: 0,
                deferred: Vec::new(),
            });
        }
        let object_bytes = (spec.object_kib as u64) << 10;
        let (deferred_kib, op_threads) = match drive_spec {
            DriveSpec::Hdd(_) => (64, 5),
            DriveSpec::Ssd(_) => (0, 16),
        };
        let deferred_kib = spec.deferred_write_kib.unwrap_or(deferred_kib);
        Ok(Self {
            acting: acting_sets(spec.pgs, spec.replicas, spec.osds),
            slots: (drive_spec.capacity_bytes() - WAL_BYTES) / object_bytes,
            object_bytes,
            deferred_bytes: deferred_kib.saturating_mul(1024),
            op_threads: spec.op_threads.unwrap_or(op_threads),
            cpu_ns_per_op: spec.cpu_us_per_op * 1e3,
            cpu_ns_per_byte: spec.cpu_us_per_kib * 1e3 / 1024.0,
            spec: spec.clone(),
            osds,
            ops: Vec::new(),
            free_ops: Vec::new(),
            pieces: Vec::new(),
            free_pieces: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            drive_done: Vec::new(),
        })
    }

    pub fn spec(&self) -> &CephSpec {
        &self.spec
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.slots * self.object_bytes * self.osds.len() as u64 / self.spec.replicas as u64
    }

    /// The acting set of placement group `pg` (primary first).
    pub fn acting_set(&self, pg: u32) -> &[u32] {
        let r = self.spec.replicas as usize;
        &self.acting[pg as usize * r..(pg as usize + 1) * r]
    }

    pub fn osd_stats(&self) -> Vec<OsdStats> {
        self.osds
            .iter()
            .map(|o| {
                let d = o.drive.stats();
                OsdStats {
                    cpu_busy_ns: o.cpu_busy_ns,
                    drive_busy_ns: d.busy_ns,
                    drive_ios: d.reads + d.writes,
                    drive_bytes: d.read_bytes + d.write_bytes,
                }
            })
            .collect()
    }

    fn push(&mut self, at: Nanos, piece: u32, kind: u8, role: u32) {
        self.seq += 1;
        let packed = ((piece as u64) << 32) | ((kind as u64) << 16) | role as u64;
        self.events.push(Reverse((at, self.seq, packed)));
    }

    /// Piece `pi` (as copy `role`) joins OSD `osd`'s op queue as `client`'s.
    fn enqueue_op(&mut self, now: Nanos, osd: u32, client: u32, pi: u32, role: u32) {
        self.osds[osd as usize].queue.push(client, (pi, role));
        self.dispatch_ops(now, osd);
    }

    /// Free op threads take queued ops, clients in turn; each runs on the cores.
    fn dispatch_ops(&mut self, now: Nanos, osd: u32) {
        while self.osds[osd as usize].queue.busy < self.op_threads {
            let Some((pi, role)) = self.osds[osd as usize].queue.pop() else {
                break;
            };
            self.osds[osd as usize].queue.busy += 1;
            let at = self.cpu(osd, now, self.pieces[pi as usize].size);
            let kind = if role == 0 {
                PRIMARY_CPU_DONE
            } else {
                REPLICA_CPU_DONE
            };
            self.push(at, pi, kind, role);
        }
    }

    /// An op thread of OSD `osd` is done with its op: the next one goes.
    fn release_thread(&mut self, now: Nanos, osd: u32) {
        let q = &mut self.osds[osd as usize].queue;
        debug_assert!(q.busy > 0, "a thread was busy");
        q.busy = q.busy.saturating_sub(1);
        self.dispatch_ops(now, osd);
    }

    /// Runs an op's share of OSD `osd`'s cores: returns when it is done.
    fn cpu(&mut self, osd: u32, now: Nanos, bytes: u32) -> Nanos {
        let cost = round_ns(self.cpu_ns_per_op + bytes as f64 * self.cpu_ns_per_byte);
        let o = &mut self.osds[osd as usize];
        let (core, free) = o
            .cores_free
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(_, f)| f)
            .expect("an OSD has at least one core");
        let done = now.max(free) + cost;
        o.cores_free[core] = done;
        o.cpu_busy_ns += cost;
        done
    }

    /// Where a piece's object lives on OSD `osd`'s drive.
    fn drive_offset(&self, p: &Piece, osd: u32) -> u64 {
        let slot = mix(p.object ^ ((osd as u64) << 48)) % self.slots;
        WAL_BYTES + slot * self.object_bytes + p.offset
    }

    fn submit_drive(&mut self, now: Nanos, osd: u32, io: DeviceIo, token: u64) {
        let o = &mut self.osds[osd as usize];
        o.drive.as_component().submit(now, io, token);
        self.schedule_wake(osd);
    }

    fn schedule_wake(&mut self, osd: u32) {
        let o = &mut self.osds[osd as usize];
        if let Some(next) = o.drive.next_event_ns()
            && o.wake_at != Some(next)
        {
            o.wake_at = Some(next);
            self.push(next, osd, DRIVE_WAKE, 0);
        }
    }

    /// A copy of piece `pi` goes to `osd`'s drive (`role` 0: the primary's).
    fn write_copy(&mut self, now: Nanos, pi: u32, osd: u32, role: u32) {
        let p = self.pieces[pi as usize];
        let token = ((pi as u64) << 32) | role as u64;
        let in_place = DeviceIo {
            offset_bytes: self.drive_offset(&p, osd),
            size_bytes: p.size,
            dir: IoDir::Write,
        };
        if p.size <= self.deferred_bytes {
            let o = &mut self.osds[osd as usize];
            let wal = DeviceIo {
                offset_bytes: o.wal_head,
                size_bytes: p.size.next_multiple_of(4096),
                dir: IoDir::Write,
            };
            o.wal_head = (o.wal_head + wal.size_bytes as u64) % WAL_BYTES;
            o.deferred.push(in_place);
            let batch = if o.deferred.len() >= DEFERRED_BATCH {
                std::mem::take(&mut o.deferred)
            } else {
                Vec::new()
            };
            self.submit_drive(now, osd, wal, token);
            for io in batch {
                self.submit_drive(now, osd, io, BACKGROUND);
            }
        } else {
            self.submit_drive(now, osd, in_place, token);
        }
    }

    fn handle(&mut self, now: Nanos, packed: u64, done: &mut Vec<Completion>) {
        let pi = (packed >> 32) as u32;
        let kind = (packed >> 16) as u8;
        let role = (packed & 0xffff) as u32;
        match kind {
            DRIVE_WAKE => self.drive_wake(now, pi),
            AT_PRIMARY => {
                let p = self.pieces[pi as usize];
                let primary = self.acting_set(p.pg)[0];
                self.enqueue_op(now, primary, p.client, pi, 0);
            }
            PRIMARY_CPU_DONE => {
                let p = self.pieces[pi as usize];
                let primary = self.acting_set(p.pg)[0];
                match p.dir {
                    IoDir::Read => {
                        let io = DeviceIo {
                            offset_bytes: self.drive_offset(&p, primary),
                            size_bytes: p.size,
                            dir: IoDir::Read,
                        };
                        self.submit_drive(now, primary, io, (pi as u64) << 32);
                    }
                    IoDir::Write => {
                        self.write_copy(now, pi, primary, 0);
                        self.release_thread(now, primary);
                        for r in 1..self.spec.replicas {
                            let osd = self.acting_set(p.pg)[r as usize];
                            let at =
                                self.osds[osd as usize]
                                    .nic
                                    .transfer(now, IoDir::Write, p.size);
                            self.push(at, pi, AT_REPLICA, r);
                        }
                    }
                }
            }
            AT_REPLICA => {
                let p = self.pieces[pi as usize];
                let set = self.acting_set(p.pg);
                let (osd, primary) = (set[role as usize], set[0]);
                // A sub-op's client is its primary OSD.
                self.enqueue_op(now, osd, PEER_CLIENT - primary, pi, role);
            }
            REPLICA_CPU_DONE => {
                let p = self.pieces[pi as usize];
                let osd = self.acting_set(p.pg)[role as usize];
                self.write_copy(now, pi, osd, role);
                self.release_thread(now, osd);
            }
            COPY_DURABLE => {
                let p = &mut self.pieces[pi as usize];
                p.pending -= 1;
                if p.pending == 0 {
                    let pg = p.pg;
                    let primary = self.acting_set(pg)[0];
                    let at = now + self.osds[primary as usize].nic.command_latency_ns();
                    self.push(at, pi, PIECE_DONE, 0);
                }
            }
            PIECE_DONE => self.piece_done(now, pi, done),
            _ => unreachable!("unknown event kind {kind}"),
        }
    }

    fn drive_wake(&mut self, now: Nanos, osd: u32) {
        let o = &mut self.osds[osd as usize];
        if o.wake_at != Some(now) {
            return; // superseded by an earlier or later wake
        }
        o.wake_at = None;
        let mut finished = std::mem::take(&mut self.drive_done);
        o.drive.as_component().advance(now, &mut finished);
        for c in finished.drain(..) {
            self.drive_finished(c, osd);
        }
        self.drive_done = finished;
        self.schedule_wake(osd);
    }

    fn drive_finished(&mut self, c: Completion, osd: u32) {
        if c.token == BACKGROUND {
            return;
        }
        let pi = (c.token >> 32) as u32;
        let role = (c.token & 0xffff) as u32;
        let p = self.pieces[pi as usize];
        match p.dir {
            IoDir::Read => {
                let at = self.osds[osd as usize]
                    .nic
                    .transfer(c.at_ns, IoDir::Read, p.size);
                self.push(at, pi, PIECE_DONE, 0);
                self.release_thread(c.at_ns, osd);
            }
            IoDir::Write => {
                // A replica's ack crosses back to the primary.
                let at = if role == 0 {
                    c.at_ns
                } else {
                    c.at_ns + self.osds[osd as usize].nic.command_latency_ns()
                };
                self.push(at, pi, COPY_DURABLE, role);
            }
        }
    }

    fn piece_done(&mut self, now: Nanos, pi: u32, done: &mut Vec<Completion>) {
        let op = self.pieces[pi as usize].op;
        self.free_pieces.push(pi);
        let o = &mut self.ops[op as usize];
        o.pieces_left -= 1;
        if o.pieces_left == 0 {
            done.push(Completion {
                token: o.token,
                at_ns: now,
            });
            self.free_ops.push(op);
        }
    }

    fn new_op(&mut self, token: u64, pieces: u32) -> u32 {
        let op = Op {
            token,
            pieces_left: pieces,
        };
        match self.free_ops.pop() {
            Some(i) => {
                self.ops[i as usize] = op;
                i
            }
            None => {
                self.ops.push(op);
                (self.ops.len() - 1) as u32
            }
        }
    }

    fn new_piece(&mut self, p: Piece) -> u32 {
        match self.free_pieces.pop() {
            Some(i) => {
                self.pieces[i as usize] = p;
                i
            }
            None => {
                self.pieces.push(p);
                (self.pieces.len() - 1) as u32
            }
        }
    }
}

/// Each placement group's acting set: `replicas` distinct OSDs chosen by hash.
fn acting_sets(pgs: u32, replicas: u32, osds: u32) -> Vec<u32> {
    let mut acting = Vec::with_capacity((pgs * replicas) as usize);
    for pg in 0..pgs {
        let start = acting.len();
        let mut attempt = 0u64;
        while acting.len() - start < replicas as usize {
            let osd = (mix(((pg as u64) << 32) | attempt) % osds as u64) as u32;
            attempt += 1;
            if !acting[start..].contains(&osd) {
                acting.push(osd);
            }
        }
    }
    acting
}

impl Component for CephCluster {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        self.submit_from(now, io, token, 0, false);
    }

    /// (No priority queueing: an urgent op is queued like any other of its client.)
    fn submit_from(&mut self, now: Nanos, io: DeviceIo, token: u64, client: u32, _: bool) {
        let size = (io.size_bytes as u64).max(1);
        let first = io.offset_bytes / self.object_bytes;
        let last = (io.offset_bytes + size - 1) / self.object_bytes;
        let op = self.new_op(token, (last - first + 1) as u32);
        for object in first..=last {
            let start = io.offset_bytes.max(object * self.object_bytes);
            let end =
                (io.offset_bytes + io.size_bytes as u64).min((object + 1) * self.object_bytes);
            let pg = (mix(object) % self.spec.pgs as u64) as u32;
            let pi = self.new_piece(Piece {
                op,
                client,
                pg,
                dir: io.dir,
                offset: start - object * self.object_bytes,
                object,
                size: end.saturating_sub(start) as u32,
                pending: self.spec.replicas,
            });
            let primary = self.acting_set(pg)[0] as usize;
            let payload = if io.dir == IoDir::Write {
                end.saturating_sub(start) as u32
            } else {
                0
            };
            let at = self.osds[primary].nic.transfer(now, IoDir::Write, payload);
            self.push(at, pi, AT_PRIMARY, 0);
        }
    }

    fn next_event_ns(&self) -> Option<Nanos> {
        self.events.peek().map(|Reverse((at, _, _))| *at)
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        while let Some(&Reverse((at, _, packed))) = self.events.peek() {
            if at > now {
                break;
            }
            self.events.pop();
            self.handle(at, packed, done);
        }
    }

    fn busy_ns(&self) -> Nanos {
        let n = self.osds.len().max(1) as u64;
        self.osds
            .iter()
            .map(|o| o.drive.stats().busy_ns)
            .sum::<Nanos>()
            / n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(drive: &str, osds: u32, replicas: u32) -> CephSpec {
        toml::from_str(&format!(
            "osds = {osds}\nreplicas = {replicas}\ndrive = \"{drive}\""
        ))
        .unwrap()
    }

    #[test]
    fn acting_sets_are_distinct_and_spread() {
        let acting = acting_sets(128, 3, 12);
        let mut primaries = [0u32; 12];
        for set in acting.chunks(3) {
            assert!(set[0] != set[1] && set[1] != set[2] && set[0] != set[2]);
            primaries[set[0] as usize] += 1;
        }
        assert!(
            primaries.iter().all(|&n| (4..=20).contains(&n)),
            "{primaries:?}"
        );
    }

    /// One CPU-bound OSD: client 0 queues 30 reads, client 1 then 10. The first 16
    /// of client 0's take the 16 op threads; from then on the op queue takes the
    /// clients in turn, so client 1's ten are done among the next twenty, not after
    /// client 0's thirty (first come, first served).
    #[test]
    fn the_op_queue_serves_clients_in_turn() {
        let mut s = spec("pcie-flash", 1, 1);
        s.cores_per_osd = 1;
        let mut c = CephCluster::new(&s).unwrap();
        let read = |i: u64| DeviceIo {
            offset_bytes: i * (4 << 20),
            size_bytes: 4096,
            dir: IoDir::Read,
        };
        for i in 0..30 {
            c.submit_from(0, read(i), i, 0, false);
        }
        for i in 30..40 {
            c.submit_from(0, read(i), i, 1, false);
        }
        let mut done = Vec::new();
        while let Some(t) = c.next_event_ns() {
            c.advance(t, &mut done);
        }
        assert_eq!(done.len(), 40);
        assert!(
            done[..16].iter().all(|d| d.token < 30),
            "the threads' first"
        );
        let early = done[16..36].iter().filter(|d| d.token >= 30).count();
        assert_eq!(early, 10, "client 1's among the next 20");
        // Without a client (plain submit) it is one FIFO: the first 30 are client 0's.
        let mut c = CephCluster::new(&s).unwrap();
        for i in 0..40 {
            c.submit(0, read(i), i);
        }
        let mut done = Vec::new();
        while let Some(t) = c.next_event_ns() {
            c.advance(t, &mut done);
        }
        assert!(done[..30].iter().all(|d| d.token < 30));
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(CephCluster::new(&spec("sata-ssd", 2, 3)).is_err());
        assert!(CephCluster::new(&spec("nope", 3, 3)).is_err());
        let mut s = spec("sata-ssd", 3, 3);
        s.object_kib = 3000;
        assert!(CephCluster::new(&s).is_err());
        assert!(toml::from_str::<CephSpec>("osds = 3\ndrive = \"sata-ssd\"\nfoo = 1").is_err());
        let mut s = spec("sata-ssd", 3, 3);
        s.op_threads = Some(0);
        assert!(CephCluster::new(&s).is_err());
    }
}
