//! `weir serve` under systemd: it takes the sockets systemd passes (socket
//! activation, `LISTEN_FDS`), tells it when it is ready and when it stops
//! (`sd_notify`), and the unit files in deploy/systemd pass `systemd-analyze
//! verify`.

mod common;

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::TempDir;
use weir_testkit::output_text;

/// A descriptor above the ones `dup2` will fill (3, 4), close-on-exec.
fn high_dup(fd: i32) -> i32 {
    // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor we own.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 64) };
    assert!(new >= 64);
    new
}

fn recv(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = socket
        .recv(&mut buf)
        .expect("a notification within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn socket_activation_and_readiness_notification() {
    let dir = TempDir::new("systemd");
    let nbd = TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").unwrap();
    let (nbd_addr, admin_addr) = (nbd.local_addr().unwrap(), admin.local_addr().unwrap());
    let (nbd_fd, admin_fd) = (high_dup(nbd.as_raw_fd()), high_dup(admin.as_raw_fd()));
    let notify_path = dir.join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let data = dir.join("data");
    let mut cmd = Command::new("sh");
    // LISTEN_PID must be the server's pid: the shell's, which exec keeps.
    cmd.arg("-c")
        .arg("export LISTEN_PID=$$; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--data-dir"])
        .arg(&data)
        // The configured addresses are not used: the passed sockets are.
        .args(["--listen", "127.0.0.1:1", "--admin-listen", "127.0.0.1:1"])
        .env("LISTEN_FDS", "2")
        .env("LISTEN_FDNAMES", "admin:nbd")
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only dup2 (async-signal-safe) between fork and exec; dup2 clears
    // close-on-exec on 3 and 4.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(admin_fd, 3) < 0 || libc::dup2(nbd_fd, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let ready = recv(&notify);
    assert!(ready.contains("READY=1"), "{ready}");
    assert!(
        ready.contains(&format!("STATUS=serving NBD on {nbd_addr}")),
        "{ready}"
    );

    // Both passed sockets serve: NBD lists the demo volumes, the admin API answers.
    let token = weir_server::admin_auth::read_token_file(&data).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let exports = weir_server::nbd_client::NbdClient::list(nbd_addr)
            .await
            .unwrap();
        assert!(exports.len() >= 5, "{exports:?}");
        let client = weir_server::admin::Client::new(admin_addr).with_token(token);
        let info = client.server_info().await.unwrap();
        assert_eq!(info.nbd_listen, nbd_addr.to_string());
        assert_eq!(info.admin_listen, admin_addr.to_string());
    });

    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let stopping = recv(&notify);
    assert!(stopping.contains("STOPPING=1"), "{stopping}");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
}

#[test]
fn a_foreign_listen_pid_is_ignored() {
    // LISTEN_PID of another process: the variables are not for this one, and
    // the server binds its own addresses.
    let dir = TempDir::new("systemd-foreign");
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env("LISTEN_PID", "1")
        .env("LISTEN_FDS", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = out;
    let mut first = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("weir serving NBD on 127.0.0.1:"), "{first}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn unit_files_pass_systemd_analyze_verify() {
    if !weir_testkit::require_tool("systemd-analyze", &[]) {
        return;
    }
    let dir = TempDir::new("systemd-units");
    let units = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/systemd");
    let mut paths = Vec::new();
    for name in ["weir.service", "weir-nbd.socket", "weir-admin.socket"] {
        let text = std::fs::read_to_string(format!("{units}/{name}")).unwrap();
        // The binary under test stands in for /usr/bin/weir (verify checks it exists).
        let text = text.replace("/usr/bin/weir", env!("CARGO_BIN_EXE_weir"));
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        paths.push(path);
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&paths)
        .output()
        .unwrap();
    let said = output_text(&out);
    assert!(out.status.success(), "{said}");
    let service = std::fs::read_to_string(format!("{units}/weir.service")).unwrap();
    assert!(service.contains("Type=notify"));
}
