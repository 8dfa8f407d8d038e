//! Crash test (issue 3, "Prove it"): `weir serve` is killed with SIGKILL in the
//! middle of a verified write workload, many times; after each restart every write
//! acknowledged by a FLUSH or written with FUA must be intact, and the volume
//! metadata (volumes created through the admin API and acknowledged) must be too.
//!
//! The suite runs a short version (`WEIR_CRASH_CYCLES`, default 12 cycles);
//! `bench/crash-test.sh` runs the long one (≥ 200 cycles) in release mode.
//!
//! Model: the volume is split into 4 KiB blocks; every write fills one block with
//! a self-describing pattern (block index, global sequence number, then bytes
//! derived from both). A block is never rewritten while a write to it is in
//! flight. After a crash a block must hold either its last durable write (or a
//! later write that was sent to it — those may or may not have reached the file),
//! or zeroes if no write to it was ever durable.
//!
//! The thin version runs the same workload on a linked clone of a golden image,
//! beside a sibling clone written with its own sequence numbers, while snapshots
//! of the clone are taken and deleted (merged down) through the admin API: a
//! block must also never show the sibling's data (a grain of another volume),
//! blocks never durably written must still read the golden image, and the
//! server's consistency check (maps, files, layer references) must pass after
//! every restart.
//!
//! The replicated version adds an asynchronous replication of the clone to a
//! second `weir serve` (never killed, slow enough that kills land mid-cycle): the
//! snapshots the replication names survive every restart, and after the resumed
//! cycle and a new one finish, the target equals the last replicated snapshot.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Rng, WeirProcess};
use weir_server::admin;
use weir_server::nbd_client::NbdClient;
use weir_server::store::VolumeCreate;

const BLOCK: usize = 4096;
const VOLUME_BYTES: u64 = 8 << 20;
const BLOCKS: u64 = VOLUME_BYTES / BLOCK as u64;
const QUEUE_DEPTH: usize = 16;

fn pattern(block: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    b[..8].copy_from_slice(&block.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ block ^ 0xD1B5_4A32_D192_ED03;
    for chunk in b[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    b
}

/// What the workload knows; shared with the test so writes acknowledged right
/// up to the kill are counted.
#[derive(Clone, Default)]
struct Model {
    /// Highest durable sequence per block.
    durable: HashMap<u64, u64>,
    /// Every sequence ever sent to a block (acknowledged or not).
    sent: HashMap<u64, HashSet<u64>>,
    /// Acknowledged, not yet covered by a FLUSH that was sent after the ack.
    acked_not_durable: Vec<(u64, u64)>,
    durable_writes: u64,
    fua_writes: u64,
    flushes: u64,
    /// Volumes whose creation the admin API acknowledged.
    created_volumes: Vec<String>,
}

impl Model {
    fn make_durable(&mut self, block: u64, seq: u64) {
        let d = self.durable.entry(block).or_insert(0);
        if seq > *d {
            *d = seq;
        }
        self.durable_writes += 1;
    }
}

/// Pipelined writes (some FUA) with periodic FLUSHes until the connection dies.
async fn workload(
    addr: std::net::SocketAddr,
    volume: &'static str,
    model: Arc<Mutex<Model>>,
    seed: u64,
    first_seq: u64,
) {
    let Ok((mut c, _)) = NbdClient::connect(addr, weir_nbd::ClientConfig::go(volume)).await else {
        return;
    };
    let mut rng = Rng::new(seed);
    let mut seq = first_seq;
    // handle → (block, seq, fua) for writes; flush handle → batch it covers.
    let mut writes: HashMap<u64, (u64, u64, bool)> = HashMap::new();
    let mut flushes: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut busy_blocks: HashSet<u64> = HashSet::new();
    loop {
        while writes.len() + flushes.len() < QUEUE_DEPTH {
            if rng.below(10) == 0 {
                let batch = std::mem::take(&mut model.lock().unwrap().acked_not_durable);
                let h = c.session().flush();
                flushes.insert(h, batch);
                continue;
            }
            let block = rng.below_except(BLOCKS, &busy_blocks);
            seq += 1;
            let fua = rng.below(8) == 0;
            model
                .lock()
                .unwrap()
                .sent
                .entry(block)
                .or_default()
                .insert(seq);
            let h = c
                .session()
                .write(block * BLOCK as u64, &pattern(block, seq), fua);
            busy_blocks.insert(block);
            writes.insert(h, (block, seq, fua));
        }
        let Ok(done) = c.next_completion().await else {
            return;
        };
        let mut m = model.lock().unwrap();
        if let Some((block, s, fua)) = writes.remove(&done.handle) {
            busy_blocks.remove(&block);
            assert!(done.result.is_ok(), "write failed: {:?}", done.result);
            if fua {
                m.fua_writes += 1;
                m.make_durable(block, s);
            } else {
                m.acked_not_durable.push((block, s));
            }
        } else if let Some(batch) = flushes.remove(&done.handle) {
            assert!(done.result.is_ok(), "flush failed: {:?}", done.result);
            m.flushes += 1;
            for (block, s) in batch {
                m.make_durable(block, s);
            }
        }
    }
}

/// Creates volumes through the admin API until the server dies.
async fn metadata_workload(client: admin::Client, model: Arc<Mutex<Model>>, cycle: u32) {
    for i in 0.. {
        let name = format!("meta-{cycle}-{i}");
        let req = VolumeCreate {
            name: name.clone(),
            size_bytes: 1 << 20,
            policy: "non-critical".into(),
            pool: None,
            access_groups: vec![],
            read_only: false,
            description: String::new(),
            cache: Default::default(),
        };
        match client.create_volume(&req).await {
            Ok(_) => model.lock().unwrap().created_volumes.push(name),
            Err(_) => return,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a block holds before any write reached it: zeroes, or (a clone) the
/// golden image's pattern, sequence 0.
#[derive(Clone, Copy, PartialEq)]
enum Base {
    Zeroes,
    Golden,
}

/// Reads the whole volume and checks every block against the model.
async fn verify(
    proc: &WeirProcess,
    volume: &str,
    base: Base,
    model: &Model,
) -> Result<u64, String> {
    let (mut c, export) = NbdClient::connect(proc.nbd_addr, weir_nbd::ClientConfig::go(volume))
        .await
        .map_err(|e| format!("connect after restart: {e:#}"))?;
    if export.size_bytes != VOLUME_BYTES {
        return Err(format!(
            "volume size is {} after restart",
            export.size_bytes
        ));
    }
    let chunk = 1u64 << 20;
    let mut checked = 0;
    for start in (0..VOLUME_BYTES).step_by(chunk as usize) {
        let data = c
            .read(start, chunk as u32)
            .await
            .map_err(|e| format!("read: {e:#}"))?
            .map_err(|e| format!("read error: {e}"))?;
        for (i, block_data) in data.chunks(BLOCK).enumerate() {
            let block = start / BLOCK as u64 + i as u64;
            let durable = model.durable.get(&block).copied();
            let untouched = match base {
                Base::Zeroes => block_data.iter().all(|&b| b == 0),
                Base::Golden => block_data == pattern(block, 0).as_slice(),
            };
            if untouched {
                if let Some(d) = durable {
                    return Err(format!(
                        "block {block}: durable write {d} lost (reads as never written)"
                    ));
                }
                continue;
            }
            let b = u64::from_le_bytes(block_data[..8].try_into().unwrap());
            let seq = u64::from_le_bytes(block_data[8..16].try_into().unwrap());
            if b != block || block_data != pattern(block, seq).as_slice() {
                return Err(format!(
                    "block {block}: corrupt content (header block {b} seq {seq})"
                ));
            }
            if !model.sent.get(&block).is_some_and(|s| s.contains(&seq)) {
                return Err(format!(
                    "block {block}: holds seq {seq:#x}, never written there (another volume's data?)"
                ));
            }
            if let Some(d) = durable
                && seq < d
            {
                return Err(format!(
                    "block {block}: holds seq {seq}, older than durable {d}"
                ));
            }
            if durable.is_some() {
                checked += 1;
            }
        }
    }
    c.disconnect().await.map_err(|e| format!("{e:#}"))?;
    Ok(checked)
}

/// The catalog after a restart: the volume and every volume the admin API
/// acknowledged are there; thin pools pass the consistency check.
async fn verify_catalog(proc: &WeirProcess, model: &Model) -> Result<(), String> {
    let client = proc.admin_client();
    for p in client.check().await.map_err(|e| format!("check: {e}"))? {
        if !p.problems.is_empty() || !p.orphan_files.is_empty() {
            return Err(format!(
                "pool {}: {:?} orphans {:?}",
                p.pool, p.problems, p.orphan_files
            ));
        }
    }
    let volumes = proc
        .admin_client()
        .list_volumes()
        .await
        .map_err(|e| format!("admin list after restart: {e}"))?;
    let crash = volumes.iter().find(|v| v.name == "crash");
    if crash.is_none_or(|v| v.size_bytes != VOLUME_BYTES || v.policy != "open") {
        return Err(format!("volume metadata changed: {crash:?}"));
    }
    for name in &model.created_volumes {
        if !volumes.iter().any(|v| &v.name == name) {
            return Err(format!("acknowledged volume {name:?} lost"));
        }
    }
    Ok(())
}

/// Takes a snapshot of the clone every few milliseconds and deletes the one
/// before (merging it into the clone's live top) until the server dies.
async fn snapshot_workload(client: admin::Client, cycle: u32) {
    let Ok(existing) = client.snapshots(Some("crash")).await else {
        return;
    };
    // Replication's snapshots are its own to release.
    let mut previous: Vec<String> = existing
        .into_iter()
        .map(|s| s.name)
        .filter(|n| !n.starts_with("repl-"))
        .collect();
    for i in 0.. {
        let name = format!("c{cycle}-{i}");
        if client.snapshot("crash", &name).await.is_err() {
            return;
        }
        for old in std::mem::take(&mut previous) {
            if client.delete_snapshot("crash", &old).await.is_err() {
                return;
            }
        }
        previous.push(name);
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}

fn cycles() -> u32 {
    std::env::var("WEIR_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let config = r#"
[[pools]]
name = "default"
max_in_flight = 32

[[policies]]
name = "open"

[[volumes]]
name = "crash"
size = "8MiB"
policy = "open"
"#;
    crash_cycles("cli-crash", config, false, false);
}

/// A hybrid pool whose flash holds 16 of the volume's 128 extents, with heat
/// that cools within a second: the workload keeps promoting, destaging and
/// demoting while the server is killed; then `fio --verify` through it.
#[test]
fn hybrid_pool_writes_survive_sigkill_during_promotion_and_demotion() {
    let flash = common::TempDir::new("cli-crash-hybrid-flash");
    let config = format!(
        r#"
[[pools]]
name = "default"
max_in_flight = 32
tier = {{ flash_dir = "{}", flash_size = "1MiB", extent = "64KiB", promote_heat = 2, half_life_s = 1, migration_mbps = 1000 }}

[[policies]]
name = "open"

[[volumes]]
name = "crash"
size = "8MiB"
policy = "open"
"#,
        flash.path().display()
    );
    crash_cycles("cli-crash-hybrid", &config, false, false);
    let journal = flash.path().join("default.weir-tier-map");
    let len = std::fs::metadata(&journal).map(|m| m.len()).unwrap_or(0);
    assert!(
        len > 32,
        "no extent ever reached flash ({len} bytes of journal)"
    );
    // fio's own verify through a fresh hybrid pool under the same churn (a
    // flash dir belongs to one data dir: the old one is gone with its volumes).
    let dir = common::TempDir::new("cli-crash-hybrid-fio");
    let fresh = flash.path().display().to_string();
    let config = config.replace(&fresh, &dir.path().join("flash").display().to_string());
    let proc = WeirProcess::start(dir.path(), &config);
    common::fio_verify(proc.nbd_addr, "crash", dir.path());
}

const THIN_CONFIG: &str = r#"
[[pools]]
name = "default"
format = "thin"
max_in_flight = 32
clone_cache = "4MiB"

[[policies]]
name = "open"

[[volumes]]
name = "gold"
size = "8MiB"
policy = "open"
"#;

/// The golden image (every block at sequence 0), its snapshot, and two linked
/// clones of it: `crash` (verified) and `other` (its sibling).
async fn thin_setup(proc: &WeirProcess) {
    let (mut c, _) = NbdClient::connect(proc.nbd_addr, weir_nbd::ClientConfig::go("gold"))
        .await
        .unwrap();
    for block in 0..BLOCKS {
        c.write(block * BLOCK as u64, &pattern(block, 0), false)
            .await
            .unwrap()
            .unwrap();
    }
    c.flush().await.unwrap().unwrap();
    c.disconnect().await.unwrap();
    let client = proc.admin_client();
    client.snapshot("gold", "base").await.unwrap();
    let req = admin::CloneRequest {
        names: vec!["crash".into(), "other".into()],
        policy: None,
    };
    client.clone_snapshot("gold", "base", &req).await.unwrap();
}

#[test]
fn thin_clone_writes_survive_sigkill_beside_a_sibling_and_snapshots() {
    crash_cycles("cli-crash-thin", THIN_CONFIG, true, false);
}

/// The thin test with the clone replicated to a second `weir serve` (limited to
/// 16 MB/s, so that most kills land in the middle of a cycle): after every
/// restart the replication's snapshots are there, and every few cycles, once the
/// resumed cycle and a new one have finished, the target holds the last
/// replicated snapshot byte for byte (a torn or misplaced resume would show).
#[test]
fn replicated_clone_survives_sigkill_mid_cycle() {
    crash_cycles("cli-crash-repl", THIN_CONFIG, true, true);
}

/// The replication target: a second server, never killed.
const TARGET_CONFIG: &str = r#"
[[pools]]
name = "default"

[[policies]]
name = "slow"
limit_mbps = 16

[[volumes]]
name = "dr"
size = "8MiB"
policy = "slow"
"#;

fn replicate_now(target: std::net::SocketAddr) -> weir_server::replicate::ReplicationRequest {
    weir_server::replicate::ReplicationRequest {
        to: format!("nbd://{target}/dr"),
        every_seconds: Some(3600),
        once: true,
        overwrite: false,
    }
}

/// After a restart: the snapshots the replication names exist; with `settle`,
/// a new cycle is asked for and awaited (after the resumed one, if any), then
/// the target must equal the last replicated snapshot. Returns whether a cycle
/// was in progress at the restart, and the cycles that finished while waiting.
async fn verify_replication(
    proc: &WeirProcess,
    target: std::net::SocketAddr,
    settle: bool,
) -> Result<(bool, u64), String> {
    let client = proc.admin_client();
    let mut status = client
        .replication("crash")
        .await
        .map_err(|e| format!("replication status: {e}"))?;
    let snaps: HashSet<String> = client
        .snapshots(Some("crash"))
        .await
        .map_err(|e| format!("snapshots: {e}"))?
        .into_iter()
        .map(|s| format!("crash@{}", s.name))
        .collect();
    for s in [&status.pending_snapshot, &status.last_snapshot]
        .into_iter()
        .flatten()
    {
        if !snaps.contains(s) {
            return Err(format!("replication names {s}, which is gone: {status:?}"));
        }
    }
    let pending = status.pending_snapshot.is_some();
    if !settle {
        return Ok((pending, 0));
    }
    let asked = client
        .replicate("crash", &replicate_now(target))
        .await
        .map_err(|e| format!("replicate: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while status.cycles_ok <= asked.cycles_started || status.pending_snapshot.is_some() {
        if Instant::now() > deadline {
            return Err(format!("replication did not settle: {status:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        status = client
            .replication("crash")
            .await
            .map_err(|e| format!("replication status: {e}"))?;
    }
    let last = status
        .last_snapshot
        .clone()
        .ok_or("no snapshot replicated")?;
    let (mut src, _) = NbdClient::connect(proc.nbd_addr, weir_nbd::ClientConfig::go(&last))
        .await
        .map_err(|e| format!("connect to {last}: {e:#}"))?;
    let (mut dst, _) = NbdClient::connect(target, weir_nbd::ClientConfig::go("dr"))
        .await
        .map_err(|e| format!("connect to the target: {e:#}"))?;
    let chunk = 1u32 << 20;
    for start in (0..VOLUME_BYTES).step_by(chunk as usize) {
        let a = src.read(start, chunk).await.map_err(|e| format!("{e:#}"))?;
        let b = dst.read(start, chunk).await.map_err(|e| format!("{e:#}"))?;
        let (a, b) = (a.map_err(|e| e.to_string())?, b.map_err(|e| e.to_string())?);
        if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
            return Err(format!(
                "target differs from {last} at byte {} ({status:?})",
                start + i as u64
            ));
        }
    }
    let _ = src.disconnect().await;
    let _ = dst.disconnect().await;
    Ok((pending, status.cycles_ok))
}

/// SIGKILLs `weir serve` under the write workload `cycles()` times, verifying
/// after every restart. `thin`: the volume is a clone beside a sibling clone,
/// with snapshots taken and merged away meanwhile.
fn crash_cycles(tag: &str, config: &str, thin: bool, replicate: bool) {
    let cycles = cycles();
    let dir = common::TempDir::new(tag);
    let target_dir = common::TempDir::new(&format!("{tag}-target"));
    let target = replicate.then(|| WeirProcess::start(target_dir.path(), TARGET_CONFIG));
    let target_addr = target.as_ref().map(|t| t.nbd_addr);
    let (mut settled, mut replicated_cycles, mut mid_cycle) = (0u32, 0u64, 0u32);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let model = Arc::new(Mutex::new(Model::default()));
    let sibling = Arc::new(Mutex::new(Model::default()));
    let base = if thin { Base::Golden } else { Base::Zeroes };
    let mut rng = Rng::new(0x5eed);
    let start = Instant::now();
    let mut verified_blocks = 0u64;
    let mut failures = Vec::new();
    // Every block the model holds durable must read back from a restarted server.
    let mut check_durable = |proc: &WeirProcess, when: &str, settle: bool| {
        rt.block_on(async {
            if let Some(t) = target_addr {
                match verify_replication(proc, t, settle).await {
                    Ok((pending, n)) => {
                        mid_cycle += u32::from(pending);
                        settled += u32::from(settle);
                        replicated_cycles += n;
                    }
                    Err(e) => failures.push(format!("{when}: {e}")),
                }
            }
            let snapshot = model.lock().unwrap().clone();
            let mut r = verify(proc, "crash", base, &snapshot).await;
            if thin && r.is_ok() {
                let other = sibling.lock().unwrap().clone();
                if let Err(e) = verify(proc, "other", base, &other).await {
                    r = Err(format!("sibling: {e}"));
                }
            }
            match r {
                Ok(n) => verified_blocks += n,
                Err(e) => failures.push(format!("{when}: {e}")),
            }
            if let Err(e) = verify_catalog(proc, &snapshot).await {
                failures.push(format!("{when}: {e}"));
            }
        })
    };
    for cycle in 0..cycles {
        let mut proc = WeirProcess::start(dir.path(), config);
        if thin && cycle == 0 {
            rt.block_on(thin_setup(&proc));
            if let Some(t) = target_addr {
                rt.block_on(proc.admin_client().replicate("crash", &replicate_now(t)))
                    .unwrap();
            }
        }
        check_durable(&proc, &format!("cycle {cycle}"), cycle % 4 == 3);
        let run_ms = 30 + rng.below(250);
        let w = rt.spawn(workload(
            proc.nbd_addr,
            "crash",
            model.clone(),
            rng.next(),
            (cycle as u64 + 1) << 32,
        ));
        // The sibling's sequence numbers carry bit 62: never the clone's.
        let sib = thin.then(|| {
            rt.spawn(workload(
                proc.nbd_addr,
                "other",
                sibling.clone(),
                rng.next(),
                (1 << 62) | ((cycle as u64 + 1) << 32),
            ))
        });
        let m = (cycle % 3 == 0)
            .then(|| rt.spawn(metadata_workload(proc.admin_client(), model.clone(), cycle)));
        let snaps = thin.then(|| rt.spawn(snapshot_workload(proc.admin_client(), cycle)));
        // A replication cycle from the start (or the resumed one goes on).
        let repl = target_addr.map(|t| {
            let client = proc.admin_client();
            rt.spawn(async move { client.replicate("crash", &replicate_now(t)).await })
        });
        std::thread::sleep(Duration::from_millis(run_ms));
        proc.kill();

        rt.block_on(async {
            let _ = w.await;
            for t in [sib, m, snaps].into_iter().flatten() {
                let _ = t.await;
            }
            if let Some(r) = repl {
                let _ = r.await;
            }
        });
        // Acknowledged writes no FLUSH covered before the kill are not durable:
        // a FLUSH on the restarted server does not cover them (a thin volume's
        // uncommitted grains are gone; a plain file's page cache happens to keep them).
        model.lock().unwrap().acked_not_durable.clear();
        sibling.lock().unwrap().acked_not_durable.clear();
    }
    // Last restart: the final kill's writes must be there too.
    let mut proc = WeirProcess::start(dir.path(), config);
    check_durable(&proc, "after the last cycle", true);
    proc.kill();
    drop(target);
    if replicate {
        println!(
            "crash test ({tag}): {mid_cycle} restarts with a replication cycle to resume; \
             target compared with the last replicated snapshot {settled} times, \
             {replicated_cycles} cycles finished while settling"
        );
        assert!(settled > 0 && replicated_cycles > 0 && mid_cycle > 0);
    }
    let m = model.lock().unwrap();
    println!(
        "crash test ({tag}): {cycles} SIGKILL cycles in {:.1} s; {} durable writes ({} FUA, {} flushes), \
         {verified_blocks} durable blocks verified, {} volumes created, {} failures",
        start.elapsed().as_secs_f64(),
        m.durable_writes,
        m.fua_writes,
        m.flushes,
        m.created_volumes.len(),
        failures.len()
    );
    assert!(
        m.durable_writes > 0,
        "the workload never made a write durable"
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
