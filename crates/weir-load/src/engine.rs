//! The real-time driver: connections, the generator pump, timers, accounting.
//!
//! Everything lives on one thread (a `LocalSet`): one `Core` behind a `RefCell`,
//! a reader and a writer task per connection, one timer task, and the caller's future
//! ticking the timeline. No `RefCell` borrow is held across an `.await`.

use crate::conn::{ReadHalf, Stream, WriteHalf, handshake, resolve, tls_configs};
use crate::scenario::{LoadScenario, VmWorkload};
use crate::stats::{Counters, Interval, timeline};
use crate::verify::{ReadTicket, SECTOR_BYTES, Shadow};
use crate::{LoadError, LoadOptions, LoadOutcome, LoadProgress, Target, VerifySummary};
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use weir_nbd::consts::DEFAULT_MAX_PAYLOAD;
use weir_nbd::{ClientSession, Completion, ReplyData};
use weir_report::{
    CaseReport, ComponentResult, IoSizeHistogram, ModelMetricResult, ScenarioReport, WindowResult,
    WorkloadResult,
};
use weir_tls::rustls;
use weir_workload::{AccessGenerator, Direction, IoGenerator, IoRequest, Issue, ModelMetric};

const MAX_NOTED: usize = 20;
/// `InFlight::vm` of the final read-back sweep's requests (no VM).
const SWEEP_VM: u32 = u32::MAX;
/// Sweep reads in flight per target, and sectors per sweep read (1 MiB).
const SWEEP_DEPTH: usize = 32;
const SWEEP_READ_SECTORS: u64 = 2048;

/// Model figures also shown per timeline interval (the others only over the run).
const TIMELINE_METRICS: [&str; 10] = [
    "opm",
    "order_latency_mean_ms",
    "rpc_latency_mean_ms",
    "rpcs_per_s",
    "logins",
    "app_launchs",
    "vsi_response_mean_ms",
    "read_iops",
    "write_iops",
    "reading_vms_pct",
];

/// Figures inside one named window (model clock, by completion time).
struct WindowCounters {
    name: String,
    start_ns: u64,
    end_ns: u64,
    total: Counters,
    per_target: Vec<Counters>,
}
/// Issues one pump may make before yielding (a guard against a generator that never
/// blocks).
const MAX_ISSUES_PER_PUMP: u32 = 1 << 16;

struct Vm {
    name: String,
    /// The `[[workload]]`/`[[model]]`/profile name (workload classes group by it).
    workload: String,
    /// Its class in [`Totals::classes`].
    class: u32,
    /// The `[[vm]]` it comes from (model metrics are combined per base).
    base: String,
    /// Model kind ("vdi", "oltp", "exchange"); `None` for access specifications.
    kind: Option<&'static str>,
    /// Where each worker's last request ended (sequential detection).
    last_end: Vec<u64>,
    target: u32,
    conn: usize,
    base_offset: u64,
    generator: Box<dyn IoGenerator>,
    outstanding: Vec<u32>,
    timer_at: Vec<Option<u64>>,
    counters: Counters,
    /// Last timeline interval in which one of its requests completed.
    active_in: u32,
    disk_bytes: u64,
    /// Stopped after its model asked for something impossible.
    halted: bool,
    /// Per worker: a request of it waits in [`Core::held`]; the worker is not
    /// polled until it is issued.
    held: Vec<bool>,
}

/// A request a model asked for while the bytes in flight were at their cap.
struct Held {
    vm: u32,
    worker: u32,
    request: IoRequest,
}

struct InFlight {
    vm: u32,
    worker: u32,
    request: IoRequest,
    issued: Instant,
    measured: bool,
    /// Verify mode: the sectors of a write, or the ticket of a read.
    first_sector: u64,
    sectors: u64,
    ticket: Option<ReadTicket>,
    /// Its bytes on the wire, counted in [`Core::bytes_in_flight`].
    bytes: u64,
}

struct Conn {
    target: u32,
    session: ClientSession,
    inflight: HashMap<u64, InFlight>,
    notify: Rc<Notify>,
    broken: bool,
    closing: bool,
}

struct Core {
    start: Instant,
    time_scale: f64,
    warmup_model_ns: u64,
    stopping: bool,
    vms: Vec<Vm>,
    conns: Vec<Conn>,
    timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    timer_notify: Rc<Notify>,
    shadow: Option<Shadow>,
    write_pattern: Vec<u8>,
    scratch: Vec<u8>,
    interval: Interval,
    /// Index of the open timeline interval.
    interval_index: u32,
    sizes: IoSizeHistogram,
    windows: Vec<WindowCounters>,
    /// The measured figures over all VMs, per target and per workload class,
    /// recorded as each request ends at full precision (the VMs' own
    /// histograms are coarser when there are many: [`vm_sigfig`]).
    totals: Totals,
    ios: u64,
    io_errors: u64,
    first_errors: Vec<String>,
    connection_errors: Vec<String>,
    verify: VerifySummary,
    /// Wakes the main future when the last in-flight request of a stopping run ends.
    drained: Rc<Notify>,
    sweep_in_flight: usize,
    sweep_notify: Rc<Notify>,
    /// Bytes of the VMs' requests in flight (a write's payload until sent, a read's
    /// reply as it comes: the driver's buffers), their most so far, and the cap
    /// ([`crate::LoadOptions::max_bytes_in_flight`]).
    bytes_in_flight: u64,
    peak_bytes_in_flight: u64,
    max_bytes_in_flight: u64,
    /// Requests that did not fit under the cap, oldest first: issued as
    /// completions make room.
    held: VecDeque<Held>,
    /// How many requests waited so.
    held_total: u64,
}

impl Core {
    fn model_ns(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.start).as_nanos() as f64 * self.time_scale) as u64
    }

    fn real_instant(&self, model_ns: u64) -> Instant {
        self.start + Duration::from_nanos((model_ns as f64 / self.time_scale).ceil() as u64)
    }

    fn in_flight(&self) -> usize {
        self.conns.iter().map(|c| c.inflight.len()).sum()
    }

    fn note_error(&mut self, message: String) {
        self.io_errors += 1;
        if self.first_errors.len() < MAX_NOTED {
            self.first_errors.push(message);
        }
    }

    /// Polls a worker until it blocks, issuing what it asks for.
    fn pump(&mut self, vm_i: u32, worker: u32, now: Instant) {
        let model_now = self.model_ns(now);
        for _ in 0..MAX_ISSUES_PER_PUMP {
            if self.stopping {
                return;
            }
            let vm = &mut self.vms[vm_i as usize];
            if self.conns[vm.conn].broken || vm.halted || vm.held[worker as usize] {
                return;
            }
            let outstanding = vm.outstanding[worker as usize];
            match vm.generator.poll(model_now, worker, outstanding) {
                Issue::Io(request)
                    if request.size_bytes == 0
                        || request
                            .offset_bytes
                            .saturating_add(request.size_bytes as u64)
                            > vm.disk_bytes =>
                {
                    vm.halted = true;
                    let msg = format!(
                        "{}: the model asked for {} bytes at offset {} of a {}-byte disk; VM stopped",
                        vm.name, request.size_bytes, request.offset_bytes, vm.disk_bytes
                    );
                    self.note_error(msg);
                    return;
                }
                Issue::Io(request)
                    if !fits(
                        self.bytes_in_flight,
                        self.max_bytes_in_flight,
                        request.size_bytes,
                    ) =>
                {
                    self.vms[vm_i as usize].held[worker as usize] = true;
                    self.held.push_back(Held {
                        vm: vm_i,
                        worker,
                        request,
                    });
                    self.held_total += 1;
                    return;
                }
                Issue::Io(request) => self.issue(vm_i, worker, request, now, model_now),
                Issue::At(t) => {
                    let slot = &mut vm.timer_at[worker as usize];
                    if *slot != Some(t) {
                        *slot = Some(t);
                        self.timers.push(Reverse((t, vm_i, worker)));
                        self.timer_notify.notify_one();
                    }
                    return;
                }
                Issue::Blocked => return,
            }
        }
    }

    /// Issues the held requests that fit now, oldest first, and polls their
    /// workers on. The wait is the driver's, not the target's: a request's latency
    /// starts when it is issued.
    fn issue_held(&mut self, now: Instant) {
        while !self.stopping {
            match self.held.front() {
                Some(h)
                    if fits(
                        self.bytes_in_flight,
                        self.max_bytes_in_flight,
                        h.request.size_bytes,
                    ) => {}
                _ => return,
            }
            let Some(h) = self.held.pop_front() else {
                return;
            };
            let vm = &mut self.vms[h.vm as usize];
            vm.held[h.worker as usize] = false;
            if self.conns[vm.conn].broken || vm.halted {
                continue;
            }
            let model_now = self.model_ns(now);
            self.issue(h.vm, h.worker, h.request, now, model_now);
            self.pump(h.vm, h.worker, now);
        }
    }

    fn issue(&mut self, vm_i: u32, worker: u32, request: IoRequest, now: Instant, model_now: u64) {
        let vm = &mut self.vms[vm_i as usize];
        vm.outstanding[worker as usize] += 1;
        let sequential = vm.last_end[worker as usize] == request.offset_bytes;
        vm.last_end[worker as usize] = request.offset_bytes + request.size_bytes as u64;
        if model_now >= self.warmup_model_ns {
            self.sizes.record(
                request.size_bytes as u64,
                request.dir == Direction::Read,
                sequential,
            );
        }
        let (target, conn_i) = (vm.target, vm.conn);
        let offset = vm.base_offset + request.offset_bytes;
        let len = request.size_bytes as u64;
        let conn = &mut self.conns[conn_i];
        let mut flight = InFlight {
            vm: vm_i,
            worker,
            request,
            issued: now,
            measured: model_now >= self.warmup_model_ns,
            first_sector: 0,
            sectors: 0,
            ticket: None,
            bytes: len,
        };
        let handle = match &mut self.shadow {
            Some(shadow) => {
                // Whole sectors: the request is widened to 512-byte boundaries.
                let first = offset / SECTOR_BYTES;
                let end = (offset + len).div_ceil(SECTOR_BYTES);
                flight.first_sector = first;
                flight.sectors = end - first;
                flight.bytes = flight.sectors * SECTOR_BYTES;
                let wire_len = flight.bytes as u32;
                match request.dir {
                    Direction::Read => {
                        flight.ticket = Some(shadow.begin_read(target, first, flight.sectors));
                        conn.session.read(first * SECTOR_BYTES, wire_len)
                    }
                    Direction::Write => {
                        self.scratch.resize(wire_len as usize, 0);
                        shadow.begin_write(target, first, &mut self.scratch);
                        conn.session
                            .write(first * SECTOR_BYTES, &self.scratch, false)
                    }
                }
            }
            None => match request.dir {
                Direction::Read => conn.session.read(offset, len as u32),
                Direction::Write => {
                    if self.write_pattern.len() < len as usize {
                        let old = self.write_pattern.len();
                        self.write_pattern.resize(len as usize, 0);
                        for (k, b) in self.write_pattern[old..].iter_mut().enumerate() {
                            *b = ((old + k) as u64).wrapping_mul(0x9e37_79b9) as u8 | 1;
                        }
                    }
                    conn.session
                        .write(offset, &self.write_pattern[..len as usize], false)
                }
            },
        };
        self.bytes_in_flight += flight.bytes;
        self.peak_bytes_in_flight = self.peak_bytes_in_flight.max(self.bytes_in_flight);
        conn.inflight.insert(handle, flight);
        conn.notify.notify_one();
    }

    fn complete(&mut self, conn_i: usize, completion: Completion, now: Instant) {
        let Some(f) = self.conns[conn_i].inflight.remove(&completion.handle) else {
            return;
        };
        let target = self.conns[conn_i].target;
        let vm_name = match self.vms.get(f.vm as usize) {
            Some(vm) => vm.name.clone(),
            None => "final read-back".to_string(),
        };
        let ok = match completion.result {
            Ok(data) => {
                match (&f.ticket, &mut self.shadow, data) {
                    (Some(ticket), Some(shadow), ReplyData::Read(bytes)) => {
                        let check = shadow.check_read(target, ticket, &bytes);
                        if check.checked_sectors > 0 {
                            self.verify.reads_checked += 1;
                            self.verify.sectors_checked += check.checked_sectors;
                        }
                        if check.mismatched_sectors > 0 {
                            self.verify.mismatched_sectors += check.mismatched_sectors;
                            self.verify.mismatched_reads += 1;
                            if let Some(vm) = self.vms.get_mut(f.vm as usize) {
                                vm.counters.mismatched_reads += 1;
                                for c in self.totals.each(vm.target as usize, vm.class as usize) {
                                    c.mismatched_reads += 1;
                                }
                            }
                            if let Some(m) = check.first_mismatch
                                && self.verify.first_mismatches.len() < MAX_NOTED
                            {
                                self.verify.first_mismatches.push(format!(
                                    "{vm_name}: {m} ({} sectors of this read differ)",
                                    check.mismatched_sectors
                                ));
                            }
                        }
                        if f.vm == SWEEP_VM {
                            self.verify.final_sectors_checked += check.checked_sectors;
                        }
                    }
                    (None, Some(shadow), _) if f.request.dir == Direction::Write => {
                        shadow.end_write(target, f.first_sector, f.sectors, true);
                    }
                    _ => {}
                }
                true
            }
            Err(e) => {
                if f.request.dir == Direction::Write
                    && let Some(shadow) = &mut self.shadow
                {
                    shadow.end_write(target, f.first_sector, f.sectors, false);
                }
                let base = self.vms.get(f.vm as usize).map_or(0, |vm| vm.base_offset);
                let msg = format!(
                    "{vm_name}: {:?} of {} bytes at {}: {e}",
                    f.request.dir,
                    f.request.size_bytes,
                    base + f.request.offset_bytes
                );
                self.note_error(msg);
                false
            }
        };
        if f.vm == SWEEP_VM {
            self.sweep_in_flight -= 1;
            self.sweep_notify.notify_one();
            return;
        }
        self.finish(f, ok, now);
    }

    /// Accounting and the generator callback for a request that ended (`ok`: with
    /// a successful reply; else the model hears a failure, never a completion).
    fn finish(&mut self, f: InFlight, ok: bool, now: Instant) {
        let latency = now.saturating_duration_since(f.issued);
        let model_now = self.model_ns(now);
        self.account(&f, latency.as_micros() as u64, ok, model_now);
        let model_latency = (latency.as_nanos() as f64 * self.time_scale) as u64;
        self.bytes_in_flight -= f.bytes;
        let vm = &mut self.vms[f.vm as usize];
        vm.outstanding[f.worker as usize] -= 1;
        if ok {
            vm.generator
                .on_complete(model_now, f.worker, &f.request, model_latency);
        } else {
            vm.generator.on_failure(model_now, f.worker, &f.request);
        }
        if self.stopping {
            if self.in_flight() == 0 {
                self.drained.notify_one();
            }
        } else {
            self.issue_held(now);
            self.pump(f.vm, f.worker, now);
        }
    }

    /// Counts a request that ended (`ok`: with a successful reply) in its VM's figures,
    /// the open interval and the windows: only successes are I/Os (with bytes and
    /// latency); a failure is an error.
    fn account(&mut self, f: &InFlight, latency_us: u64, ok: bool, model_now: u64) {
        let (dir, bytes) = (f.request.dir, f.request.size_bytes as u64);
        self.ios += u64::from(ok);
        let vm = &mut self.vms[f.vm as usize];
        if f.measured {
            vm.counters.record(dir, bytes, latency_us, ok);
            for c in self.totals.each(vm.target as usize, vm.class as usize) {
                c.record(dir, bytes, latency_us, ok);
            }
        }
        let iv = &mut self.interval;
        iv.record(f.vm as usize, dir, bytes, latency_us, ok);
        if vm.active_in != self.interval_index {
            vm.active_in = self.interval_index;
            iv.active_vms += 1;
        }
        let target = vm.target as usize;
        for w in &mut self.windows {
            if (w.start_ns..w.end_ns).contains(&model_now) {
                w.total.record(dir, bytes, latency_us, ok);
                w.per_target[target].record(dir, bytes, latency_us, ok);
            }
        }
    }

    /// A connection died: its requests fail, its VMs stop.
    fn break_conn(&mut self, conn_i: usize, reason: String, now: Instant) {
        let conn = &mut self.conns[conn_i];
        if conn.broken {
            return;
        }
        conn.broken = true;
        conn.notify.notify_one();
        let lost: Vec<InFlight> = conn.inflight.drain().map(|(_, f)| f).collect();
        if !conn.closing {
            self.connection_errors.push(format!(
                "connection {conn_i} (target {}): {reason}",
                conn.target
            ));
        }
        let target = self.conns[conn_i].target;
        for f in lost {
            if f.request.dir == Direction::Write
                && let Some(shadow) = &mut self.shadow
            {
                shadow.end_write(target, f.first_sector, f.sectors, false);
            }
            if f.vm == SWEEP_VM {
                self.note_error(format!(
                    "final read-back: request lost with connection {conn_i}: {reason}"
                ));
                self.sweep_in_flight -= 1;
                self.sweep_notify.notify_one();
                continue;
            }
            self.note_error(format!(
                "{}: request lost with connection {conn_i}: {reason}",
                self.vms[f.vm as usize].name
            ));
            self.finish(f, false, now);
        }
        if self.stopping && self.in_flight() == 0 {
            self.drained.notify_one();
        }
    }
}

/// Whether a request of `size` bytes may be issued with `in_flight` bytes in
/// flight under a cap of `cap`: it fits, or nothing is in flight (a request larger
/// than the cap then goes alone).
fn fits(in_flight: u64, cap: u64, size: u32) -> bool {
    in_flight == 0 || in_flight + size as u64 <= cap
}

async fn writer_task(core: Rc<RefCell<Core>>, conn_i: usize, mut wh: WriteHalf) {
    let notify = core.borrow().conns[conn_i].notify.clone();
    loop {
        notify.notified().await;
        let (out, closing, broken) = {
            let mut c = core.borrow_mut();
            let conn = &mut c.conns[conn_i];
            (conn.session.take_output(), conn.closing, conn.broken)
        };
        if broken && !closing {
            return;
        }
        // A flush after each batch: over TLS it is what puts the records on the wire.
        if !out.is_empty()
            && let Err(e) = async {
                wh.write_all(&out).await?;
                wh.flush().await
            }
            .await
        {
            core.borrow_mut()
                .break_conn(conn_i, format!("write: {e}"), Instant::now());
            return;
        }
        if closing {
            let _ = wh.shutdown().await;
            return;
        }
    }
}

async fn reader_task(core: Rc<RefCell<Core>>, conn_i: usize, mut rh: ReadHalf) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let r = rh.read(&mut buf).await;
        let now = Instant::now();
        let mut c = core.borrow_mut();
        let n = match r {
            Ok(0) => {
                let reason = if c.conns[conn_i].closing {
                    "closed".to_string()
                } else {
                    "the server closed the connection".to_string()
                };
                c.break_conn(conn_i, reason, now);
                return;
            }
            Ok(n) => n,
            Err(e) => {
                c.break_conn(conn_i, format!("read: {e}"), now);
                return;
            }
        };
        if let Err(e) = c.conns[conn_i].session.input(&buf[..n]) {
            c.break_conn(conn_i, format!("protocol error: {e}"), now);
            return;
        }
        while let Some(completion) = c.conns[conn_i].session.poll_completion() {
            c.complete(conn_i, completion, now);
        }
    }
}

async fn timer_task(core: Rc<RefCell<Core>>) {
    let notify = core.borrow().timer_notify.clone();
    loop {
        let next = {
            let c = core.borrow();
            if c.stopping {
                return;
            }
            c.timers.peek().map(|Reverse((t, _, _))| c.real_instant(*t))
        };
        match next {
            None => notify.notified().await,
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at.into()) => {}
                    _ = notify.notified() => continue,
                }
            }
        }
        let now = Instant::now();
        let mut c = core.borrow_mut();
        let model_now = c.model_ns(now);
        while let Some(&Reverse((t, vm, worker))) = c.timers.peek() {
            if t > model_now || c.stopping {
                break;
            }
            c.timers.pop();
            let slot = &mut c.vms[vm as usize].timer_at[worker as usize];
            if *slot == Some(t) {
                *slot = None;
                c.pump(vm, worker, now);
            }
        }
    }
}

struct Plan {
    vm_target: Vec<u32>,
    vm_base: Vec<u64>,
    vm_disk: Vec<u64>,
    notes: Vec<String>,
}

/// The target of each VM (`crate::target::assign_targets`: its volume's export,
/// else round-robin); the connections and the disks' layout both follow it.
fn vm_targets(scenario: &LoadScenario, targets: &[Target]) -> Vec<u32> {
    crate::target::assign_targets(scenario.vms.iter().map(|v| v.volume.as_deref()), targets)
}

/// Places the VMs' disks on the targets (module docs of `scenario`).
fn layout(scenario: &LoadScenario, targets: &[Target], sizes: &[u64]) -> Result<Plan, LoadError> {
    let vm_target = vm_targets(scenario, targets);
    let mut notes = Vec::new();
    let mut vm_base = vec![0u64; scenario.vms.len()];
    let mut vm_disk = vec![0u64; scenario.vms.len()];
    for (t, &size) in sizes.iter().enumerate() {
        let on: Vec<usize> = (0..scenario.vms.len())
            .filter(|&i| vm_target[i] == t as u32)
            .collect();
        if on.is_empty() {
            continue;
        }
        let explicit: u64 = on.iter().filter_map(|&i| scenario.vms[i].disk_bytes).sum();
        let n_auto = on
            .iter()
            .filter(|&&i| scenario.vms[i].disk_bytes.is_none())
            .count() as u64;
        let room_for_explicit = if n_auto > 0 { size / 2 } else { size };
        let scale = if explicit > room_for_explicit {
            let s = room_for_explicit as f64 / explicit as f64;
            notes.push(format!(
                "{}: the VMs' disks ({explicit} bytes) do not fit the export ({size} bytes); scaled by {s:.4}",
                targets[t]
            ));
            s
        } else {
            1.0
        };
        let mut used = 0u64;
        let mut sized = Vec::new();
        for &i in &on {
            if let Some(b) = scenario.vms[i].disk_bytes {
                let b = ((b as f64 * scale) as u64) / 4096 * 4096;
                sized.push((i, b));
                used += b;
            }
        }
        let auto = (size - used.min(size))
            .checked_div(n_auto)
            .map_or(0, |b| b / 4096 * 4096);
        let mut next = 0u64;
        for &i in &on {
            let disk = sized
                .iter()
                .find(|(j, _)| *j == i)
                .map_or(auto, |(_, b)| *b);
            if disk < 4096 {
                return Err(LoadError::Layout(format!(
                    "{}: {} VMs do not fit an export of {size} bytes (VM {:?} would get {disk} bytes)",
                    targets[t],
                    on.len(),
                    scenario.vms[i].name
                )));
            }
            vm_base[i] = next;
            vm_disk[i] = disk;
            next += disk;
        }
    }
    Ok(Plan {
        vm_target,
        vm_base,
        vm_disk,
        notes,
    })
}

/// The models' own figures over `[from_ns, to_ns)` of the model clock, combined over
/// the copies of one `[[vm]]`; keyed by `"<vm>.<metric>"` (the simulator's
/// `model:<vm>.<metric>`).
fn collect_metrics(vms: &[Vm], from_ns: u64, to_ns: u64) -> BTreeMap<String, ModelMetric> {
    let mut parts: BTreeMap<String, Vec<ModelMetric>> = BTreeMap::new();
    for vm in vms {
        for m in vm.generator.metrics(from_ns, to_ns) {
            parts
                .entry(format!("{}.{}", vm.base, m.name))
                .or_default()
                .push(m);
        }
    }
    parts
        .into_iter()
        .filter_map(|(k, v)| ModelMetric::combine(&v).map(|m| (k, m)))
        .collect()
}

/// After the run, reads back up to `budget_sectors` of what was written to each target
/// (settled sectors only) and checks it: lost or corrupted writes that no read of the
/// run happened to see.
async fn final_sweep(core: &Rc<RefCell<Core>>, n_targets: usize, budget_sectors: u64) {
    let notify = core.borrow().sweep_notify.clone();
    for t in 0..n_targets as u32 {
        let (conn_i, ranges) = {
            let c = core.borrow();
            let Some(conn_i) = c.conns.iter().position(|x| x.target == t && !x.broken) else {
                continue;
            };
            let Some(shadow) = &c.shadow else { return };
            (
                conn_i,
                shadow.settled_ranges(t, SWEEP_READ_SECTORS, budget_sectors),
            )
        };
        for (first, n) in ranges {
            while core.borrow().sweep_in_flight >= SWEEP_DEPTH {
                notify.notified().await;
            }
            let mut c = core.borrow_mut();
            if c.conns[conn_i].broken {
                break;
            }
            let Some(ticket) = c.shadow.as_ref().map(|s| s.begin_read(t, first, n)) else {
                return;
            };
            let conn = &mut c.conns[conn_i];
            let handle = conn
                .session
                .read(first * SECTOR_BYTES, (n * SECTOR_BYTES) as u32);
            conn.inflight.insert(
                handle,
                InFlight {
                    vm: SWEEP_VM,
                    worker: 0,
                    request: IoRequest {
                        offset_bytes: first * SECTOR_BYTES,
                        size_bytes: (n * SECTOR_BYTES) as u32,
                        dir: Direction::Read,
                    },
                    issued: Instant::now(),
                    measured: false,
                    first_sector: first,
                    sectors: n,
                    ticket: Some(ticket),
                    bytes: 0,
                },
            );
            conn.notify.notify_one();
            c.sweep_in_flight += 1;
        }
    }
    while core.borrow().sweep_in_flight > 0 {
        notify.notified().await;
    }
}

/// A target's name in the report: its export, or the address for the default export.
fn volume_name(t: &Target) -> String {
    if t.export.is_empty() {
        format!("{} (default export)", t.socket_address())
    } else {
        t.export.clone()
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs the scenario against the targets: checks the options, connects, lays out
/// and starts the VMs, ticks the timeline until the end, stops, and reports.
pub(crate) async fn run(
    opts: LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> Result<LoadOutcome, LoadError> {
    let timing = check_options(&opts)?;
    let tls = tls_configs(&opts)?;
    let scenario = &opts.scenario;
    let seed = opts.seed.unwrap_or(scenario.seed);
    let n_targets = opts.targets.len();
    let conns_for = connections_per_target(&opts)?;
    let resolved = resolve_targets(&opts.targets).await?;
    let connected = connect(&opts.targets, &resolved, &conns_for, &tls).await?;
    let plan = layout(scenario, &opts.targets, &connected.sizes)?;
    let (vms, max_size) = build_vms(&opts, &plan, &connected, seed)?;
    let Connected { streams, sizes, .. } = connected;
    let n_vms = vms.len();
    let (conns, halves) = split_connections(streams);
    let start = Instant::now();
    let core = new_core(
        &opts,
        seed,
        start,
        vms,
        conns,
        write_pattern(seed, max_size),
    );
    let core = Rc::new(RefCell::new(core));
    let tasks = Tasks::spawn(&core, halves);
    start_vms(&mut core.borrow_mut(), start);
    let (mut intervals, interval_metrics) =
        tick_timeline(&core, start, &timing, n_vms, progress).await;
    let end = Instant::now();
    drain(&core, opts.drain_timeout).await;
    if opts.verify && opts.final_check_bytes > 0 {
        final_check(&core, &opts, n_targets).await;
    }
    disconnect(&core);
    tasks.join().await;
    // The tail interval (drain) joins the last one.
    let tail = std::mem::replace(&mut core.borrow_mut().interval, Interval::new(n_vms));
    if let Some(last) = intervals.last_mut() {
        add_interval(last, &tail);
    }
    let (run_metrics, model_results) = model_results(&core.borrow(), end);
    let end_model_ns = core.borrow().model_ns(end);
    let core = Rc::try_unwrap(core)
        .map_err(|_| LoadError::Runtime("tasks still hold the driver".into()))?
        .into_inner();
    Ok(build_outcome(
        core,
        scenario,
        &opts,
        seed,
        plan.notes,
        (end - start)
            .saturating_sub(timing.warmup_real)
            .as_secs_f64(),
        intervals,
        timing.interval.as_secs_f64(),
        sizes,
        (model_results, end_model_ns),
        (interval_metrics, run_metrics),
    ))
}

/// The run's wall-clock times.
struct Timing {
    /// The whole run: the warm-up, then the measured time.
    duration: Duration,
    /// Of the timeline.
    interval: Duration,
    /// The scenario's warm-up at the time scale.
    warmup_real: Duration,
}

/// Checks the targets, time scale and duration; the run's times.
fn check_options(opts: &LoadOptions) -> Result<Timing, LoadError> {
    if opts.targets.is_empty() {
        return Err(LoadError::InvalidOption("give at least one target".into()));
    }
    if !(opts.time_scale.is_finite() && opts.time_scale > 0.0 && opts.time_scale <= 1e6) {
        return Err(LoadError::InvalidOption(format!(
            "time scale must be in (0, 1e6], got {}",
            opts.time_scale
        )));
    }
    check_outstanding(&opts.scenario)?;
    timing(opts)
}

/// Most I/Os the VMs may keep outstanding at once, over all targets. The driver
/// holds about 600 bytes for each (its record, the NBD session's, the reply
/// buffers; measured: 4 Mi reads in flight took 2.5 GB, 256 Mi aborted on a
/// 2.3 GB allocation), so 1 Mi bounds it near 650 MB; a real target queues far
/// fewer (an NVMe queue holds at most 64 Ki, a Linux block queue a few thousand),
/// so a deeper load measures the client's queue, not the storage. The simulator,
/// which has no NBD state, allows 4,000,000.
pub const MAX_OUTSTANDING_IOS: u64 = 1 << 20;

/// Refuses a scenario whose VMs could keep more than [`MAX_OUTSTANDING_IOS`] I/Os
/// outstanding, before anything is allocated for them.
fn check_outstanding(scenario: &LoadScenario) -> Result<(), LoadError> {
    let n = scenario.max_outstanding();
    if n > MAX_OUTSTANDING_IOS {
        return Err(LoadError::InvalidOption(format!(
            "the VMs may keep {n} I/Os outstanding (workers × qd, summed over the VMs); at most {MAX_OUTSTANDING_IOS} against real targets"
        )));
    }
    Ok(())
}

/// Longest wall-clock run, warm-up included.
const MAX_RUN: Duration = Duration::from_secs(30 * 24 * 3600);

/// The run's times: the warm-up (`warmup_s` at the time scale) runs first, then the
/// measured part (`--duration`, else `duration_s` at the time scale, else 10 s), as
/// in `weir sim`, where `duration_s` is the measured time after `warmup_s`.
fn timing(opts: &LoadOptions) -> Result<Timing, LoadError> {
    let (scenario, scale) = (&opts.scenario, opts.time_scale);
    let measured = match (opts.duration, scenario.duration_s) {
        (Some(d), _) => d,
        (None, Some(s)) => wall(s, scale, "scenario.duration_s")?,
        (None, None) => Duration::from_secs(10),
    };
    let warmup_real = wall(scenario.warmup_s, scale, "scenario.warmup_s")?;
    let duration = measured + warmup_real;
    if measured.is_zero() || duration > MAX_RUN {
        return Err(LoadError::InvalidOption(format!(
            "the measured time must be > 0 and, with the warm-up ({warmup_real:?}), at most 30 days; got {measured:?}"
        )));
    }
    let interval = match (opts.timeline_interval, scenario.timeline_interval_s) {
        (Some(i), _) => i,
        (None, Some(s)) => wall(s, scale, "scenario.timeline_interval_s")?,
        (None, None) => Duration::from_secs(1),
    };
    Ok(Timing {
        duration,
        interval: interval.max(Duration::from_millis(10)),
        warmup_real,
    })
}

/// `model_s` model seconds (`key` of the scenario) as wall-clock time at time scale
/// `scale`; refused beyond [`MAX_RUN`].
fn wall(model_s: f64, scale: f64, key: &str) -> Result<Duration, LoadError> {
    let s = model_s / scale;
    match Duration::try_from_secs_f64(s) {
        Ok(d) if d <= MAX_RUN => Ok(d),
        _ => Err(LoadError::InvalidOption(format!(
            "{key} = {model_s} model seconds at time scale {scale} is {s:.3e} s of wall-clock time; at most 30 days"
        ))),
    }
}

/// Each target's socket addresses, resolved once; a target that reaches an address
/// of an earlier one for the same export name is refused (`127.0.0.1` and
/// `localhost`, plain text and TLS: the same disk, which two VMs would share).
async fn resolve_targets(targets: &[Target]) -> Result<Vec<Vec<SocketAddr>>, LoadError> {
    let mut seen: HashMap<(SocketAddr, &str), usize> = HashMap::new();
    let mut resolved = Vec::with_capacity(targets.len());
    for (i, t) in targets.iter().enumerate() {
        let addrs = resolve(t).await.map_err(|message| LoadError::Connect {
            target: t.to_string(),
            message,
        })?;
        for a in &addrs {
            if let Some(&j) = seen.get(&(*a, t.export.as_str())) {
                return Err(LoadError::InvalidOption(format!(
                    "target {t} is listed twice: {} reaches the same export at {a} (its VMs' disks would overlap)",
                    targets[j]
                )));
            }
        }
        seen.extend(addrs.iter().map(|a| ((*a, t.export.as_str()), i)));
        resolved.push(addrs);
    }
    Ok(resolved)
}

/// Connections to open to each target: one to each target a VM uses, the rest of
/// the budget (`--connections`, else up to 4 a target) given out round-robin, at
/// most one a VM.
fn connections_per_target(opts: &LoadOptions) -> Result<Vec<u32>, LoadError> {
    let n_targets = opts.targets.len();
    let mut vms_on = vec![0u32; n_targets];
    for t in vm_targets(&opts.scenario, &opts.targets) {
        vms_on[t as usize] += 1;
    }
    let used_targets = vms_on.iter().filter(|&&n| n > 0).count() as u32;
    let mut conns_for: Vec<u32> = vms_on.iter().map(|&n| n.min(1)).collect();
    let budget = match opts.connections {
        Some(0) => return Err(LoadError::InvalidOption("connections must be ≥ 1".into())),
        Some(c) if c < used_targets => {
            return Err(LoadError::InvalidOption(format!(
                "{c} connections cannot reach the {used_targets} targets the VMs use"
            )));
        }
        Some(c) => c.min(4096),
        None => vms_on.iter().map(|&n| n.min(4)).sum(),
    };
    let mut left = budget - used_targets;
    while left > 0 {
        let mut gave = false;
        for t in 0..n_targets {
            if left > 0 && conns_for[t] < vms_on[t] {
                conns_for[t] += 1;
                left -= 1;
                gave = true;
            }
        }
        if !gave {
            break;
        }
    }
    Ok(conns_for)
}

/// The open connections (target index, socket, session) and, per target, what its
/// export said.
struct Connected {
    streams: Vec<(u32, Stream, ClientSession)>,
    sizes: Vec<u64>,
    read_only: Vec<bool>,
    max_payload: Vec<u32>,
}

/// Opens `conns_for[t]` connections to each target `t`, one after the other
/// (`nbds://` ones over TLS with `tls[t]`).
async fn connect(
    targets: &[Target],
    resolved: &[Vec<SocketAddr>],
    conns_for: &[u32],
    tls: &[Option<Arc<rustls::ClientConfig>>],
) -> Result<Connected, LoadError> {
    let n_targets = targets.len();
    let mut connected = Connected {
        streams: Vec::new(),
        sizes: vec![0u64; n_targets],
        read_only: vec![false; n_targets],
        max_payload: vec![DEFAULT_MAX_PAYLOAD; n_targets],
    };
    for (t, target) in targets.iter().enumerate() {
        for _ in 0..conns_for[t] {
            let (stream, export, leftover) = handshake(target, &resolved[t], tls[t].as_ref())
                .await
                .map_err(|message| LoadError::Connect {
                    target: target.to_string(),
                    message,
                })?;
            let info = export.export_info();
            connected.sizes[t] = export.size_bytes;
            connected.read_only[t] = info.read_only();
            connected.max_payload[t] = info.block_size.max_payload_bytes.min(DEFAULT_MAX_PAYLOAD);
            let mut session = ClientSession::new(info);
            session.input(&leftover).map_err(|e| LoadError::Connect {
                target: target.to_string(),
                message: format!("after the handshake: {e}"),
            })?;
            connected.streams.push((t as u32, stream, session));
        }
    }
    Ok(connected)
}

/// The VMs, each with its generator and spread round-robin over its target's
/// connections; also the largest transfer of an access specification.
fn build_vms(
    opts: &LoadOptions,
    plan: &Plan,
    connected: &Connected,
    seed: u64,
) -> Result<(Vec<Vm>, u32), LoadError> {
    let scenario = &opts.scenario;
    let mut conn_of_target: Vec<Vec<usize>> = vec![vec![]; opts.targets.len()];
    for (i, (t, _, _)) in connected.streams.iter().enumerate() {
        conn_of_target[*t as usize].push(i);
    }
    let mut next_on_target = vec![0usize; opts.targets.len()];
    let mut vms = Vec::new();
    let mut max_size = 0u32;
    for (i, svm) in scenario.vms.iter().enumerate() {
        let t = plan.vm_target[i] as usize;
        let vm_seed = splitmix64(seed ^ splitmix64(i as u64));
        let generator = vm_generator(
            opts,
            svm,
            t,
            connected,
            plan.vm_disk[i],
            vm_seed,
            &mut max_size,
        )?;
        let conns = &conn_of_target[t];
        let conn = conns[next_on_target[t] % conns.len()];
        next_on_target[t] += 1;
        let workers = generator.workers() as usize;
        vms.push(Vm {
            name: svm.name.clone(),
            workload: svm.workload.clone(),
            base: svm.base.clone(),
            kind: match &svm.run {
                VmWorkload::Access(_) => None,
                VmWorkload::Model { spec, .. } => Some(match spec.as_ref() {
                    weir_workload::ModelSpec::Vdi(_) => "vdi",
                    weir_workload::ModelSpec::Oltp(_) => "oltp",
                    weir_workload::ModelSpec::Exchange(_) => "exchange",
                }),
            },
            last_end: vec![u64::MAX; workers],
            target: t as u32,
            conn,
            base_offset: plan.vm_base[i],
            generator,
            outstanding: vec![0; workers],
            timer_at: vec![None; workers],
            counters: Counters::new(vm_sigfig(scenario.vms.len())),
            class: 0,
            active_in: u32::MAX,
            disk_bytes: plan.vm_disk[i],
            halted: false,
            held: vec![false; workers],
        });
    }
    Ok((vms, max_size))
}

/// The generator of VM `svm` on target `t` (checked against what the target
/// accepts); raises `max_size` to an access specification's largest transfer.
fn vm_generator(
    opts: &LoadOptions,
    svm: &crate::scenario::LoadVm,
    t: usize,
    connected: &Connected,
    disk_bytes: u64,
    vm_seed: u64,
    max_size: &mut u32,
) -> Result<Box<dyn IoGenerator>, LoadError> {
    let layout_err = |e: weir_workload::WorkloadError| {
        LoadError::Layout(format!("VM {:?} ({}): {e}", svm.name, svm.workload))
    };
    let target = &opts.targets[t];
    match &svm.run {
        VmWorkload::Access(spec) => {
            let spec_max = spec.max_size_bytes();
            *max_size = (*max_size).max(spec_max);
            let max_payload = connected.max_payload[t];
            if spec_max as u64 + 2 * SECTOR_BYTES > max_payload as u64 {
                return Err(LoadError::Layout(format!(
                    "VM {:?}: transfers of {spec_max} bytes exceed what {target} accepts ({max_payload} bytes)",
                    svm.name
                )));
            }
            if connected.read_only[t] && spec.read_pct() < 100.0 {
                return Err(LoadError::Layout(format!(
                    "VM {:?} writes, but {target} is read-only",
                    svm.name
                )));
            }
            Ok(Box::new(
                AccessGenerator::new(spec, disk_bytes, vm_seed).map_err(layout_err)?,
            ))
        }
        VmWorkload::Model {
            spec,
            instance,
            instances,
        } => {
            if connected.read_only[t] {
                return Err(LoadError::Layout(format!(
                    "VM {:?} runs model {:?}, which writes, but {target} is read-only",
                    svm.name,
                    spec.name(),
                )));
            }
            let generator = spec
                .build(disk_bytes, vm_seed, *instance, *instances)
                .map_err(layout_err)?;
            Ok(generator)
        }
    }
}

/// The bytes every write sends (verify mode checks reads against them): `max_size`
/// bytes from `seed`.
fn write_pattern(seed: u64, max_size: u32) -> Vec<u8> {
    let mut write_pattern = vec![0u8; max_size as usize];
    for (k, w) in write_pattern.chunks_mut(8).enumerate() {
        let v = splitmix64(seed ^ (k as u64)).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
    write_pattern
}

/// Splits the connected sockets into the connections' state and their socket halves.
fn split_connections(
    streams: Vec<(u32, Stream, ClientSession)>,
) -> (Vec<Conn>, Vec<(ReadHalf, WriteHalf)>) {
    let mut conns = Vec::new();
    let mut halves = Vec::new();
    for (t, stream, session) in streams {
        halves.push(stream.split());
        conns.push(Conn {
            target: t,
            session,
            inflight: HashMap::new(),
            notify: Rc::new(Notify::new()),
            broken: false,
            closing: false,
        });
    }
    (conns, halves)
}

/// Measured figures beside the VMs' own (see [`Core::totals`]).
struct Totals {
    all: Counters,
    per_target: Vec<Counters>,
    /// Workload classes: name, VMs, figures; `Vm::class` indexes it.
    classes: Vec<(String, u32, Counters)>,
}

impl Totals {
    fn new(n_targets: usize, vms: &mut [Vm]) -> Totals {
        let mut classes: Vec<(String, u32, Counters)> = Vec::new();
        for vm in vms.iter_mut() {
            let i = match classes.iter().position(|(n, _, _)| *n == vm.workload) {
                Some(i) => i,
                None => {
                    classes.push((vm.workload.clone(), 0, Counters::new(3)));
                    classes.len() - 1
                }
            };
            classes[i].1 += 1;
            vm.class = i as u32;
        }
        Totals {
            all: Counters::new(3),
            per_target: (0..n_targets).map(|_| Counters::new(3)).collect(),
            classes,
        }
    }

    /// Every figure of VM `vm`'s target and class.
    fn each(&mut self, target: usize, class: usize) -> [&mut Counters; 3] {
        [
            &mut self.all,
            &mut self.per_target[target],
            &mut self.classes[class].2,
        ]
    }
}

/// Significant figures of each VM's latency histogram: 3 for a few VMs, 2
/// (≈ 28 KB each) up to 1,000, 1 (≈ 4 KB) beyond (100,000 VMs took 2.9 GB at
/// 2); the totals, targets and classes keep 3 ([`Totals`]).
fn vm_sigfig(vms: usize) -> u8 {
    match vms {
        0..=64 => 3,
        65..=1000 => 2,
        _ => 1,
    }
}

/// The driver's state at `start`, before anything is issued.
fn new_core(
    opts: &LoadOptions,
    seed: u64,
    start: Instant,
    mut vms: Vec<Vm>,
    conns: Vec<Conn>,
    write_pattern: Vec<u8>,
) -> Core {
    let scenario = &opts.scenario;
    let n_targets = opts.targets.len();
    let n_vms = vms.len();
    let totals = Totals::new(n_targets, &mut vms);
    Core {
        start,
        time_scale: opts.time_scale,
        warmup_model_ns: (scenario.warmup_s * 1e9) as u64,
        stopping: false,
        vms,
        conns,
        timers: BinaryHeap::new(),
        timer_notify: Rc::new(Notify::new()),
        shadow: opts
            .verify
            .then(|| Shadow::new(seed, n_targets, opts.target_zeroed)),
        write_pattern,
        scratch: Vec::new(),
        interval: Interval::new(n_vms),
        interval_index: 0,
        sizes: IoSizeHistogram::with_seed_buckets(),
        windows: scenario
            .windows
            .iter()
            .map(|w| WindowCounters {
                name: w.name.clone(),
                start_ns: (w.start_s * 1e9) as u64,
                end_ns: (w.end_s * 1e9) as u64,
                total: Counters::new(2),
                per_target: (0..n_targets).map(|_| Counters::new(2)).collect(),
            })
            .collect(),
        totals,
        ios: 0,
        io_errors: 0,
        first_errors: vec![],
        connection_errors: vec![],
        verify: VerifySummary::default(),
        drained: Rc::new(Notify::new()),
        sweep_in_flight: 0,
        sweep_notify: Rc::new(Notify::new()),
        bytes_in_flight: 0,
        peak_bytes_in_flight: 0,
        max_bytes_in_flight: opts.max_bytes_in_flight,
        held: VecDeque::new(),
        held_total: 0,
    }
}

/// The tasks of a run: a writer and a reader per connection, and the timer.
struct Tasks {
    writers: Vec<tokio::task::JoinHandle<()>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    timer: tokio::task::JoinHandle<()>,
}

impl Tasks {
    /// Starts the tasks on the current `LocalSet`.
    fn spawn(core: &Rc<RefCell<Core>>, halves: Vec<(ReadHalf, WriteHalf)>) -> Tasks {
        let mut writers = Vec::new();
        let mut readers = Vec::new();
        for (i, (rh, wh)) in halves.into_iter().enumerate() {
            writers.push(tokio::task::spawn_local(writer_task(core.clone(), i, wh)));
            readers.push(tokio::task::spawn_local(reader_task(core.clone(), i, rh)));
        }
        let timer = tokio::task::spawn_local(timer_task(core.clone()));
        Tasks {
            writers,
            readers,
            timer,
        }
    }

    /// Lets the writers send what is left (the disconnects) for up to 5 s in all (a
    /// target that stopped reading must not hold the run), then ends every task.
    async fn join(self) {
        let writers_deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        for mut w in self.writers {
            if tokio::time::timeout_at(writers_deadline, &mut w)
                .await
                .is_err()
            {
                w.abort();
                let _ = w.await;
            }
        }
        for r in &self.readers {
            r.abort();
        }
        self.timer.abort();
        // Aborted tasks drop their share of the core only once polled again.
        for r in self.readers {
            let _ = r.await;
        }
        let _ = self.timer.await;
    }
}

/// Lets every worker of every VM issue its first requests.
fn start_vms(c: &mut Core, start: Instant) {
    for vm in 0..c.vms.len() as u32 {
        for w in 0..c.vms[vm as usize].outstanding.len() as u32 {
            c.pump(vm, w, start);
        }
    }
}

/// Closes a timeline interval every `timing.interval` until the end of the run (or
/// until every connection is broken), reporting progress at each; the intervals and
/// the models' figures in each.
async fn tick_timeline(
    core: &Rc<RefCell<Core>>,
    start: Instant,
    timing: &Timing,
    n_vms: usize,
    progress: &mut dyn FnMut(&LoadProgress),
) -> (Vec<Interval>, Vec<BTreeMap<String, ModelMetric>>) {
    let (duration, interval) = (timing.duration, timing.interval);
    let deadline = start + duration;
    let mut intervals: Vec<Interval> = Vec::new();
    let mut interval_metrics: Vec<BTreeMap<String, ModelMetric>> = Vec::new();
    let mut model_from = 0u64;
    let mut next_tick = start + interval;
    loop {
        let at = next_tick.min(deadline);
        tokio::time::sleep_until(at.into()).await;
        let mut c = core.borrow_mut();
        let mut closed = std::mem::replace(&mut c.interval, Interval::new(n_vms));
        closed.length_s = (at - (next_tick - interval)).as_secs_f64().max(1e-3);
        c.interval_index += 1;
        let p = LoadProgress {
            elapsed_s: at.duration_since(start).as_secs_f64(),
            duration_s: duration.as_secs_f64(),
            ios: c.ios,
            iops: closed.ios as f64 / closed.length_s,
            errors: c.io_errors,
            mismatched_reads: c.verify.mismatched_reads,
        };
        let all_broken = c.conns.iter().all(|x| x.broken);
        let model_to = c.model_ns(at);
        interval_metrics.push(collect_metrics(&c.vms, model_from, model_to));
        model_from = model_to;
        drop(c);
        intervals.push(closed);
        progress(&p);
        if at >= deadline || all_broken {
            break;
        }
        next_tick += interval;
    }
    (intervals, interval_metrics)
}

/// Stops issuing and waits up to `timeout` for the requests in flight; breaks the
/// connections still waiting for replies then.
async fn drain(core: &Rc<RefCell<Core>>, timeout: Duration) {
    let drained = {
        let mut c = core.borrow_mut();
        c.stopping = true;
        c.timer_notify.notify_one();
        c.drained.clone()
    };
    let wait_drain = async {
        loop {
            if core.borrow().in_flight() == 0 {
                return;
            }
            drained.notified().await;
        }
    };
    if tokio::time::timeout(timeout, wait_drain).await.is_err() {
        let mut c = core.borrow_mut();
        let now = Instant::now();
        for i in 0..c.conns.len() {
            let n = c.conns[i].inflight.len();
            if n > 0 {
                c.break_conn(
                    i,
                    format!("{n} requests without a reply {timeout:?} after the run ended"),
                    now,
                );
            }
        }
    }
}

/// Verify mode: the final read-back ([`final_sweep`]) within the drain timeout;
/// breaks the connections still waiting for replies then.
async fn final_check(core: &Rc<RefCell<Core>>, opts: &LoadOptions, n_targets: usize) {
    let deadline = tokio::time::Instant::now() + opts.drain_timeout;
    let budget = opts.final_check_bytes.div_ceil(SECTOR_BYTES);
    if tokio::time::timeout_at(deadline, final_sweep(core, n_targets, budget))
        .await
        .is_err()
    {
        let mut c = core.borrow_mut();
        let now = Instant::now();
        for i in 0..c.conns.len() {
            if !c.conns[i].inflight.is_empty() {
                c.break_conn(
                    i,
                    format!(
                        "final read-back not answered within {:?}",
                        opts.drain_timeout
                    ),
                    now,
                );
            }
        }
    }
}

/// Marks every connection closing, with an NBD disconnect on those not broken, and
/// wakes their writers.
fn disconnect(core: &Rc<RefCell<Core>>) {
    let mut c = core.borrow_mut();
    for conn in c.conns.iter_mut() {
        conn.closing = true;
        if !conn.broken {
            conn.session.disconnect();
        }
        conn.notify.notify_one();
    }
}

/// Adds interval `tail`'s figures to `last`.
fn add_interval(last: &mut Interval, tail: &Interval) {
    last.ios += tail.ios;
    last.reads += tail.reads;
    last.writes += tail.writes;
    last.bytes += tail.bytes;
    last.errors += tail.errors;
    last.active_vms = last.active_vms.max(tail.active_vms);
    let _ = last.latency_us.add(&tail.latency_us);
    for (a, b) in last.vm_ios.iter_mut().zip(&tail.vm_ios) {
        *a += b;
    }
}

/// The models' figures over the measured run (ending at `end`), and as report rows
/// over the run and over each window it reached.
fn model_results(
    c: &Core,
    end: Instant,
) -> (BTreeMap<String, ModelMetric>, Vec<ModelMetricResult>) {
    let end_model = c.model_ns(end);
    let run = collect_metrics(&c.vms, c.warmup_model_ns, end_model);
    let kinds: BTreeMap<&str, &str> = c
        .vms
        .iter()
        .filter_map(|v| v.kind.map(|k| (v.base.as_str(), k)))
        .collect();
    let mut results = Vec::new();
    let mut push = |window: &str, metrics: &BTreeMap<String, ModelMetric>| {
        for (key, m) in metrics {
            let source = key.strip_suffix(&format!(".{}", m.name)).unwrap_or(key);
            results.push(ModelMetricResult {
                source: source.to_string(),
                kind: kinds.get(source).copied().unwrap_or("").to_string(),
                window: window.to_string(),
                name: m.name.clone(),
                value: m.value,
                unit: m.unit.clone(),
            });
        }
    };
    push("", &run);
    for w in &c.windows {
        if w.start_ns < end_model {
            push(
                &w.name,
                &collect_metrics(&c.vms, w.start_ns, w.end_ns.min(end_model)),
            );
        }
    }
    (run, results)
}

/// The run's outcome: its report (one case, "load") and its counts.
#[allow(clippy::too_many_arguments)]
fn build_outcome(
    core: Core,
    scenario: &LoadScenario,
    opts: &LoadOptions,
    seed: u64,
    layout_notes: Vec<String>,
    measured_s: f64,
    intervals: Vec<Interval>,
    interval_s: f64,
    sizes: Vec<u64>,
    (model_results, end_model_ns): (Vec<ModelMetricResult>, u64),
    (interval_metrics, run_metrics): (
        Vec<BTreeMap<String, ModelMetric>>,
        BTreeMap<String, ModelMetric>,
    ),
) -> LoadOutcome {
    let (workloads, total, per_target) = workload_results(&core, opts, measured_s);
    let mut total_result = total.result("total", measured_s);
    // Errors outside the measured window (lost at the end) still count.
    total_result.errors = total_result
        .errors
        .max(core.io_errors + core.verify.mismatched_reads);
    let mut components = target_components(&per_target, opts, &sizes, measured_s);
    components.extend(class_components(&core, measured_s));
    let vm_names: Vec<String> = core.vms.iter().map(|v| v.name.clone()).collect();
    let verify = opts.verify.then(|| core.verify.clone());
    let mut description = describe(&core, scenario, opts, seed, verify.as_ref(), &run_metrics);
    description.extend(layout_notes);
    let case = CaseReport {
        name: "load".to_string(),
        description: description.join("; "),
        params: Default::default(),
        duration_s: measured_s,
        // The timeline runs in wall seconds from the start, warm-up included.
        warmup_s: scenario.warmup_s / opts.time_scale,
        workloads,
        total: Some(total_result),
        comparisons: vec![],
        components,
        model_metrics: model_results,
        windows: window_results(&core, opts, end_model_ns),
        io_sizes: Some(core.sizes.clone()),
        timeline: load_timeline(&intervals, interval_s, &vm_names, &interval_metrics),
        events: 0,
    };
    LoadOutcome {
        report: ScenarioReport {
            scenario: scenario.name.clone(),
            description: scenario.description.clone(),
            seed,
            cases: vec![case],
        },
        ios: core.ios,
        io_errors: core.io_errors,
        first_errors: core.first_errors,
        connection_errors: core.connection_errors,
        verify,
        model_metrics: run_metrics,
        peak_bytes_in_flight: core.peak_bytes_in_flight,
        held_for_byte_cap: core.held_total,
    }
}

/// A row per VM, then per target (with several); also the totals over all VMs and
/// per target.
fn workload_results(
    core: &Core,
    opts: &LoadOptions,
    measured_s: f64,
) -> (Vec<WorkloadResult>, Counters, Vec<Counters>) {
    let mut workloads = Vec::new();
    let (total, per_target) = (core.totals.all.clone(), core.totals.per_target.clone());
    for vm in &core.vms {
        let mut r = vm.counters.result(&vm.name, measured_s);
        r.volume = Some(volume_name(&opts.targets[vm.target as usize]));
        workloads.push(r);
    }
    if opts.targets.len() > 1 {
        for (t, c) in per_target.iter().enumerate() {
            let name = volume_name(&opts.targets[t]);
            let mut r = c.result(&format!("volume:{name}"), measured_s);
            r.volume = Some(name);
            workloads.push(r);
        }
    }
    (workloads, total, per_target)
}

/// A component per target that served I/O (`sizes`: the exports' sizes).
fn target_components(
    per_target: &[Counters],
    opts: &LoadOptions,
    sizes: &[u64],
    measured_s: f64,
) -> Vec<ComponentResult> {
    per_target
        .iter()
        .enumerate()
        .filter(|(_, c)| c.ios() + c.errors > 0)
        .map(|(t, c)| {
            let r = c.result("", measured_s);
            ComponentResult {
                name: format!("{} ({} bytes)", opts.targets[t], sizes[t]),
                kind: format!(
                    "nbd target: mean {:.3} ms, p99 {:.3} ms",
                    r.latency_ms.mean, r.latency_ms.p99
                ),
                utilisation: f64::NAN,
                ios: r.ios,
                mbps: r.mbps,
            }
        })
        .collect()
}

/// A component per workload class (VMs running the same workload), when a class
/// groups several VMs or there are several classes.
fn class_components(core: &Core, measured_s: f64) -> Vec<ComponentResult> {
    let classes: BTreeMap<&str, (u32, &Counters)> = (core.totals.classes.iter())
        .map(|(name, n, c)| (name.as_str(), (*n, c)))
        .collect();
    let mut components = Vec::new();
    if classes.len() > 1 || classes.values().any(|(n, _)| *n > 1) {
        for (name, (n, c)) in &classes {
            let r = c.result("", measured_s);
            components.push(ComponentResult {
                name: format!("workload {name} ({n} VMs)"),
                kind: format!(
                    "class: {:.0} IOPS ({:.0} read, {:.0} write), mean {:.3} ms, p95 {:.3} ms, p99 {:.3} ms",
                    r.iops, r.read_iops, r.write_iops, r.latency_ms.mean, r.latency_ms.p95, r.latency_ms.p99
                ),
                utilisation: f64::NAN,
                ios: r.ios,
                mbps: r.mbps,
            });
        }
    }
    components
}

/// The report's description, a part each: the scenario's, the run's setup, the
/// verification, the first errors, the scenario's notes.
fn describe(
    core: &Core,
    scenario: &LoadScenario,
    opts: &LoadOptions,
    seed: u64,
    verify: Option<&VerifySummary>,
    run_metrics: &BTreeMap<String, ModelMetric>,
) -> Vec<String> {
    let mut description = vec![format!(
        "weir load against {}; time scale {}, {} connections, {} VMs, seed {seed}",
        opts.targets
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        opts.time_scale,
        core.conns.len(),
        core.vms.len(),
    )];
    if !scenario.description.is_empty() {
        description.insert(0, scenario.description.clone());
    }
    if let Some(v) = verify {
        description.push(format!(
            "verify: {} reads checked ({} sectors), {} mismatched sectors in {} reads{}",
            v.reads_checked,
            v.sectors_checked,
            v.mismatched_sectors,
            v.mismatched_reads,
            if opts.target_zeroed {
                "; target assumed zeroed"
            } else {
                "; never-written sectors not checked"
            }
        ));
        if opts.final_check_bytes > 0 {
            description.push(format!(
                "final read-back: {} sectors checked",
                v.final_sectors_checked
            ));
        }
        for m in &v.first_mismatches {
            description.push(format!("mismatch: {m}"));
        }
    }
    for e in core.first_errors.iter().take(5) {
        description.push(format!("error: {e}"));
    }
    for e in &core.connection_errors {
        description.push(format!("connection: {e}"));
    }
    if !run_metrics.is_empty() {
        description.push(format!(
            "{} model figures in model_metrics (JSON)",
            run_metrics.len()
        ));
    }
    if core.held_total > 0 {
        description.push(held_note(core));
    }
    description.extend(scenario.notes.iter().cloned());
    description
}

/// Says that requests waited for the cap of bytes in flight: the load was below
/// the depth the scenario asks for.
fn held_note(core: &Core) -> String {
    format!(
        "{} requests waited for the cap of {} bytes in flight (--max-in-flight): the load ran below the depth its scenario asks for",
        core.held_total, core.max_bytes_in_flight
    )
}

/// The figures of each window the run reached, over the part it reached.
fn window_results(core: &Core, opts: &LoadOptions, end_model_ns: u64) -> Vec<WindowResult> {
    core.windows
        .iter()
        .filter(|w| w.start_ns < end_model_ns)
        .map(|w| {
            let real_s = (w.end_ns.min(end_model_ns) - w.start_ns) as f64 / 1e9 / opts.time_scale;
            let mut figures = vec![w.total.result("total", real_s)];
            for (t, c) in w.per_target.iter().enumerate() {
                if c.ios() > 0 {
                    figures.push(
                        c.result(&format!("volume:{}", volume_name(&opts.targets[t])), real_s),
                    );
                }
            }
            WindowResult {
                name: w.name.clone(),
                start_s: w.start_ns as f64 / 1e9,
                end_s: w.end_ns as f64 / 1e9,
                figures,
                components: Vec::new(),
            }
        })
        .collect()
}

/// The timeline: I/O series, the share of VMs issuing I/O, and the model figures of
/// [`TIMELINE_METRICS`] per interval.
fn load_timeline(
    intervals: &[Interval],
    interval_s: f64,
    vm_names: &[String],
    interval_metrics: &[BTreeMap<String, ModelMetric>],
) -> Vec<weir_report::TimelineSeries> {
    let mut t = timeline(intervals, interval_s, vm_names);
    t.push(weir_report::TimelineSeries {
        name: "VMs issuing I/O %".to_string(),
        unit: "%".to_string(),
        interval_s,
        values: intervals
            .iter()
            .map(|i| 100.0 * i.active_vms as f64 / vm_names.len().max(1) as f64)
            .collect(),
    });
    let names: std::collections::BTreeSet<&String> = interval_metrics
        .iter()
        .flat_map(|m| m.keys())
        .filter(|k| {
            k.rsplit_once('.')
                .is_some_and(|(_, metric)| TIMELINE_METRICS.contains(&metric))
        })
        .collect();
    for name in names {
        let unit = interval_metrics
            .iter()
            .find_map(|m| m.get(name))
            .map(|m| m.unit.clone())
            .unwrap_or_default();
        t.push(weir_report::TimelineSeries {
            name: name.clone(),
            unit,
            interval_s,
            values: interval_metrics
                .iter()
                .map(|m| m.get(name).map_or(f64::NAN, |x| x.value))
                .collect(),
        });
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(header: &str) -> LoadOptions {
        let text = format!("[scenario]\n{header}\n[[vm]]\nname = \"a\"\nworkload = \"oltp\"\n");
        LoadOptions::new(
            Target::parse_list("nbd://127.0.0.1:1/").unwrap(),
            LoadScenario::from_toml_str("t.toml", &text).unwrap(),
        )
    }

    /// `duration_s` is measured after `warmup_s`, as in `weir sim`: the run takes
    /// both (it measured 1 s of `warmup_s = 1, duration_s = 2`, and refused
    /// `duration_s = 1`); `--duration` replaces the measured part.
    #[test]
    fn the_warm_up_comes_before_the_measured_time() {
        let t = check_options(&opts("warmup_s = 1\nduration_s = 2")).unwrap();
        assert_eq!((t.duration, t.warmup_real), (secs(3.0), secs(1.0)));
        let t = check_options(&opts("warmup_s = 1\nduration_s = 1")).unwrap();
        assert_eq!(t.duration, secs(2.0));
        let mut o = opts("warmup_s = 4\nduration_s = 8");
        o.time_scale = 4.0;
        o.duration = Some(secs(0.5));
        let t = check_options(&o).unwrap();
        assert_eq!((t.duration, t.warmup_real), (secs(1.5), secs(1.0)));
        o.duration = None;
        assert_eq!(check_options(&o).unwrap().duration, secs(3.0));
    }

    /// Times that are valid model seconds but too long at a small time scale are
    /// refused naming their key (they panicked converting to a duration).
    #[test]
    fn wall_times_beyond_30_days_are_refused() {
        for (header, key) in [
            ("duration_s = 1e8", "scenario.duration_s"),
            ("warmup_s = 1e8", "scenario.warmup_s"),
            ("timeline_interval_s = 1e8", "scenario.timeline_interval_s"),
        ] {
            let mut o = opts(header);
            o.time_scale = 1e-300;
            let e = check_options(&o).err().expect(header).to_string();
            assert!(e.contains(key) && e.contains("30 days"), "{header}: {e}");
        }
        let mut o = opts("duration_s = 1e8");
        o.duration = Some(secs(1.0));
        assert!(check_options(&o).is_ok(), "--duration replaces duration_s");
        let mut o = opts("warmup_s = 3000000");
        o.duration = Some(secs(1.0));
        let e = check_options(&o).err().unwrap().to_string();
        assert!(e.contains("30 days"), "{e}");
    }

    /// More than 1 Mi I/Os outstanding in all are refused before the run
    /// (`qd=65536,workers=4096` aborted on a 2.3 GB allocation).
    #[test]
    fn too_many_outstanding_ios_are_refused() {
        let spec = |s: &str| {
            LoadOptions::new(
                Target::parse_list("nbd://127.0.0.1:1/").unwrap(),
                LoadScenario::from_spec(s).unwrap(),
            )
        };
        for s in [
            "qd=65536,workers=4096",
            "qd=65536,workers=64",
            "qd=1024,vms=1025",
        ] {
            let e = check_options(&spec(s)).err().expect(s).to_string();
            assert!(e.contains("at most 1048576"), "{s}: {e}");
        }
        assert!(check_options(&spec("qd=1024,vms=1024")).is_ok());
        assert!(check_options(&spec("vdi-boot,vms=4")).is_ok());
        for (name, toml) in weir_sim::builtin_scenarios() {
            let s = LoadScenario::from_toml_str(name, toml).unwrap();
            assert!(
                check_outstanding(&s).is_ok(),
                "{name}: {}",
                s.max_outstanding()
            );
        }
    }

    /// The same export under two spellings of its host (or plain and TLS) is one
    /// disk: refused (session 30: two VMs shared it and verify reported 123,032
    /// "misdirected" sectors). Another export of the same server is not.
    #[test]
    fn a_target_listed_twice_is_found_by_its_address() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let check = |list: &str| rt.block_on(resolve_targets(&Target::parse_list(list).unwrap()));
        for list in [
            "nbd://127.0.0.1:9/x,nbd://localhost:9/x",
            "nbd://127.0.0.1:9/,nbds://127.0.0.1:9/",
            "nbd://[::ffff:127.0.0.1]:9/x,nbd://127.0.0.1:9/x",
            "nbd://127.0.0.1:9/,nbd://127.0.0.1:9",
        ] {
            let e = check(list).expect_err(list).to_string();
            assert!(e.contains("listed twice"), "{list}: {e}");
        }
        for list in [
            "nbd://127.0.0.1:9/x,nbd://localhost:9/y",
            "nbd://127.0.0.1:9/x,nbd://127.0.0.1:10/x",
        ] {
            assert!(check(list).is_ok(), "{list}");
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }
}
