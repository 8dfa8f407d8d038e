//! Shared helpers: a temporary data directory and a server on ephemeral ports.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use weir_server::{RunningServer, WeirConfig};

pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "weir-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Volumes: `open` (16 MiB, any host), `ro` (1 MiB, read-only, loopback group),
/// `hidden` (1 MiB, only 10.0.0.0/8: never this test's host), `slow` (limited
/// to 100 IOPS by the `slow100` policy).
pub const TEST_CONFIG: &str = r#"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

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

pub fn config(dir: &Path) -> WeirConfig {
    let mut c = WeirConfig::from_toml_str(TEST_CONFIG, "test config").unwrap();
    c.data_dir = dir.to_path_buf();
    c
}

pub async fn start(dir: &Path) -> RunningServer {
    RunningServer::start(config(dir))
        .await
        .expect("server starts")
}

/// `nbd://` URI of a volume.
pub fn uri(server: &RunningServer, volume: &str) -> String {
    format!("nbd://{}/{volume}", server.nbd_addr())
}

/// Whether an external tool is installed; prints the skip line when it is not.
pub fn have(tool: &str) -> bool {
    let found = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        println!("skipped: {tool} not installed");
    }
    found
}
