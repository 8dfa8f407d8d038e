//! Interoperability with real NBD clients: qemu-io, qemu-img, nbdinfo (libnbd).
//! A missing tool prints "skipped: <tool> not installed" and the test returns.

mod common;

use std::process::Output;

use weir_testkit::{output_text as text, require_tool};

/// Runs `cmd args…` off the async runtime (the server runs on it).
async fn run(cmd: &str, args: &[&str]) -> Output {
    let cmd = cmd.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(&cmd)
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("{cmd} does not run: {e}"))
    })
    .await
    .unwrap()
}

/// As [`run`], asserting that the command succeeds.
async fn run_ok(cmd: &str, args: &[&str]) -> Output {
    let o = run(cmd, args).await;
    assert!(o.status.success(), "{cmd} {args:?}: {}", text(&o));
    o
}

/// `qemu-io` arguments running `commands` on the raw image at `uri`.
fn qemu_io_args<'a>(read_only: bool, commands: &[&'a str], uri: &'a str) -> Vec<&'a str> {
    let mut args = if read_only { vec!["-r"] } else { vec![] };
    args.extend(["-f", "raw"]);
    for c in commands {
        args.extend(["-c", c]);
    }
    args.push(uri);
    args
}

/// Runs `qemu-io` commands on `uri`, asserting that it succeeds and that no
/// command (a pattern check, a write) reports a failure.
async fn qemu_io_ok(read_only: bool, commands: &[&str], uri: &str) {
    let o = run_ok("qemu-io", &qemu_io_args(read_only, commands, uri)).await;
    assert!(!text(&o).contains("failed"), "{commands:?}: {}", text(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_writes_and_verifies_a_pattern() {
    if !require_tool("qemu-io", &[]) {
        return;
    }
    let dir = common::TempDir::new("qemu-io");
    let server = common::start(dir.path()).await;
    let uri = common::uri(&server, "open");
    let write = [
        "write -P 0xab 0 1M",
        "write -P 0xcd -f 2M 64k",
        "flush",
        "aio_write -P 0x11 4M 128k",
        "aio_flush",
    ];
    qemu_io_ok(false, &write, &uri).await;
    // A pattern mismatch prints "Pattern verification failed".
    let verify = [
        "read -P 0xab 0 1M",
        "read -P 0xcd 2M 64k",
        "read -P 0x11 4M 128k",
        "read -P 0 8M 4k",
    ];
    qemu_io_ok(false, &verify, &uri).await;
    // Write zeroes and discard.
    qemu_io_ok(
        false,
        &["write -z 0 64k", "read -P 0 0 64k", "discard 1M 1M"],
        &uri,
    )
    .await;
    // Writes to the read-only export fail cleanly.
    let ro = common::uri(&server, "ro");
    let o = run("qemu-io", &qemu_io_args(false, &["write 0 4k"], &ro)).await;
    // qemu refuses to open a read-only export read-write.
    assert!(
        !o.status.success() && text(&o).contains("Permission denied"),
        "{}",
        text(&o)
    );
    qemu_io_ok(true, &["read -P 0 0 4k"], &ro).await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_reads_size_and_allocation_map() {
    if !require_tool("qemu-img", &[]) || !require_tool("qemu-io", &[]) {
        return;
    }
    let dir = common::TempDir::new("qemu-img");
    let server = common::start(dir.path()).await;
    let uri = common::uri(&server, "open");
    qemu_io_ok(false, &["write -P 1 1M 1M"], &uri).await;
    let o = run_ok("qemu-img", &["info", "--output=json", "-f", "raw", &uri]).await;
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["virtual-size"], 16 << 20);
    let o = run_ok("qemu-img", &["map", "--output=json", "-f", "raw", &uri]).await;
    let map: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let data_at_1m = map
        .iter()
        .any(|e| e["start"] == 1 << 20 && e["data"] == true);
    let hole_at_0 = map
        .iter()
        .any(|e| e["start"] == 0 && e["data"] == false && e["zero"] == true);
    assert!(data_at_1m && hole_at_0, "map from base:allocation: {map:?}");
    // Copy the volume out and check it.
    let out = dir.join("copy.raw");
    let out_arg = out.display().to_string();
    run_ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri, &out_arg],
    )
    .await;
    let copy = std::fs::read(&out).unwrap();
    assert_eq!(copy.len(), 16 << 20);
    assert!(
        copy[1 << 20..2 << 20].iter().all(|&b| b == 1) && copy[..1 << 20].iter().all(|&b| b == 0)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_lists_visible_exports_and_describes_one() {
    if !require_tool("nbdinfo", &[]) {
        return;
    }
    let dir = common::TempDir::new("nbdinfo");
    let server = common::start(dir.path()).await;
    let server_uri = format!("nbd://{}", server.nbd_addr());
    let o = run_ok("nbdinfo", &["--list", "--json", &server_uri]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["open", "ro", "slow"], "{v}");
    let open = common::uri(&server, "open");
    let o = run_ok("nbdinfo", &["--json", &open]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 16 << 20);
    assert_eq!(e["description"], "open to all hosts");
    assert_eq!(e["can_multi_conn"], true);
    assert_eq!(e["can_flush"], true);
    assert_eq!(e["can_fua"], true);
    assert_eq!(e["can_trim"], true);
    assert_eq!(e["can_zero"], true);
    assert_eq!(e["can_fast_zero"], true);
    assert_eq!(e["can_cache"], true);
    assert_eq!(e["block_size_maximum"], 64 << 20);
    let ro = run("nbdinfo", &["--json", &common::uri(&server, "ro")]).await;
    let v: serde_json::Value = serde_json::from_slice(&ro.stdout).unwrap();
    assert_eq!(v["exports"][0]["is_read_only"], true);
    let o = run_ok("nbdinfo", &["--map", &open]).await;
    assert!(text(&o).contains("hole"), "{}", text(&o));
    let hidden = run("nbdinfo", &[&common::uri(&server, "hidden")]).await;
    assert!(
        !hidden.status.success(),
        "hidden export must not open: {}",
        text(&hidden)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_nbd_engine_writes_and_verifies() {
    if !require_tool("fio", &[]) {
        return;
    }
    let engines = run("fio", &["--enghelp"]).await;
    if !text(&engines).lines().any(|l| l.trim() == "nbd") {
        println!("skipped: fio built without the nbd engine");
        return;
    }
    let dir = common::TempDir::new("fio");
    let server = common::start(dir.path()).await;
    let uri_arg = format!("--uri={}", common::uri(&server, "open"));
    let directory_arg = format!("--directory={}", dir.path().display());
    let o = run_ok(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &uri_arg,
            "--rw=randwrite",
            "--bs=4k",
            "--size=8M",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_state_save=0",
            &directory_arg,
            "--output-format=json",
        ],
    )
    .await;
    // fio may print notes before the JSON document.
    let stdout = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&stdout[stdout.find('{').unwrap_or(0)..]).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert_eq!(job["write"]["io_bytes"], 8 << 20);
    assert_eq!(
        job["read"]["io_bytes"],
        8 << 20,
        "verify pass read everything back"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdcopy_round_trips_over_multiple_connections() {
    if !require_tool("nbdcopy", &[]) {
        return;
    }
    let dir = common::TempDir::new("nbdcopy");
    let server = common::start(dir.path()).await;
    // 16 MiB source (the size of the volume): a pattern with a zero gap in the middle.
    let mut src: Vec<u8> = (0..16u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    src[4 << 20..6 << 20].fill(0);
    let src_path = dir.join("src.raw");
    let out_path = dir.join("out.raw");
    std::fs::write(&src_path, &src).unwrap();
    let uri = common::uri(&server, "open");
    // nbdcopy opens several connections when the server offers CAN_MULTI_CONN.
    let (src_arg, out_arg) = (
        src_path.display().to_string(),
        out_path.display().to_string(),
    );
    run_ok("nbdcopy", &["--connections=4", "--flush", &src_arg, &uri]).await;
    run_ok("nbdcopy", &["--connections=4", &uri, &out_arg]).await;
    assert!(std::fs::read(&out_path).unwrap() == src, "copy differs");
    server.shutdown().await.unwrap();
}
