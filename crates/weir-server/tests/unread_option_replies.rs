//! Clients that pipeline option requests during the handshake and read no
//! replies: a thousand `NBD_OPT_LIST`s fit in one 16 KiB read, and each answers
//! the whole export list (up to 4 KiB of description per volume). The server
//! used to build every reply of a read at once — 33 MB per connection here, 2.8
//! GB for 100 such connections of `weir serve`. It now answers at most
//! `ServerHandshake::MAX_OUTPUT` bytes before sending them, and reads no more
//! options until they are sent.
//!
//! Alone in its test binary: it measures the memory of the process the server
//! runs in.

mod common;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use weir_nbd::consts::*;

const LISTS: usize = 1000;
const DEAF_CLIENTS: usize = 16;

/// The greeting taken, the client flags and `LISTS` `NBD_OPT_LIST`s sent.
async fn pipeline_lists(addr: std::net::SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    // A small receive window: the replies pile up on the server's side.
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).await.unwrap();
    let mut out = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    for _ in 0..LISTS {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&OPT_LIST.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
    }
    s.write_all(&out).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_options_with_unread_replies_cost_bounded_memory() {
    let description = "d".repeat(4000);
    let toml: String = (0..8)
        .map(|i| {
            format!(
                "[[volumes]]\nname = \"v{i}\"\nsize = \"1MiB\"\npolicy = \"non-critical\"\n\
                 description = \"{description}\"\n"
            )
        })
        .collect();
    let (_dir, server) = common::start_with("unread-options", &toml).await;
    let addr = server.nbd_addr();
    // Warm up (the first connection's allocations), then the baseline.
    drop(common::connect(&server, "v0").await);
    let idle = common::rss_bytes();
    let mut deaf = Vec::new();
    for _ in 0..DEAF_CLIENTS {
        deaf.push(pipeline_lists(addr).await);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let grown = common::rss_bytes().saturating_sub(idle);
    // Others are still served meanwhile.
    let (mut other, _) = common::connect(&server, "v1").await;
    other.read(0, 4096).await.unwrap().unwrap();
    println!(
        "{DEAF_CLIENTS} clients sent {LISTS} NBD_OPT_LISTs each and read nothing: RSS +{} MiB \
         over {} MiB",
        grown >> 20,
        idle >> 20
    );
    // Before: ~33 MB of replies per connection (530 MB here).
    assert!(grown < 64 << 20, "memory grew by {} MiB", grown >> 20);
    // A client that reads gets every reply, in order: each LIST answers 8 exports
    // and an ACK.
    let mut s = deaf.pop().unwrap();
    let mut acks = 0;
    let mut servers = 0;
    while acks < LISTS {
        let mut h = [0u8; 20];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut h))
            .await
            .expect("the server answers every option")
            .unwrap();
        assert_eq!(u32::from_be_bytes(h[8..12].try_into().unwrap()), OPT_LIST);
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut data = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut data).await.unwrap();
        match kind {
            REP_SERVER => servers += 1,
            REP_ACK => {
                assert_eq!(servers, 8, "one reply per export before each ACK");
                servers = 0;
                acks += 1;
            }
            other => panic!("unexpected reply type {other:#x}"),
        }
    }
}
