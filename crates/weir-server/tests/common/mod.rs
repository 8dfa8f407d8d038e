//! Shared helpers: servers on ephemeral loopback ports in a temporary data
//! directory, and the load the QoS tests drive through them.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use weir_nbd::{ClientConfig, ClientExport};
use weir_server::nbd_client::NbdClient;
use weir_server::{RunningServer, WeirConfig};

pub use weir_testkit::TempDir;

/// Volumes: `open` (16 MiB, any host), `ro` (1 MiB, read-only, loopback group),
/// `hidden` (1 MiB, only 10.0.0.0/8: never this test's host), `slow` (limited
/// to 100 IOPS by the `slow100` policy).
pub const TEST_CONFIG: &str = r#"
[[pools]]
name = "default"
max_in_flight = 16

[[policies]]
name = "slow100"
limit_iops = 100

[[access_groups]]
name = "loopback"
hosts = ["127.0.0.0/8", "::1"]

[[access_groups]]
name = "far"
hosts = ["10.0.0.0/8"]

[[volumes]]
name = "open"
size = "16MiB"
policy = "mission-critical"
description = "open to all hosts"

[[volumes]]
name = "ro"
size = "1MiB"
policy = "non-critical"
access_groups = ["loopback"]
read_only = true

[[volumes]]
name = "hidden"
size = "1MiB"
policy = "non-critical"
access_groups = ["far"]

[[volumes]]
name = "slow"
size = "1MiB"
policy = "slow100"
"#;

/// Serialises the tests of one binary that measure time (rates, latencies,
/// shares) or flood a server: libtest runs a binary's tests on as many threads
/// as there are CPUs, and on a 2-core machine a flood beside a timed test takes
/// the CPU its clients need (gate.rs's small reader fell from 490 to 375 IOPS
/// beside its sibling floods). Hold the guard for the whole test.
pub async fn timed_alone() -> tokio::sync::MutexGuard<'static, ()> {
    static TIMED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TIMED.lock().await
}

/// A probe of what else the machine did while a live timing test ran: the
/// share of all CPUs that other processes (and, in a VM, the hypervisor's steal)
/// took, from `/proc/stat` and `/proc/self/stat`, and a cyclictest-style
/// thread that sleeps 1 ms at a time and records how late it woke. A live
/// test compares with it to tell a disagreement of its own from a machine
/// whose CPUs were taken by something else (a neighbour on a shared CI host).
pub struct NoiseProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Duration>>,
    cpu_at_start: Option<CpuTicks>,
}

/// Clock ticks: the machine's busy and total, and this process's.
#[derive(Clone, Copy, Debug)]
struct CpuTicks {
    busy: u64,
    total: u64,
    ours: u64,
}

impl CpuTicks {
    fn now() -> Option<CpuTicks> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        // cpu user nice system idle iowait irq softirq steal (guest time is
        // already inside user and nice).
        let f: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the parenthesised name: utime and stime are the 12th and 13th.
        let after = &own[own.rfind(')')? + 2..];
        let mut o = after.split_whitespace().skip(11);
        let ours = o.next()?.parse::<u64>().ok()? + o.next()?.parse::<u64>().ok()?;
        Some(CpuTicks {
            busy: f.iter().sum::<u64>() - f[3] - f[4],
            total: f.iter().sum(),
            ours,
        })
    }
}

/// What a [`NoiseProbe`] saw.
#[derive(Clone, Copy, Debug)]
pub struct Noise {
    /// Share of all CPUs' time that other processes or the hypervisor took.
    pub others: f64,
    pub wakeups: usize,
    pub p99_late: Duration,
    /// Share of the probe's time lost to wake-ups later than 1 ms.
    pub lost: f64,
}

impl Noise {
    /// Whether the machine stayed quiet enough for a live timing comparison:
    /// others took < 15 % of the CPUs and 99 % of 1 ms sleeps woke within 2 ms
    /// of their time (the backstop for a hypervisor that reports no steal).
    /// Measured on a 2-core machine during the twin's live runs: idle, others
    /// 0-7 %, p99 0.2-1.8 ms; with four CPU burners beside them (the flood
    /// then kept 0.3-0.45× of its IOPS and the shares ratio fell to 1.6),
    /// others 79-89 %, p99 0.3-3.1 ms. So the share of the CPUs decides, and a
    /// disagreement on a quiet machine still fails.
    pub fn quiet(&self) -> bool {
        self.others < 0.15 && self.p99_late <= Duration::from_millis(2)
    }
}

impl std::fmt::Display for Noise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "other processes took {:.0} % of the CPUs; 1 ms sleeps woke p99 {:.2} ms late \
             ({} wake-ups, {:.1} % of the time lost)",
            self.others * 100.0,
            self.p99_late.as_secs_f64() * 1e3,
            self.wakeups,
            self.lost * 100.0
        )
    }
}

impl NoiseProbe {
    pub fn start() -> NoiseProbe {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut late = Vec::with_capacity(65_536);
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
                late.push(t.elapsed().saturating_sub(Duration::from_millis(1)));
            }
            late
        });
        NoiseProbe {
            stop,
            thread,
            cpu_at_start: CpuTicks::now(),
        }
    }

    pub fn finish(self) -> Noise {
        let cpu = self.cpu_at_start.zip(CpuTicks::now());
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut late = self.thread.join().expect("the noise probe's thread");
        late.sort();
        let slept = Duration::from_millis(late.len() as u64);
        let total = late.iter().sum::<Duration>() + slept;
        let lost: Duration = late.iter().filter(|l| **l > Duration::from_millis(1)).sum();
        let others = cpu.map_or(0.0, |(a, b)| {
            let busy = (b.busy - a.busy).saturating_sub(b.ours - a.ours);
            busy as f64 / (b.total - a.total).max(1) as f64
        });
        Noise {
            others,
            wakeups: late.len(),
            p99_late: late
                .get((late.len().max(1) - 1) * 99 / 100)
                .copied()
                .unwrap_or_default(),
            lost: lost.as_secs_f64() / total.as_secs_f64().max(1e-9),
        }
    }
}

/// Two policies for a shares test: `high` (2000 shares) and `normal` (1000).
pub const HIGH_AND_NORMAL_SHARES: &str = r#"
[[policies]]
name = "high"
shares = 2000
[[policies]]
name = "normal"
shares = 1000
"#;

/// A `[[volumes]]` entry.
pub fn volume_toml(name: &str, size: &str, policy: &str, pool: &str) -> String {
    format!(
        "[[volumes]]\nname = \"{name}\"\nsize = \"{size}\"\npolicy = \"{policy}\"\npool = \"{pool}\"\n"
    )
}

/// `toml` parsed, with both listeners on ephemeral loopback ports and the data
/// directory `dir`.
pub fn config_from(toml: &str, dir: &Path) -> WeirConfig {
    let mut c = WeirConfig::from_toml_str(toml, "test config").unwrap();
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.admin_listen = "127.0.0.1:0".parse().unwrap();
    c.data_dir = dir.to_path_buf();
    c
}

/// [`TEST_CONFIG`] on `dir`.
pub fn config(dir: &Path) -> WeirConfig {
    config_from(TEST_CONFIG, dir)
}

/// A server with [`TEST_CONFIG`] on `dir`.
pub async fn start(dir: &Path) -> RunningServer {
    RunningServer::start(config(dir))
        .await
        .expect("server starts")
}

/// A server with the configuration `toml` in a fresh directory named after `tag`
/// (keep the directory as long as the server runs).
pub async fn start_with(tag: &str, toml: &str) -> (TempDir, RunningServer) {
    let dir = TempDir::new(tag);
    let server = RunningServer::start(config_from(toml, dir.path()))
        .await
        .expect("server starts");
    (dir, server)
}

/// An NBD client connected to `volume` (panics naming the volume when it cannot).
pub async fn connect(server: &RunningServer, volume: &str) -> (NbdClient, ClientExport) {
    NbdClient::connect(server.nbd_addr(), ClientConfig::go(volume))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {volume}: {e:#}"))
}

/// The value of the `/metrics` sample whose line starts with `series` (a name
/// with its labels, e.g. `weir_connections` or `name{volume="v"}`).
pub fn sample(server: &RunningServer, series: &str) -> u64 {
    let text = weir_server::admin::metrics_text(server.state());
    let prefix = format!("{series} ");
    let line = text.lines().find(|l| l.starts_with(&prefix));
    let line = line.unwrap_or_else(|| panic!("no {series} in /metrics"));
    line[prefix.len()..]
        .trim()
        .parse()
        .expect("an integer sample")
}

/// Resident memory of this process, bytes.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib << 10
}

/// `nbd://` URI of a volume.
pub fn uri(server: &RunningServer, volume: &str) -> String {
    format!("nbd://{}/{volume}", server.nbd_addr())
}

/// One completed request: when it completed and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub done_at: Instant,
    pub latency: Duration,
}

/// A closed-loop random-read load on one volume.
#[derive(Clone, Copy, Debug)]
pub struct ReadLoad<'a> {
    pub volume: &'a str,
    /// Local address to connect from (a second "host" on loopback), or the default.
    pub from: Option<IpAddr>,
    pub queue_depth: usize,
    pub size_bytes: u32,
    /// Reads fall at multiples of `size_bytes` below this.
    pub span_bytes: u64,
    pub seed: u64,
}

impl ReadLoad<'_> {
    /// Keeps `queue_depth` reads in flight until `end`, then waits for the last ones;
    /// returns every completion.
    pub async fn run_until(self, addr: SocketAddr, end: Instant) -> Vec<Sample> {
        let (mut c, _) = NbdClient::connect_from(self.from, addr, ClientConfig::go(self.volume))
            .await
            .unwrap();
        let slots = self.span_bytes / self.size_bytes as u64;
        let mut x = self.seed | 1;
        let mut sent: HashMap<u64, Instant> = HashMap::new();
        let mut samples = Vec::new();
        loop {
            if Instant::now() < end {
                while sent.len() < self.queue_depth {
                    // xorshift64
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let offset = (x % slots) * self.size_bytes as u64;
                    let handle = c.session().read(offset, self.size_bytes);
                    sent.insert(handle, Instant::now());
                }
            } else if sent.is_empty() {
                break;
            }
            let done = c.next_completion().await.unwrap();
            assert!(
                done.result.is_ok(),
                "{}: {:?}",
                self.volume,
                done.result.err()
            );
            let now = Instant::now();
            if let Some(t) = sent.remove(&done.handle) {
                samples.push(Sample {
                    done_at: now,
                    latency: now - t,
                });
            }
        }
        c.disconnect().await.unwrap();
        samples
    }

    /// As [`ReadLoad::run_until`], for `duration` from now.
    pub async fn run_for(self, addr: SocketAddr, duration: Duration) -> Vec<Sample> {
        self.run_until(addr, Instant::now() + duration).await
    }
}

/// An emulated `15k-sas-raid5x24` pool with default settings, 400 GiB volumes and
/// closed-loop 4 KiB random readers (the acceptance runs and the twin test).
pub mod emulated {
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use super::{ReadLoad, Sample, volume_toml};

    pub const SPAN: u64 = 400 << 30;
    pub const WARMUP: Duration = Duration::from_secs(3);

    pub fn pool(qos: bool) -> String {
        format!(
            "[[pools]]\nname = \"array\"\ndevice = \"15k-sas-raid5x24\"\n{}",
            if qos { "" } else { "qos = false\n" }
        )
    }

    pub fn volumes(names_policies: &[(&str, &str)]) -> String {
        names_policies
            .iter()
            .map(|(n, p)| volume_toml(n, "400GiB", p, "array"))
            .collect()
    }

    /// Runs one reader per `(volume, queue depth)` for `WARMUP + measure` and returns
    /// the completions inside the measured part.
    pub async fn run(
        addr: SocketAddr,
        loads: &[(&str, usize)],
        measure: Duration,
    ) -> Vec<Vec<Sample>> {
        let start = Instant::now();
        let end = start + WARMUP + measure;
        let handles: Vec<_> = loads
            .iter()
            .enumerate()
            .map(|(i, &(volume, qd))| {
                let volume = volume.to_string();
                tokio::spawn(async move {
                    ReadLoad {
                        volume: &volume,
                        from: None,
                        queue_depth: qd,
                        size_bytes: 4096,
                        span_bytes: SPAN,
                        seed: 17 + i as u64 * 7919,
                    }
                    .run_until(addr, end)
                    .await
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            let samples = h.await.unwrap();
            out.push(
                samples
                    .into_iter()
                    .filter(|s| s.done_at >= start + WARMUP && s.done_at < end)
                    .collect(),
            );
        }
        out
    }

    pub fn iops(s: &[Sample], measure: Duration) -> f64 {
        s.len() as f64 / measure.as_secs_f64()
    }

    pub fn pct(s: &[Sample], p: f64) -> f64 {
        let mut l: Vec<f64> = s.iter().map(|x| x.latency.as_secs_f64() * 1e3).collect();
        l.sort_by(f64::total_cmp);
        l.get(((l.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    }
}
