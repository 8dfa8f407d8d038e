//! Exchange, LoadGen-like: mailboxes whose users act on a schedule; each action is an
//! RPC to the server that needs a few database page reads (one after another) and
//! leaves database and log writes behind (issued without waiting).
//! RPC latency = `rpc_cpu_ms` + the time of the action's reads. LoadGen passes while
//! the average RPC latency stays below 50 ms (000, note 2).
//!
//! Calibration: 000 ran 400 mailboxes in 4 databases (100 each), Outlook_200 action
//! profile, 100 MB mailboxes. The I/O per mailbox is not in the seeds; Weir uses
//! Microsoft's Exchange 2010 sizing figure for a 200-messages/day profile, ≈ 0.20
//! database IOPS per mailbox, split 60:40 reads:writes with 32 KB pages (Exchange
//! 2010's page size): one action per mailbox every 30 s (`actions_per_hour = 120`)
//! with 3.6 reads and 2.4 writes per action on average (one of the writes is a 4 KB
//! sequential log write).

use crate::model::{GIB, MIB, ModelMetric, PerSecond, check_range, exp_gap_ns, window_s};
use crate::{Direction, IoGenerator, IoRequest, Issue, Nanos, WorkloadError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeSpec {
    pub name: String,
    /// Mailboxes in this database (000: 100 per database, 4 databases).
    #[serde(default = "d_mailboxes")]
    pub mailboxes: u32,
    /// Mailbox size, MB (000: 100 MB).
    #[serde(default = "d_mailbox_mb")]
    pub mailbox_mb: f64,
    #[serde(default = "d_actions")]
    pub actions_per_hour: f64,
    /// Mean database reads per action (fraction: a further read with that chance).
    #[serde(default = "d_reads")]
    pub reads_per_action: f64,
    /// Mean writes per action, the log write included.
    #[serde(default = "d_writes")]
    pub writes_per_action: f64,
    #[serde(default = "d_page")]
    pub page_bytes: u32,
    #[serde(default = "d_cpu")]
    pub rpc_cpu_ms: f64,
}

fn d_mailboxes() -> u32 {
    100
}
fn d_mailbox_mb() -> f64 {
    100.0
}
fn d_actions() -> f64 {
    120.0
}
fn d_reads() -> f64 {
    3.6
}
fn d_writes() -> f64 {
    2.4
}
fn d_page() -> u32 {
    32768
}
fn d_cpu() -> f64 {
    2.0
}

const LOG_BYTES: u64 = GIB;
const LOG_WRITE: u32 = 4096;

impl ExchangeSpec {
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.mailboxes == 0 || self.mailboxes > 100_000 {
            return Err(WorkloadError::invalid("mailboxes", "must be 1-100000"));
        }
        check_range("mailbox_mb", self.mailbox_mb, 1.0, 1e6)?;
        check_range("actions_per_hour", self.actions_per_hour, 0.0, 36_000.0)?;
        check_range("reads_per_action", self.reads_per_action, 0.0, 1000.0)?;
        check_range("writes_per_action", self.writes_per_action, 1.0, 1000.0)?;
        check_range("rpc_cpu_ms", self.rpc_cpu_ms, 0.0, 1e4)?;
        if self.page_bytes == 0 || !self.page_bytes.is_multiple_of(512) || self.page_bytes > 1 << 20
        {
            return Err(WorkloadError::invalid(
                "page_bytes",
                "must be a multiple of 512 up to 1 MiB",
            ));
        }
        Ok(())
    }

    pub(crate) fn db_bytes(&self) -> u64 {
        // Database file ≈ 1.2 × the mailbox data (white space, indexes).
        ((self.mailboxes as f64 * self.mailbox_mb * 1.2 * MIB as f64) as u64 / 65536 * 65536)
            .max(self.page_bytes as u64 * 16)
    }

    pub fn min_volume_bytes(&self) -> u64 {
        self.db_bytes() + LOG_BYTES
    }
}

#[derive(Clone, Debug)]
struct Mailbox {
    next_action: Nanos,
    reads_left: u32,
    read_in_flight: bool,
    writes_left: u32,
    started: Option<Nanos>,
}

pub(crate) struct ExchangeModel {
    spec: ExchangeSpec,
    db_bytes: u64,
    log_cursor: u64,
    boxes: Vec<Mailbox>,
    rng: ChaCha8Rng,
    rpcs: PerSecond,
    /// RPCs whose read failed (not in `rpcs`).
    failed_rpcs: PerSecond,
    /// Database and log writes that failed.
    failed_writes: PerSecond,
}

fn draw_count(rng: &mut ChaCha8Rng, mean: f64) -> u32 {
    let whole = mean.floor();
    whole as u32 + u32::from(rng.random::<f64>() < mean - whole)
}

impl ExchangeModel {
    pub(crate) fn new(spec: &ExchangeSpec, _volume_bytes: u64, seed: u64) -> ExchangeModel {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let rate = spec.actions_per_hour / 3600.0;
        let boxes = (0..spec.mailboxes)
            .map(|_| Mailbox {
                next_action: exp_gap_ns(&mut rng, rate),
                reads_left: 0,
                read_in_flight: false,
                writes_left: 0,
                started: None,
            })
            .collect();
        ExchangeModel {
            spec: spec.clone(),
            db_bytes: spec.db_bytes(),
            log_cursor: 0,
            boxes,
            rng,
            rpcs: PerSecond::default(),
            failed_rpcs: PerSecond::default(),
            failed_writes: PerSecond::default(),
        }
    }

    fn page_offset(&mut self) -> u64 {
        let page = self.spec.page_bytes as u64;
        self.rng.random_range(0..self.db_bytes / page) * page
    }
}

impl IoGenerator for ExchangeModel {
    fn workers(&self) -> u32 {
        self.spec.mailboxes
    }

    fn poll(&mut self, now_ns: Nanos, worker: u32, _outstanding: u32) -> Issue {
        let w = worker as usize;
        if w >= self.boxes.len() {
            return Issue::Blocked;
        }
        // Leftover writes of the last action go out first, without waiting.
        if self.boxes[w].writes_left > 0 {
            self.boxes[w].writes_left -= 1;
            let (offset, size) = if self.boxes[w].writes_left == 0 {
                if self.log_cursor + LOG_WRITE as u64 > LOG_BYTES {
                    self.log_cursor = 0;
                }
                let o = self.db_bytes + self.log_cursor;
                self.log_cursor += LOG_WRITE as u64;
                (o, LOG_WRITE)
            } else {
                (self.page_offset(), self.spec.page_bytes)
            };
            return Issue::Io(IoRequest {
                offset_bytes: offset,
                size_bytes: size,
                dir: Direction::Write,
            });
        }
        let b = &self.boxes[w];
        if b.read_in_flight {
            return Issue::Blocked;
        }
        if b.started.is_none() {
            if now_ns < b.next_action {
                return Issue::At(b.next_action);
            }
            let reads = draw_count(&mut self.rng, self.spec.reads_per_action);
            let b = &mut self.boxes[w];
            b.started = Some(now_ns);
            b.reads_left = reads;
        }
        if self.boxes[w].reads_left > 0 {
            let offset = self.page_offset();
            let b = &mut self.boxes[w];
            b.reads_left -= 1;
            b.read_in_flight = true;
            return Issue::Io(IoRequest {
                offset_bytes: offset,
                size_bytes: self.spec.page_bytes,
                dir: Direction::Read,
            });
        }
        // The action's reads are done: the RPC returns after its CPU time.
        let started = self.boxes[w].started.take().unwrap_or(now_ns);
        let latency_ms = (now_ns - started) as f64 / 1e6 + self.spec.rpc_cpu_ms;
        self.rpcs.record(now_ns, latency_ms);
        let writes = draw_count(&mut self.rng, self.spec.writes_per_action).max(1);
        let gap = exp_gap_ns(&mut self.rng, self.spec.actions_per_hour / 3600.0);
        let b = &mut self.boxes[w];
        b.writes_left = writes;
        b.next_action = now_ns.saturating_add(gap);
        self.poll(now_ns, worker, _outstanding)
    }

    fn on_complete(&mut self, _now: Nanos, worker: u32, request: &IoRequest, _lat: Nanos) {
        if request.dir == Direction::Read
            && let Some(b) = self.boxes.get_mut(worker as usize)
        {
            b.read_in_flight = false;
        }
    }

    /// A failed read fails its RPC: counted in `failed_rpcs` (not in the RPC
    /// latency), the action's other reads and its writes dropped, the next action
    /// drawn as after a success. A failed write is counted in `failed_writes`.
    fn on_failure(&mut self, now_ns: Nanos, worker: u32, request: &IoRequest) {
        if request.dir == Direction::Write {
            self.failed_writes.record(now_ns, 1.0);
            return;
        }
        let Some(b) = self.boxes.get_mut(worker as usize) else {
            return;
        };
        let started = b.started.take().unwrap_or(now_ns);
        b.read_in_flight = false;
        b.reads_left = 0;
        self.failed_rpcs
            .record(now_ns, (now_ns - started) as f64 / 1e6);
        let gap = exp_gap_ns(&mut self.rng, self.spec.actions_per_hour / 3600.0);
        self.boxes[worker as usize].next_action = now_ns.saturating_add(gap);
    }

    fn metrics(&self, from_ns: Nanos, to_ns: Nanos) -> Vec<ModelMetric> {
        let (n, sum, max) = self.rpcs.window(from_ns, to_ns);
        let failed = self.failed_rpcs.window(from_ns, to_ns).0;
        let s = window_s(from_ns, to_ns);
        vec![
            ModelMetric::mean(
                "rpc_latency_mean_ms",
                if n > 0 { sum / n as f64 } else { f64::NAN },
                "ms",
                n as f64,
            ),
            ModelMetric::mean("rpc_latency_max_ms", max, "ms", 1.0),
            ModelMetric::sum(
                "rpcs_per_s",
                if s > 0.0 { n as f64 / s } else { 0.0 },
                "RPC/s",
            ),
            ModelMetric::sum("failed_rpcs", failed as f64, "RPCs"),
            ModelMetric::sum(
                "failed_writes",
                self.failed_writes.window(from_ns, to_ns).0 as f64,
                "writes",
            ),
            ModelMetric::mean(
                "rpc_pass",
                if n > 0 && failed == 0 && sum / (n as f64) < 50.0 {
                    1.0
                } else {
                    0.0
                },
                "1 = pass (< 50 ms, none failed)",
                1.0,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelSpec, run_fixed_latency};

    fn metric(g: &dyn IoGenerator, name: &str, to: Nanos) -> f64 {
        g.metrics(0, to)
            .into_iter()
            .find(|m| m.name == name)
            .unwrap()
            .value
    }

    #[test]
    fn rpc_latency_tracks_read_latency_and_io_rate_matches_sizing() {
        let spec: ExchangeSpec = toml::from_str("name = \"exch\"").unwrap();
        let end = 600_000_000_000;
        let mut fast = ModelSpec::Exchange(spec.clone())
            .build(20 << 30, 1, 0, 1)
            .unwrap();
        let ios = run_fixed_latency(fast.as_mut(), 2_000_000, end);
        let mut slow = ModelSpec::Exchange(spec).build(20 << 30, 1, 0, 1).unwrap();
        run_fixed_latency(slow.as_mut(), 20_000_000, end);
        let (f, s) = (
            metric(fast.as_ref(), "rpc_latency_mean_ms", end),
            metric(slow.as_ref(), "rpc_latency_mean_ms", end),
        );
        // 2 ms CPU + 3.6 reads × latency.
        assert!((f - (2.0 + 3.6 * 2.0)).abs() < 1.5, "{f}");
        assert!((s - (2.0 + 3.6 * 20.0)).abs() < 10.0, "{s}");
        assert_eq!(metric(fast.as_ref(), "rpc_pass", end), 1.0);
        assert_eq!(metric(slow.as_ref(), "rpc_pass", end), 0.0);
        // ≈ 0.2 IOPS per mailbox, 60 % reads.
        let iops_per_box = ios.len() as f64 / 600.0 / 100.0;
        assert!((iops_per_box - 0.2).abs() < 0.03, "{iops_per_box}");
        let reads = ios.iter().filter(|r| r.1.dir == Direction::Read).count() as f64;
        assert!((reads / ios.len() as f64 - 0.6).abs() < 0.05);
    }
}
