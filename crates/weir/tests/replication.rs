//! Replication through the real binary: `weir volume replicate --once` to a
//! second `weir serve` (4 MB/s, so the copy takes a while), the source `weir
//! serve` killed with SIGKILL in the middle of the cycle, restarted: the cycle
//! resumes from its last checkpoint by itself and the target matches the
//! snapshot byte for byte (`qemu-img compare`). A missing tool prints
//! "skipped: …".

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Rng, TempDir, WeirProcess};
use weir_server::nbd_client::NbdClient;
use weir_testkit::{output_text as text, require_tool};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 48 * MIB;

const CONFIG: &str = r#"
[[pools]]
name = "thin"
format = "thin"

[[volumes]]
name = "db"
size = "48MiB"
policy = "non-critical"
pool = "thin"
"#;

/// The target: a second `weir serve`, its volume `dr` limited to 4 MB/s by
/// QoS so that the copy takes a while. (nbdkit's delay filter would do, but
/// nbdkit 1.32 aborts — `raw_send_socket: Assertion sock >= 0` — when a client
/// dies while a delayed write sleeps, which is what this test does.)
const TARGET: &str = r#"
[[policies]]
name = "slow"
limit_mbps = 4

[[volumes]]
name = "dr"
size = "48MiB"
policy = "slow"
"#;

fn weir(server: &WeirProcess, args: &[&str]) -> std::process::Output {
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["volume", "--admin", &server.admin_addr.to_string()])
        .env("WEIR_ADMIN_TOKEN", &server.admin_token)
        .args(args)
        .output()
        .expect("weir runs");
    assert!(o.status.success(), "weir volume {args:?}: {}", text(&o));
    o
}

#[test]
fn killed_mid_cycle_the_replication_resumes_after_restart() {
    if !require_tool("qemu-img", &[]) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (dir, target_dir) = (TempDir::new("repl-kill"), TempDir::new("repl-kill-target"));
    let target = WeirProcess::start(target_dir.path(), TARGET);
    let to = format!("nbd://{}/dr", target.nbd_addr);
    let mut source = WeirProcess::start(dir.path(), CONFIG);
    // Fill the volume with data that is not all alike.
    rt.block_on(async {
        let (mut c, _) = NbdClient::connect(source.nbd_addr, weir_nbd::ClientConfig::go("db"))
            .await
            .unwrap();
        let mut rng = Rng::new(42);
        for i in 0..SIZE / MIB {
            let chunk: Vec<u8> = (0..MIB / 8)
                .flat_map(|_| rng.next().to_le_bytes())
                .collect();
            c.write(i * MIB, &chunk, false).await.unwrap().unwrap();
        }
        c.flush().await.unwrap().unwrap();
    });
    weir(
        &source,
        &["replicate", "db", "--to", &to, "--once", "--no-wait"],
    );
    // A checkpoint (every 5 s) records how far the copy is; then SIGKILL.
    let cursor = rt.block_on(async {
        let admin = source.admin_client();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = admin.replication("db").await.unwrap();
            assert!(
                s.last_cycle.is_none(),
                "finished before a checkpoint: {s:?}"
            );
            if s.pending_cursor_bytes > 0 {
                return s.pending_cursor_bytes;
            }
            assert!(Instant::now() < deadline, "no checkpoint: {s:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    source.kill();
    let source = WeirProcess::start(dir.path(), CONFIG);
    let report = rt.block_on(async {
        let admin = source.admin_client();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = admin.replication("db").await.unwrap();
            if let Some(c) = s.last_cycle {
                return c;
            }
            assert!(Instant::now() < deadline, "not resumed: {s:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert_eq!(report.snapshot, "db@repl-1");
    let from = report.resumed_from_bytes.expect("resumed, not restarted");
    assert!(
        from >= cursor && from < SIZE,
        "{report:?} (cursor {cursor})"
    );
    assert_eq!(report.shipped_bytes + report.zeroed_bytes, SIZE - from);
    // Reading the target back need not crawl at 4 MB/s.
    weir(&target, &["set-policy", "dr", "non-critical"]);
    let snap = format!("nbd://{}/db@repl-1", source.nbd_addr);
    let o = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw", &snap, &to])
        .output()
        .unwrap();
    assert!(o.status.success(), "qemu-img compare: {}", text(&o));

    // The CLI's views of it, then stop.
    let list = String::from_utf8(weir(&source, &["replications"]).stdout).unwrap();
    assert!(list.contains("db") && list.contains(&to), "{list}");
    let stats = String::from_utf8(weir(&source, &["stats", "db"]).stdout).unwrap();
    assert!(stats.contains("replication lag"), "{stats}");
    let out = weir(&source, &["replicate", "db", "--stop"]);
    assert!(
        text(&out).contains("stopped replicating db"),
        "{}",
        text(&out)
    );
    let snaps = String::from_utf8(weir(&source, &["snapshots", "db"]).stdout).unwrap();
    assert!(!snaps.contains("repl-"), "{snaps}");
}
