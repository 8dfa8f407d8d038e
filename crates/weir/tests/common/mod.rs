//! Helpers for tests that run the real `weir` binary.
#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use weir_testkit::TempDir;

/// xorshift64*: deterministic, dependency-free randomness for workloads.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A random value below `n` that is not in `taken` (which must leave one free).
    pub fn below_except(&mut self, n: u64, taken: &HashSet<u64>) -> u64 {
        loop {
            let v = self.below(n);
            if !taken.contains(&v) {
                return v;
            }
        }
    }
}

/// The `weir` binary under test (`WEIR_BIN` overrides it).
pub fn weir_bin() -> String {
    std::env::var("WEIR_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_weir").to_string())
}

/// A `weir serve` child process on ephemeral ports (read from its banner).
pub struct WeirProcess {
    pub child: Child,
    pub nbd_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The admin API's token (from `data/admin-token`).
    pub admin_token: String,
    pub stdout: mpsc::Receiver<String>,
}

fn addr_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let token: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',')
        .collect();
    token.parse().ok()
}

impl WeirProcess {
    /// Writes `config` (listeners are forced to ephemeral loopback ports) into
    /// `dir/weir.toml` and starts `weir serve` on `dir/data`.
    pub fn start(dir: &Path, config: &str) -> WeirProcess {
        Self::start_on(dir, config, &dir.join("data"))
    }

    /// As [`WeirProcess::start`], with the data directory `data`.
    pub fn start_on(dir: &Path, config: &str, data: &Path) -> WeirProcess {
        Self::spawn(dir, config, Command::new(env!("CARGO_BIN_EXE_weir")), data)
    }

    /// As [`WeirProcess::start`], with the NBD listener on `listen` (to restart
    /// a server on the port its clients know).
    pub fn start_listening(dir: &Path, config: &str, listen: SocketAddr) -> WeirProcess {
        let cmd = Command::new(env!("CARGO_BIN_EXE_weir"));
        Self::spawn_at(dir, config, cmd, &dir.join("data"), listen)
    }

    /// As [`WeirProcess::start`], through `sh -c script weir serve …`: the script
    /// sets what the server runs under (an open-files limit, a mount namespace)
    /// and ends with `exec "$0" "$@"`. `WEIR_BIN` overrides the binary (to
    /// measure another build, e.g. before a fix).
    pub fn start_with(dir: &Path, config: &str, script: &str) -> WeirProcess {
        Self::start_with_listening(dir, config, script, "127.0.0.1:0".parse().unwrap())
    }

    /// [`WeirProcess::start_with`] with the NBD listener on `listen` (a server
    /// in a network namespace of its own, reached on another interface).
    pub fn start_with_listening(
        dir: &Path,
        config: &str,
        script: &str,
        listen: SocketAddr,
    ) -> WeirProcess {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).arg(weir_bin());
        Self::spawn_at(dir, config, cmd, &dir.join("data"), listen)
    }

    fn spawn(dir: &Path, config: &str, cmd: Command, data: &Path) -> WeirProcess {
        Self::spawn_at(dir, config, cmd, data, "127.0.0.1:0".parse().unwrap())
    }

    fn spawn_at(
        dir: &Path,
        config: &str,
        mut cmd: Command,
        data: &Path,
        listen: SocketAddr,
    ) -> WeirProcess {
        let config_path = dir.join("weir.toml");
        let text = format!("listen = \"{listen}\"\nadmin_listen = \"127.0.0.1:0\"\n{config}");
        std::fs::write(&config_path, text).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("weir.log"))
            .unwrap();
        let mut child = cmd
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .arg("--data-dir")
            .arg(data)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("weir serve starts");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut nbd_addr = None;
        let mut admin_addr = None;
        while nbd_addr.is_none() || admin_addr.is_none() {
            let line = match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(l) => l,
                Err(e) => {
                    let _ = child.kill();
                    let log = std::fs::read_to_string(dir.join("weir.log")).unwrap_or_default();
                    panic!("weir serve did not print its addresses ({e}); log:\n{log}");
                }
            };
            nbd_addr = nbd_addr.or_else(|| addr_after(&line, "NBD on "));
            admin_addr = admin_addr.or_else(|| addr_after(&line, "http://"));
        }
        let admin_token = weir_server::admin_auth::read_token_file(data)
            .expect("weir serve wrote its admin token");
        WeirProcess {
            child,
            nbd_addr: nbd_addr.unwrap(),
            admin_addr: admin_addr.unwrap(),
            admin_token,
            stdout: rx,
        }
    }

    /// An admin API client with the server's token.
    pub fn admin_client(&self) -> weir_server::admin::Client {
        weir_server::admin::Client::new(self.admin_addr).with_token(self.admin_token.clone())
    }

    /// `weir ARGS --admin <this server>` with its token; asserts success and
    /// returns what it printed.
    pub fn cli(&self, args: &[&str]) -> String {
        let o = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(args)
            .arg("--admin")
            .arg(self.admin_addr.to_string())
            .env("WEIR_ADMIN_TOKEN", &self.admin_token)
            .output()
            .expect("weir runs");
        let said = weir_testkit::output_text(&o);
        assert!(o.status.success(), "weir {args:?}: {said}");
        said
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM (graceful shutdown).
    /// Waits for the process to exit, at most `within` (else panics with
    /// `what` did not end it).
    pub fn wait_exit(&mut self, within: Duration, what: &str) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                t.elapsed() < within,
                "{what} did not end weir serve in {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn terminate(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
}

impl Drop for WeirProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// Resident memory of process `pid`, MiB.
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// `fio --verify` (crc32c, random 4 KiB writes over 8 MiB) of `volume` at
/// `addr`, if fio has its nbd engine (else a printed skip).
pub fn fio_verify(addr: SocketAddr, volume: &str, dir: &Path) {
    let fio_ok = Command::new("fio")
        .arg("--enghelp")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("nbd"));
    if !fio_ok {
        println!("skipped: fio with the nbd engine is not installed");
        return;
    }
    let uri = format!("nbd://{addr}/{volume}");
    let out = Command::new("fio")
        .args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=8m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ])
        .current_dir(dir)
        .output()
        .expect("running fio");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fio verify of {uri}:\n{text}");
    assert!(!text.contains("verify: bad"), "{text}");
}
