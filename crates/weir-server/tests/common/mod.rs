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
