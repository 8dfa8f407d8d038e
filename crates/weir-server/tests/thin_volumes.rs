//! Thin pools with real clients: snapshots while writes continue (qemu-img
//! compare), fio verify on 20 linked clones at once, rollback to exact bytes,
//! and everything surviving a restart with a consistent catalog. A missing tool
//! prints "skipped: <tool> not installed" and the test returns.

mod common;

use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex};

use rand::{Rng, SeedableRng};
use weir_nbd::ClientConfig;
use weir_server::nbd_client::NbdClient;
use weir_server::{RunningServer, WeirConfig};
use weir_testkit::{output_text as text, require_tool};

const THIN: &str = r#"
[[pools]]
name = "thin"
format = "thin"
clone_cache = "64MiB"

[[volumes]]
name = "db"
size = "16MiB"
policy = "non-critical"
pool = "thin"
"#;

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

async fn run_ok(cmd: &str, args: &[&str]) -> Output {
    let o = run(cmd, args).await;
    assert!(o.status.success(), "{cmd} {args:?}: {}", text(&o));
    o
}

/// `qemu-img compare` of a raw file with an NBD export; true when identical.
async fn same(file: &Path, uri: &str) -> bool {
    let f = file.to_str().unwrap();
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", f, uri])
        .await
        .status
        .success()
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

async fn write_all(server: &RunningServer, volume: &str, data: &[u8]) {
    let (mut c, _) = NbdClient::connect(server.nbd_addr(), ClientConfig::go(volume))
        .await
        .unwrap();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        c.write((i << 20) as u64, chunk, false)
            .await
            .unwrap()
            .unwrap();
    }
    c.flush().await.unwrap().unwrap();
}

fn config(dir: &Path) -> WeirConfig {
    common::config_from(THIN, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_under_writes_matches_a_copy_taken_at_that_moment() {
    if !require_tool("qemu-img", &["--version"]) {
        return;
    }
    let dir = common::TempDir::new("thin-snap");
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    let size = 16usize << 20;
    let base = random_bytes(1, size);
    write_all(&server, "db", &base).await;
    // QD1 writer: the model, and the one write in flight (if any).
    type State = (Vec<u8>, Option<(usize, Vec<u8>)>);
    let state: Arc<Mutex<State>> = Arc::new(Mutex::new((base, None)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (state, stop, addr) = (state.clone(), stop.clone(), server.nbd_addr());
        tokio::spawn(async move {
            let (mut c, _) = NbdClient::connect(addr, ClientConfig::go("db"))
                .await
                .unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
            let mut writes = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || writes < 50 {
                let len = rng.random_range(1..=96) * 1024;
                let off = rng.random_range(0..(size - len) / 512) * 512;
                let data = random_bytes(rng.random(), len);
                state.lock().unwrap().1 = Some((off, data.clone()));
                c.write(off as u64, &data, false).await.unwrap().unwrap();
                let mut s = state.lock().unwrap();
                s.0[off..off + len].copy_from_slice(&data);
                s.1 = None;
                writes += 1;
            }
            writes
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (without, with) = {
        let s = state.lock().unwrap();
        let snap = server.state().store().snapshot("db", "s1");
        snap.expect("snapshot under writes");
        let mut with = s.0.clone();
        if let Some((off, data)) = &s.1 {
            with[*off..off + data.len()].copy_from_slice(data);
        }
        (s.0.clone(), with)
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert!(writes >= 50);
    let (a, b) = (dir.path().join("without.raw"), dir.path().join("with.raw"));
    std::fs::write(&a, &without).unwrap();
    std::fs::write(&b, &with).unwrap();
    let snap_uri = common::uri(&server, "db@s1");
    assert!(
        same(&a, &snap_uri).await || same(&b, &snap_uri).await,
        "the snapshot is the volume as it was when it was taken"
    );
    // The volume itself moved on; the snapshot refuses writes.
    let now = dir.path().join("now.raw");
    std::fs::write(&now, &state.lock().unwrap().0).unwrap();
    assert!(same(&now, &common::uri(&server, "db")).await);
    let o = run("qemu-io", &["-f", "raw", "-c", "write 0 4k", &snap_uri]).await;
    assert!(
        !o.status.success() || text(&o).contains("failed"),
        "{}",
        text(&o)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_linked_clones_pass_fio_verify_at_once_and_keep_the_image() {
    if !require_tool("fio", &["--version"]) || !require_tool("qemu-img", &["--version"]) {
        return;
    }
    let engines = run("fio", &["--enghelp"]).await;
    if !text(&engines).lines().any(|l| l.trim() == "nbd") {
        println!("skipped: fio built without the nbd engine");
        return;
    }
    let dir = common::TempDir::new("thin-clones");
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    let image = random_bytes(3, 16 << 20);
    write_all(&server, "db", &image).await;
    server.state().store().snapshot("db", "gold").unwrap();
    let names: Vec<String> = (1..=20).map(|i| format!("vm{i:02}")).collect();
    server
        .state()
        .clone_snapshot("db", "gold", &names, None)
        .unwrap();
    // Every clone: random 4 KiB writes over the first 4 MiB, then verify.
    let mut args = vec![
        "--ioengine=nbd".to_string(),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        "--size=4M".into(),
        "--iodepth=8".into(),
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
        "--verify_state_save=0".into(),
        format!("--directory={}", dir.path().display()),
        "--output-format=json".into(),
    ];
    for n in &names {
        args.push(format!("--name={n}"));
        args.push(format!("--uri={}", common::uri(&server, n)));
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run_ok("fio", &argv).await;
    let stdout = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&stdout[stdout.find('{').unwrap_or(0)..]).unwrap();
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 20);
    for job in jobs {
        assert_eq!(job["error"], 0, "{job}");
        assert_eq!(
            job["read"]["io_bytes"],
            4 << 20,
            "verify read everything back"
        );
    }
    // Beyond what fio wrote, each clone still reads the image; the image and its
    // snapshot are untouched.
    let gold = dir.path().join("gold.raw");
    std::fs::write(&gold, &image).unwrap();
    assert!(same(&gold, &common::uri(&server, "db@gold")).await);
    assert!(same(&gold, &common::uri(&server, "db")).await);
    let tail = dir.path().join("tail.raw");
    std::fs::write(&tail, &image[4 << 20..]).unwrap();
    for n in ["vm01", "vm20"] {
        let uri = format!(
            "json:{{\"driver\":\"raw\",\"offset\":{},\"file\":{{\"driver\":\"nbd\",\"server\":{{\"type\":\"inet\",\"host\":\"127.0.0.1\",\"port\":\"{}\"}},\"export\":\"{n}\"}}}}",
            4 << 20,
            server.nbd_addr().port()
        );
        let o = run(
            "qemu-img",
            &["compare", "-f", "raw", tail.to_str().unwrap(), &uri],
        )
        .await;
        assert!(o.status.success(), "{n}: {}", text(&o));
    }
    // The snapshot cannot go while clones read from it.
    let e = server.state().delete_snapshot("db", "gold").unwrap_err();
    assert!(e.to_string().contains("clones"), "{e}");
    let checks = server.state().check_thin().unwrap();
    assert!(checks.iter().all(|c| c.problems.is_empty()), "{checks:?}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_restores_the_exact_bytes_and_everything_survives_a_restart() {
    if !require_tool("qemu-img", &["--version"]) || !require_tool("qemu-io", &["--version"]) {
        return;
    }
    let dir = common::TempDir::new("thin-rollback");
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    let a = random_bytes(4, 16 << 20);
    write_all(&server, "db", &a).await;
    server.state().store().snapshot("db", "before").unwrap();
    let uri = common::uri(&server, "db");
    run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x77 1000 200k",
            "-c",
            "write -z 5M 3M",
            "-c",
            "discard 9M 2M",
            "-c",
            "write -P 0x21 15M 1M",
            &uri,
        ],
    )
    .await;
    let file_a = dir.path().join("a.raw");
    std::fs::write(&file_a, &a).unwrap();
    assert!(!same(&file_a, &uri).await, "the writes changed the volume");
    server.state().store().rollback("db", "before").unwrap();
    assert!(
        same(&file_a, &uri).await,
        "rollback restores the snapshot's bytes"
    );
    // A clone, a second snapshot and a write, then a restart.
    server
        .state()
        .clone_snapshot("db", "before", &["c1".into()], None)
        .unwrap();
    run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x42 0 64k",
            &common::uri(&server, "c1"),
        ],
    )
    .await;
    server.shutdown().await.unwrap();
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    assert!(same(&file_a, &common::uri(&server, "db")).await);
    assert!(same(&file_a, &common::uri(&server, "db@before")).await);
    let o = run(
        "qemu-io",
        &[
            "-r",
            "-f",
            "raw",
            "-c",
            "read -P 0x42 0 64k",
            &common::uri(&server, "c1"),
        ],
    )
    .await;
    assert!(
        o.status.success() && !text(&o).contains("fail"),
        "{}",
        text(&o)
    );
    let checks = server.state().check_thin().unwrap();
    assert!(
        checks
            .iter()
            .all(|c| c.problems.is_empty() && c.orphan_files.is_empty()),
        "{checks:?}"
    );
    // Flatten the clone; then the snapshot has one branch and can go, merged.
    server.state().flatten_volume("c1").unwrap();
    server.state().delete_snapshot("db", "before").unwrap();
    assert!(same(&file_a, &common::uri(&server, "db")).await);
    server.shutdown().await.unwrap();
}

async fn read_all(server: &RunningServer, volume: &str, len: usize) -> Vec<u8> {
    let (mut c, _) = NbdClient::connect(server.nbd_addr(), ClientConfig::go(volume))
        .await
        .unwrap();
    let mut out = Vec::with_capacity(len);
    for at in (0..len).step_by(1 << 20) {
        out.extend(c.read(at as u64, 1 << 20).await.unwrap().unwrap());
    }
    out
}

/// A flatten and a snapshot's merge copy grains without the store's lock: while
/// they copy, the server goes on (other volumes snapshot, clients connect) and the
/// volume itself takes writes — only changes to its layers (snapshot, resize,
/// delete, rollback) are refused, with the reason; the result holds every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flatten_and_merge_copy_without_the_store_lock() {
    use weir_server::store::{DeleteSnapshot, Flatten, StoreError};
    let dir = weir_testkit::TempDir::new("thin-busy");
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    let state = server.state();
    let gold = random_bytes(7, 16 << 20);
    write_all(&server, "db", &gold).await;
    state.store().snapshot("db", "base").unwrap();
    let names = vec!["c1".to_string()];
    state.clone_snapshot("db", "base", &names, None).unwrap();

    let Flatten::Copy(plan) = state.store().flatten_begin("c1").unwrap() else {
        panic!("a clone has layers to copy");
    };
    let refused = |r: Result<_, StoreError>| match r {
        Err(StoreError::Conflict(m)) => assert!(m.contains("being flattened"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a busy volume's layers changed"),
    };
    refused(state.store().snapshot("c1", "x").map(drop));
    refused(state.store().resize("c1", 32 << 20).map(drop));
    refused(state.store().rollback("c1", "x").map(drop));
    refused(state.delete_volume("c1").map(drop));
    refused(state.flatten_volume("c1").map(drop));
    // The rest of the server is not held up.
    state.store().snapshot("db", "meanwhile").unwrap();
    assert!(server.admin_client().list_volumes().await.unwrap().len() >= 2);
    // The clone takes writes before and during the copy.
    let mut expect = gold.clone();
    let (mut c, _) = NbdClient::connect(server.nbd_addr(), ClientConfig::go("c1"))
        .await
        .unwrap();
    let a = random_bytes(8, 64 << 10);
    c.write(0, &a, false).await.unwrap().unwrap();
    expect[..a.len()].copy_from_slice(&a);
    let copy = tokio::task::spawn_blocking(move || {
        let r = plan.copy();
        (plan, r)
    });
    for k in 0..32u64 {
        let at = (1 << 20) + k * (300 << 10);
        let b = random_bytes(100 + k, 4096);
        c.write(at, &b, false).await.unwrap().unwrap();
        expect[at as usize..at as usize + b.len()].copy_from_slice(&b);
    }
    c.flush().await.unwrap().unwrap();
    let (plan, copied) = copy.await.unwrap();
    state.store().flatten_finish(plan, copied).unwrap();
    state.store().snapshot("c1", "x").unwrap();
    assert_eq!(read_all(&server, "c1", 16 << 20).await, expect);

    // db@base now has one branch (db's later state): its deletion merges.
    state.delete_snapshot("db", "meanwhile").unwrap();
    let DeleteSnapshot::Merge(merge) = state.store().delete_snapshot_begin("db", "base").unwrap()
    else {
        panic!("db's top reads from base");
    };
    match state.store().snapshot("db", "y") {
        Err(StoreError::Conflict(m)) => assert!(m.contains("merging a deleted snapshot"), "{m}"),
        other => panic!("{other:?}"),
    }
    let merged = merge.copy();
    let gone = state.store().delete_snapshot_finish(merge, merged).unwrap();
    assert_eq!(gone.name, "base");
    assert_eq!(read_all(&server, "db", 16 << 20).await, gold);
    assert_eq!(read_all(&server, "c1", 16 << 20).await, expect);
    // The admin API's flatten and merging delete (the server's three steps).
    let admin = server.admin_client();
    admin.snapshot("c1", "y").await.unwrap();
    let req = weir_server::admin::CloneRequest {
        names: vec!["c2".into()],
        policy: None,
    };
    admin.clone_snapshot("c1", "y", &req).await.unwrap();
    admin.flatten("c2").await.unwrap();
    admin.delete_snapshot("c1", "x").await.unwrap();
    assert_eq!(read_all(&server, "c2", 16 << 20).await, expect);
    assert_eq!(read_all(&server, "c1", 16 << 20).await, expect);
    let checks = state.check_thin().unwrap();
    assert!(
        checks
            .iter()
            .all(|c| c.problems.is_empty() && c.orphan_files.is_empty()),
        "{checks:?}"
    );
    server.shutdown().await.unwrap();
}

/// A snapshot deleted while replication collapses the released layer below it
/// (found by the SIGKILL crash test as "durable write lost"): the collapse
/// relabels the snapshot onto the merged-into layer while the deletion copies
/// the old layer into its child; the deletion must not then drop the layer the
/// snapshot moved to, whose own grains were never copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_deleted_during_a_replication_collapse_below_it_keeps_the_data() {
    use weir_server::replicate::NbdUrl;
    use weir_server::store::{DeleteSnapshot, StoreError};
    let dir = weir_testkit::TempDir::new("thin-collapse-race");
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    let state = server.state();
    // The oldest data (only in the layer replication will release) ...
    let mut expect = random_bytes(11, 4 << 20);
    write_all(&server, "db", &expect).await;
    let to = NbdUrl::parse("nbd://127.0.0.1:9/nowhere").unwrap();
    state
        .store()
        .put_replication("db", &to, None, false)
        .unwrap();
    let first = state.store().replication_begin("db").unwrap();
    state
        .store()
        .replication_finish("db", &first.snapshot.name)
        .unwrap();
    // ... newer data under a user snapshot ...
    let (mut c, _) = NbdClient::connect(server.nbd_addr(), ClientConfig::go("db"))
        .await
        .unwrap();
    let newer = random_bytes(12, 64 << 10);
    c.write(1 << 20, &newer, false).await.unwrap().unwrap();
    c.flush().await.unwrap().unwrap();
    expect[1 << 20..(1 << 20) + newer.len()].copy_from_slice(&newer);
    state.store().snapshot("db", "s").unwrap();
    // ... and a second cycle, which releases the first one's snapshot.
    let second = state.store().replication_begin("db").unwrap();
    state
        .store()
        .replication_finish("db", &second.snapshot.name)
        .unwrap();
    // The collapse copies "s" up into the released layer, outside the lock;
    // meanwhile "s" is deleted (merged into its child), then the collapse's
    // relabel lands before the deletion's last step.
    let collapse = state
        .store()
        .replication_collapse_next("db")
        .unwrap()
        .expect("the released layer collapses");
    weir_thin::commit_into(
        &collapse.parent_layer,
        &collapse.child_layer,
        collapse.parent_is_base,
        collapse.cache.as_deref(),
    )
    .unwrap();
    let DeleteSnapshot::Merge(plan) = state.store().delete_snapshot_begin("db", "s").unwrap()
    else {
        panic!("the next snapshot's layer reads from s");
    };
    let merged = plan.copy();
    assert!(state.store().replication_relabel(&collapse).unwrap());
    match state.store().delete_snapshot_finish(plan, merged) {
        Err(StoreError::Conflict(m)) => assert!(m.contains("try again"), "{m}"),
        other => panic!("the deletion went on over a moved snapshot: {other:?}"),
    }
    assert_eq!(read_all(&server, "db", 4 << 20).await, expect);
    // Deleted again, from its new layer, nothing is lost either.
    state.delete_snapshot("db", "s").unwrap();
    assert_eq!(read_all(&server, "db", 4 << 20).await, expect);
    for check in state.check_thin().unwrap() {
        assert!(check.problems.is_empty(), "{check:?}");
    }
}

/// `weir volume check` reads the layers without the store's lock (with
/// thousands of layers it took seconds in which no client could open a volume):
/// clones deleted and made while it runs are neither problems nor orphans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_runs_without_the_store_lock_while_clones_come_and_go() {
    let dir = weir_testkit::TempDir::new("thin-check-unlocked");
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    let state = server.state();
    write_all(&server, "db", &random_bytes(3, 4 << 20)).await;
    state.store().snapshot("db", "gold").unwrap();
    let names: Vec<String> = (1..=4).map(|i| format!("c{i}")).collect();
    state.clone_snapshot("db", "gold", &names, None).unwrap();
    for n in &names {
        write_all(&server, n, &[7; 1 << 20]).await;
    }
    let plan = state.store().check_thin_begin();
    // Between the catalog read and the files read: one clone goes, one comes
    // and is written (its layer files appear).
    state.delete_volume("c1").unwrap();
    state
        .clone_snapshot("db", "gold", &["c5".to_string()], None)
        .unwrap();
    write_all(&server, "c5", &[9; 1 << 20]).await;
    let ran = tokio::task::spawn_blocking(move || plan.run())
        .await
        .unwrap()
        .unwrap();
    let checks = state.store().check_thin_finish(ran);
    assert!(
        checks
            .iter()
            .all(|c| c.problems.is_empty() && c.orphan_files.is_empty()),
        "{checks:?}"
    );
    // And the whole check, as the admin API runs it, after.
    let checks = state.check_thin().unwrap();
    assert!(checks.iter().all(|c| c.problems.is_empty()), "{checks:?}");
    server.shutdown().await.unwrap();
}

/// A rollback of a volume a caching gateway holds the exclusive lease of is
/// refused (the gateway's cache would keep serving the data the rollback takes
/// back: session 30 read 0x02 through the gateway, 0x01 directly); after the
/// lease is broken it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_volume_is_not_rolled_back_under_its_gateway() {
    let dir = common::TempDir::new("thin-rollback-leased");
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    write_all(&server, "db", &[1; 1 << 20]).await;
    let state = server.state();
    state.store().snapshot("db", "before").unwrap();
    let leased = ClientConfig {
        meta_contexts: vec!["weir:exclusive=gw".into()],
        ..ClientConfig::go("db")
    };
    let (mut gateway, export) = NbdClient::connect(server.nbd_addr(), leased).await.unwrap();
    assert!(export.export_info().exclusive_lease.is_some());
    gateway.write(0, &[2; 4096], false).await.unwrap().unwrap();
    let e = state
        .rollback_volume("db", "before")
        .unwrap_err()
        .to_string();
    assert!(e.contains("break-lease") && e.contains("leased"), "{e}");
    assert_eq!(gateway.read(0, 4).await.unwrap().unwrap(), vec![2; 4]);
    state.leases.break_lease("db");
    state.rollback_volume("db", "before").unwrap();
    let (mut c, _) = NbdClient::connect(server.nbd_addr(), ClientConfig::go("db"))
        .await
        .unwrap();
    assert_eq!(c.read(0, 4).await.unwrap().unwrap(), vec![1; 4]);
    server.shutdown().await.unwrap();
}

/// A data directory whose metadata file is gone but whose pools hold volume
/// files is refused at start, the files untouched (session 30: every thin layer
/// was deleted as an orphan, and a volume declared anew read an old one's data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_catalog_is_refused_not_taken_for_a_new_directory() {
    let dir = common::TempDir::new("thin-lost-meta");
    let server = RunningServer::start(config(dir.path())).await.unwrap();
    write_all(&server, "db", &[7; 1 << 20]).await;
    server.shutdown().await.unwrap();
    let files = |d: &Path| {
        let mut v = Vec::new();
        for e in walk(d) {
            v.push((e.clone(), std::fs::metadata(&e).unwrap().len()));
        }
        v.sort();
        v
    };
    let before = files(&dir.path().join("pools"));
    assert!(!before.is_empty());
    std::fs::remove_file(dir.path().join("weir-meta.json")).unwrap();
    let e = RunningServer::start(config(dir.path()))
        .await
        .err()
        .expect("started without its catalog");
    let e = format!("{e:#}");
    assert!(
        e.contains("weir-meta.json is missing") && e.contains("Restore"),
        "{e}"
    );
    assert_eq!(files(&dir.path().join("pools")), before, "files changed");
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}
