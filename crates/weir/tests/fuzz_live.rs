//! Live-session fuzzing (issue 15): mutated NBD client sessions against a real
//! `weir serve`, each over its own TCP connection, several at once. Half the
//! inputs are real sessions (option haggling, then requests) with a few bytes
//! flipped, inserted, deleted, duplicated or overwritten with boundary values;
//! half are structure-aware scripts from `weir_nbd::fuzz::client_stream`.
//!
//! Every session must end with the server closing the connection (no hang),
//! the server must stay up with no panic in its log, a well-behaved client must
//! still be served between batches, and the server's memory must stay flat.
//!
//! `live_sessions_fuzzed` runs 2,000 sessions in the suite; `bench/fuzz.sh`
//! runs it with `FUZZ_SESSIONS=1000000`. `FUZZ_SEED` picks another run; a
//! failing session's bytes are saved under `target/fuzz-live-failures/`.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Rng, TempDir, WeirProcess, rss_mib};
use weir_nbd::consts::*;
use weir_nbd::{ClientConfig, RequestHeader};
use weir_server::nbd_client::NbdClient;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A session a real client could send: flags, options, GO, then requests.
fn valid_session(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    let option = |out: &mut Vec<u8>, code: u32, data: &[u8]| {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
    };
    let name: &[u8] = if rng.below(2) == 0 { b"a" } else { b"huge" };
    let mut named = (name.len() as u32).to_be_bytes().to_vec();
    named.extend_from_slice(name);
    if rng.below(2) == 0 {
        option(&mut out, OPT_STRUCTURED_REPLY, &[]);
        let mut meta = named.clone();
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        meta.extend_from_slice(BASE_ALLOCATION.as_bytes());
        option(&mut out, OPT_SET_META_CONTEXT, &meta);
    }
    if rng.below(4) == 0 {
        option(&mut out, OPT_LIST, &[]);
    }
    let mut go = named;
    go.extend_from_slice(&[0, 1, 0, 3]); // one info request: block size
    option(&mut out, OPT_GO, &go);
    for handle in 0..1 + rng.below(16) {
        request(rng, &mut out, handle);
    }
    out
}

fn request(rng: &mut Rng, out: &mut Vec<u8>, handle: u64) {
    let commands = [
        CMD_READ,
        CMD_WRITE,
        CMD_FLUSH,
        CMD_TRIM,
        CMD_WRITE_ZEROES,
        CMD_CACHE,
        CMD_BLOCK_STATUS,
    ];
    let command = commands[rng.below(commands.len() as u64) as usize];
    let length = if command == CMD_FLUSH {
        0
    } else {
        512 << rng.below(5)
    };
    let offset = if command == CMD_FLUSH {
        0
    } else {
        rng.below(1 << 14) << 12
    };
    let header = RequestHeader {
        flags: 0,
        command,
        handle,
        offset,
        length,
    };
    out.extend_from_slice(&header.encode());
    if command == CMD_WRITE {
        out.resize(out.len() + length as usize, rng.next() as u8);
    }
}

const BOUNDARIES: &[u32] = &[0, 1, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff, 1 << 25, 4096];

/// A few random edits of `data`.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(8) {
        let len = data.len() as u64;
        let at = rng.below(len.max(1)) as usize;
        match rng.below(5) {
            0 if !data.is_empty() => data[at] ^= 1 << rng.below(8),
            1 => data
                .splice(at..at, (0..rng.below(16)).map(|_| rng.next() as u8))
                .for_each(drop),
            2 => data
                .drain(at..(at + rng.below(32) as usize).min(data.len()))
                .for_each(drop),
            3 => {
                let end = (at + rng.below(64) as usize).min(data.len());
                let copy = data[at..end].to_vec();
                data.splice(at..at, copy).for_each(drop);
            }
            _ if at + 4 <= data.len() => {
                let v = BOUNDARIES[rng.below(BOUNDARIES.len() as u64) as usize];
                data[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
            _ => {}
        }
    }
}

/// Input number `index` of the run seeded `seed`.
fn input(seed: u64, index: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    if rng.below(2) == 0 {
        let mut session = valid_session(&mut rng);
        mutate(&mut rng, &mut session);
        session
    } else {
        let script: Vec<u8> = (0..64 + rng.below(960)).map(|_| rng.next() as u8).collect();
        weir_nbd::fuzz::client_stream(&script)
    }
}

/// Whether `buf` holds a transmission reply's magic (the session got past the
/// handshake, give or take a coincidence).
fn has_reply(buf: &[u8]) -> bool {
    let magics = [
        SIMPLE_REPLY_MAGIC.to_be_bytes(),
        STRUCTURED_REPLY_MAGIC.to_be_bytes(),
    ];
    buf.windows(4).any(|w| magics.iter().any(|m| w == m))
}

/// Sends `bytes` in random pieces, half-closes, reads until the server closes.
/// `Ok(true)` when the server sent transmission replies; `Err` names what went
/// wrong (a hang: no close within the deadline).
fn play(addr: SocketAddr, bytes: &[u8], rng: &mut Rng) -> Result<bool, String> {
    let stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut reader = stream.try_clone().unwrap();
    std::thread::scope(|scope| {
        let drain = scope.spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let (mut buf, mut replied) = (vec![0u8; 1 << 16], false);
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => return Ok(replied),
                    Ok(n) => replied |= has_reply(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                        return Ok(replied);
                    }
                    Err(e) if Instant::now() > deadline => return Err(format!("hang: {e}")),
                    Err(_) => {}
                }
            }
        });
        let mut writer = &stream;
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = (1 + rng.below(4096) as usize).min(rest.len());
            // The server may close first (a protocol error): stop sending then.
            if writer.write_all(&rest[..n]).is_err() {
                break;
            }
            rest = &rest[n..];
        }
        let _ = stream.shutdown(Shutdown::Write);
        drain.join().unwrap()
    })
}

/// A well-behaved client writes and reads back a block on the volume no fuzzed
/// session names.
fn healthy(rt: &tokio::runtime::Runtime, addr: SocketAddr, round: u64) {
    rt.block_on(async {
        let connect = NbdClient::connect(addr, ClientConfig::go("check"));
        let (mut c, _) = tokio::time::timeout(Duration::from_secs(10), connect)
            .await
            .expect("a well-behaved client is served within 10 s")
            .expect("a well-behaved client connects");
        let data = vec![round as u8; 4096];
        c.write((round % 1024) * 4096, &data, true)
            .await
            .unwrap()
            .unwrap();
        let back = c.read((round % 1024) * 4096, 4096).await.unwrap().unwrap();
        assert_eq!(
            back, data,
            "the well-behaved client read back what it wrote"
        );
        c.disconnect().await.unwrap();
    });
}

fn save_failure(seed: u64, index: u64, bytes: &[u8]) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-live-failures");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("seed{seed}-input{index}.bin"));
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

#[test]
fn live_sessions_fuzzed() {
    let sessions: u64 = env_or("FUZZ_SESSIONS", 2_000);
    let seed: u64 = env_or("FUZZ_SEED", 1);
    let threads: u64 = env_or("FUZZ_THREADS", 4);
    let dir = TempDir::new("fuzz-live");
    let config = "[[volumes]]\nname = \"a\"\nsize = \"64MiB\"\npolicy = \"non-critical\"\n\
                  [[volumes]]\nname = \"huge\"\nsize = \"256MiB\"\npolicy = \"non-critical\"\n\
                  [[volumes]]\nname = \"check\"\nsize = \"4MiB\"\npolicy = \"non-critical\"\n";
    let mut proc = WeirProcess::start(dir.path(), config);
    let (addr, pid) = (proc.nbd_addr, proc.child.id());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batch = (sessions / 10).clamp(1, 100_000);
    let (next, transmitted) = (AtomicU64::new(0), AtomicU64::new(0));
    let started = Instant::now();
    let (mut rss_warm, mut rss_peak) = (0.0f64, 0.0f64);
    for round in 0..sessions.div_ceil(batch) {
        let end = ((round + 1) * batch).min(sessions);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= end {
                            return;
                        }
                        let bytes = input(seed, i);
                        let mut rng = Rng::new(seed.wrapping_add(i));
                        match play(addr, &bytes, &mut rng) {
                            Ok(replied) => {
                                transmitted.fetch_add(u64::from(replied), Ordering::Relaxed);
                            }
                            Err(e) => {
                                let saved = save_failure(seed, i, &bytes);
                                panic!("session {i} (FUZZ_SEED={seed}): {e}; saved to {saved}");
                            }
                        }
                    }
                });
            }
        });
        next.store(end, Ordering::Relaxed);
        assert!(proc.child.try_wait().unwrap().is_none(), "weir serve died");
        healthy(&rt, addr, round);
        let rss = rss_mib(pid);
        if round == 0 {
            rss_warm = rss;
        }
        rss_peak = rss_peak.max(rss);
        println!(
            "live fuzz: {end} of {sessions} sessions after {:.0} s; server RSS {rss:.1} MiB",
            started.elapsed().as_secs_f64()
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    let log = std::fs::read_to_string(dir.join("weir.log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    let transmitted = transmitted.into_inner();
    println!(
        "live fuzz: {sessions} sessions (seed {seed}) in {elapsed:.1} s ({:.0}/s), {transmitted} \
         reached transmission: 0 crashes, 0 hangs; server RSS {rss_warm:.1} MiB after the first tenth, peak {rss_peak:.1} MiB; \
         log {} bytes",
        sessions as f64 / elapsed,
        log.len()
    );
    assert!(
        transmitted * 5 >= sessions,
        "only {transmitted} of {sessions} sessions reached transmission: the inputs are too broken"
    );
    assert!(
        rss_peak <= rss_warm * 1.5 + 64.0,
        "server memory grew: {rss_warm:.1} MiB after the first tenth, peak {rss_peak:.1} MiB"
    );
    proc.terminate();
    let status = proc.child.wait().unwrap();
    assert!(
        status.success(),
        "weir serve exited with {status} after SIGTERM"
    );
}
