//! QoS in the I/O path: one `weir_qos::Scheduler` per pool. Sessions submit
//! validated requests ([`QosPool::submit`], the one place QoS plugs in); a
//! dispatcher task per pool releases them to the backend while keeping at most
//! `max_in_flight` outstanding, sleeping until `WaitUntil` when every queued
//! request is held back by a limit, and reports completions back to the
//! scheduler (latency as the client saw it, queueing included).
//!
//! Datastore-wide congestion control (a pool with `congestion = { enabled = true,
//! threshold_ms = 30 }`), as in the simulator: each client host has a
//! `weir_qos::HostWindow` bounding the requests it may have in the pool (queued
//! in the scheduler or executing). Requests beyond the window wait in the host's
//! own FIFO before they reach the scheduler, as they would in a hypervisor's
//! device queue. Once per period every window is recomputed from the pool's mean
//! latency (`DatastoreLatency`, from admission to completion) against the
//! threshold, with `β` in proportion to the shares of the volumes the host has
//! open, so shares hold across hosts and the pool's latency settles near the
//! threshold.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use weir_model::IoDir;
use weir_nbd::Command;
use weir_nbd::{ErrorCode, NbdError};
use weir_qos::{
    ClientId, CongestionConfig, DatastoreLatency, Dispatch, Dispatched, HostWindow, IoCost, Nanos,
    Policy, Scheduler, SchedulerConfig, VolumeId,
};

use crate::device::EmulatedDevice;
use crate::session::Job;

/// CLOCK_MONOTONIC (the clock `Instant` reads on Linux) in nanoseconds, without
/// `Instant`'s `Duration` arithmetic: the pool reads it several times per I/O
/// (that arithmetic was a quarter of the QoS path's instructions).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

thread_local! {
    /// The requests a pump releases, collected under the scheduler lock and started
    /// after it: one buffer per thread, reused (a nested pump finds it empty and
    /// uses a fresh one).
    static RELEASED: std::cell::Cell<Vec<Dispatched<Job>>> = const { std::cell::Cell::new(Vec::new()) };
}

pub struct QosPool {
    pub name: String,
    scheduler: Mutex<Scheduler<Job>>,
    wake: Notify,
    in_flight: AtomicUsize,
    max_in_flight: usize,
    /// CLOCK_MONOTONIC at the server's epoch, ns (the scheduler's time zero).
    epoch_ns: u64,
    device: Option<Arc<EmulatedDevice>>,
    congestion: Option<Mutex<Congestion>>,
    /// `false`: requests bypass the scheduler (pool option `qos = false`).
    qos: bool,
}

/// Per-host windows of one pool (datastore-wide congestion control).
struct Congestion {
    config: CongestionConfig,
    initial_window: u32,
    latency: DatastoreLatency,
    hosts: HashMap<ClientId, HostGate>,
}

struct HostGate {
    window: HostWindow,
    /// Requests of this host in the pool (queued in the scheduler or executing).
    in_pool: usize,
    /// Requests waiting for room in the window, oldest first.
    waiting: VecDeque<(VolumeId, IoCost, Job)>,
    /// Open connections per volume (the host's shares are their policies' shares).
    connections: HashMap<VolumeId, usize>,
}

/// A snapshot of one host's window on a pool.
#[derive(Clone, Debug, PartialEq)]
pub struct HostWindowStats {
    pub client: ClientId,
    pub window: u32,
    pub host_shares: u64,
    pub in_pool: usize,
    pub waiting: usize,
}

impl QosPool {
    /// `device`: emulated-device mode (READ/WRITE complete no earlier than the model says).
    pub fn new(
        name: &str,
        max_in_flight: u32,
        config: SchedulerConfig,
        epoch: Instant,
        device: Option<Arc<EmulatedDevice>>,
    ) -> QosPool {
        QosPool {
            name: name.to_string(),
            scheduler: Mutex::new(Scheduler::new(config)),
            wake: Notify::new(),
            in_flight: AtomicUsize::new(0),
            max_in_flight: max_in_flight.max(1) as usize,
            epoch_ns: monotonic_ns().saturating_sub(epoch.elapsed().as_nanos() as u64),
            device,
            congestion: None,
            qos: true,
        }
    }

    /// `false` bypasses the scheduler: requests go straight to the backend
    /// (no shares, limits, reservations or congestion control on this pool).
    pub fn with_qos(mut self, enabled: bool) -> QosPool {
        self.qos = enabled;
        self
    }

    /// Turns on datastore-wide congestion control (when `config.enabled`): hosts
    /// start with a window of `max_in_flight` (the device queue depth).
    pub fn with_congestion(mut self, config: CongestionConfig) -> QosPool {
        if config.enabled {
            self.congestion = Some(Mutex::new(Congestion {
                config: config.sanitized(),
                initial_window: self.max_in_flight as u32,
                latency: DatastoreLatency::new(),
                hosts: HashMap::new(),
            }));
        }
        self
    }

    fn congestion(&self) -> Option<MutexGuard<'_, Congestion>> {
        self.congestion
            .as_ref()
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The recomputation period of the host windows (`None`: control is off).
    pub fn congestion_period(&self) -> Option<Duration> {
        self.congestion()
            .map(|c| Duration::from_nanos(c.config.period_ns()))
    }

    pub fn device(&self) -> Option<&Arc<EmulatedDevice>> {
        self.device.as_ref()
    }

    /// Nanoseconds since the server's epoch (the scheduler's clock).
    pub fn now_ns(&self) -> Nanos {
        monotonic_ns().saturating_sub(self.epoch_ns)
    }

    fn lock(&self) -> MutexGuard<'_, Scheduler<Job>> {
        self.scheduler.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn add_volume(&self, volume: VolumeId, policy: Policy) {
        let now = self.now_ns();
        self.lock().add_volume(now, volume, policy);
        self.wake.notify_one();
    }

    /// Changes a volume's policy; applies to requests already queued.
    pub fn set_policy(&self, volume: VolumeId, policy: Policy) {
        let now = self.now_ns();
        self.lock().set_policy(now, volume, policy);
        self.wake.notify_one();
    }

    /// Removes a volume; returns its queued requests, including those waiting
    /// behind a host window (the caller fails them).
    pub fn remove_volume(&self, volume: VolumeId) -> Vec<Job> {
        let queued = self.lock().remove_volume(volume);
        let mut jobs = Vec::new();
        let mut by_client: HashMap<ClientId, usize> = HashMap::new();
        for job in queued {
            *by_client.entry(job.client).or_insert(0) += 1;
            jobs.push(job);
        }
        if let Some(mut c) = self.congestion() {
            for gate in c.hosts.values_mut() {
                let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                    gate.waiting.drain(..).partition(|(v, _, _)| *v == volume);
                gate.waiting = kept;
                jobs.extend(gone.into_iter().map(|(_, _, j)| j));
            }
        }
        for (client, n) in by_client {
            self.left_pool(client, n);
        }
        jobs
    }

    /// Queues a validated request (behind its host's window when congestion
    /// control is on); `Err`: the volume is unknown to the pool.
    pub fn submit(
        self: &Arc<Self>,
        volume: VolumeId,
        client: ClientId,
        cost: IoCost,
        job: Job,
    ) -> Result<(), String> {
        if !self.qos {
            // QoS disabled on this pool: straight to the backend.
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            let _ = self.clone().start(None, job);
            return Ok(());
        }
        if let Some(mut c) = self.congestion() {
            let initial = c.initial_window;
            let config = c.config.clone();
            let gate = c
                .hosts
                .entry(client)
                .or_insert_with(|| HostGate::new(config, initial));
            if gate.in_pool >= gate.window.window() as usize || !gate.waiting.is_empty() {
                gate.waiting.push_back((volume, cost, job));
                return Ok(());
            }
            gate.in_pool += 1;
        }
        let now = self.now_ns();
        let queued = self.lock().enqueue(now, volume, client, cost, job);
        if let Err(e) = queued {
            self.left_pool(client, 1);
            return Err(e.to_string());
        }
        self.pump_inline();
        Ok(())
    }

    /// `count` requests of `client` left the pool: admit waiting ones into the room.
    fn left_pool(&self, client: ClientId, count: usize) {
        let admitted: Vec<(VolumeId, IoCost, Job)> = {
            let Some(mut c) = self.congestion() else {
                return;
            };
            let Some(gate) = c.hosts.get_mut(&client) else {
                return;
            };
            gate.in_pool = gate.in_pool.saturating_sub(count);
            gate.admit()
        };
        self.enqueue_admitted(client, admitted);
    }

    fn enqueue_admitted(&self, client: ClientId, admitted: Vec<(VolumeId, IoCost, Job)>) {
        if admitted.is_empty() {
            return;
        }
        let now = self.now_ns();
        let mut refused = Vec::new();
        {
            let mut s = self.lock();
            for (volume, cost, job) in admitted {
                if s.policy(volume).is_none() {
                    refused.push(job);
                } else {
                    let _ = s.enqueue(now, volume, client, cost, job);
                }
            }
        }
        self.wake.notify_one();
        // A volume removed between admission and enqueue: fail its requests.
        let n = refused.len();
        for job in refused {
            crate::session::fail(job, volume_gone()).deliver();
        }
        if n > 0 {
            self.left_pool(client, n);
        }
    }

    /// A connection of `client` to `volume` opened (`+1`) or closed (`-1`): the
    /// host's shares for its window follow the volumes it has open.
    pub fn host_connection(&self, client: ClientId, volume: VolumeId, opened: bool) {
        let Some(mut c) = self.congestion() else {
            return;
        };
        let initial = c.initial_window;
        let config = c.config.clone();
        let gate = c
            .hosts
            .entry(client)
            .or_insert_with(|| HostGate::new(config, initial));
        let n = gate.connections.entry(volume).or_insert(0);
        if opened {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        if *n == 0 {
            gate.connections.remove(&volume);
        }
    }

    /// Recomputes every host window from the pool's mean latency of the period
    /// (skipped when nothing completed), then admits what now fits.
    pub fn update_windows(&self) {
        let now = self.now_ns();
        // Shares of each host's open volumes, read before taking the congestion lock.
        let volumes: Vec<(ClientId, Vec<VolumeId>)> = match self.congestion() {
            None => return,
            Some(c) => c
                .hosts
                .iter()
                .map(|(k, g)| (*k, g.connections.keys().copied().collect()))
                .collect(),
        };
        let shares: HashMap<ClientId, u64> = {
            let s = self.lock();
            volumes
                .into_iter()
                .map(|(client, vs)| {
                    let total: u64 = vs
                        .iter()
                        .map(|v| s.policy(*v).map_or(1000, |p| p.shares.get() as u64))
                        .sum();
                    (client, total.max(1))
                })
                .collect()
        };
        let mut admitted = Vec::new();
        {
            let Some(mut c) = self.congestion() else {
                return;
            };
            let mean_ms = c.latency.take_mean_ms();
            for (client, gate) in c.hosts.iter_mut() {
                if let Some(&sh) = shares.get(client) {
                    gate.window.set_host_shares(sh);
                }
                if let Some(mean_ms) = mean_ms {
                    gate.window.update(now, mean_ms);
                }
                let a = gate.admit();
                if !a.is_empty() {
                    admitted.push((*client, a));
                }
            }
        }
        for (client, a) in admitted {
            self.enqueue_admitted(client, a);
        }
    }

    /// Every host's window (empty when congestion control is off).
    pub fn host_windows(&self) -> Vec<HostWindowStats> {
        let Some(c) = self.congestion() else {
            return Vec::new();
        };
        let mut v: Vec<_> = c
            .hosts
            .iter()
            .map(|(client, g)| HostWindowStats {
                client: *client,
                window: g.window.window(),
                host_shares: g.window.host_shares(),
                in_pool: g.in_pool,
                waiting: g.waiting.len(),
            })
            .collect();
        v.sort_by_key(|h| h.client.0);
        v
    }

    /// Runs [`QosPool::update_windows`] every period (until aborted; returns at
    /// once when congestion control is off).
    pub async fn run_congestion_control(self: Arc<Self>) {
        let Some(period) = self.congestion_period() else {
            return;
        };
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.update_windows();
        }
    }

    /// Shutdown: takes every request still queued (in the scheduler or behind a
    /// host window) so the caller can fail it; volumes stay registered, so
    /// requests arriving afterwards still run.
    pub fn take_queued(&self) -> Vec<Job> {
        let volumes: Vec<(VolumeId, Policy)> = {
            let s = self.lock();
            s.volumes()
                .filter_map(|v| s.policy(v).cloned().map(|p| (v, p)))
                .collect()
        };
        let mut jobs = Vec::new();
        for (volume, policy) in volumes {
            jobs.extend(self.remove_volume(volume));
            self.add_volume(volume, policy);
        }
        jobs
    }

    /// Runs a request at once, past the scheduler (shutdown).
    pub fn execute_now(self: &Arc<Self>, job: Job) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let _ = self.clone().start(None, job);
    }

    pub fn queued(&self) -> usize {
        self.lock().queued()
    }
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
    pub fn volume_stats(&self, volume: VolumeId) -> Option<weir_qos::VolumeStats> {
        self.lock().stats(volume)
    }

    /// Releases what the scheduler allows now (up to `max_in_flight` outstanding)
    /// and starts it; returns when to try again if requests are limit-held.
    /// Called inline from `submit` and from completions (no task hop on the
    /// request path), and by the dispatcher task for timed wake-ups.
    fn pump(self: &Arc<Self>) -> Option<Nanos> {
        loop {
            let mut wake_at: Option<Nanos> = None;
            // This thread's buffer (keeps its capacity: no allocation per I/O).
            let mut released = RELEASED.take();
            {
                let mut s = self.lock();
                // One clock reading per batch: its decisions are taken at one instant.
                let now = self.now_ns();
                // `in_flight` only grows under the scheduler lock: the bound is exact.
                while self.in_flight.load(Ordering::Acquire) < self.max_in_flight {
                    match s.dispatch(now) {
                        Dispatch::Io(d) => {
                            self.in_flight.fetch_add(1, Ordering::AcqRel);
                            released.push(d);
                        }
                        Dispatch::WaitUntil(t) => {
                            wake_at = Some(t);
                            break;
                        }
                        Dispatch::Idle => break,
                    }
                }
            }
            let mut finished_inline = false;
            for d in released.drain(..) {
                let Dispatched {
                    volume,
                    client,
                    cost,
                    enqueued_at,
                    payload: job,
                    ..
                } = d;
                finished_inline |= self
                    .clone()
                    .start(Some((volume, client, cost, enqueued_at)), job);
            }
            RELEASED.set(released);
            // Requests that completed inline made room: release more (a loop, not
            // recursion, so a deep queue cannot grow the stack).
            if !finished_inline {
                return wake_at;
            }
        }
    }

    /// Pumps, and hands a limit wake-up time to the dispatcher task.
    fn pump_inline(self: &Arc<Self>) {
        if self.pump().is_some() {
            self.wake.notify_one();
        }
    }

    /// The dispatcher loop for timed wake-ups (runs until the task is aborted).
    pub async fn run(self: Arc<Self>) {
        loop {
            match self.pump() {
                Some(t) => {
                    let delay = Duration::from_nanos(t.saturating_sub(self.now_ns()));
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// Runs a released request: inline when the backend can serve it without
    /// blocking (returns `true`: finished, without pumping), else on the blocking
    /// pool (one hand-off), or in a task that also waits for the emulated device.
    /// `scheduled`: what to report to the scheduler (`None` when QoS is bypassed).
    fn start(
        self: Arc<Self>,
        scheduled: Option<(VolumeId, ClientId, IoCost, Nanos)>,
        job: Job,
    ) -> bool {
        if self.device.is_none() {
            let job = match crate::session::try_perform_inline(job) {
                Ok(done) => {
                    self.finish(scheduled, false);
                    done.deliver();
                    return true;
                }
                Err(job) => job,
            };
            tokio::task::spawn_blocking(move || {
                let done = crate::session::perform(job);
                self.finish(scheduled, true);
                done.deliver();
            });
        } else {
            tokio::spawn(self.execute_on_device(scheduled, job));
        }
        false
    }

    async fn execute_on_device(
        self: Arc<Self>,
        scheduled: Option<(VolumeId, ClientId, IoCost, Nanos)>,
        job: Job,
    ) {
        // Emulated device: the model starts serving the request now, in parallel
        // with the real file I/O; the reply waits for both.
        let device_done = self.device.as_ref().and_then(|dev| {
            let (offset, length, dir) = match job.command {
                Command::Read { offset, length, .. } => (offset, length, IoDir::Read),
                Command::Write { offset, length, .. } => (offset, length, IoDir::Write),
                _ => return None,
            };
            Some(dev.submit(
                dev.volume_base(job.volume.id.0).wrapping_add(offset),
                length,
                dir,
            ))
        });
        let completed = tokio::task::spawn_blocking(move || crate::session::perform(job)).await;
        if let Some(done) = device_done {
            let _ = done.await;
        }
        self.finish(scheduled, true);
        if let Ok(done) = completed {
            done.deliver();
        }
    }

    /// A released request finished: tell the scheduler and the host window, and
    /// (`pump`) release what that made room for.
    fn finish(
        self: &Arc<Self>,
        scheduled: Option<(VolumeId, ClientId, IoCost, Nanos)>,
        pump: bool,
    ) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let Some((volume, client, cost, enqueued_at)) = scheduled else {
            return;
        };
        let now = self.now_ns();
        let latency_ns = now.saturating_sub(enqueued_at);
        self.lock().complete(now, volume, client, cost, latency_ns);
        if let Some(mut c) = self.congestion() {
            c.latency.record(latency_ns);
        }
        self.left_pool(client, 1);
        if pump {
            self.pump_inline();
        }
    }
}

impl HostGate {
    fn new(config: CongestionConfig, initial_window: u32) -> HostGate {
        HostGate {
            window: HostWindow::new(config, 1000, initial_window),
            in_pool: 0,
            waiting: VecDeque::new(),
            connections: HashMap::new(),
        }
    }

    /// Takes the waiting requests that fit in the window now.
    fn admit(&mut self) -> Vec<(VolumeId, IoCost, Job)> {
        let mut out = Vec::new();
        while self.in_pool < self.window.window() as usize {
            let Some(r) = self.waiting.pop_front() else {
                break;
            };
            self.in_pool += 1;
            out.push(r);
        }
        out
    }
}

/// The error a request gets when its volume disappears while it waits.
pub fn volume_gone() -> NbdError {
    NbdError::new(ErrorCode::Io, "volume was deleted")
}
