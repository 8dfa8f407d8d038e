//! Graceful shutdown of the real binary (issue 3): SIGTERM during a write
//! workload → the server stops accepting, answers the requests it has read,
//! makes every acknowledged write durable and exits 0.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Rng, WeirProcess};
use weir_server::nbd_client::NbdClient;

const BLOCK: u64 = 4096;
const BLOCKS: u64 = (16 << 20) / BLOCK;

fn pattern(block: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![(seq % 251) as u8; BLOCK as usize];
    b[..8].copy_from_slice(&block.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b
}

const CONFIG: &str = r#"
[[policies]]
name = "open"
[[volumes]]
name = "vol"
size = "16MiB"
policy = "open"
"#;

#[test]
fn sigterm_during_writes_exits_0_with_acknowledged_writes_durable() {
    let dir = common::TempDir::new("cli-shutdown");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut proc = WeirProcess::start(dir.path(), CONFIG);
    let addr = proc.nbd_addr;
    // Writes at QD 32 (no FLUSH, no FUA): only the shutdown makes them durable.
    let workload = rt.spawn(async move {
        let (mut c, _) = NbdClient::connect(addr, weir_nbd::ClientConfig::go("vol"))
            .await
            .unwrap();
        let mut rng = Rng::new(42);
        let mut seq = 0u64;
        let mut in_flight: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut busy = std::collections::HashSet::new();
        let mut acked: HashMap<u64, u64> = HashMap::new();
        let mut errors = 0u64;
        let mut refused = false;
        let end_reason = loop {
            while !refused && in_flight.len() < 32 {
                let block = rng.below_except(BLOCKS, &busy);
                seq += 1;
                let h = c
                    .session()
                    .write(block * BLOCK, &pattern(block, seq), false);
                busy.insert(block);
                in_flight.insert(h, (block, seq));
            }
            match c.next_completion().await {
                Ok(done) => {
                    let (block, s) = in_flight
                        .remove(&done.handle)
                        .expect("reply to a request we sent");
                    busy.remove(&block);
                    match done.result {
                        Ok(_) => {
                            acked.insert(block, s);
                        }
                        Err(e) => {
                            // ESHUTDOWN: stop sending, collect the rest.
                            assert_eq!(e.code, weir_nbd::ErrorCode::Shutdown, "{e}");
                            errors += 1;
                            refused = true;
                        }
                    }
                    if refused && in_flight.is_empty() {
                        break "every request answered".to_string();
                    }
                }
                Err(e) => break format!("{e:#}"),
            }
        };
        (acked, errors, in_flight.len(), end_reason)
    });
    std::thread::sleep(Duration::from_millis(400));
    proc.terminate();
    let t = Instant::now();
    let status = proc.wait_exit(Duration::from_secs(20), "SIGTERM");
    let (acked, errors, unanswered, end_reason) = rt.block_on(workload).unwrap();
    println!(
        "SIGTERM: exit {status} after {:?}; {} blocks acknowledged, {errors} failed cleanly, \
         {unanswered} unanswered at close ({end_reason})",
        t.elapsed(),
        acked.len()
    );
    assert!(status.success(), "weir serve exited with {status}");
    assert!(acked.len() > 100, "the workload barely ran");
    // Every request got a reply (done, or refused with ESHUTDOWN): no reset.
    assert_eq!(unanswered, 0, "{end_reason}");
    // New connections are refused once the server is gone; restart and verify.
    let proc = WeirProcess::start(dir.path(), CONFIG);
    rt.block_on(async {
        let (mut c, _) = NbdClient::connect(proc.nbd_addr, weir_nbd::ClientConfig::go("vol"))
            .await
            .unwrap();
        for (&block, &seq) in &acked {
            let data = c.read(block * BLOCK, BLOCK as u32).await.unwrap().unwrap();
            assert!(
                data == pattern(block, seq),
                "block {block}: acknowledged write {seq} not durable after SIGTERM"
            );
        }
        c.disconnect().await.unwrap();
    });
}
