//! QoS in the I/O path: one `weir_qos::Scheduler` per pool. Sessions submit
//! validated requests ([`QosPool::submit`], the one place QoS plugs in); a
//! dispatcher task per pool releases them to the backend while keeping at most
//! `max_in_flight` outstanding, sleeping until `WaitUntil` when every queued
//! request is held back by a limit, and reports completions back to the
//! scheduler (latency as the client saw it, queueing included).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use weir_model::IoDir;
use weir_nbd::Command;
use weir_qos::{
    ClientId, Dispatch, Dispatched, IoCost, Nanos, Policy, Scheduler, SchedulerConfig, VolumeId,
};

use crate::device::EmulatedDevice;
use crate::session::Job;

pub struct QosPool {
    pub name: String,
    scheduler: Mutex<Scheduler<Job>>,
    wake: Notify,
    in_flight: AtomicUsize,
    max_in_flight: usize,
    epoch: Instant,
    device: Option<Arc<EmulatedDevice>>,
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
            epoch,
            device,
        }
    }

    pub fn device(&self) -> Option<&Arc<EmulatedDevice>> {
        self.device.as_ref()
    }

    /// Nanoseconds since the server's epoch (the scheduler's clock).
    pub fn now_ns(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
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

    /// Removes a volume; returns its queued requests (the caller fails them).
    pub fn remove_volume(&self, volume: VolumeId) -> Vec<Job> {
        self.lock().remove_volume(volume)
    }

    /// Queues a validated request; `Err` gives the job back (unknown volume).
    pub fn submit(
        &self,
        volume: VolumeId,
        client: ClientId,
        cost: IoCost,
        job: Job,
    ) -> Result<(), String> {
        let now = self.now_ns();
        self.lock()
            .enqueue(now, volume, client, cost, job)
            .map_err(|e| e.to_string())?;
        self.wake.notify_one();
        Ok(())
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

    /// The dispatcher loop (runs until the task is aborted).
    pub async fn run(self: Arc<Self>) {
        loop {
            let mut wake_at: Option<Nanos> = None;
            let mut released: Vec<Dispatched<Job>> = Vec::new();
            {
                let mut s = self.lock();
                while self.in_flight.load(Ordering::Acquire) + released.len() < self.max_in_flight {
                    match s.dispatch(self.now_ns()) {
                        Dispatch::Io(d) => released.push(d),
                        Dispatch::WaitUntil(t) => {
                            wake_at = Some(t);
                            break;
                        }
                        Dispatch::Idle => break,
                    }
                }
            }
            self.in_flight.fetch_add(released.len(), Ordering::AcqRel);
            for d in released {
                let pool = self.clone();
                tokio::spawn(async move { pool.execute(d).await });
            }
            match wake_at {
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

    async fn execute(self: Arc<Self>, d: Dispatched<Job>) {
        let Dispatched {
            volume,
            client,
            cost,
            enqueued_at,
            payload: job,
            ..
        } = d;
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
        let now = self.now_ns();
        self.lock()
            .complete(now, volume, client, cost, now.saturating_sub(enqueued_at));
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.wake.notify_one();
        if let Ok(done) = completed {
            done.deliver();
        }
    }
}
