//! A client that pipelines READs and never reads the replies (issue 15: 100,000
//! READs of 60 KiB took the server's memory up by 2.96 GB). A request holds its
//! connection's budget until its reply is written to the socket, so the server
//! stops reading from such a client after 256 requests; its memory stays flat
//! and other clients are served. The full-size run (1,000,000 READs, RSS and
//! other clients' throughput) is `bench/hardening.sh`.
//!
//! Alone in its test binary: it measures the memory of the process the server
//! runs in.

mod common;

use std::time::{Duration, Instant};

const READS: u64 = 5_000;
const READ_BYTES: u32 = 60 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_no_replies_is_not_read_from_and_costs_bounded_memory() {
    let (_dir, server) = common::start_with(
        "unread",
        "[[volumes]]\nname = \"deaf\"\nsize = \"64MiB\"\npolicy = \"non-critical\"\n\
         [[volumes]]\nname = \"other\"\nsize = \"16MiB\"\npolicy = \"non-critical\"\n",
    )
    .await;
    let (mut other, _) = common::connect(&server, "other").await;
    let mut reads = async |n: u64| {
        let t = Instant::now();
        for i in 0..n {
            other.read((i % 256) * 65536, 65536).await.unwrap().unwrap();
        }
        t.elapsed()
    };
    reads(200).await;
    let idle = common::rss_bytes();
    // Pipelines READs of 60 KiB (5,000 x 60 KiB = 293 MiB of replies) and never
    // reads a reply.
    let (mut deaf, _) = common::connect(&server, "deaf").await;
    for i in 0..READS {
        let offset = ((i * READ_BYTES as u64) % ((64 << 20) - READ_BYTES as u64)) & !4095;
        deaf.session().read(offset, READ_BYTES);
    }
    deaf.send().await.unwrap();
    // Until the server stops producing replies for it.
    let counters = server.state().metrics.volume("deaf");
    let mut last = u64::MAX;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = counters.snapshot().read_ios;
        if now == last {
            break;
        }
        last = now;
    }
    let grown = common::rss_bytes().saturating_sub(idle);
    let others = reads(200).await;
    println!(
        "{READS} READs of 60 KiB sent, {last} answered by the server; RSS +{} MiB over \
         {} MiB; 200 reads of another client meanwhile took {others:?}",
        grown >> 20,
        idle >> 20
    );
    // 256 requests held, plus the replies the socket buffers took.
    assert!(
        last <= 1_000,
        "the server kept reading: {last} replies made"
    );
    assert!(grown < 64 << 20, "memory grew by {} MiB", grown >> 20);
    assert!(others < Duration::from_secs(2), "{others:?}");
    drop(deaf);
    other.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}
