//! Helpers shared by the integration tests of several Weir crates. It is a
//! dev-dependency only (`publish = false`) and depends on nothing but `std`, so every
//! crate's tests can use it without a dependency cycle.
//!
//! - [`TempDir`]: a fresh directory under the system temp dir, removed on drop (also
//!   when the test panics).
//! - [`require_tool`]: whether an external program (qemu-img, nbdinfo, fio, nbdkit…)
//!   can be run; when it cannot, it prints the reason the calling test is skipped.
//! - [`output_text`]: a finished command's stdout and stderr, for failure messages.
//! - [`Pki`]: a CA with server and client certificates (openssl), laid out as qemu's
//!   and libnbd's certificate directories.

mod pki;

pub use pki::Pki;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh directory `weir-<tag>-<pid>-<n>` under the system temp dir, removed with
/// everything in it when dropped.
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
        std::fs::create_dir_all(&p)
            .unwrap_or_else(|e| panic!("cannot create test directory {}: {e}", p.display()));
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `tool` is a program on the `PATH`.
pub fn tool_installed(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `tool` can be run. When it is missing and `apt_packages` is not empty, it
/// tries once per process (and only as root) `apt-get install -y <apt_packages>`.
/// When the tool cannot be had it prints `skipped: <tool> not installed` (with the
/// install attempt) so that the test's output says why it did nothing.
pub fn require_tool(tool: &str, apt_packages: &[&str]) -> bool {
    if tool_installed(tool) {
        return true;
    }
    if apt_packages.is_empty() {
        println!("skipped: {tool} not installed");
        return false;
    }
    static TRIED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let first_try = {
        let mut tried = TRIED.lock().unwrap_or_else(|e| e.into_inner());
        let first = !tried.iter().any(|t| t == tool);
        if first {
            tried.push(tool.to_string());
        }
        first
    };
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if first_try && root {
        println!(
            "{tool} missing: running apt-get install -y {}",
            apt_packages.join(" ")
        );
        let _ = Command::new("apt-get")
            .arg("install")
            .arg("-y")
            .args(apt_packages)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let ok = tool_installed(tool);
    if !ok {
        println!("skipped: {tool} not installed (and could not be installed)");
    }
    ok
}

/// A finished command's stdout followed by its stderr, lossily decoded.
pub fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A free TCP port on 127.0.0.1 (free when asked: [`start_daemon`] retries).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed on drop (nbdkit, qemu-nbd).
pub struct Daemon(pub std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` with `args(port)` on a free port; waits until it accepts.
pub fn start_daemon(cmd: &str, args: impl Fn(u16) -> Vec<String>) -> (Daemon, u16) {
    for _ in 0..5 {
        let port = free_port();
        let child = Command::new(cmd)
            .args(args(port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd} does not run: {e}"));
        let mut d = Daemon(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = d.0.try_wait() {
                break; // exited (port taken?): try another port
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return (d, port);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = d.0.kill();
    }
    panic!("{cmd} did not start");
}

/// `nbdkit -f -i 127.0.0.1 -p PORT --exit-with-parent ARGS…` on a free port
/// (plugin, its size, filters and their settings in `args`).
pub fn start_nbdkit(args: &[&str]) -> (Daemon, u16) {
    start_daemon("nbdkit", |p| {
        let head = [
            "-f",
            "-i",
            "127.0.0.1",
            "-p",
            &p.to_string(),
            "--exit-with-parent",
        ]
        .map(String::from);
        head.into_iter()
            .chain(args.iter().map(|a| a.to_string()))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_dirs_are_fresh_distinct_and_removed_on_drop() {
        let a = TempDir::new("testkit");
        let b = TempDir::new("testkit");
        assert_ne!(a.path(), b.path());
        std::fs::write(a.join("f"), b"x").unwrap();
        assert!(a.join("f").exists());
        let kept = a.path().to_path_buf();
        drop(a);
        assert!(!kept.exists(), "{} left behind", kept.display());
        assert!(b.path().is_dir());
    }

    #[test]
    fn tools_are_found_on_the_path_and_missing_ones_refused() {
        assert!(tool_installed("sh"));
        assert!(require_tool("sh", &[]));
        let missing = "weir-testkit-no-such-tool";
        assert!(!tool_installed(missing));
        assert!(!require_tool(missing, &[]));
    }

    #[test]
    fn output_text_joins_stdout_and_stderr() {
        let o = Command::new("sh")
            .args(["-c", "echo out; echo err >&2"])
            .output()
            .unwrap();
        assert_eq!(output_text(&o), "out\nerr\n");
    }
}
