//! The gate: the one sans-I/O QoS driver that both worlds run. It owns
//! - **admission** per client host (optional PARDA windows: a host may have at most
//!   its window of requests in the gate, the rest wait in the host's FIFO),
//! - the **tag scheduler** (reservations, shares, limits, service levels; per-client
//!   fair sub-queues within a volume; large requests paced in pieces under a limit),
//! - the **device in-flight limit** (pieces outstanding at the device, adapted by
//!   the [`DepthController`] while a latency target is at risk),
//! - **completion accounting** (latency to the scheduler's risk tracking, device
//!   time to the depth controller, period latency for PARDA),
//! - optionally the **gateway window** (PARDA one level up): the gate itself is one
//!   host of a datastore it shares with other gates it cannot see (other `weir
//!   serve` gateways on one Ceph cluster; the simulator's hosts on one array). Its
//!   window bounds the pieces it keeps at the device (the cap), and adapts each
//!   period to the device latency against the threshold, with `β` from the shares
//!   of the volumes that did I/O in the period — so gates that see the same latency
//!   hold windows in proportion to their aggregate shares, with no coordinator.
//!   With `fair_rate` it also paces its releases to its weighted max-min share of
//!   the datastore's throughput while that is congested ([`crate::fair_rate`]), for
//!   devices that serve their clients in turn rather than by outstanding count.
//!
//! Events in, decisions out: [`Gate::submit`], [`Gate::complete`] and [`Gate::wake`]
//! take `now` and append what they release to `out`; [`Gate::next_wakeup`] says when
//! to call `wake` if nothing else happens first. No I/O, no clock, no threads: the
//! server wraps it in a thin tokio driver and performs what it releases; the
//! simulator's host tier and array tier are two instances of it.
//!
//! A released [`Release`] is one piece of a request (the whole request unless it
//! is paced); the driver performs it and reports it with [`Gate::complete`] and its
//! [`Ticket`]. When the last piece of a request completes, `complete` returns
//! [`Finished`].
//!
//! **Classes.** A device may be several devices behind one queue (a hybrid array's
//! disks and its flash tier). A request is submitted in a class
//! ([`Gate::submit_in_class`]); class 0 is the device the in-flight limit (depth,
//! cap) bounds, and every other class has its own fixed bound
//! ([`Gate::set_class_limit`]), so requests of a fast class do not wait for slots
//! held by a slow one. The scheduler still decides the order across classes: a
//! released piece whose class is full is *parked* until its class frees a slot, and
//! nothing else is released meanwhile. Only class 0's device times feed the depth
//! controller. Without `set_class_limit` every request is class 0 and nothing of
//! this applies.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::depth::{DepthConfig, DepthController};
use crate::fair_rate::{GatewayShare, RateCap};
use crate::scheduler::{IdMap, IoKind, IoRange};
use crate::{
    ClientId, CongestionConfig, DatastoreLatency, Dispatch, Dispatched, HostWindow, IoCost,
    NANOS_PER_SEC, Nanos, PACE_QUANTUM_NS, Phase, Piece, Policy, PolicyError, Scheduler,
    SchedulerConfig, VolumeId, VolumeStats,
};

#[derive(Clone, Debug, PartialEq)]
pub struct GateConfig {
    pub scheduler: SchedulerConfig,
    /// Most pieces outstanding at the device: the adaptive depth's ceiling.
    pub max_in_flight: u32,
    pub depth: DepthConfig,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            scheduler: SchedulerConfig::default(),
            max_in_flight: 64,
            depth: DepthConfig::default(),
        }
    }
}

/// A validated request on its way in.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GateRequest {
    pub volume: VolumeId,
    pub client: ClientId,
    pub kind: IoKind,
    pub offset: u64,
    /// Bytes (ignored for kinds without a range: flush, other).
    pub length: u32,
}

impl GateRequest {
    pub fn range(&self) -> IoRange {
        IoRange {
            kind: self.kind,
            offset: self.offset,
            length: self.length,
        }
    }
}

/// Identifies one released piece; hand it back to [`Gate::complete`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    slot: u32,
    generation: u32,
    released_at: Nanos,
}

impl Ticket {
    /// When the piece was released (its device time starts here).
    pub fn released_at(&self) -> Nanos {
        self.released_at
    }
}

/// One piece released to the device.
#[derive(Debug)]
pub struct Release<T> {
    pub ticket: Ticket,
    pub volume: VolumeId,
    pub client: ClientId,
    pub kind: IoKind,
    pub piece: Piece,
    pub phase: Phase,
    /// The volume is protected (mission- or business-critical with a latency
    /// target): a device with priority queueing should serve it ahead of the rest
    /// (`weir_model::Component::submit_urgent`; SCSI HEAD OF QUEUE, NCQ priority).
    pub urgent: bool,
    /// The request's payload (a clone for every piece but the last).
    pub payload: T,
}

/// A request whose last piece completed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub volume: VolumeId,
    pub client: ClientId,
    pub kind: IoKind,
    /// From submission to the completion of its last piece.
    pub latency_ns: Nanos,
}

/// A request the gate refused (its payload comes back).
#[derive(Debug)]
pub struct Rejected<T> {
    pub error: PolicyError,
    pub payload: T,
}

/// One client host's admission window (datastore-wide congestion control).
#[derive(Clone, Debug, PartialEq)]
pub struct HostWindowStats {
    pub client: ClientId,
    pub window: u32,
    pub host_shares: u64,
    /// Requests of this host in the gate (queued or at the device).
    pub in_gate: usize,
    /// Requests waiting for room in the window.
    pub waiting: usize,
}

struct Entry<T> {
    generation: u32,
    live: bool,
    /// The gate's copy until the last piece is released.
    payload: Option<T>,
    request: GateRequest,
    submitted_at: Nanos,
    /// Pieces released and not completed.
    outstanding: u32,
    released_all: bool,
    /// Taken out (volume removed, shutdown): pieces still out complete silently.
    cancelled: bool,
    /// Its class (0: the device the depth limit applies to).
    class: u32,
}

/// The bound of a class other than 0 and its pieces outstanding.
#[derive(Clone, Copy, Debug, Default)]
struct ClassBound {
    limit: u32,
    in_flight: u32,
}

/// The gate's own window on a shared datastore (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayWindowStats {
    pub window: u32,
    /// The shares it last stepped with (of the volumes active in that period).
    pub shares: u64,
    /// Pieces at the device now (class 0).
    pub in_flight: u32,
    /// The device latency it last stepped with, ms (`None`: no period with I/O yet).
    pub latency_ms: Option<f64>,
    /// The fair rate it paces to, cost units per second (`None`: not paced).
    pub rate_units_per_s: Option<f64>,
    /// Its last period as published to the other gateways (`fair_rate` only).
    pub share: Option<GatewayShare>,
}

struct GatewayWindow {
    config: CongestionConfig,
    window: HostWindow,
    /// Device time (release to completion) of class-0 pieces this period.
    latency: DatastoreLatency,
    /// Volumes with a piece completed at the device this period.
    active: HashSet<VolumeId>,
    last_latency_ms: Option<f64>,
    /// The fair rate (`config.fair_rate`) and the period it is measured over.
    cap: RateCap,
    /// When the next release may go at the rate (GCRA's theoretical arrival time).
    tat: Nanos,
    /// Cost units released to the device this period, since `period_start`.
    units: u64,
    period_start: Nanos,
    /// The rate held requests back this period.
    paced: bool,
    last_share: Option<GatewayShare>,
}

/// Takes the slots waiting for room in their host's window for which `pred` holds.
fn take_waiting_where(admission: &mut Option<Admission>, pred: impl Fn(u32) -> bool) -> Vec<u32> {
    let Some(adm) = admission else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for host in adm.hosts.values_mut() {
        let (gone, kept): (VecDeque<u32>, VecDeque<u32>) =
            host.waiting.drain(..).partition(|&s| pred(s));
        host.waiting = kept;
        out.extend(gone);
    }
    out
}

struct HostGate {
    window: HostWindow,
    in_gate: usize,
    waiting: VecDeque<u32>,
}

struct Admission {
    config: CongestionConfig,
    initial_window: u32,
    hosts: HashMap<ClientId, HostGate>,
}

impl Admission {
    fn host(&mut self, client: ClientId) -> &mut HostGate {
        let (config, initial) = (&self.config, self.initial_window);
        self.hosts.entry(client).or_insert_with(|| HostGate {
            window: HostWindow::new(config.clone(), 1000, initial),
            in_gate: 0,
            waiting: VecDeque::new(),
        })
    }
}

/// The QoS gate of one device (see the module docs).
pub struct Gate<T> {
    sched: Scheduler<u32>,
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    /// Pieces of class 0 outstanding (what the depth limit bounds).
    device_in_flight: u32,
    /// Classes 1.. (index `class - 1`); empty unless `set_class_limit` was called.
    classes: Vec<ClassBound>,
    /// A piece the scheduler released whose class was full: it goes first.
    parked: Option<Dispatched<u32>>,
    /// A bound set by the driver (the simulator's host window), besides the depth.
    cap: u32,
    depth: DepthController,
    admission: Option<Admission>,
    gateway: Option<GatewayWindow>,
    /// Completion latencies since the last `take_period_latency` (for PARDA).
    period_latency: DatastoreLatency,
    wake_at: Option<Nanos>,
    /// Per volume: requests submitted and not finished, and the sum and count of
    /// that figure sampled at its completions this period (the share bound).
    demand: IdMap<VolumeId, Demand>,
    /// Slots held for a volume's next request (anticipation), until a deadline.
    held: VecDeque<(VolumeId, Nanos)>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Demand {
    outstanding: u32,
    sum: u64,
    samples: u32,
    /// Its proportional part of the depth while the share bound is in force.
    part: f64,
}

impl<T: Clone> Gate<T> {
    pub fn new(config: GateConfig) -> Gate<T> {
        let depth = DepthController::new(config.depth.clone(), config.max_in_flight);
        Gate {
            sched: Scheduler::new(config.scheduler),
            entries: Vec::new(),
            free: Vec::new(),
            device_in_flight: 0,
            classes: Vec::new(),
            parked: None,
            cap: u32::MAX,
            depth,
            admission: None,
            gateway: None,
            period_latency: DatastoreLatency::new(),
            wake_at: None,
            demand: IdMap::default(),
            held: VecDeque::new(),
        }
    }

    /// Turns on per-host admission windows (PARDA): each host starts with
    /// `initial_window` requests in the gate.
    pub fn enable_host_windows(&mut self, config: CongestionConfig, initial_window: u32) {
        self.admission = Some(Admission {
            config: config.sanitized(),
            initial_window: initial_window.max(1),
            hosts: HashMap::new(),
        });
    }

    pub fn scheduler_config(&self) -> &SchedulerConfig {
        self.sched.config()
    }

    /// Adds a volume, or changes its policy if it exists (queued requests follow).
    pub fn add_volume(&mut self, now: Nanos, volume: VolumeId, policy: Policy) {
        self.sched.add_volume(now, volume, policy);
    }

    pub fn set_policy(
        &mut self,
        now: Nanos,
        volume: VolumeId,
        policy: Policy,
        out: &mut Vec<Release<T>>,
    ) {
        self.sched.set_policy(now, volume, policy);
        self.pump(now, out);
    }

    /// Removes a volume; returns the payloads of its requests not fully released
    /// (the driver fails them). Pieces already at the device complete silently.
    pub fn remove_volume(&mut self, volume: VolumeId) -> Vec<T> {
        let mut slots = self.unpark(|d| d.volume == volume);
        slots.extend(self.sched.remove_volume(volume));
        let mut out = self.cancel(slots, true);
        let waiting = self.take_waiting(|r| r.volume == volume);
        out.extend(self.cancel(waiting, false));
        self.demand.remove(&volume);
        out
    }

    /// Takes `volume`'s requests for whose payload `pred` holds and that are not
    /// fully released yet (their client is gone: no reply can reach it), and
    /// returns their payloads (the driver fails them). What was released stays
    /// charged; pieces already out complete silently. Others' requests may be
    /// released into `out`.
    pub fn cancel_where(
        &mut self,
        now: Nanos,
        volume: VolumeId,
        pred: impl Fn(&T) -> bool,
        out: &mut Vec<Release<T>>,
    ) -> Vec<T> {
        let entries = &self.entries;
        let matches = |s: &u32| {
            let e = &entries[*s as usize];
            e.request.volume == volume && e.payload.as_ref().is_some_and(&pred)
        };
        let slots = self.sched.extract(now, volume, matches);
        let waiting = take_waiting_where(&mut self.admission, |s| matches(&s));
        // A middle piece of one of them parked for room goes with it.
        self.unpark(|d| slots.contains(&d.payload));
        let mut gone = self.cancel(slots, true);
        gone.extend(self.cancel(waiting, false));
        self.admit_all(now);
        self.pump(now, out);
        gone
    }

    /// Takes every request not fully released yet (shutdown); volumes stay.
    pub fn take_queued(&mut self, now: Nanos) -> Vec<T> {
        let volumes: Vec<VolumeId> = self.sched.volumes().collect();
        let mut slots = self.unpark(|_| true);
        for v in volumes {
            slots.extend(self.sched.extract(now, v, |_| true));
        }
        let mut out = self.cancel(slots, true);
        let waiting = self.take_waiting(|_| true);
        out.extend(self.cancel(waiting, false));
        out
    }

    /// The parked piece's slot, taken out if `pred` holds for it.
    fn unpark(&mut self, pred: impl Fn(&Dispatched<u32>) -> bool) -> Vec<u32> {
        match self.parked.take() {
            Some(d) if pred(&d) => vec![d.payload],
            other => {
                self.parked = other;
                Vec::new()
            }
        }
    }

    fn take_waiting(&mut self, pred: impl Fn(&GateRequest) -> bool) -> Vec<u32> {
        let entries = &self.entries;
        take_waiting_where(&mut self.admission, |s| pred(&entries[s as usize].request))
    }

    /// Lets waiting requests of every host into the scheduler as far as its
    /// window has room (after requests in the gate were cancelled).
    fn admit_all(&mut self, now: Nanos) {
        let hosts: Vec<ClientId> = match &self.admission {
            Some(adm) => adm.hosts.keys().copied().collect(),
            None => return,
        };
        for client in hosts {
            self.admit(now, client);
        }
    }

    /// Marks entries cancelled and returns their payloads. A piece that was not
    /// the last may still be out: the entry lives until it completes. `in_gate`:
    /// the entries had been admitted (they count in their host's window).
    fn cancel(&mut self, slots: Vec<u32>, in_gate: bool) -> Vec<T> {
        let mut out = Vec::new();
        for slot in slots {
            let e = &mut self.entries[slot as usize];
            if !e.live || e.cancelled {
                continue;
            }
            e.cancelled = true;
            let (client, volume) = (e.request.client, e.request.volume);
            if let Some(d) = self.demand.get_mut(&volume) {
                d.outstanding = d.outstanding.saturating_sub(1);
            }
            if let Some(p) = e.payload.take() {
                out.push(p);
            }
            if self.entries[slot as usize].outstanding == 0 {
                self.free_entry(slot);
            }
            if in_gate {
                self.left_gate(client);
            }
        }
        out
    }

    /// Queues a request and releases what may go now into `out`.
    pub fn submit(
        &mut self,
        now: Nanos,
        request: GateRequest,
        payload: T,
        out: &mut Vec<Release<T>>,
    ) -> Result<(), Rejected<T>> {
        self.submit_in_class(now, request, 0, payload, out)
    }

    /// [`Gate::submit`] for a request of `class` (see the module docs; a class
    /// without a bound set by [`Gate::set_class_limit`] is class 0).
    pub fn submit_in_class(
        &mut self,
        now: Nanos,
        request: GateRequest,
        class: u32,
        payload: T,
        out: &mut Vec<Release<T>>,
    ) -> Result<(), Rejected<T>> {
        if self.sched.policy(request.volume).is_none() {
            return Err(Rejected {
                error: PolicyError::UnknownVolume(request.volume.0),
                payload,
            });
        }
        let class = if class as usize <= self.classes.len() {
            class
        } else {
            0
        };
        let slot = self.alloc(now, request, class, payload);
        self.demand.entry(request.volume).or_default().outstanding += 1;
        // The slot held for this volume's next request is its to use now.
        if let Some(i) = self.held.iter().position(|h| h.0 == request.volume) {
            self.held.remove(i);
        }
        let admit = match &mut self.admission {
            None => true,
            Some(adm) => {
                let host = adm.host(request.client);
                if host.in_gate >= host.window.window() as usize || !host.waiting.is_empty() {
                    host.waiting.push_back(slot);
                    false
                } else {
                    host.in_gate += 1;
                    true
                }
            }
        };
        if admit {
            self.enqueue(now, slot);
        }
        self.pump(now, out);
        Ok(())
    }

    fn alloc(&mut self, now: Nanos, request: GateRequest, class: u32, payload: T) -> u32 {
        let entry = |generation| Entry {
            generation,
            live: true,
            payload: Some(payload),
            request,
            submitted_at: now,
            outstanding: 0,
            released_all: false,
            cancelled: false,
            class,
        };
        match self.free.pop() {
            Some(slot) => {
                let e = &mut self.entries[slot as usize];
                *e = entry(e.generation.wrapping_add(1));
                slot
            }
            None => {
                self.entries.push(entry(0));
                (self.entries.len() - 1) as u32
            }
        }
    }

    fn free_entry(&mut self, slot: u32) {
        let e = &mut self.entries[slot as usize];
        debug_assert!(e.live && e.outstanding == 0);
        e.live = false;
        e.payload = None;
        self.free.push(slot);
    }

    fn enqueue(&mut self, now: Nanos, slot: u32) {
        let r = self.entries[slot as usize].request;
        // The volume exists (checked at submit, or admitted from a window: a removed
        // volume's waiting requests were cancelled with it).
        let queued = self
            .sched
            .enqueue_range(now, r.volume, r.client, r.range(), slot);
        debug_assert!(queued.is_ok(), "admitted request for an unknown volume");
    }

    /// The current in-flight limit: the adaptive depth, under the driver's cap.
    pub fn limit(&self) -> u32 {
        self.depth.limit().min(self.cap).max(1)
    }

    /// Pieces the device may take now: the limit less the slots held for a volume.
    fn room(&self) -> u32 {
        self.limit().saturating_sub(self.held.len() as u32)
    }

    /// A bound on outstanding pieces set by the driver (u32::MAX: none).
    pub fn set_cap(&mut self, now: Nanos, cap: u32, out: &mut Vec<Release<T>>) {
        self.cap = cap.max(1);
        self.pump(now, out);
    }

    /// Bounds class `class` (≥ 1) at `limit` outstanding pieces (at least 1),
    /// creating it and any lower class not created yet (bound 1 until set).
    /// Class 0 is the device, bounded by [`Gate::limit`]; a `class` of 0 is ignored.
    pub fn set_class_limit(
        &mut self,
        now: Nanos,
        class: u32,
        limit: u32,
        out: &mut Vec<Release<T>>,
    ) {
        let Some(i) = (class as usize).checked_sub(1) else {
            return;
        };
        if self.classes.len() <= i {
            self.classes.resize(
                i + 1,
                ClassBound {
                    limit: 1,
                    in_flight: 0,
                },
            );
        }
        self.classes[i].limit = limit.max(1);
        self.pump(now, out);
    }

    /// Pieces of `class` outstanding (class 0: the device).
    pub fn class_in_flight(&self, class: u32) -> u32 {
        match class {
            0 => self.device_in_flight,
            c => self.classes.get(c as usize - 1).map_or(0, |b| b.in_flight),
        }
    }

    fn has_room(&self, class: u32, now: Nanos) -> bool {
        match class {
            0 => self.device_in_flight < self.room() && self.rate_wait(now).is_none(),
            c => self
                .classes
                .get(c as usize - 1)
                .is_some_and(|b| b.in_flight < b.limit),
        }
    }

    /// A new device depth ceiling (the pool's `max_in_flight`).
    pub fn set_max_in_flight(&mut self, now: Nanos, max: u32, out: &mut Vec<Release<T>>) {
        self.depth.set_max(max);
        self.pump(now, out);
    }

    /// Releases what the scheduler allows while there is room at the device (in
    /// some class; a piece whose class is full is parked and stops the releases).
    fn pump(&mut self, now: Nanos, out: &mut Vec<Release<T>>) {
        self.wake_at = None;
        while self.held.front().is_some_and(|h| h.1 <= now) {
            self.held.pop_front();
        }
        loop {
            if let Some(d) = self.parked.take() {
                if !self.has_room(self.entries[d.payload as usize].class, now) {
                    self.parked = Some(d);
                    break;
                }
                self.release(now, d, out);
                continue;
            }
            let room = self.has_room(0, now)
                || (1..=self.classes.len() as u32).any(|c| self.has_room(c, now));
            if !room {
                break;
            }
            match self.sched.dispatch(now) {
                Dispatch::Io(d) => {
                    if self.has_room(self.entries[d.payload as usize].class, now) {
                        self.release(now, d, out);
                    } else {
                        self.parked = Some(d);
                        break;
                    }
                }
                Dispatch::WaitUntil(t) => {
                    self.wake_at = Some(t);
                    break;
                }
                Dispatch::Idle => break,
            }
        }
        if let Some(&(_, until)) = self.held.front() {
            self.wake_at = Some(self.wake_at.map_or(until, |t| t.min(until)));
        }
        if let Some(at) = self.rate_wait(now)
            && self.queued() > 0
        {
            self.wake_at = Some(self.wake_at.map_or(at, |t| t.min(at)));
            if let Some(g) = &mut self.gateway {
                g.paced = true;
            }
        }
    }

    /// When the next class-0 piece may go at the gateway's fair rate (`None`: now,
    /// or no rate): GCRA with a burst of [`PACE_QUANTUM_NS`] of the rate.
    fn rate_wait(&self, now: Nanos) -> Option<Nanos> {
        let g = self.gateway.as_ref()?;
        g.cap.rate()?;
        let at = g.tat.saturating_sub(PACE_QUANTUM_NS);
        (at > now).then_some(at)
    }

    /// A class-0 piece of `units` cost units leaves: counted for the gateway's
    /// period, and charged at its fair rate.
    fn charge_gateway(&mut self, now: Nanos, units: u64) {
        let Some(g) = &mut self.gateway else {
            return;
        };
        g.units += units;
        if let Some(rate) = g.cap.rate() {
            let ns = (units as f64 * NANOS_PER_SEC as f64 / rate).ceil() as Nanos;
            g.tat = g.tat.max(now) + ns;
        }
    }

    fn release(&mut self, now: Nanos, d: Dispatched<u32>, out: &mut Vec<Release<T>>) {
        let slot = d.payload;
        let e = &mut self.entries[slot as usize];
        debug_assert!(e.live && !e.cancelled && !e.released_all);
        let payload = if d.piece.last {
            e.released_all = true;
            e.payload.take()
        } else {
            e.payload.clone()
        };
        let Some(payload) = payload else {
            return; // cannot happen: a queued entry holds its payload
        };
        e.outstanding += 1;
        let (generation, class) = (e.generation, e.class);
        match class {
            0 => {
                self.device_in_flight += 1;
                let cost = IoCost {
                    kind: d.cost.kind,
                    size_bytes: d.piece.length,
                };
                let units = self.sched.config().units(cost);
                self.charge_gateway(now, units);
            }
            c => self.classes[c as usize - 1].in_flight += 1,
        }
        out.push(Release {
            ticket: Ticket {
                slot,
                generation,
                released_at: now,
            },
            volume: d.volume,
            client: d.client,
            kind: d.cost.kind,
            piece: d.piece,
            phase: d.phase,
            urgent: self.sched.protected_target_ns(d.volume).is_some(),
            payload,
        });
    }

    /// A timer set from [`Gate::next_wakeup`] fired (or the driver just wants to
    /// re-evaluate): releases what may go now.
    pub fn wake(&mut self, now: Nanos, out: &mut Vec<Release<T>>) {
        self.pump(now, out);
    }

    /// When queued requests held back by a limit may go (`None`: nothing waits on
    /// time; a completion or submission will release the rest).
    pub fn next_wakeup(&self) -> Option<Nanos> {
        self.wake_at
    }

    /// A released piece completed. Returns the request when this was its last
    /// piece; releases what the freed slot allows into `out`. A ticket that is not
    /// outstanding (completed twice, or forged) is ignored.
    pub fn complete(
        &mut self,
        now: Nanos,
        ticket: Ticket,
        out: &mut Vec<Release<T>>,
    ) -> Option<Finished> {
        let e = self.entries.get_mut(ticket.slot as usize)?;
        if !e.live || e.generation != ticket.generation || e.outstanding == 0 {
            return None;
        }
        e.outstanding -= 1;
        let r = e.request;
        let device_ns = now.saturating_sub(ticket.released_at);
        match e.class {
            0 => {
                self.device_in_flight -= 1;
                if let Some(g) = &mut self.gateway {
                    g.latency.record(device_ns);
                    g.active.insert(r.volume);
                }
                let target = self.sched.protected_target_ns(r.volume);
                if self.depth.on_completion(now, device_ns, target) {
                    self.end_period();
                }
            }
            c => self.classes[c as usize - 1].in_flight -= 1,
        }
        let e = &self.entries[ticket.slot as usize];
        let done = e.outstanding == 0 && (e.released_all || e.cancelled);
        let mut finished = None;
        if done {
            let cancelled = e.cancelled;
            let latency_ns = now.saturating_sub(e.submitted_at);
            self.free_entry(ticket.slot);
            if !cancelled {
                let cost = IoCost {
                    kind: r.kind,
                    size_bytes: r.length,
                };
                self.sched
                    .complete(now, r.volume, r.client, cost, latency_ns);
                self.note_finished(now, r.volume);
                self.period_latency.record(latency_ns);
                self.left_gate(r.client);
                self.admit(now, r.client);
                finished = Some(Finished {
                    volume: r.volume,
                    client: r.client,
                    kind: r.kind,
                    latency_ns,
                });
            }
        }
        self.pump(now, out);
        finished
    }

    /// A request of `volume` finished: its demand sample, and anticipation — while
    /// the share bound is in force, a volume under its proportional part of the
    /// depth with nothing queued gets the freed slot held for its next request.
    fn note_finished(&mut self, now: Nanos, volume: VolumeId) {
        let Some(d) = self.demand.get_mut(&volume) else {
            return;
        };
        d.sum += d.outstanding as u64;
        d.samples += 1;
        d.outstanding = d.outstanding.saturating_sub(1);
        let (outstanding, part) = (d.outstanding, d.part);
        let hold = self.depth.anticipate_ns();
        if hold > 0
            && (outstanding as f64) < part
            && self.held.len() < self.limit() as usize / 2
            && self.sched.stats(volume).is_some_and(|s| s.queued == 0)
        {
            self.held.push_back((volume, now + hold));
        }
    }

    /// A depth-control period ended: the share bound for the next one.
    fn end_period(&mut self) {
        let mut active = Vec::new();
        for (volume, d) in self.demand.iter_mut() {
            if d.samples > 0 {
                let shares = self.sched.policy(*volume).map_or(1000, |p| p.shares.get());
                active.push((*volume, d.sum as f64 / d.samples as f64, shares));
            }
            d.sum = 0;
            d.samples = 0;
            d.part = 0.0;
        }
        let demand: Vec<(f64, u32)> = active.iter().map(|a| (a.1, a.2)).collect();
        self.depth.set_share_demand(&demand);
        if let Some(depth) = self.depth.share_depth() {
            let total: f64 = active.iter().map(|a| a.2.max(1) as f64).sum();
            for (volume, _, shares) in active {
                if let Some(d) = self.demand.get_mut(&volume) {
                    d.part = depth as f64 * shares.max(1) as f64 / total;
                }
            }
        } else {
            self.held.clear();
        }
    }

    fn left_gate(&mut self, client: ClientId) {
        if let Some(adm) = &mut self.admission
            && let Some(h) = adm.hosts.get_mut(&client)
        {
            h.in_gate = h.in_gate.saturating_sub(1);
        }
    }

    /// Moves waiting requests of `client` into the scheduler while its window has room.
    fn admit(&mut self, now: Nanos, client: ClientId) {
        let mut admitted = Vec::new();
        if let Some(adm) = &mut self.admission
            && let Some(h) = adm.hosts.get_mut(&client)
        {
            while h.in_gate < h.window.window() as usize {
                let Some(slot) = h.waiting.pop_front() else {
                    break;
                };
                h.in_gate += 1;
                admitted.push(slot);
            }
        }
        for slot in admitted {
            self.enqueue(now, slot);
        }
    }

    /// Forgets the window of every host that `keep` rejects and that has nothing
    /// admitted or waiting (a host gone from a server that outlives it; one that
    /// comes back starts again at the initial window). Returns how many.
    pub fn forget_idle_hosts(&mut self, keep: impl Fn(ClientId) -> bool) -> usize {
        let Some(adm) = &mut self.admission else {
            return 0;
        };
        let before = adm.hosts.len();
        adm.hosts
            .retain(|c, h| keep(*c) || h.in_gate > 0 || !h.waiting.is_empty());
        before - adm.hosts.len()
    }

    /// The host's shares for its window (the sum of the shares of the volumes it uses).
    pub fn set_host_shares(&mut self, client: ClientId, shares: u64) {
        if let Some(adm) = &mut self.admission {
            adm.host(client).window.set_host_shares(shares.max(1));
        }
    }

    /// One PARDA period: every host window steps towards `mean_ms` against the
    /// threshold (skipped when `None`: nothing completed), then admits what fits.
    pub fn update_host_windows(
        &mut self,
        now: Nanos,
        mean_ms: Option<f64>,
        out: &mut Vec<Release<T>>,
    ) {
        let clients: Vec<ClientId> = match &mut self.admission {
            None => return,
            Some(adm) => {
                for h in adm.hosts.values_mut() {
                    if let Some(m) = mean_ms {
                        h.window.update(now, m);
                    }
                }
                adm.hosts.keys().copied().collect()
            }
        };
        for c in clients {
            self.admit(now, c);
        }
        self.pump(now, out);
    }

    /// Turns on the gateway window (see the module docs): the cap starts at
    /// `initial_window` (the device queue depth) and follows the window from then on.
    pub fn enable_gateway_window(&mut self, config: CongestionConfig, initial_window: u32) {
        let config = config.sanitized();
        let window = HostWindow::new(config.clone(), 1000, initial_window);
        self.cap = window.window();
        self.gateway = Some(GatewayWindow {
            config,
            window,
            latency: DatastoreLatency::new(),
            active: HashSet::new(),
            last_latency_ms: None,
            cap: RateCap::new(),
            tat: 0,
            units: 0,
            period_start: 0,
            paced: false,
            last_share: None,
        });
    }

    /// The gateway period since the last call: the device latencies (empty
    /// without a gateway window) — a driver that can see the other gates of the
    /// datastore merges theirs (SIOC's datastore-wide mean), one that cannot uses
    /// its own — and, for the other gateways' fair rates, this gate's
    /// [`GatewayShare`] (the shares of the volumes active in it, the cost units
    /// released per second, its own mean device latency). Take it before
    /// [`Gate::update_gateway_window`], which paces with the share.
    pub fn take_gateway_period(&mut self, now: Nanos) -> (DatastoreLatency, Option<GatewayShare>) {
        let sched = &self.sched;
        let Some(g) = self.gateway.as_mut() else {
            return (DatastoreLatency::new(), None);
        };
        let latency = std::mem::take(&mut g.latency);
        let shares: u64 = g
            .active
            .iter()
            .map(|v| sched.policy(*v).map_or(1000, |p| p.shares.get() as u64))
            .sum();
        let elapsed_ns = now.saturating_sub(g.period_start).max(1);
        let share = GatewayShare {
            shares: if shares > 0 {
                shares
            } else {
                g.window.host_shares()
            },
            units_per_s: g.units as f64 * NANOS_PER_SEC as f64 / elapsed_ns as f64,
            latency_ms: latency.clone().take_mean_ms().unwrap_or(0.0),
            paced: g.paced,
        };
        (g.units, g.period_start, g.paced) = (0, now, false);
        g.last_share = Some(share);
        (latency, Some(share))
    }

    /// One gateway-window period: `β` from the shares of the volumes active in it
    /// (unchanged when none was), a step towards `mean_ms` against the threshold
    /// (skipped when `None`), then the cap follows the window. With `fair_rate`, the
    /// pacing rate follows this gate's last [`Gate::take_gateway_period`] against
    /// `others` (the other gateways' last periods).
    pub fn update_gateway_window(
        &mut self,
        now: Nanos,
        mean_ms: Option<f64>,
        others: &[GatewayShare],
        out: &mut Vec<Release<T>>,
    ) {
        let Some(g) = &mut self.gateway else {
            return;
        };
        let shares: u64 = g
            .active
            .drain()
            .map(|v| self.sched.policy(v).map_or(1000, |p| p.shares.get() as u64))
            .sum();
        if shares > 0 {
            g.window.set_host_shares(shares);
        }
        if let Some(m) = mean_ms {
            g.window.update(now, m);
            g.last_latency_ms = Some(m);
        }
        if g.config.fair_rate
            && let Some(own) = g.last_share
        {
            g.cap.update(&g.config, mean_ms, &own, others);
        }
        self.cap = g.window.window();
        self.pump(now, out);
    }

    /// The gateway window, if on.
    pub fn gateway_window(&self) -> Option<GatewayWindowStats> {
        self.gateway.as_ref().map(|g| GatewayWindowStats {
            window: g.window.window(),
            shares: g.window.host_shares(),
            in_flight: self.device_in_flight,
            latency_ms: g.last_latency_ms,
            rate_units_per_s: g.cap.rate(),
            share: g.last_share.filter(|_| g.config.fair_rate),
        })
    }

    /// Completion latencies (submission to last piece) since the last call.
    pub fn take_period_latency(&mut self) -> DatastoreLatency {
        std::mem::take(&mut self.period_latency)
    }

    /// Every host's window (empty without admission windows), by client id.
    pub fn host_windows(&self) -> Vec<HostWindowStats> {
        let Some(adm) = &self.admission else {
            return Vec::new();
        };
        let mut v: Vec<_> = adm
            .hosts
            .iter()
            .map(|(c, h)| HostWindowStats {
                client: *c,
                window: h.window.window(),
                host_shares: h.window.host_shares(),
                in_gate: h.in_gate,
                waiting: h.waiting.len(),
            })
            .collect();
        v.sort_by_key(|h| h.client.0);
        v
    }

    /// Pieces outstanding, every class.
    pub fn in_flight(&self) -> u32 {
        self.device_in_flight + self.classes.iter().map(|c| c.in_flight).sum::<u32>()
    }

    /// Requests queued in the scheduler (not fully released; a parked last piece
    /// counts).
    pub fn queued(&self) -> usize {
        self.sched.queued() + self.parked.as_ref().is_some_and(|d| d.piece.last) as usize
    }

    pub fn depth(&self) -> &DepthController {
        &self.depth
    }

    pub fn volume_stats(&self, volume: VolumeId) -> Option<VolumeStats> {
        self.sched.stats(volume)
    }

    pub fn policy(&self, volume: VolumeId) -> Option<&Policy> {
        self.sched.policy(volume)
    }

    pub fn volumes(&self) -> impl Iterator<Item = VolumeId> + '_ {
        self.sched.volumes()
    }

    pub fn at_risk(&self, now: Nanos, volume: VolumeId) -> bool {
        self.sched.at_risk(now, volume)
    }

    pub fn latency_ewma_ms(&self, volume: VolumeId) -> Option<f64> {
        self.sched.latency_ewma_ms(volume)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NANOS_PER_MS, NANOS_PER_SEC, Shares};

    const MS: Nanos = NANOS_PER_MS;

    fn gate(max_in_flight: u32) -> Gate<u32> {
        Gate::new(GateConfig {
            max_in_flight,
            depth: DepthConfig {
                adaptive: false,
                ..DepthConfig::default()
            },
            ..GateConfig::default()
        })
    }

    fn req(volume: u32, client: u32, kind: IoKind, offset: u64, length: u32) -> GateRequest {
        GateRequest {
            volume: VolumeId(volume),
            client: ClientId(client),
            kind,
            offset,
            length,
        }
    }

    fn limited(iops: Option<f64>, mbps: Option<f64>) -> Policy {
        Policy {
            limit_iops: iops,
            limit_mbps: mbps,
            ..Policy::best_effort("lim")
        }
    }

    #[test]
    fn the_in_flight_limit_holds_and_completions_release_the_rest() {
        let mut g = gate(2);
        g.add_volume(0, VolumeId(1), Policy::best_effort("a"));
        let mut out = Vec::new();
        for i in 0..5 {
            g.submit(
                0,
                req(1, 1, IoKind::Read, i * 4096, 4096),
                i as u32,
                &mut out,
            )
            .unwrap();
        }
        assert_eq!(out.len(), 2);
        assert_eq!((g.in_flight(), g.queued()), (2, 3));
        let first = out.remove(0);
        let done = g.complete(3 * MS, first.ticket, &mut out).unwrap();
        assert_eq!(done.latency_ns, 3 * MS);
        assert_eq!(out.len(), 2, "the freed slot went to the next request");
        // A ticket completed twice is ignored.
        assert!(g.complete(4 * MS, first.ticket, &mut out).is_none());
        assert_eq!(g.in_flight(), 2);
        let unknown = g.submit(0, req(9, 1, IoKind::Read, 0, 4096), 99, &mut out);
        assert_eq!(unknown.unwrap_err().payload, 99);
    }

    /// Drives the gate with an instant device: every release completes at once.
    fn run_instant(
        g: &mut Gate<u32>,
        until: Nanos,
        mut on_release: impl FnMut(Nanos, &Release<u32>),
    ) {
        let mut now = 0;
        let mut out = Vec::new();
        g.wake(now, &mut out);
        while now < until {
            while let Some(r) = out.pop() {
                on_release(now, &r);
                g.complete(now, r.ticket, &mut out);
            }
            match g.next_wakeup() {
                Some(t) => now = t,
                None => break,
            }
            g.wake(now, &mut out);
        }
    }

    #[test]
    fn a_large_read_is_paced_in_pieces_and_a_small_reader_keeps_its_share() {
        let mut g = gate(64);
        g.add_volume(0, VolumeId(1), limited(Some(1000.0), None));
        let mut out = Vec::new();
        // Host 1: two 32 MiB reads; host 2: 4 KiB reads (kept at QD1 below).
        for i in 0..2u64 {
            g.submit(0, req(1, 1, IoKind::Read, i << 25, 32 << 20), 1, &mut out)
                .unwrap();
        }
        g.submit(0, req(1, 2, IoKind::Read, 0, 4096), 2, &mut out)
            .unwrap();
        let mut per_second = [0u64; 3];
        let mut small = 0u32;
        let mut pending_small: Option<Nanos> = None;
        let mut now = 0;
        loop {
            while let Some(r) = out.pop() {
                assert!(r.piece.length <= 20480, "piece of {} bytes", r.piece.length);
                if now < 3 * NANOS_PER_SEC {
                    per_second[(now / NANOS_PER_SEC) as usize] +=
                        (r.piece.length as u64).div_ceil(4096);
                }
                if r.payload == 2 {
                    small += 1;
                    pending_small = Some(now + MS); // the reader's next request
                }
                g.complete(now, r.ticket, &mut out);
            }
            let next = [g.next_wakeup(), pending_small].into_iter().flatten().min();
            let Some(t) = next else { break };
            now = t;
            if now >= 3 * NANOS_PER_SEC {
                break;
            }
            if pending_small == Some(now) {
                pending_small = None;
                g.submit(now, req(1, 2, IoKind::Read, 0, 4096), 2, &mut out)
                    .unwrap();
            }
            g.wake(now, &mut out);
        }
        for (s, units) in per_second.iter().enumerate() {
            assert!(
                *units <= 1020,
                "second {s}: {units} units under a 1,000 IOPS limit"
            );
            assert!(
                *units >= 950,
                "second {s}: {units} units: the limit was not used"
            );
        }
        // Fair sub-queues: the 4 KiB reader gets a piece's worth for each of its
        // requests, i.e. ≥ 1/6 of the releases at 5 units per piece, and is
        // never starved by the 32 MiB reads.
        assert!(small >= 150, "small reader: {small} I/Os in 3 s");
    }

    #[test]
    fn every_command_pays_under_a_bandwidth_only_limit() {
        for kind in [
            IoKind::WriteZeroes,
            IoKind::Trim,
            IoKind::Flush,
            IoKind::Cache,
            IoKind::Other,
        ] {
            let mut g = gate(64);
            g.add_volume(0, VolumeId(1), limited(None, Some(10.0)));
            let mut out = Vec::new();
            for i in 0..20_000u64 {
                g.submit(0, req(1, 1, kind, i << 20, 1 << 20), 0, &mut out)
                    .unwrap();
            }
            let mut bytes = 0u64;
            let cfg = g.scheduler_config().clone();
            run_instant(&mut g, NANOS_PER_SEC, |now, r| {
                if now < NANOS_PER_SEC {
                    let cost = IoCost {
                        kind: r.kind,
                        size_bytes: r.piece.length,
                    };
                    bytes += cfg.charged_bytes(cost).max(cfg.min_limit_bytes());
                }
            });
            assert!(
                bytes <= 10_200_000,
                "{kind:?}: {bytes} bytes charged in one second under 10 MB/s"
            );
            assert!(bytes >= 9_000_000, "{kind:?}: only {bytes} bytes in 1 s");
        }
    }

    /// A gateway window of 2-64 with a 10 ms threshold that jumps to its target
    /// (γ = 1), with or without fair rates.
    fn window_config(fair_rate: bool) -> CongestionConfig {
        CongestionConfig {
            threshold_ms: 10.0,
            min_window: 2,
            max_window: 64,
            gamma: 1.0,
            fair_rate,
            ..CongestionConfig::default()
        }
    }

    /// The gateway window bounds the pieces at the device, shrinks while the device
    /// latency is over the threshold, and takes its shares from the volumes that did
    /// I/O in the period only (an idle volume of 4000 shares does not count).
    #[test]
    fn gateway_window_caps_the_device_and_follows_active_shares() {
        let mut g = gate(64);
        g.enable_gateway_window(window_config(false), 32);
        let high = Policy {
            shares: Shares::HIGH,
            ..Policy::best_effort("high")
        };
        let idle = Policy {
            shares: Shares::new(4000).unwrap(),
            ..Policy::best_effort("idle")
        };
        g.add_volume(0, VolumeId(1), high);
        g.add_volume(0, VolumeId(2), idle);
        let mut out = Vec::new();
        for i in 0..100 {
            g.submit(
                0,
                req(1, 7, IoKind::Read, i * 4096, 4096),
                i as u32,
                &mut out,
            )
            .unwrap();
        }
        assert_eq!(out.len(), 32, "the initial window is the cap");
        assert_eq!(g.gateway_window().unwrap().in_flight, 32);
        // Every piece took 40 ms at the device: 4x the threshold.
        let now = 40 * NANOS_PER_MS;
        let done: Vec<_> = out.drain(..).map(|r| r.ticket).collect();
        for t in done {
            g.complete(now, t, &mut out);
        }
        assert_eq!(out.len(), 32, "completions refill the window");
        let mut outstanding: Vec<_> = out.drain(..).map(|r| r.ticket).collect();
        let latency = g.take_gateway_period(now).0.take_mean_ms().unwrap();
        assert!((latency - 40.0).abs() < 1e-9, "{latency}");
        out.clear();
        g.update_gateway_window(now, Some(latency), &[], &mut out);
        // γ = 1: w = L/lat·w + β = 10/40·32 + 2 (2000 shares) = 10.
        let w = g.gateway_window().unwrap();
        assert_eq!((w.window, w.shares, w.latency_ms), (10, 2000, Some(40.0)));
        // The cap takes effect as pieces complete: 32 refilled the old window; when
        // they finish, only 10 are released in their place.
        assert!(out.is_empty());
        for t in outstanding.drain(..) {
            g.complete(2 * now, t, &mut out);
        }
        assert_eq!(out.len(), 10);
        assert_eq!(g.in_flight(), 10);
        // A period with no completions keeps the window and the shares.
        g.update_gateway_window(now, None, &[], &mut Vec::new());
        assert_eq!(g.gateway_window().unwrap().window, 10);
        assert_eq!(g.gateway_window().unwrap().shares, 2000);
    }

    /// With `fair_rate`, a busy gate served more than its part beside another busy
    /// gateway with twice its shares paces its releases to a third of what the
    /// datastore delivered once the latency crosses the threshold; it reports its
    /// period (and that its pace held requests back) for the others; the pace
    /// lifts when the congestion ends.
    #[test]
    fn fair_rate_paces_a_busy_gateway_to_its_share_of_the_total() {
        let mut g = gate(64);
        g.enable_gateway_window(window_config(true), 8);
        g.add_volume(0, VolumeId(1), Policy::best_effort("b"));
        let mut out = Vec::new();
        let mut next = 0u64;
        let mut submit = |g: &mut Gate<u32>, now, out: &mut Vec<Release<u32>>| {
            g.submit(now, req(1, 7, IoKind::Read, next * 4096, 4096), 0, out)
                .unwrap();
            next += 1;
        };
        // One second at 20 ms per I/O, window 8, 100 waiting: 400 I/Os/s.
        for _ in 0..108 {
            submit(&mut g, 0, &mut out);
        }
        let mut now = 0;
        while now < NANOS_PER_SEC {
            now += 20 * NANOS_PER_MS;
            let done: Vec<_> = out.drain(..).map(|r| r.ticket).collect();
            for t in done {
                g.complete(now, t, &mut out);
                submit(&mut g, now, &mut out);
            }
        }
        let (mut latency, own) = g.take_gateway_period(now);
        let own = own.unwrap();
        assert_eq!((own.shares, own.latency_ms), (1000, 20.0));
        assert!((own.units_per_s - 400.0).abs() < 9.0, "{own:?}");
        // The other gateway (2000 shares) got 400/s too, waiting at the device.
        let other = GatewayShare {
            shares: 2000,
            units_per_s: 400.0,
            latency_ms: 20.0,
            paced: false,
        };
        let mean = latency.take_mean_ms();
        g.update_gateway_window(now, mean, &[other], &mut out);
        // Ours is a third of the 800 delivered.
        let rate = g.gateway_window().unwrap().rate_units_per_s.unwrap();
        assert!((rate - 800.0 / 3.0).abs() < 6.0, "rate {rate}");
        // Completions now release at most the rate: over the next second, with
        // the device answering in 1 ms, no more than rate + the burst.
        let mut released = 0;
        let start = now;
        while now < start + NANOS_PER_SEC {
            now += NANOS_PER_MS;
            if g.next_wakeup().is_some_and(|t| t <= now) {
                g.wake(now, &mut out);
            }
            let done: Vec<_> = out.drain(..).map(|r| r.ticket).collect();
            released += done.len();
            for t in done {
                g.complete(now, t, &mut out);
                submit(&mut g, now, &mut out);
            }
        }
        // (The 8 the last completions of the first second released count here.)
        assert!(
            (255..=285).contains(&released),
            "{released} released in 1 s at {rate}/s"
        );
        // It says its pace held requests back. The congestion ends (1 ms, under
        // half the threshold): no pace.
        assert!(g.take_gateway_period(now).1.unwrap().paced);
        let other = GatewayShare {
            latency_ms: 1.0,
            ..other
        };
        g.update_gateway_window(now, Some(1.0), &[other], &mut out);
        assert_eq!(g.gateway_window().unwrap().rate_units_per_s, None);
    }

    #[test]
    fn host_windows_hold_requests_beyond_the_window() {
        let mut g = gate(64);
        g.enable_host_windows(
            CongestionConfig {
                min_window: 2,
                max_window: 2,
                ..CongestionConfig::default()
            },
            2,
        );
        g.add_volume(0, VolumeId(1), Policy::best_effort("a"));
        let mut out = Vec::new();
        for i in 0..4 {
            g.submit(0, req(1, 7, IoKind::Write, 0, 4096), i, &mut out)
                .unwrap();
        }
        assert_eq!(out.len(), 2);
        let w = &g.host_windows()[0];
        assert_eq!((w.window, w.in_gate, w.waiting), (2, 2, 2));
        let r = out.remove(0);
        g.complete(MS, r.ticket, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].payload, 2, "the waiting request was admitted");
    }

    #[test]
    fn only_idle_hosts_are_forgotten() {
        let mut g = gate(64);
        g.enable_host_windows(
            CongestionConfig {
                min_window: 1,
                max_window: 1,
                ..CongestionConfig::default()
            },
            1,
        );
        g.add_volume(0, VolumeId(1), Policy::best_effort("a"));
        let mut out = Vec::new();
        for (i, client) in [(0, 7), (1, 7), (2, 8)] {
            g.submit(0, req(1, client, IoKind::Read, 0, 4096), i, &mut out)
                .unwrap();
        }
        assert_eq!(g.host_windows().len(), 2);
        assert_eq!(g.forget_idle_hosts(|_| false), 0, "both have work");
        let done: Vec<_> = std::mem::take(&mut out);
        for r in done {
            g.complete(MS, r.ticket, &mut out);
        }
        // 8 is idle; 7's second request was admitted and is in the gate.
        assert_eq!(g.forget_idle_hosts(|_| false), 1);
        assert_eq!(g.host_windows()[0].client, ClientId(7));
        for r in std::mem::take(&mut out) {
            g.complete(2 * MS, r.ticket, &mut out);
        }
        assert_eq!(g.forget_idle_hosts(|c| c == ClientId(7)), 0, "kept");
        assert_eq!(g.forget_idle_hosts(|_| false), 1);
        assert!(g.host_windows().is_empty());
    }

    #[test]
    fn a_full_class_parks_its_piece_and_holds_the_schedulers_order() {
        // Class 0 (disks) bound 2, class 1 (flash) bound 1.
        let mut g = gate(2);
        let mut out = Vec::new();
        g.set_class_limit(0, 1, 1, &mut out);
        g.add_volume(0, VolumeId(1), Policy::best_effort("a"));
        for (i, class) in [(0u32, 1u32), (1, 1), (2, 0), (3, 0)] {
            g.submit_in_class(0, req(1, 1, IoKind::Read, 0, 4096), class, i, &mut out)
                .unwrap();
        }
        // 0 goes to flash; 1 is flash too and parks; 2 and 3 wait behind it although
        // the disks have room (the scheduler's order holds).
        let released: Vec<u32> = out.iter().map(|r| r.payload).collect();
        assert_eq!(released, vec![0]);
        assert_eq!((g.class_in_flight(1), g.class_in_flight(0)), (1, 0));
        assert_eq!(g.queued(), 3);
        let first = out.remove(0);
        g.complete(MS, first.ticket, &mut out).unwrap();
        let released: Vec<u32> = out.iter().map(|r| r.payload).collect();
        assert_eq!(released, vec![1, 2, 3]);
        assert_eq!((g.class_in_flight(1), g.class_in_flight(0)), (1, 2));
        assert_eq!(g.in_flight(), 3);
        // An unknown class is class 0; removing the volume unparks and cancels.
        g.submit_in_class(MS, req(1, 1, IoKind::Read, 0, 4096), 7, 4, &mut out)
            .unwrap();
        g.submit_in_class(MS, req(1, 1, IoKind::Read, 0, 4096), 1, 5, &mut out)
            .unwrap();
        assert_eq!(out.len(), 3, "4 waits for a disk slot: parked");
        assert_eq!(g.remove_volume(VolumeId(1)), vec![4, 5]);
        // What was released before the removal completes as usual.
        for r in std::mem::take(&mut out) {
            assert!(g.complete(2 * MS, r.ticket, &mut out).is_some());
        }
        assert_eq!((g.in_flight(), g.queued()), (0, 0));
    }

    #[test]
    fn removing_a_volume_returns_what_is_queued_and_lets_pieces_finish() {
        let mut g = gate(1);
        g.add_volume(0, VolumeId(1), limited(Some(100.0), None));
        let mut out = Vec::new();
        g.submit(0, req(1, 1, IoKind::Read, 0, 1 << 20), 5, &mut out)
            .unwrap();
        g.submit(0, req(1, 1, IoKind::Read, 0, 4096), 6, &mut out)
            .unwrap();
        assert_eq!(out.len(), 1);
        assert!(!out[0].piece.last);
        let gone = g.remove_volume(VolumeId(1));
        assert_eq!(gone, vec![5, 6]);
        let r = out.remove(0);
        assert!(g.complete(MS, r.ticket, &mut out).is_none());
        assert_eq!((g.in_flight(), g.queued()), (0, 0));
    }

    /// A gone connection's requests (payloads under 10 here) are taken out of its
    /// volume, half-released or queued, its host's next request is served at once
    /// and the other connection's request stays; the piece already out completes
    /// silently and nothing is left counted.
    #[test]
    fn a_gone_connection_s_requests_are_taken_out_and_its_host_served_next() {
        let mut g = gate(4);
        g.add_volume(0, VolumeId(1), limited(Some(1000.0), None));
        let mut out = Vec::new();
        for p in 1..=8 {
            g.submit(0, req(1, 1, IoKind::Trim, 0, 64 << 20), p, &mut out)
                .unwrap();
        }
        g.submit(0, req(1, 2, IoKind::Read, 0, 4096), 20, &mut out)
            .unwrap();
        assert_eq!(out.len(), 1, "one 5 ms piece of the first TRIM");
        assert!(!out[0].piece.last);
        let gone = g.cancel_where(MS, VolumeId(1), |&p| p < 10, &mut out);
        assert_eq!(gone, (1..=8).collect::<Vec<_>>());
        let piece = out.remove(0);
        assert!(g.complete(2 * MS, piece.ticket, &mut out).is_none());
        assert_eq!(g.queued(), 1, "the other host's read stays");
        g.submit(2 * MS, req(1, 1, IoKind::Read, 0, 4096), 11, &mut out)
            .unwrap();
        g.wake(10 * MS, &mut out);
        let released: Vec<u32> = out.iter().map(|r| r.payload).collect();
        assert_eq!(released, vec![20, 11], "served within 5 ms of the limit");
        for r in std::mem::take(&mut out) {
            assert!(g.complete(11 * MS, r.ticket, &mut out).is_some());
        }
        assert_eq!((g.in_flight(), g.queued()), (0, 0));
    }
}
