//! Emulated-device mode: a pool whose configuration names a device model
//! (`device = "15k-sas-raid5x24"`, any of `weir_model::ARRAY_PRESETS`) completes
//! each READ and WRITE no earlier than that model says, driven by real time.
//! The data still lives in the pool's files; the model only decides *when* the
//! reply may go out, so a laptop serves with the latency and throughput curve
//! of a 24-drive array (queueing, RAID write penalty, controller cache).
//!
//! Every volume of the pool shares one model instance (one array), each at its
//! own base offset, so volumes compete for the same drives as they would.
//!
//! What reaches the model is what the QoS gate releases: each piece of a request
//! paced under a limit is submitted separately (so the array sees paced traffic).
//! READ and CACHE pieces are served as reads, WRITE and WRITE_ZEROES as writes;
//! TRIM, FLUSH and BLOCK_STATUS cost the gate an operation but take no device time
//! (the `weir-model` arrays have no flush or discard cost).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};
use weir_model::{Array, Completion, Component, DeviceIo, IoDir, Nanos};

pub struct EmulatedDevice {
    pub preset: String,
    state: Mutex<State>,
    wake: Notify,
    epoch: Instant,
}

struct State {
    array: Array,
    waiters: HashMap<u64, oneshot::Sender<()>>,
    next_token: u64,
    done: Vec<Completion>,
}

impl State {
    /// Advances the model to `now` through every event on the way (the model's
    /// contract: never step past its next event), waking finished requests.
    fn catch_up(&mut self, now: Nanos) {
        while let Some(t) = self.array.next_event_ns() {
            if t > now {
                break;
            }
            self.array.advance(t, &mut self.done);
        }
        self.array.advance(now, &mut self.done);
        for c in self.done.drain(..) {
            if let Some(w) = self.waiters.remove(&c.token) {
                let _ = w.send(());
            }
        }
    }
}

impl EmulatedDevice {
    /// `preset`: a name from `weir_model::ARRAY_PRESETS`.
    pub fn new(preset: &str, epoch: Instant) -> Result<EmulatedDevice, String> {
        let array = Array::from_preset(preset, 1).map_err(|e| e.to_string())?;
        Ok(EmulatedDevice {
            preset: preset.to_string(),
            state: Mutex::new(State {
                array,
                waiters: HashMap::new(),
                next_token: 1,
                done: Vec::new(),
            }),
            wake: Notify::new(),
            epoch,
        })
    }

    fn now_ns(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.lock().array.capacity_bytes()
    }

    /// Where a volume starts on the emulated array (spread by volume id, 1 MiB aligned).
    pub fn volume_base(&self, volume_id: u32) -> u64 {
        let capacity = self.capacity_bytes().max(1);
        ((volume_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) % capacity) & !((1 << 20) - 1)
    }

    /// Submits one I/O to the model now and resolves when the model completes it.
    /// `urgent`: the model's drives serve it ahead of ordinary commands (NCQ
    /// priority; the gate marks the pieces of protected volumes so).
    pub fn submit(
        &self,
        offset_bytes: u64,
        size_bytes: u32,
        dir: IoDir,
        urgent: bool,
    ) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.lock();
            let now = self.now_ns();
            st.catch_up(now);
            let token = st.next_token;
            st.next_token += 1;
            st.waiters.insert(token, tx);
            let io = DeviceIo {
                offset_bytes,
                size_bytes: size_bytes.max(1),
                dir,
            };
            if urgent {
                st.array.submit_urgent(now, io, token);
            } else {
                st.array.submit(now, io, token);
            }
        }
        self.wake.notify_one();
        rx
    }

    /// Requests submitted and not completed yet.
    pub fn in_flight(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Drives the model with real time (runs until the task is aborted).
    pub async fn run(self: Arc<Self>) {
        loop {
            let next = self.lock().array.next_event_ns();
            match next {
                None => self.wake.notified().await,
                Some(t) => {
                    let delay = Duration::from_nanos(t.saturating_sub(self.now_ns()));
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
            let now = self.now_ns();
            self.lock().catch_up(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_complete_when_the_model_says() {
        let dev = Arc::new(EmulatedDevice::new("15k-sas-raid5x24", Instant::now()).unwrap());
        let driver = tokio::spawn(dev.clone().run());
        let start = Instant::now();
        // Random 8 KiB reads far apart: each is a seek plus rotation on a 15K drive.
        for i in 0..5u64 {
            dev.submit(
                i * 7_777_777_777 % dev.capacity_bytes(),
                8192,
                IoDir::Read,
                false,
            )
            .await
            .unwrap();
        }
        let per_io = start.elapsed() / 5;
        assert!(
            per_io >= Duration::from_micros(500),
            "a disk read took only {per_io:?}"
        );
        assert_eq!(dev.in_flight(), 0);
        driver.abort();
        assert!(EmulatedDevice::new("no-such-array", Instant::now()).is_err());
    }
}
