//! Interoperability with real NBD clients: qemu-io, qemu-img, nbdinfo (libnbd).
//! A missing tool prints "skipped: <tool> not installed" and the test returns.

mod common;

use std::process::Output;

async fn run(cmd: &str, args: Vec<String>) -> Output {
    let cmd = cmd.to_string();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(&cmd)
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_writes_and_verifies_a_pattern() {
    if !common::have("qemu-io") {
        return;
    }
    let dir = common::TempDir::new("qemu-io");
    let server = common::start(dir.path()).await;
    let uri = common::uri(&server, "open");
    let args = |cmds: &[&str]| {
        let mut a = vec!["-f".to_string(), "raw".to_string()];
        for c in cmds {
            a.push("-c".into());
            a.push(c.to_string());
        }
        a.push(uri.clone());
        a
    };
    let o = run(
        "qemu-io",
        args(&[
            "write -P 0xab 0 1M",
            "write -P 0xcd -f 2M 64k",
            "flush",
            "aio_write -P 0x11 4M 128k",
            "aio_flush",
        ]),
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    let o = run(
        "qemu-io",
        args(&[
            "read -P 0xab 0 1M",
            "read -P 0xcd 2M 64k",
            "read -P 0x11 4M 128k",
            "read -P 0 8M 4k",
        ]),
    )
    .await;
    assert!(
        o.status.success() && !text(&o).contains("Pattern verification failed"),
        "{}",
        text(&o)
    );
    // Write zeroes and discard.
    let o = run(
        "qemu-io",
        args(&["write -z 0 64k", "read -P 0 0 64k", "discard 1M 1M"]),
    )
    .await;
    assert!(
        o.status.success() && !text(&o).contains("failed"),
        "{}",
        text(&o)
    );
    // Writes to the read-only export fail cleanly.
    let ro = common::uri(&server, "ro");
    let o = run(
        "qemu-io",
        vec![
            "-f".into(),
            "raw".into(),
            "-c".into(),
            "write 0 4k".into(),
            ro,
        ],
    )
    .await;
    // qemu refuses to open a read-only export read-write.
    assert!(
        !o.status.success() && text(&o).contains("Permission denied"),
        "{}",
        text(&o)
    );
    let o = run(
        "qemu-io",
        vec![
            "-r".into(),
            "-f".into(),
            "raw".into(),
            "-c".into(),
            "read -P 0 0 4k".into(),
            common::uri(&server, "ro"),
        ],
    )
    .await;
    assert!(
        o.status.success() && !text(&o).contains("failed"),
        "{}",
        text(&o)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_reads_size_and_allocation_map() {
    if !common::have("qemu-img") || !common::have("qemu-io") {
        return;
    }
    let dir = common::TempDir::new("qemu-img");
    let server = common::start(dir.path()).await;
    let uri = common::uri(&server, "open");
    let o = run(
        "qemu-io",
        vec![
            "-f".into(),
            "raw".into(),
            "-c".into(),
            "write -P 1 1M 1M".into(),
            uri.clone(),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    let o = run(
        "qemu-img",
        vec![
            "info".into(),
            "--output=json".into(),
            "-f".into(),
            "raw".into(),
            uri.clone(),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["virtual-size"], 16 << 20);
    let o = run(
        "qemu-img",
        vec![
            "map".into(),
            "--output=json".into(),
            "-f".into(),
            "raw".into(),
            uri.clone(),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    let map: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let data_at_1m = map
        .iter()
        .any(|e| e["start"] == 1 << 20 && e["data"] == true);
    let hole_at_0 = map
        .iter()
        .any(|e| e["start"] == 0 && e["data"] == false && e["zero"] == true);
    assert!(data_at_1m && hole_at_0, "map from base:allocation: {map:?}");
    // Copy the volume out and check it.
    let out = dir.path().join("copy.raw");
    let o = run(
        "qemu-img",
        vec![
            "convert".into(),
            "-f".into(),
            "raw".into(),
            "-O".into(),
            "raw".into(),
            uri,
            out.display().to_string(),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    let copy = std::fs::read(&out).unwrap();
    assert_eq!(copy.len(), 16 << 20);
    assert!(
        copy[1 << 20..2 << 20].iter().all(|&b| b == 1) && copy[..1 << 20].iter().all(|&b| b == 0)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_lists_visible_exports_and_describes_one() {
    if !common::have("nbdinfo") {
        return;
    }
    let dir = common::TempDir::new("nbdinfo");
    let server = common::start(dir.path()).await;
    let o = run(
        "nbdinfo",
        vec![
            "--list".into(),
            "--json".into(),
            format!("nbd://{}", server.nbd_addr()),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["open", "ro", "slow"], "{v}");
    let o = run(
        "nbdinfo",
        vec!["--json".into(), common::uri(&server, "open")],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
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
    assert_eq!(e["block_size_maximum"], 32 << 20);
    let ro = run("nbdinfo", vec!["--json".into(), common::uri(&server, "ro")]).await;
    let v: serde_json::Value = serde_json::from_slice(&ro.stdout).unwrap();
    assert_eq!(v["exports"][0]["is_read_only"], true);
    let o = run(
        "nbdinfo",
        vec!["--map".into(), common::uri(&server, "open")],
    )
    .await;
    assert!(
        o.status.success() && text(&o).contains("hole"),
        "{}",
        text(&o)
    );
    let hidden = run("nbdinfo", vec![common::uri(&server, "hidden")]).await;
    assert!(
        !hidden.status.success(),
        "hidden export must not open: {}",
        text(&hidden)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_nbd_engine_writes_and_verifies() {
    if !common::have("fio") {
        return;
    }
    let engines = run("fio", vec!["--enghelp".into()]).await;
    if !text(&engines).lines().any(|l| l.trim() == "nbd") {
        println!("skipped: fio built without the nbd engine");
        return;
    }
    let dir = common::TempDir::new("fio");
    let server = common::start(dir.path()).await;
    let o = run(
        "fio",
        vec![
            "--name=verify".into(),
            "--ioengine=nbd".into(),
            format!("--uri={}", common::uri(&server, "open")),
            "--rw=randwrite".into(),
            "--bs=4k".into(),
            "--size=8M".into(),
            "--iodepth=16".into(),
            "--verify=crc32c".into(),
            "--do_verify=1".into(),
            "--verify_state_save=0".into(),
            format!("--directory={}", dir.path().display()),
            "--output-format=json".into(),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
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
    if !common::have("nbdcopy") {
        return;
    }
    let dir = common::TempDir::new("nbdcopy");
    let server = common::start(dir.path()).await;
    // 16 MiB source (the size of the volume): a pattern with a zero gap in the middle.
    let mut src: Vec<u8> = (0..16u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    src[4 << 20..6 << 20].fill(0);
    let src_path = dir.path().join("src.raw");
    let out_path = dir.path().join("out.raw");
    std::fs::write(&src_path, &src).unwrap();
    let uri = common::uri(&server, "open");
    // nbdcopy opens several connections when the server offers CAN_MULTI_CONN.
    let o = run(
        "nbdcopy",
        vec![
            "--connections=4".into(),
            "--flush".into(),
            src_path.display().to_string(),
            uri.clone(),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    let o = run(
        "nbdcopy",
        vec![
            "--connections=4".into(),
            uri,
            out_path.display().to_string(),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    assert!(std::fs::read(&out_path).unwrap() == src, "copy differs");
    server.shutdown().await.unwrap();
}
