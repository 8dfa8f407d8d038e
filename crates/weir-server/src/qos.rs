//! QoS in the I/O path: a thin tokio driver around one `weir_qos::Gate` per pool
//! (the sans-I/O QoS driver the simulator runs too: per-host admission windows,
//! the tag scheduler with per-client fair sub-queues and paced pieces, the
//! adaptive device in-flight limit, completion accounting). This module only
//! supplies time, a lock, a timer and threads:
//!
//! - [`QosPool::submit`] takes the gate's lock once, submits, and performs what the
//!   gate released after unlocking (no task hop on the request path);
//! - a piece that finished runs [`QosPool::complete`] (one lock round-trip), which
//!   releases what the freed slot allows;
//! - the dispatcher ([`QosPool::start_dispatcher`]) sleeps until the gate's
//!   `next_wakeup()` (requests held back by a limit), or until kicked when an
//!   earlier wake-up appears. It is a thread waiting on a condition variable, not
//!   a tokio task: tokio's timer has 1 ms granularity, so a task wakes up to 1 ms
//!   late; the limit tag then lags `now` and a completion that happens while a
//!   QD1 client is between requests releases a 5 ms piece of a large request
//!   ahead of it. Measured in `tests/gate.rs` (a 4 KiB QD1 reader beside a paced
//!   32 MiB read under 1,000 IOPS): 215 IOPS for the small reader with a tokio
//!   sleep, 949 with the thread (which wakes within tens of microseconds);
//! - with `congestion`, [`QosPool::run_congestion_control`] sets every host's
//!   shares (those of the volumes it has open) and steps the host windows each
//!   period with the gate's own mean latency of the period;
//! - with `gateway_congestion`, the same task steps the gate's gateway window (this
//!   server is one host of a datastore other gateways share, e.g. one Ceph pool)
//!   with the datastore-wide device latency of the period, shared with the other
//!   gateways through a small volume on the datastore (`crate::datastore_stats`;
//!   docs/QOS.md on why not each gateway's own).
//!
//! **Who performs the I/O.** The pool is generic over a [`Perform`] implementation
//! that the session layer supplies (`session::Io`): the pool hands it each released
//! piece and reports back when a request is finished; it never touches sockets,
//! backends or replies. That removes the old `qos` ↔ `session` import cycle with
//! the least machinery: a trait with three associated functions, resolved at
//! compile time (no boxed closure, no dynamic dispatch on the I/O path), rather
//! than splitting "perform what was released" across two modules that both
//! drive the gate. A performer may finish a piece on the calling thread (page-cache
//! hits): it returns it, and the pool completes it in its own loop, so a deep queue
//! of inline completions iterates instead of recursing.
//!
//! Per-I/O overhead: one clock reading per lock acquisition (a batch of decisions
//! takes one instant), releases collected in a per-thread buffer the performer
//! provides ([`Perform::buffers`]: a `thread_local!` cannot be generic), and the
//! dispatcher is notified only when a wake-up earlier than the one it sleeps
//! towards appears.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::LocalKey;
use std::time::{Duration, Instant};

use weir_qos::{
    ClientId, CongestionConfig, DatastoreLatency, Finished, Gate, GateConfig, GateRequest,
    GatewayShare, Nanos, Policy, Rejected, Release, Ticket, VolumeId,
};
pub use weir_qos::{GatewayWindowStats, HostWindowStats};

/// The gateway window's shared statistics: the merge state and the stats
/// volume's backend (`crate::datastore_stats`).
pub type SharedStats = (
    crate::datastore_stats::StatsMerge,
    Arc<dyn crate::backend::Backend>,
);

use crate::datastore_stats::ShareRecord;
use crate::device::EmulatedDevice;

/// CLOCK_MONOTONIC (the clock `Instant` reads on Linux) in nanoseconds, without
/// `Instant`'s `Duration` arithmetic (that arithmetic was a quarter of the QoS
/// path's instructions).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Performs what a pool's gate releases (the session layer implements it).
pub trait Perform: Sized + Send + Sync + 'static {
    /// What travels through the gate with a request (cloned for every piece but
    /// the last: keep it cheap, e.g. an `Arc`).
    type Payload: Clone + Send + 'static;
    /// What a performed piece reports (e.g. the encoded reply of a whole request).
    type Outcome: Send + 'static;

    /// Starts one released piece. `Some`: it finished on this thread (the pool
    /// completes it); `None`: it runs elsewhere, and that code calls
    /// [`QosPool::complete`] when it is done. Must not call into the pool itself.
    fn start(pool: &Arc<QosPool<Self>>, release: Release<Self::Payload>)
    -> Option<Performed<Self>>;

    /// A performed piece was completed at the gate; `finished` is `Some` when it
    /// was its request's last (`None` also for pieces of a request the pool gave
    /// back through [`QosPool::remove_volume`] or [`QosPool::take_queued`]).
    fn done(performed: Performed<Self>, finished: Option<Finished>);

    /// This thread's reusable buffers (`thread_local!` in the implementation).
    fn buffers() -> &'static LocalKey<Cell<Buffers<Self>>>;
}

/// A piece that was performed, on its way back to the gate.
pub struct Performed<P: Perform> {
    pub ticket: Ticket,
    pub payload: P::Payload,
    pub outcome: P::Outcome,
}

/// Per-thread buffers of the pool's loops (kept between calls: no allocation per I/O).
pub struct Buffers<P: Perform> {
    released: Vec<Release<P::Payload>>,
    performed: Vec<Performed<P>>,
    finished: Vec<Option<Finished>>,
}

impl<P: Perform> Buffers<P> {
    pub const fn new() -> Self {
        Buffers {
            released: Vec::new(),
            performed: Vec::new(),
            finished: Vec::new(),
        }
    }
}

impl<P: Perform> Default for Buffers<P> {
    fn default() -> Self {
        Self::new()
    }
}

struct Inner<T> {
    gate: Gate<T>,
    /// Open connections per host and volume (a host's shares for its window are
    /// the shares of the volumes it has open).
    connections: HashMap<ClientId, HashMap<VolumeId, usize>>,
}

pub struct QosPool<P: Perform> {
    pub name: String,
    inner: Mutex<Inner<P::Payload>>,
    timer: Mutex<TimerState>,
    timer_cv: Condvar,
    /// The wake-up the dispatcher sleeps towards (`u64::MAX`: none).
    armed: AtomicU64,
    /// CLOCK_MONOTONIC at the server's epoch, ns (the gate's time zero).
    epoch_ns: u64,
    device: Option<Arc<EmulatedDevice>>,
    congestion_period: Option<Duration>,
    gateway_period: Option<Duration>,
    /// Taken by `run_congestion_control` (see `with_gateway_stats`).
    gateway_stats: Mutex<Option<SharedStats>>,
    /// `false`: requests bypass the gate (pool option `qos = false`).
    qos: bool,
    /// Requests performed past the gate on blocking threads ([`QosPool::spawn_bypass`]).
    bypass: Mutex<Bypass>,
    _perform: PhantomData<fn() -> P>,
}

/// A request performed past the gate, on a blocking thread.
pub type BypassJob = Box<dyn FnOnce() + Send>;

/// What runs past the gate: at most `limit` jobs at once, the rest in order.
struct Bypass {
    limit: usize,
    running: usize,
    waiting: VecDeque<BypassJob>,
}

impl<P: Perform> QosPool<P> {
    /// `device`: emulated-device mode (the performer waits for the model).
    pub fn new(
        name: &str,
        config: GateConfig,
        epoch: Instant,
        device: Option<Arc<EmulatedDevice>>,
    ) -> QosPool<P> {
        let bypass_limit = config.max_in_flight.max(1) as usize;
        QosPool {
            name: name.to_string(),
            inner: Mutex::new(Inner {
                gate: Gate::new(config),
                connections: HashMap::new(),
            }),
            timer: Mutex::new(TimerState::default()),
            timer_cv: Condvar::new(),
            armed: AtomicU64::new(u64::MAX),
            epoch_ns: monotonic_ns().saturating_sub(epoch.elapsed().as_nanos() as u64),
            device,
            congestion_period: None,
            gateway_period: None,
            gateway_stats: Mutex::new(None),
            qos: true,
            bypass: Mutex::new(Bypass {
                limit: bypass_limit,
                running: 0,
                waiting: VecDeque::new(),
            }),
            _perform: PhantomData,
        }
    }

    /// Runs `job` on a blocking thread, past the gate (`qos = false`, shutdown),
    /// but never more than `max_in_flight` of this pool's at once: the others
    /// wait in order and run on the threads that finish. Without the bound, one
    /// pool on a device that stopped answering took every thread of the
    /// runtime's blocking pool, and every other pool's requests waited behind it
    /// (docs/HARDENING.md).
    pub fn spawn_bypass(self: &Arc<Self>, job: BypassJob) {
        {
            let mut b = self.bypass.lock().unwrap_or_else(|e| e.into_inner());
            if b.running >= b.limit {
                b.waiting.push_back(job);
                return;
            }
            b.running += 1;
        }
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut job = job;
            loop {
                job();
                let mut b = pool.bypass.lock().unwrap_or_else(|e| e.into_inner());
                match b.waiting.pop_front() {
                    Some(next) => job = next,
                    None => {
                        b.running -= 1;
                        return;
                    }
                }
            }
        });
    }

    /// `false` bypasses the gate: the session performs requests at once (no
    /// shares, limits, reservations, depth limit or congestion control).
    pub fn with_qos(mut self, enabled: bool) -> QosPool<P> {
        self.qos = enabled;
        self
    }

    /// Turns on datastore-wide congestion control (when `config.enabled`): every
    /// host starts with a window of the pool's `max_in_flight`.
    pub fn with_congestion(mut self, config: CongestionConfig) -> QosPool<P> {
        if config.enabled {
            let config = config.sanitized();
            self.congestion_period = Some(Duration::from_nanos(config.period_ns()));
            let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
            let initial = inner.gate.depth().max();
            inner.gate.enable_host_windows(config, initial);
        }
        self
    }

    /// Turns on the gateway window (when `config.enabled`): the pool's pieces at the
    /// backend follow a PARDA window on the shared datastore behind it, starting at
    /// `max_in_flight`.
    pub fn with_gateway_window(mut self, config: Option<CongestionConfig>) -> QosPool<P> {
        if let Some(config) = config.filter(|c| c.enabled) {
            let config = config.sanitized();
            self.gateway_period = Some(Duration::from_nanos(config.period_ns()));
            let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
            let initial = inner.gate.depth().max();
            inner.gate.enable_gateway_window(config, initial);
        }
        self
    }

    /// The gateway window steps with the datastore-wide mean shared through this
    /// stats volume (`crate::datastore_stats`) instead of this gateway's own.
    pub fn with_gateway_stats(self, stats: Option<SharedStats>) -> QosPool<P> {
        *self.gateway_stats.lock().unwrap_or_else(|e| e.into_inner()) = stats;
        self
    }

    /// Whether requests go through the gate (`qos = true`, the default).
    pub fn qos_enabled(&self) -> bool {
        self.qos
    }

    /// The recomputation period of the host windows (`None`: control is off).
    pub fn congestion_period(&self) -> Option<Duration> {
        self.congestion_period
    }

    /// Whether any window control runs (host windows or the gateway window).
    pub fn has_congestion_control(&self) -> bool {
        self.congestion_period.is_some() || self.gateway_period.is_some()
    }

    pub fn device(&self) -> Option<&Arc<EmulatedDevice>> {
        self.device.as_ref()
    }

    /// Nanoseconds since the server's epoch (the gate's clock).
    pub fn now_ns(&self) -> Nanos {
        monotonic_ns().saturating_sub(self.epoch_ns)
    }

    fn lock(&self) -> MutexGuard<'_, Inner<P::Payload>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After a gate call (under its lock): wakes the dispatcher if the gate now
    /// wants a wake-up earlier than the one it sleeps towards.
    fn arm(&self, gate: &Gate<P::Payload>) {
        if let Some(t) = gate.next_wakeup()
            && t < self.armed.load(Ordering::Acquire)
        {
            self.timer().kicked = true;
            self.timer_cv.notify_one();
        }
    }

    pub fn add_volume(&self, volume: VolumeId, policy: Policy) {
        let now = self.now_ns();
        self.lock().gate.add_volume(now, volume, policy);
    }

    /// Changes a volume's policy; applies to requests already queued.
    pub fn set_policy(self: &Arc<Self>, volume: VolumeId, policy: Policy) {
        let mut b = P::buffers().take();
        {
            let mut g = self.lock();
            let now = self.now_ns();
            g.gate.set_policy(now, volume, policy, &mut b.released);
            self.arm(&g.gate);
        }
        self.perform(b);
    }

    /// Removes a volume; returns the payloads of its requests not fully released
    /// (queued, or waiting behind a host window: the caller fails them). Pieces
    /// already at the backend complete silently.
    pub fn remove_volume(&self, volume: VolumeId) -> Vec<P::Payload> {
        self.lock().gate.remove_volume(volume)
    }

    /// Takes `volume`'s requests whose payload `pred` holds that are not fully
    /// released yet (their connection is gone) and returns them (the caller
    /// fails them); performs what that lets the gate release for others.
    pub fn cancel_where(
        self: &Arc<Self>,
        volume: VolumeId,
        pred: impl Fn(&P::Payload) -> bool,
    ) -> Vec<P::Payload> {
        let mut b = P::buffers().take();
        let gone = {
            let mut g = self.lock();
            let now = self.now_ns();
            let gone = g.gate.cancel_where(now, volume, pred, &mut b.released);
            self.arm(&g.gate);
            gone
        };
        self.perform(b);
        gone
    }

    /// Submits a validated request and performs what the gate releases now;
    /// `Err`: the volume is unknown to the pool (the payload comes back).
    pub fn submit(
        self: &Arc<Self>,
        request: GateRequest,
        payload: P::Payload,
    ) -> Result<(), Rejected<P::Payload>> {
        let mut b = P::buffers().take();
        let submitted = {
            let mut g = self.lock();
            // One clock reading per batch: its decisions are taken at one instant.
            let now = self.now_ns();
            let r = g.gate.submit(now, request, payload, &mut b.released);
            self.arm(&g.gate);
            r
        };
        self.perform(b);
        submitted
    }

    /// A piece performed away from the submitting thread is done: completes it at
    /// the gate, reports it to the performer, and performs what that released.
    pub fn complete(self: &Arc<Self>, performed: Performed<P>) {
        let mut b = P::buffers().take();
        let finished = {
            let mut g = self.lock();
            let now = self.now_ns();
            let f = g.gate.complete(now, performed.ticket, &mut b.released);
            self.arm(&g.gate);
            f
        };
        P::done(performed, finished);
        self.perform(b);
    }

    /// Starts every released piece; completes the ones that finished inline (one
    /// lock round-trip per batch), and repeats while that releases more (a loop,
    /// not recursion, so a deep queue cannot grow the stack).
    fn perform(self: &Arc<Self>, mut b: Buffers<P>) {
        while !b.released.is_empty() {
            for r in b.released.drain(..) {
                if let Some(p) = P::start(self, r) {
                    b.performed.push(p);
                }
            }
            if b.performed.is_empty() {
                break;
            }
            {
                let mut g = self.lock();
                let now = self.now_ns();
                for p in &b.performed {
                    b.finished
                        .push(g.gate.complete(now, p.ticket, &mut b.released));
                }
                self.arm(&g.gate);
            }
            for (p, f) in b.performed.drain(..).zip(b.finished.drain(..)) {
                P::done(p, f);
            }
        }
        P::buffers().set(b);
    }

    fn timer(&self) -> MutexGuard<'_, TimerState> {
        self.timer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the dispatcher: a thread that releases requests held back by a limit
    /// at the gate's `next_wakeup()`, in `runtime`'s context (pieces it releases
    /// are performed as on any other path). It stops when the guard is dropped.
    pub fn start_dispatcher(self: &Arc<Self>, runtime: tokio::runtime::Handle) -> Dispatcher<P> {
        let pool = self.clone();
        let thread = std::thread::Builder::new()
            .name(format!("weir-qos-{}", self.name))
            .spawn(move || {
                let _runtime = runtime.enter();
                pool.dispatch();
            })
            .expect("spawning the QoS dispatcher thread");
        Dispatcher {
            pool: self.clone(),
            thread: Some(thread),
        }
    }

    /// The dispatcher loop: sleeps until the gate's wake-up (or a kick from
    /// [`QosPool::arm`] when an earlier one appears), then wakes the gate.
    fn dispatch(self: &Arc<Self>) {
        loop {
            let next = {
                let g = self.lock();
                let t = g.gate.next_wakeup();
                self.armed.store(t.unwrap_or(u64::MAX), Ordering::Release);
                t
            };
            {
                let mut timer = self.timer();
                loop {
                    if timer.stop {
                        return;
                    }
                    if timer.kicked {
                        timer.kicked = false;
                        break;
                    }
                    match next {
                        None => {
                            timer = self.timer_cv.wait(timer).unwrap_or_else(|e| e.into_inner())
                        }
                        Some(t) => {
                            let now = self.now_ns();
                            if now >= t {
                                break;
                            }
                            timer = self
                                .timer_cv
                                .wait_timeout(timer, Duration::from_nanos(t - now))
                                .unwrap_or_else(|e| e.into_inner())
                                .0;
                        }
                    }
                }
            }
            let mut b = P::buffers().take();
            {
                let mut g = self.lock();
                let now = self.now_ns();
                g.gate.wake(now, &mut b.released);
            }
            self.perform(b);
        }
    }

    /// A connection of `client` to `volume` opened or closed: the host's shares
    /// for its window follow the volumes it has open.
    pub fn host_connection(&self, client: ClientId, volume: VolumeId, opened: bool) {
        if self.congestion_period.is_none() {
            return;
        }
        let mut g = self.lock();
        let volumes = g.connections.entry(client).or_default();
        let n = volumes.entry(volume).or_insert(0);
        if opened {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        if *n == 0 {
            volumes.remove(&volume);
            if volumes.is_empty() {
                g.connections.remove(&client);
            }
        }
    }

    /// One congestion-control period: sets every host's shares, steps every host
    /// window towards the gate's mean latency of the period (skipped when nothing
    /// completed), then performs what the windows now admit.
    pub fn update_windows(self: &Arc<Self>) {
        let mut b = P::buffers().take();
        {
            let mut g = self.lock();
            let now = self.now_ns();
            let Inner { gate, connections } = &mut *g;
            for (client, volumes) in connections.iter() {
                let shares: u64 = volumes
                    .keys()
                    .map(|v| gate.policy(*v).map_or(1000, |p| p.shares.get() as u64))
                    .sum();
                gate.set_host_shares(*client, shares.max(1));
            }
            // Windows of hosts gone (and done): bounded by the hosts connected.
            gate.forget_idle_hosts(|c| connections.contains_key(&c));
            let mean_ms = gate.take_period_latency().take_mean_ms();
            gate.update_host_windows(now, mean_ms, &mut b.released);
            self.arm(gate);
        }
        self.perform(b);
    }

    /// Every host's window (empty when congestion control is off).
    pub fn host_windows(&self) -> Vec<HostWindowStats> {
        self.lock().gate.host_windows()
    }

    /// The device latencies this gateway saw since the last call, and its period
    /// for the other gateways' fair rates.
    pub fn take_gateway_period(&self) -> (DatastoreLatency, Option<GatewayShare>) {
        let mut g = self.lock();
        let now = self.now_ns();
        g.gate.take_gateway_period(now)
    }

    /// One gateway-window period: steps the window with `mean_ms` (skipped when
    /// `None`: nothing completed anywhere) and the fair rate against `others`,
    /// then performs what the new cap admits.
    pub fn step_gateway_window(self: &Arc<Self>, mean_ms: Option<f64>, others: &[GatewayShare]) {
        let mut b = P::buffers().take();
        {
            let mut g = self.lock();
            let now = self.now_ns();
            g.gate
                .update_gateway_window(now, mean_ms, others, &mut b.released);
            self.arm(&g.gate);
        }
        self.perform(b);
    }

    /// The gateway window (`None` when `gateway_congestion` is off).
    pub fn gateway_window(&self) -> Option<GatewayWindowStats> {
        self.lock().gate.gateway_window()
    }

    /// Runs [`QosPool::update_windows`] and the gateway window, each every its own
    /// period, until aborted (returns at once when both are off). With the pool's
    /// `gateway_stats_volume` the gateway window steps with the datastore-wide mean
    /// shared through that volume; without, with this gateway's own.
    pub async fn run_congestion_control(self: Arc<Self>) {
        let mut stats = self
            .gateway_stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let mut hosts = match self.congestion_period {
            Some(p) => Some(Self::ticker(p).await),
            None => None,
        };
        let mut gateway = match self.gateway_period {
            Some(p) => Some(Self::ticker(p).await),
            None => None,
        };
        if hosts.is_none() && gateway.is_none() {
            return;
        }
        let mut warn = crate::connections::RateLimited::new(crate::connections::WARN_EVERY);
        loop {
            tokio::select! {
                _ = Self::tick(&mut hosts) => self.update_windows(),
                _ = Self::tick(&mut gateway) => {
                    let (mean_ms, others) = self.gateway_period_mean(&mut stats, &mut warn).await;
                    self.step_gateway_window(mean_ms, &others);
                }
            }
        }
    }

    /// The mean latency the gateway window steps with this period — the
    /// datastore-wide one from the stats volume, or this gateway's own (no stats
    /// volume, or the exchange failed: a rate-limited warning says so) — and the
    /// other gateways' periods for the fair rate (none without the stats volume).
    async fn gateway_period_mean(
        &self,
        stats: &mut Option<SharedStats>,
        warn: &mut crate::connections::RateLimited,
    ) -> (Option<f64>, Vec<GatewayShare>) {
        let (mut own, share) = self.take_gateway_period();
        let Some((mut merge, backend)) = stats.take() else {
            return (own.take_mean_ms(), Vec::new());
        };
        let period_us = self.gateway_period.map_or(0, |p| p.as_micros()) as u32;
        let share = share.map(|s| ShareRecord::from_share(&s, period_us));
        let period = own.clone();
        let (merge, backend, result) = tokio::task::spawn_blocking(move || {
            let r = merge.exchange(&*backend, &period, share);
            (merge, backend, r)
        })
        .await
        .expect("the stats exchange does not panic");
        *stats = Some((merge, backend));
        match result {
            Ok(mut all) => (all.latency.take_mean_ms(), all.others),
            Err(e) => {
                if let Some(n) = warn.allow(Instant::now()) {
                    tracing::warn!(
                        pool = %self.name,
                        "gateway stats volume: {e}; the gateway window steps with this \
                         gateway's own latency meanwhile{}",
                        crate::connections::suppressed_note(n)
                    );
                }
                (own.take_mean_ms(), Vec::new())
            }
        }
    }

    /// The next tick of an optional interval (never, without one).
    async fn tick(t: &mut Option<tokio::time::Interval>) {
        match t {
            Some(t) => {
                t.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    async fn ticker(period: Duration) -> tokio::time::Interval {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        tick
    }

    /// Shutdown: takes every request not fully released (queued in the gate or
    /// behind a host window) so the caller can run or fail it; volumes stay, so
    /// requests arriving afterwards still run.
    pub fn take_queued(&self) -> Vec<P::Payload> {
        let mut g = self.lock();
        let now = self.now_ns();
        g.gate.take_queued(now)
    }

    /// Requests queued in the gate (not fully released).
    pub fn queued(&self) -> usize {
        self.lock().gate.queued()
    }

    /// Pieces at the backend now.
    pub fn in_flight(&self) -> u32 {
        self.lock().gate.in_flight()
    }

    /// The current device in-flight limit (the adaptive depth, at most `max_in_flight`).
    pub fn depth_limit(&self) -> u32 {
        self.lock().gate.limit()
    }

    /// The pool's `max_in_flight` (the depth limit's ceiling).
    pub fn max_in_flight(&self) -> u32 {
        self.lock().gate.depth().max()
    }

    /// `(in flight, depth limit, max_in_flight, queued)` under one lock.
    pub fn gauges(&self) -> PoolGauges {
        let g = self.lock();
        let gateway = g.gate.gateway_window();
        PoolGauges {
            in_flight: g.gate.in_flight(),
            depth_limit: g.gate.limit(),
            max_in_flight: g.gate.depth().max(),
            queued: g.gate.queued(),
            gateway_window: gateway.as_ref().map(|w| w.window),
            gateway_shares: gateway.as_ref().map(|w| w.shares),
            gateway_rate: gateway.and_then(|w| w.rate_units_per_s),
        }
    }

    /// The policy the scheduler enforces for `volume` now.
    pub fn policy(&self, volume: VolumeId) -> Option<weir_qos::Policy> {
        self.lock().gate.policy(volume).cloned()
    }

    pub fn volume_stats(&self, volume: VolumeId) -> Option<weir_qos::VolumeStats> {
        self.lock().gate.volume_stats(volume)
    }
}

#[derive(Default)]
struct TimerState {
    /// An earlier wake-up appeared (or the gate changed): re-read it.
    kicked: bool,
    stop: bool,
}

/// The running dispatcher of a pool (see [`QosPool::start_dispatcher`]); dropping
/// it stops the thread and waits for it.
pub struct Dispatcher<P: Perform> {
    pool: Arc<QosPool<P>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<P: Perform> Drop for Dispatcher<P> {
    fn drop(&mut self) {
        self.pool.timer().stop = true;
        self.pool.timer_cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A pool's gate at one moment.
#[derive(Copy, Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolGauges {
    /// Pieces at the backend now (0 on a `qos = false` pool: its requests bypass
    /// the gate).
    pub in_flight: u32,
    /// The device in-flight limit now (adaptive depth; `max_in_flight` when fixed).
    pub depth_limit: u32,
    pub max_in_flight: u32,
    /// Requests queued in the gate (not fully released).
    pub queued: usize,
    /// The gateway window on the shared datastore (`gateway_congestion` on only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_window: Option<u32>,
    /// The shares it steps with: its volumes active in the last period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_shares: Option<u64>,
    /// The fair rate the gateway paces to, cost units per second
    /// (`gateway_congestion.fair_rate`, while paced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_rate: Option<f64>,
}
