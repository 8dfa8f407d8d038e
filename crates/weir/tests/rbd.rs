//! Weir on Ceph RBD (`backend = "rbd"`, docs/RBD.md), against a real cluster:
//! the dev cluster of `scripts/ceph-dev.sh`, which `.ci/run` starts and names in
//! `WEIR_CEPH_CONF`, `WEIR_CEPH_KEYRING`, `WEIR_CEPH_CLIENT` and
//! `WEIR_CEPH_POOL` (`eval "$(scripts/ceph-dev.sh env)"` by hand). Without one
//! the cluster tests print "skipped: <why>" (`WEIR_CEPH_SKIP` carries .ci/run's
//! reason); the configuration checks run everywhere.
//!
//! - interop: qemu-img, qemu-io, nbdcopy and fio --verify through Weir on RBD,
//!   the data checked on the cluster with `rbd export`; create, resize and
//!   delete through the admin API reach the images;
//! - snapshots and clones: RBD snapshots exported as `volume@snapshot` (also
//!   after a restart), layered clones, flatten, rollback, delete-snapshot
//!   refused while clones read from it, checked with qemu-io and `rbd info`;
//! - crash: `weir serve` killed with SIGKILL under a pipelined write load with
//!   periodic FLUSHes, restarted on the same data directory: every write
//!   acknowledged before an acknowledged FLUSH is there, no block holds data
//!   never written to it.
//! - a full pool (quota) answers ENOSPC; a stopped monitor or OSD (SIGSTOP, in
//!   tests that run alone: [`Cluster::exclusive`]) holds neither the admin API
//!   nor other pools' clients.

mod common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use common::{Rng, WeirProcess};
use weir_nbd::{ClientConfig, ReplyData};
use weir_server::nbd_client::NbdClient;
use weir_server::store::VolumeCreate;

/// Where the dev cluster is.
struct Cluster {
    conf: String,
    keyring: String,
    client: String,
    pool: String,
    /// [`CLUSTER_USE`], shared (most tests) or exclusive (a test stopping a
    /// daemon of the cluster).
    _use: ClusterUse,
}

/// The tests of this file run at once on one cluster; one that stops a daemon
/// ([`Cluster::exclusive`]) runs alone.
static CLUSTER_USE: RwLock<()> = RwLock::new(());

#[allow(dead_code)] // held for its Drop
enum ClusterUse {
    Shared(RwLockReadGuard<'static, ()>),
    Exclusive(RwLockWriteGuard<'static, ()>),
}

impl Cluster {
    /// The cluster named by the environment, or `None` after printing why not.
    fn from_env() -> Option<Cluster> {
        let shared = CLUSTER_USE.read().unwrap_or_else(|e| e.into_inner());
        Self::with_use(ClusterUse::Shared(shared))
    }

    /// As [`Cluster::from_env`], once no other test of this file uses it.
    fn exclusive() -> Option<Cluster> {
        let alone = CLUSTER_USE.write().unwrap_or_else(|e| e.into_inner());
        Self::with_use(ClusterUse::Exclusive(alone))
    }

    fn with_use(_use: ClusterUse) -> Option<Cluster> {
        if let Ok(why) = std::env::var("WEIR_CEPH_SKIP") {
            println!("skipped: {why}");
            return None;
        }
        let Ok(conf) = std::env::var("WEIR_CEPH_CONF") else {
            println!(
                "skipped: no Ceph cluster: WEIR_CEPH_CONF is not set (scripts/ceph-dev.sh start, \
                 then eval \"$(scripts/ceph-dev.sh env)\")"
            );
            return None;
        };
        let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
        Some(Cluster {
            conf,
            keyring: var("WEIR_CEPH_KEYRING", ""),
            client: var("WEIR_CEPH_CLIENT", "admin"),
            pool: var("WEIR_CEPH_POOL", "weir"),
            _use,
        })
    }

    fn pool_toml(&self) -> String {
        self.pool_toml_on(&self.pool)
    }

    /// A Weir pool "ceph" on the RADOS pool `rados_pool`.
    fn pool_toml_on(&self, rados_pool: &str) -> String {
        let keyring = if self.keyring.is_empty() {
            String::new()
        } else {
            format!("rbd_keyring = \"{}\"\n", self.keyring)
        };
        format!(
            "[[pools]]\nname = \"ceph\"\nbackend = \"rbd\"\nrbd_pool = \"{}\"\n\
             rbd_ceph_conf = \"{}\"\nrbd_client = \"{}\"\n{keyring}",
            rados_pool, self.conf, self.client
        )
    }

    /// Runs the `ceph` tool on the cluster; `None` if it is not installed.
    fn ceph(&self, args: &[&str]) -> Option<std::process::Output> {
        let mut cmd = Command::new("ceph");
        cmd.args(["-c", &self.conf, "--id", &self.client]);
        if !self.keyring.is_empty() {
            cmd.args(["-k", &self.keyring]);
        }
        cmd.args(args).output().ok()
    }

    /// As [`Cluster::ceph`], asserting success.
    fn ceph_ok(&self, args: &[&str]) -> String {
        let out = self.ceph(args).expect("the ceph tool runs");
        assert!(out.status.success(), "ceph {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether RADOS pool `pool` carries the `full_quota` flag (its quota reached).
    fn pool_full(&self, pool: &str) -> bool {
        self.ceph_ok(&["osd", "dump"])
            .lines()
            .any(|l| l.contains(&format!("'{pool}'")) && l.contains("full_quota"))
    }

    /// Waits (at most 60 s) until `pool`'s `full_quota` flag is `full`.
    fn wait_pool_full(&self, pool: &str, full: bool) {
        let start = Instant::now();
        while self.pool_full(pool) != full {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "RADOS pool {pool}: full_quota not {full} after 60 s"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Runs the `rbd` tool on the cluster; `None` if it is not installed.
    fn rbd(&self, args: &[&str]) -> Option<std::process::Output> {
        let mut cmd = Command::new("rbd");
        cmd.args(["-c", &self.conf, "--id", &self.client]);
        if !self.keyring.is_empty() {
            cmd.args(["-k", &self.keyring]);
        }
        cmd.args(args).output().ok()
    }

    fn images(&self) -> Option<Vec<String>> {
        let out = self.rbd(&["ls", &self.pool])?;
        assert!(out.status.success(), "rbd ls: {out:?}");
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect(),
        )
    }
}

/// A volume (image) name no other run uses: the cluster outlives test runs.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{what}-{}-{nanos:x}", std::process::id())
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        let x = rng.next().to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
    v
}

#[test]
fn rbd_pool_keys_are_checked_and_a_bad_cluster_stops_the_start_with_the_reason() {
    for (toml, want) in [
        (
            "[[pools]]\nname = \"c\"\nbackend = \"rbd\"\n",
            "rbd_pool: required with backend = \"rbd\"",
        ),
        (
            "[[pools]]\nname = \"c\"\nrbd_pool = \"weir\"\n",
            "rbd_pool: only for a pool with backend = \"rbd\"",
        ),
        (
            "[[pools]]\nname = \"c\"\nbackend = \"rbd\"\nrbd_pool = \"w\"\nformat = \"thin\"\n",
            "format = \"thin\" is for file pools",
        ),
        (
            "[[pools]]\nname = \"c\"\nbackend = \"rbd\"\nrbd_pool = \"w\"\nupstream = \"nbd://h\"\n",
            "two different bottoms",
        ),
        (
            "[[pools]]\nname = \"c\"\nbackend = \"rbd\"\nrbd_pool = \"w\"\nrbd_client = \"a b\"\n",
            "rbd_client",
        ),
        (
            "[[pools]]\nname = \"c\"\nbackend = \"rbd\"\nrbd_pool = \"w\"\nrbd_connect_timeout_s = 0\n",
            "rbd_connect_timeout_s: must be 1-3600",
        ),
        (
            "[[pools]]\nname = \"c\"\nbackend = \"ceph\"\n",
            "expected `file` or `rbd`",
        ),
    ] {
        let e = weir_server::WeirConfig::from_toml_str(toml, "w.toml").unwrap_err();
        assert!(e.to_string().contains(want), "{toml}: {e}");
    }
    // A configuration file that is not there: `weir serve` refuses to start and
    // says why (or, without librbd, that librbd is missing).
    let dir = common::TempDir::new("rbd-bad-conf");
    let config = dir.path().join("weir.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[[pools]]\nname = \"ceph\"\n\
         backend = \"rbd\"\nrbd_pool = \"weir\"\nrbd_ceph_conf = \"/nonexistent/ceph.conf\"\n",
    )
    .unwrap();
    let out = Command::new(common::weir_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with a missing ceph.conf");
    assert!(
        err.contains("rbd_ceph_conf /nonexistent/ceph.conf: no such file")
            || err.contains("librbd.so.1"),
        "{err}"
    );
}

#[test]
fn rbd_interop_qemu_img_qemu_io_nbdcopy_fio_and_admin_operations() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let dir = common::TempDir::new("rbd-interop");
    let vol = unique("interop");
    let server = WeirProcess::start(
        dir.path(),
        &format!(
            "{}[[volumes]]\nname = \"{vol}\"\npool = \"ceph\"\nsize = \"64MiB\"\npolicy = \"mission-critical\"\n",
            cluster.pool_toml()
        ),
    );
    let uri = format!("nbd://{}/{vol}", server.nbd_addr);
    let data = random_bytes(24 << 20, 7);
    let src = dir.path().join("src.raw");
    std::fs::write(&src, &data).unwrap();
    let rbd_cli = cluster.images().is_some();
    if !rbd_cli {
        println!("skipped (part): the rbd tool is not installed: data not checked on the cluster");
    }

    if have("nbdcopy") {
        run(Command::new("nbdcopy").arg(&src).arg(&uri));
        let back = dir.path().join("back.raw");
        run(Command::new("nbdcopy").arg(&uri).arg(&back));
        let back = std::fs::read(&back).unwrap();
        assert_eq!(back.len(), 64 << 20);
        assert!(
            back[..data.len()] == data[..],
            "nbdcopy: data read back differs"
        );
        assert!(back[data.len()..].iter().all(|&b| b == 0));
        if rbd_cli {
            let exported = dir.path().join("export.raw");
            let image = format!("{}/{vol}", cluster.pool);
            let out = cluster
                .rbd(&["export", &image, exported.to_str().unwrap()])
                .unwrap();
            assert!(out.status.success(), "rbd export: {out:?}");
            let on_rbd = std::fs::read(&exported).unwrap();
            assert!(
                on_rbd[..data.len()] == data[..],
                "the image on the cluster differs from what was written through Weir"
            );
        }
    } else {
        println!("skipped (part): nbdcopy is not installed");
    }

    if have("qemu-io") && have("qemu-img") {
        let out = run(Command::new("qemu-io").args([
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0xab 32M 1M",
            "-c",
            "write -z 33M 4M",
            "-c",
            "discard 40M 8M",
            "-c",
            "flush",
            "-c",
            "read -P 0xab 32M 1M",
            "-c",
            "read -P 0 33M 4M",
            "-c",
            "read -P 0 40M 8M",
        ]));
        assert!(!out.contains("Pattern verification failed"), "{out}");
        // qemu-img: the allocation map (block status from rbd_diff_iterate2):
        // written data is data, the never-written tail reads as zeroes.
        let map = run(Command::new("qemu-img").args(["map", "-f", "raw", "--output=json", &uri]));
        let map: serde_json::Value = serde_json::from_str(&map).unwrap();
        let extents = map.as_array().unwrap();
        let at = |off: u64| {
            extents
                .iter()
                .find(|e| {
                    let s = e["start"].as_u64().unwrap();
                    s <= off && off < s + e["length"].as_u64().unwrap()
                })
                .unwrap_or_else(|| panic!("no extent at {off}: {map}"))
        };
        assert_eq!(at(0)["data"], true, "{map}");
        assert_eq!(at(32 << 20)["data"], true, "{map}");
        assert_eq!(at(60 << 20)["zero"], true, "{map}");
        assert_eq!(at(60 << 20)["data"], false, "{map}");
        // qemu-img convert out of Weir: the same bytes.
        let conv = dir.path().join("conv.raw");
        run(Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw", &uri])
            .arg(&conv));
        let conv = std::fs::read(&conv).unwrap();
        assert!(conv[..data.len()] == data[..], "qemu-img convert differs");
        assert!(conv[32 << 20..33 << 20].iter().all(|&b| b == 0xab));
        assert!(conv[33 << 20..].iter().all(|&b| b == 0 || b == 0xab));
        run(Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw", &uri])
            .arg(dir.path().join("conv.raw")));
    } else {
        println!("skipped (part): qemu-io/qemu-img are not installed");
    }

    let fio_nbd = Command::new("fio")
        .arg("--enghelp")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("nbd"));
    if fio_nbd {
        run(Command::new("fio")
            .args([
                "--name=rbd-verify",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=16",
                "--size=16m",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--verify_state_save=0",
            ])
            .current_dir(dir.path()));
    } else {
        println!("skipped (part): fio with the nbd engine is not installed");
    }

    // Admin operations reach the images.
    let rt = rt();
    let admin = server.admin_client();
    let other = unique("api");
    rt.block_on(admin.create_volume(&VolumeCreate {
        name: other.clone(),
        size_bytes: 8 << 20,
        policy: "non-critical".into(),
        pool: Some("ceph".into()),
        access_groups: vec![],
        read_only: false,
        description: String::new(),
        cache: Default::default(),
    }))
    .expect("create in the RBD pool");
    let again = rt.block_on(admin.create_volume(&VolumeCreate {
        name: other.clone(),
        size_bytes: 8 << 20,
        policy: "non-critical".into(),
        pool: Some("ceph".into()),
        access_groups: vec![],
        read_only: false,
        description: String::new(),
        cache: Default::default(),
    }));
    assert!(again.is_err(), "a second create of the same name succeeded");
    rt.block_on(admin.resize_volume(&other, 12 << 20))
        .expect("resize");
    let (c, export) = rt
        .block_on(NbdClient::connect(
            server.nbd_addr,
            ClientConfig::go(&other),
        ))
        .unwrap();
    assert_eq!(export.size_bytes, 12 << 20, "the export follows the resize");
    rt.block_on(c.disconnect()).unwrap();
    if rbd_cli {
        let info = cluster
            .rbd(&[
                "info",
                "--format",
                "json",
                &format!("{}/{other}", cluster.pool),
            ])
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        assert_eq!(info["size"], 12 << 20, "{info}");
    }
    rt.block_on(admin.delete_volume(&other)).expect("delete");
    rt.block_on(admin.delete_volume(&vol)).expect("delete");
    if let Some(images) = cluster.images() {
        assert!(
            !images.contains(&other) && !images.contains(&vol),
            "deleted volumes' images are still in the pool: {images:?}"
        );
    }
}

const BLOCK: usize = 4096;
const BLOCKS: u64 = 2048; // 8 MiB
const QUEUE_DEPTH: usize = 16;
const FLUSH_EVERY: u64 = 64;

fn pattern(block: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    b[..8].copy_from_slice(&block.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ block ^ 0xD1B5_4A32_D192_ED03;
    for chunk in b[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    b
}

/// What the writer knows, shared so the test sees it after the kill.
#[derive(Default)]
struct Model {
    seq: u64,
    /// Per block: the highest sequence sent (it may or may not have landed).
    sent: HashMap<u64, u64>,
    /// Per block: the highest sequence acknowledged.
    acked: HashMap<u64, u64>,
    /// Per block: the highest sequence made durable by an acknowledged FLUSH.
    durable: HashMap<u64, u64>,
    flushes: u64,
    /// When the first write was acknowledged.
    first_ack: Option<Instant>,
}

/// Writes random blocks (never one already in flight), a FLUSH every
/// `FLUSH_EVERY` acknowledged writes, until the connection dies.
async fn write_until_killed(addr: std::net::SocketAddr, vol: String, model: Arc<Mutex<Model>>) {
    write_blocks(addr, vol, model, u64::MAX).await
}

/// As [`write_until_killed`], stopping (after a FLUSH) once `limit` writes
/// were acknowledged.
async fn write_blocks(
    addr: std::net::SocketAddr,
    vol: String,
    model: Arc<Mutex<Model>>,
    limit: u64,
) {
    let Ok((mut c, _)) = NbdClient::connect(addr, ClientConfig::go(&vol)).await else {
        return;
    };
    let mut rng = Rng::new(model.lock().unwrap().seq ^ 0x5eed);
    let mut in_flight: HashMap<u64, (u64, u64)> = HashMap::new(); // handle -> (block, seq)
    let mut busy: HashSet<u64> = HashSet::new();
    let mut flush: Option<(u64, HashMap<u64, u64>)> = None;
    let mut since_flush = 0u64;
    let mut acked = 0u64;
    loop {
        if acked >= limit {
            if in_flight.is_empty() && flush.is_none() {
                let snapshot = model.lock().unwrap().acked.clone();
                if c.flush().await.unwrap().is_ok() {
                    let mut m = model.lock().unwrap();
                    for (b, s) in snapshot {
                        let d = m.durable.entry(b).or_insert(0);
                        *d = (*d).max(s);
                    }
                    m.flushes += 1;
                }
                c.disconnect().await.unwrap();
                return;
            }
        } else {
            while in_flight.len() < QUEUE_DEPTH {
                let block = rng.below_except(BLOCKS, &busy);
                let seq = {
                    let mut m = model.lock().unwrap();
                    m.seq += 1;
                    let seq = m.seq;
                    m.sent.insert(block, seq);
                    seq
                };
                let h = c
                    .session()
                    .write(block * BLOCK as u64, &pattern(block, seq), false);
                in_flight.insert(h, (block, seq));
                busy.insert(block);
            }
        }
        if flush.is_none() && since_flush >= FLUSH_EVERY && acked < limit {
            // Writes acknowledged before the FLUSH is sent are durable once it is.
            let snapshot = model.lock().unwrap().acked.clone();
            flush = Some((c.session().flush(), snapshot));
            since_flush = 0;
        }
        let Ok(comp) = c.next_completion().await else {
            return; // killed
        };
        if let Some((block, seq)) = in_flight.remove(&comp.handle) {
            busy.remove(&block);
            if comp.result.is_ok() {
                let mut m = model.lock().unwrap();
                m.acked.insert(block, seq);
                m.first_ack.get_or_insert_with(Instant::now);
                since_flush += 1;
                acked += 1;
            }
        } else if flush.as_ref().is_some_and(|(h, _)| *h == comp.handle) {
            let (_, snapshot) = flush.take().unwrap();
            if comp.result.is_ok() {
                let mut m = model.lock().unwrap();
                for (b, s) in snapshot {
                    let d = m.durable.entry(b).or_insert(0);
                    *d = (*d).max(s);
                }
                m.flushes += 1;
            }
        }
    }
}

/// Every block holds its durable write or a later one sent to it, or zeroes
/// if none of its writes was durable; never anything else. The problems found.
async fn check_blocks(
    addr: std::net::SocketAddr,
    vol: &str,
    m: &Model,
    cycle: usize,
) -> Vec<String> {
    let mut problems = Vec::new();
    let (mut c, _) = NbdClient::connect(addr, ClientConfig::go(vol))
        .await
        .unwrap();
    let mut handles = HashMap::new();
    for block in 0..BLOCKS {
        handles.insert(c.session().read(block * BLOCK as u64, BLOCK as u32), block);
        if handles.len() == 64 || block == BLOCKS - 1 {
            while !handles.is_empty() {
                let comp = c.next_completion().await.unwrap();
                let block = handles.remove(&comp.handle).unwrap();
                let Ok(ReplyData::Read(data)) = comp.result else {
                    panic!("cycle {cycle}: reading block {block} failed");
                };
                let durable = m.durable.get(&block).copied();
                if data.iter().all(|&b| b == 0) {
                    if durable.is_some() {
                        problems.push(format!(
                            "cycle {cycle}: block {block} lost its flushed write {durable:?} \
                             (last sent {:?}): zeroes",
                            m.sent.get(&block)
                        ));
                    }
                    continue;
                }
                let b = u64::from_le_bytes(data[..8].try_into().unwrap());
                let seq = u64::from_le_bytes(data[8..16].try_into().unwrap());
                if b != block || data != pattern(block, seq) {
                    problems.push(format!(
                        "cycle {cycle}: block {block} holds data never written to it"
                    ));
                } else if seq < durable.unwrap_or(0) {
                    problems.push(format!(
                        "cycle {cycle}: block {block} lost its flushed write {durable:?}: holds {seq}"
                    ));
                } else if seq > m.sent[&block] {
                    problems.push(format!(
                        "cycle {cycle}: block {block} holds {seq}, never sent"
                    ));
                }
            }
        }
    }
    c.disconnect().await.unwrap();
    problems
}

#[test]
fn rbd_gateway_killed_under_write_load_loses_no_flushed_write() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let cycles: usize = std::env::var("WEIR_RBD_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let dir = common::TempDir::new("rbd-crash");
    let vol = unique("crash");
    let config = format!(
        "{}[[volumes]]\nname = \"{vol}\"\npool = \"ceph\"\nsize = \"8MiB\"\npolicy = \"business-critical\"\n",
        cluster.pool_toml()
    );
    let model = Arc::new(Mutex::new(Model::default()));
    let rt = rt();
    let mut server = WeirProcess::start(dir.path(), &config);
    for cycle in 0..cycles {
        let writer = rt.spawn(write_until_killed(
            server.nbd_addr,
            vol.clone(),
            model.clone(),
        ));
        // Kill once a few flushes were acknowledged and writes are in flight.
        let start = Instant::now();
        let flushes_before = model.lock().unwrap().flushes;
        let mut rng = Rng::new(cycle as u64);
        let want = flushes_before + 3 + rng.below(5);
        while model.lock().unwrap().flushes < want {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "cycle {cycle}: no progress (flushes {})",
                model.lock().unwrap().flushes
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.below(50)));
        server.kill();
        rt.block_on(writer).unwrap();
        server = WeirProcess::start(dir.path(), &config);
        let m = std::mem::take(&mut *model.lock().unwrap());
        let t = Instant::now();
        let problems = rt.block_on(check_blocks(server.nbd_addr, &vol, &m, cycle));
        if !problems.is_empty() {
            // What the cluster holds, read without Weir.
            let export = dir.path().join("export.raw");
            let image = format!("{}/{vol}", cluster.pool);
            let on_rbd = cluster
                .rbd(&["export", &image, export.to_str().unwrap()])
                .filter(|o| o.status.success())
                .and_then(|_| std::fs::read(&export).ok());
            let zero_on_rbd = on_rbd.map(|d| {
                d.chunks(BLOCK)
                    .enumerate()
                    .filter(|(b, c)| {
                        m.durable.contains_key(&(*b as u64)) && c.iter().all(|&x| x == 0)
                    })
                    .count()
            });
            panic!(
                "{} problems (durable blocks reading zeroes on the cluster itself, by rbd export: \
                 {zero_on_rbd:?}):\n{}",
                problems.len(),
                problems[..problems.len().min(20)].join("\n")
            );
        }
        println!(
            "cycle {cycle}: killed after {} writes sent, {} acknowledged blocks, {} flushes; \
             {} blocks durable, all intact (checked in {:?})",
            m.seq,
            m.acked.len(),
            m.flushes,
            m.durable.len(),
            t.elapsed()
        );
        *model.lock().unwrap() = m;
    }
    rt.block_on(server.admin_client().delete_volume(&vol))
        .expect("delete");
}

/// `qemu-io` commands against an export; fails the test on a pattern mismatch.
fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut cmd = Command::new("qemu-io");
    if uri.contains('@') {
        cmd.arg("-r"); // snapshot exports are read-only
    }
    cmd.args(["-f", "raw", uri]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    let out = run(&mut cmd);
    assert!(
        !out.contains("Pattern verification failed") && !out.contains("failed"),
        "qemu-io {cmds:?} on {uri}:\n{out}"
    );
    out
}

#[test]
fn rbd_snapshots_clones_flatten_and_rollback_map_to_rbd() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    if !have("qemu-io") {
        println!("skipped: qemu-io is not installed");
        return;
    }
    let dir = common::TempDir::new("rbd-snap");
    let vol = unique("snap");
    let config = format!(
        "{}[[volumes]]\nname = \"{vol}\"\npool = \"ceph\"\nsize = \"16MiB\"\npolicy = \"non-critical\"\n",
        cluster.pool_toml()
    );
    let mut server = WeirProcess::start(dir.path(), &config);
    let rt = rt();
    let uri = |s: &WeirProcess, e: &str| format!("nbd://{}/{e}", s.nbd_addr);
    qemu_io(&uri(&server, &vol), &["write -P 0x11 0 1M"]);
    let snap = rt
        .block_on(server.admin_client().snapshot(&vol, "s1"))
        .expect("snapshot");
    assert_eq!(snap.size_bytes, 16 << 20);
    qemu_io(&uri(&server, &vol), &["write -P 0x22 0 1M"]);
    // The snapshot's export survives a restart.
    server.kill();
    server = WeirProcess::start(dir.path(), &config);
    let admin = server.admin_client();
    let at_s1 = format!("{vol}@s1");
    qemu_io(&uri(&server, &at_s1), &["read -P 0x11 0 1M"]);
    qemu_io(&uri(&server, &vol), &["read -P 0x22 0 1M"]);
    let listed = rt.block_on(admin.snapshots(Some(&vol))).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    // Clones read the snapshot; writes to a clone stay in it.
    let (c1, c2) = (format!("{vol}-c1"), format!("{vol}-c2"));
    let clones = rt
        .block_on(admin.clone_snapshot(
            &vol,
            "s1",
            &weir_server::admin::CloneRequest {
                names: vec![c1.clone(), c2.clone()],
                policy: None,
            },
        ))
        .expect("clone");
    assert_eq!(clones.len(), 2);
    assert_eq!(clones[0].origin.as_deref(), Some(at_s1.as_str()));
    qemu_io(
        &uri(&server, &c1),
        &["read -P 0x11 0 1M", "write -P 0x33 0 64k"],
    );
    qemu_io(&uri(&server, &c2), &["read -P 0x11 0 1M"]);
    qemu_io(&uri(&server, &at_s1), &["read -P 0x11 0 1M"]);
    if cluster.images().is_some() {
        let info = cluster
            .rbd(&[
                "info",
                "--format",
                "json",
                &format!("{}/{c2}", cluster.pool),
            ])
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        assert_eq!(info["parent"]["image"], vol.as_str(), "{info}");
        assert_eq!(info["parent"]["snapshot"], "s1", "{info}");
    }
    let e = rt
        .block_on(admin.delete_snapshot(&vol, "s1"))
        .expect_err("a snapshot read by clones is not deleted");
    assert!(e.to_string().contains("flatten or delete them"), "{e}");
    let e = rt
        .block_on(admin.delete_volume(&vol))
        .expect_err("a volume with snapshots is not deleted");
    assert!(e.to_string().contains("has snapshots"), "{e}");
    // Flatten: the clone keeps its data without its parent.
    let flat = rt.block_on(admin.flatten(&c1)).expect("flatten");
    assert_eq!(flat.origin, None);
    qemu_io(
        &uri(&server, &c1),
        &["read -P 0x33 0 64k", "read -P 0x11 64k 960k"],
    );
    if cluster.images().is_some() {
        let info = cluster
            .rbd(&[
                "info",
                "--format",
                "json",
                &format!("{}/{c1}", cluster.pool),
            ])
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        assert!(
            info.get("parent").is_none(),
            "flattened clone has a parent: {info}"
        );
    }
    rt.block_on(admin.delete_volume(&c1)).expect("delete c1");
    rt.block_on(admin.delete_volume(&c2)).expect("delete c2");
    // Rollback returns the volume to the snapshot.
    rt.block_on(admin.rollback(&vol, "s1")).expect("rollback");
    qemu_io(&uri(&server, &vol), &["read -P 0x11 0 1M"]);
    rt.block_on(admin.delete_snapshot(&vol, "s1"))
        .expect("delete-snapshot");
    assert!(rt.block_on(admin.snapshots(Some(&vol))).unwrap().is_empty());
    rt.block_on(admin.delete_volume(&vol)).expect("delete");
    if let Some(images) = cluster.images() {
        for i in [&vol, &c1, &c2] {
            assert!(!images.contains(i), "{i} still in the pool: {images:?}");
        }
    }
}

#[test]
fn rbd_failover_gateway_b_takes_a_killed_gateways_volume_over_within_5_s() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let (dir_a, dir_b) = (
        common::TempDir::new("rbd-failover-a"),
        common::TempDir::new("rbd-failover-b"),
    );
    let vol = unique("failover");
    // Both gateways declare the volume: A creates the image, B adopts it.
    let config = format!(
        "{}[[volumes]]\nname = \"{vol}\"\npool = \"ceph\"\nsize = \"8MiB\"\npolicy = \"business-critical\"\n",
        cluster.pool_toml()
    );
    let mut a = WeirProcess::start(dir_a.path(), &config);
    let b = WeirProcess::start(dir_b.path(), &config);
    let rt = rt();
    let model = Arc::new(Mutex::new(Model::default()));
    let writer = rt.spawn(write_until_killed(a.nbd_addr, vol.clone(), model.clone()));
    let start = Instant::now();
    while model.lock().unwrap().flushes < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no progress on gateway A"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    a.kill();
    let killed = Instant::now();
    rt.block_on(writer).unwrap();
    let taken = rt
        .block_on(b.admin_client().takeover(&vol))
        .expect("takeover on B");
    assert!(
        !taken.fenced.is_empty(),
        "gateway A held the image's lock, yet nothing was fenced: {taken:?}"
    );
    // The client reconnects to B and goes on writing.
    let before = {
        let mut m = model.lock().unwrap();
        m.first_ack = None;
        m.acked.len()
    };
    rt.block_on(write_blocks(b.nbd_addr, vol.clone(), model.clone(), 200));
    let m = std::mem::take(&mut *model.lock().unwrap());
    let served = m.first_ack.expect("a write acknowledged by B") - killed;
    println!(
        "gateway A killed; B took over (fenced {:?}) and acknowledged its first write {served:?} \
         after the kill; {before} blocks written through A, {} durable in all",
        taken.fenced,
        m.durable.len()
    );
    assert!(
        served < Duration::from_secs(5),
        "B served the volume {served:?} after A was killed (target 5 s)"
    );
    let problems = rt.block_on(check_blocks(b.nbd_addr, &vol, &m, 0));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // B holds the lock now: taking over again fences nobody (not B itself).
    let again = rt
        .block_on(b.admin_client().takeover(&vol))
        .expect("a second takeover");
    assert!(again.fenced.is_empty(), "{again:?}");
    rt.block_on(b.admin_client().delete_volume(&vol))
        .expect("delete");
}

/// Two gateways share their latency through one stats image (issue 13 item 3):
/// both write it at once without fencing each other (its exclusive lock is off),
/// each finds the other's slot, and the window steps with the shared mean.
#[test]
fn rbd_gateways_share_a_stats_image_without_its_lock() {
    use weir_server::datastore_stats::{SLOT_BYTES, STATS_BYTES, SlotRecord};
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let (vol_a, vol_b, stats) = (unique("gw-a"), unique("gw-b"), unique("sioc"));
    let config = |id: u32, vol: &str| {
        format!(
            "{}gateway_congestion = {{ enabled = true, threshold_ms = 5, period_ms = 100 }}\n\
             gateway_stats_volume = \"{stats}\"\ngateway_id = {id}\n\
             [[volumes]]\nname = \"{vol}\"\npool = \"ceph\"\nsize = \"8MiB\"\n\
             policy = \"non-critical\"\n\
             [[volumes]]\nname = \"{stats}\"\npool = \"ceph\"\nsize = \"64KiB\"\n\
             policy = \"non-critical\"\n",
            cluster.pool_toml()
        )
    };
    let (dir_a, dir_b) = (
        common::TempDir::new("rbd-sioc-a"),
        common::TempDir::new("rbd-sioc-b"),
    );
    let a = WeirProcess::start(dir_a.path(), &config(3, &vol_a));
    let b = WeirProcess::start(dir_b.path(), &config(7, &vol_b));
    if let Some(out) = cluster.rbd(&["info", &format!("{}/{stats}", cluster.pool)]) {
        let info = String::from_utf8_lossy(&out.stdout);
        assert!(!info.contains("exclusive-lock"), "{info}");
    }
    let rt = rt();
    // Writes through both gateways for a few periods.
    let model = Arc::new(Mutex::new(Model::default()));
    rt.block_on(async {
        tokio::join!(
            write_blocks(a.nbd_addr, vol_a.clone(), model.clone(), 300),
            write_blocks(
                b.nbd_addr,
                vol_b.clone(),
                Arc::new(Mutex::new(Model::default())),
                300
            ),
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    // The stats image, read through gateway A: both slots, each at its id.
    let area = rt.block_on(async {
        let (mut c, _) = NbdClient::connect(a.nbd_addr, ClientConfig::go(&stats))
            .await
            .unwrap();
        let h = c.session().read(0, STATS_BYTES as u32);
        let comp = c.next_completion().await.unwrap();
        assert_eq!(comp.handle, h);
        match comp.result {
            Ok(ReplyData::Read(d)) => d,
            other => panic!("read of the stats image: {other:?}"),
        }
    });
    for id in [3usize, 7] {
        let r = SlotRecord::decode(&area[id * SLOT_BYTES..]).expect("a valid slot");
        assert_eq!(r.gateway_id as usize, id);
        // The last period (after the writes) may hold no I/O: the slot is live.
        assert!(r.seq >= 2, "slot {id}: {r:?}");
    }
    let pools = rt.block_on(a.admin_client().list_pools()).unwrap();
    assert!(pools[0].gateway_latency_ms.is_some(), "{pools:?}");
    assert!(pools[0].gauges.gateway_window.is_some());
    for (gw, vol) in [(&a, &vol_a), (&b, &vol_b)] {
        rt.block_on(gw.admin_client().delete_volume(vol))
            .expect("delete");
    }
    // B closes the stats image on a graceful stop; then A can remove it.
    let mut b = b;
    b.terminate();
    let _ = b.child.wait();
    rt.block_on(a.admin_client().delete_volume(&stats))
        .expect("delete stats");
}

/// A RADOS pool whose quota is reached: a write fails with ENOSPC (librados
/// otherwise waits, without end, for space), what was written stays readable,
/// and writes succeed again once the quota is lifted. On a RADOS pool of its
/// own, so the other tests' pool is never full.
#[test]
fn rbd_full_pool_quota_fails_writes_with_enospc_and_recovers() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let pool = unique("quota");
    match cluster.ceph(&["osd", "pool", "create", &pool, "8", "8"]) {
        None => {
            println!("skipped: the ceph tool is not installed");
            return;
        }
        Some(out) => assert!(out.status.success(), "ceph osd pool create: {out:?}"),
    }
    let _removed_last = RadosPool(&cluster, pool.clone());
    let out = cluster.rbd(&["pool", "init", &pool]).expect("rbd runs");
    assert!(out.status.success(), "rbd pool init: {out:?}");
    cluster.ceph_ok(&["osd", "pool", "set-quota", &pool, "max_bytes", "8388608"]);
    let dir = common::TempDir::new("rbd-quota");
    let server = WeirProcess::start(
        dir.path(),
        &format!(
            "{}[[volumes]]\nname = \"q\"\npool = \"ceph\"\nsize = \"64MiB\"\npolicy = \"mission-critical\"\n",
            cluster.pool_toml_on(&pool)
        ),
    );
    const MIB: usize = 1 << 20;
    let data = random_bytes(16 * MIB, 31);
    let rt = rt();
    let (mut c, _) = rt
        .block_on(NbdClient::connect(server.nbd_addr, ClientConfig::go("q")))
        .unwrap();
    let mut write = |offset: usize, bytes: &[u8]| {
        let w = c.write(offset as u64, bytes, false);
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), w).await })
            .unwrap_or_else(|_| panic!("a write at {offset} to a full pool hung for 20 s"))
            .unwrap()
    };
    // 16 MiB, twice the quota: the cluster marks the pool full a few seconds later.
    for (i, chunk) in data.chunks(MIB).enumerate() {
        write(i * MIB, chunk).unwrap();
    }
    cluster.wait_pool_full(&pool, true);
    let e = write(32 * MIB, &data[..MIB]).expect_err("a write to a full pool succeeded");
    assert_eq!(e.code, weir_nbd::ErrorCode::NoSpc, "{e:?}");
    cluster.ceph_ok(&["osd", "pool", "set-quota", &pool, "max_bytes", "0"]);
    cluster.wait_pool_full(&pool, false);
    write(32 * MIB, &data[..MIB]).expect("a write once the quota is lifted");
    rt.block_on(async {
        assert!(c.flush().await.unwrap().is_ok());
        let back = c.read(0, 16 * MIB as u32).await.unwrap().unwrap();
        assert!(
            back == data,
            "data written before the pool was full differs"
        );
        let back = c.read(32 * MIB as u64, MIB as u32).await.unwrap().unwrap();
        assert!(
            back[..] == data[..MIB],
            "the write after the quota was lifted differs"
        );
        c.disconnect().await.unwrap();
    });
}

/// A RADOS pool a test made, removed when the test ends (after its servers).
struct RadosPool<'a>(&'a Cluster, String);

impl Drop for RadosPool<'_> {
    fn drop(&mut self) {
        let p = &self.1;
        let _ = self
            .0
            .ceph(&["osd", "pool", "rm", p, p, "--yes-i-really-really-mean-it"]);
    }
}

/// A daemon of the dev cluster stopped with SIGSTOP (the process is there, and
/// answers nothing), continued when dropped.
struct Stopped(libc::pid_t);

impl Stopped {
    /// Stops daemon `name` (`mon.a`, `osd.0`) of the cluster; `None`, with the
    /// test's "skipped" line, when its pid file (in `run/` beside the ceph.conf,
    /// as scripts/ceph-dev.sh keeps it) is not there.
    fn daemon(cluster: &Cluster, name: &str) -> Option<Stopped> {
        let stopped = Self::pid_of(cluster, name).and_then(|pid| {
            // SAFETY: kill(2) on the dev cluster's daemon.
            (unsafe { libc::kill(pid, libc::SIGSTOP) } == 0).then_some(Stopped(pid))
        });
        if stopped.is_none() {
            println!(
                "skipped: no pid file of the dev cluster's {name} beside {}",
                cluster.conf
            );
        }
        stopped
    }

    fn pid_of(cluster: &Cluster, name: &str) -> Option<libc::pid_t> {
        let run = std::path::Path::new(&cluster.conf).parent()?.join("run");
        let pid = std::fs::read_to_string(run.join(format!("{name}.pid"))).ok()?;
        pid.trim().parse().ok()
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the daemon stopped above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// The monitor stops answering: `weir pool list` and metrics scrapes (the
/// cluster's space, `rados_cluster_stat`, asked with the volume store locked)
/// answer within a second or two, from the last measurement, instead of holding
/// the store — every admin request and every new NBD connection — for
/// `rbd_connect_timeout_s` (30 s) per call.
#[test]
fn rbd_a_stopped_monitor_does_not_hold_the_admin_api() {
    let Some(cluster) = Cluster::exclusive() else {
        return;
    };
    let dir = common::TempDir::new("rbd-mon-stopped");
    let server = WeirProcess::start(
        dir.path(),
        &format!(
            "{}[[pools]]\nname = \"local\"\n[[volumes]]\nname = \"{}\"\npool = \"ceph\"\n\
             size = \"16MiB\"\npolicy = \"mission-critical\"\n[[volumes]]\nname = \"f\"\n\
             pool = \"local\"\nsize = \"16MiB\"\npolicy = \"mission-critical\"\n",
            cluster.pool_toml(),
            unique("mon")
        ),
    );
    let rt = rt();
    let admin = server.admin_client();
    let measured = rt.block_on(admin.capacity()).unwrap();
    let ceph = measured.iter().find(|p| p.name == "ceph").unwrap();
    assert!(ceph.capacity_bytes > 0, "{measured:?}");
    std::thread::sleep(Duration::from_secs(3)); // the measurement is old
    let Some(mon) = Stopped::daemon(&cluster, "mon.a") else {
        return;
    };
    let start = Instant::now();
    let scrape = rt.spawn({
        let admin = server.admin_client();
        async move { admin.metrics().await.map(|_| start.elapsed()) }
    });
    std::thread::sleep(Duration::from_millis(300));
    let listed = rt.block_on(admin.list_volumes());
    let list_took = start.elapsed();
    let opened = rt.block_on(NbdClient::connect(server.nbd_addr, ClientConfig::go("f")));
    let open_took = start.elapsed();
    let capacity = rt.block_on(admin.capacity());
    let capacity_took = start.elapsed();
    drop(mon);
    let scrape_took = rt.block_on(scrape).unwrap().unwrap();
    assert_eq!(listed.unwrap().len(), 2);
    opened.unwrap();
    for (what, took) in [
        ("a metrics scrape", scrape_took),
        ("a volume list", list_took),
        ("an NBD connection to a file volume", open_took),
        ("a capacity request", capacity_took),
    ] {
        assert!(
            took < Duration::from_secs(5),
            "with the monitor stopped, {what} took {took:?} (since the monitor stopped)"
        );
    }
    let capacity = capacity.unwrap();
    let now = capacity.iter().find(|p| p.name == "ceph");
    assert_eq!(now, Some(ceph), "not the last measurement");
}

/// An OSD stops answering (SIGSTOP): an admin operation on an RBD volume
/// (create, delete) fails after `rbd_connect_timeout_s` with the reason instead
/// of holding the volume store until the OSD is back — with it every admin
/// request and every new NBD connection, to any pool, waited without end.
#[test]
fn rbd_a_stopped_osd_bounds_admin_operations_and_spares_other_pools() {
    let Some(cluster) = Cluster::exclusive() else {
        return;
    };
    let dir = common::TempDir::new("rbd-osd-stopped");
    let (vol, new) = (unique("osd"), unique("osd-new"));
    let server = WeirProcess::start(
        dir.path(),
        &format!(
            "{}rbd_connect_timeout_s = 3\n[[pools]]\nname = \"local\"\n[[volumes]]\n\
             name = \"{vol}\"\npool = \"ceph\"\nsize = \"16MiB\"\npolicy = \"mission-critical\"\n\
             [[volumes]]\nname = \"f\"\npool = \"local\"\nsize = \"16MiB\"\npolicy = \"mission-critical\"\n",
            cluster.pool_toml()
        ),
    );
    let rt = rt();
    let admin = server.admin_client();
    let Some(osd) = Stopped::daemon(&cluster, "osd.0") else {
        return;
    };
    let start = Instant::now();
    let create = rt.spawn({
        let admin = server.admin_client();
        async move {
            let r = admin
                .create_volume(&VolumeCreate {
                    name: new,
                    size_bytes: 8 << 20,
                    policy: "non-critical".into(),
                    pool: Some("ceph".into()),
                    access_groups: vec![],
                    read_only: false,
                    description: String::new(),
                    cache: Default::default(),
                })
                .await;
            (r, start.elapsed())
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    fn within_10_s<T>(rt: &tokio::runtime::Runtime, what: &str, f: impl Future<Output = T>) -> T {
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), f).await })
            .unwrap_or_else(|_| panic!("with an OSD stopped, {what} took more than 10 s"))
    }
    let listed = within_10_s(&rt, "a volume list", admin.list_volumes());
    let list_took = start.elapsed();
    let read = within_10_s(&rt, "a read of a file volume", async {
        let (mut c, _) = NbdClient::connect(server.nbd_addr, ClientConfig::go("f")).await?;
        c.read(0, 4096).await
    });
    let (created, create_took) = rt.block_on(create).unwrap();
    let deleted = within_10_s(&rt, "a delete of an RBD volume", admin.delete_volume(&vol));
    drop(osd);
    assert_eq!(listed.unwrap().len(), 2);
    read.unwrap().unwrap();
    assert!(
        list_took < Duration::from_secs(5),
        "a volume list took {list_took:?}"
    );
    assert!(
        create_took < Duration::from_secs(5),
        "a create took {create_took:?}"
    );
    for (what, r) in [("create", created), ("delete", deleted)] {
        let e = r
            .expect_err(&format!("{what} succeeded with the OSD stopped"))
            .to_string();
        assert!(e.contains("did not answer within 3 s"), "{what}: {e}");
    }
    // The OSD back: the cluster serves again.
    let again = unique("osd-again");
    rt.block_on(admin.create_volume(&VolumeCreate {
        name: again,
        size_bytes: 8 << 20,
        policy: "non-critical".into(),
        pool: Some("ceph".into()),
        access_groups: vec![],
        read_only: false,
        description: String::new(),
        cache: Default::default(),
    }))
    .expect("a create once the OSD is back");
}
