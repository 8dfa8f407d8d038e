//! The server on an ephemeral port, driven by the weir-nbd client.

mod common;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_nbd::consts::*;
use weir_nbd::{ClientConfig, ErrorCode, Extent, ProtocolError, ReplyData};
use weir_server::nbd_client::NbdClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_round_trips_and_errors() {
    let dir = common::TempDir::new("roundtrip");
    let server = common::start(dir.path()).await;
    let (mut c, export) = common::connect(&server, "open").await;
    assert_eq!(export.size_bytes, 16 << 20);
    assert!(export.structured_replies);
    assert_eq!(export.description, "open to all hosts");
    assert_ne!(export.transmission_flags & FLAG_CAN_MULTI_CONN, 0);
    assert_ne!(export.transmission_flags & FLAG_SEND_FLUSH, 0);

    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    c.write(4 << 20, &data, false).await.unwrap().unwrap();
    c.write(8 << 20, &data[..4096], true)
        .await
        .unwrap()
        .unwrap();
    c.flush().await.unwrap().unwrap();
    assert_eq!(c.read(4 << 20, 1 << 20).await.unwrap().unwrap(), data);
    assert_eq!(c.read(8 << 20, 4096).await.unwrap().unwrap(), data[..4096]);
    assert_eq!(c.read(0, 512).await.unwrap().unwrap(), vec![0u8; 512]);

    // Errors: past the end, unknown command; the connection goes on.
    let e = c
        .write((16 << 20) - 10, &[1; 20], false)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpc);
    assert!(e.message.contains("exceeds the export size"), "{e}");
    assert_eq!(
        c.read(16 << 20, 1).await.unwrap().unwrap_err().code,
        ErrorCode::Inval
    );
    let h = c.session().send_raw(42, 0, 0, 0, &[]);
    assert_eq!(c.wait(h).await.unwrap().unwrap_err().code, ErrorCode::Inval);
    // (A WRITE over the maximum payload ends the connection: tests/hardening.rs.)
    assert_eq!(
        c.read(4 << 20, 16).await.unwrap().unwrap(),
        data[..16],
        "connection still in sync"
    );

    // Trim, write zeroes, cache and block status.
    let h = c.session().trim(4 << 20, 1 << 20);
    c.wait(h).await.unwrap().unwrap();
    assert_eq!(
        c.read(4 << 20, 4096).await.unwrap().unwrap(),
        vec![0u8; 4096],
        "trimmed range reads as zero"
    );
    let h = c.session().block_status(4 << 20, 1 << 20, false);
    let ReplyData::BlockStatus(contexts) = c.wait(h).await.unwrap().unwrap() else {
        panic!()
    };
    assert_eq!(contexts.len(), 1);
    assert_eq!(contexts[0].0, weir_nbd::BASE_ALLOCATION_ID);
    assert_eq!(
        contexts[0].1,
        vec![Extent {
            length: 1 << 20,
            flags: STATE_HOLE | STATE_ZERO
        }],
        "punched range is a hole"
    );
    let h = c.session().block_status(8 << 20, 8192, true);
    let ReplyData::BlockStatus(contexts) = c.wait(h).await.unwrap().unwrap() else {
        panic!()
    };
    assert_eq!(contexts[0].1.len(), 1);
    assert_eq!(
        contexts[0].1[0].flags & STATE_HOLE,
        0,
        "written block is data"
    );
    c.write(8 << 20, &[9u8; 4096], false)
        .await
        .unwrap()
        .unwrap();
    let h = c.session().write_zeroes(8 << 20, 4096, true);
    c.wait(h).await.unwrap().unwrap();
    assert_eq!(
        c.read(8 << 20, 4096).await.unwrap().unwrap(),
        vec![0u8; 4096]
    );
    let h = c.session().cache(0, 1 << 20);
    c.wait(h).await.unwrap().unwrap();
    // Zero-length TRIM and WRITE_ZEROES (unspecified in proto.md): both succeed
    // as no-ops (the TRIM used to fail EINVAL from fallocate).
    let h = c.session().trim(8 << 20, 0);
    c.wait(h).await.unwrap().unwrap();
    let h = c.session().write_zeroes(8 << 20, 0, false);
    c.wait(h).await.unwrap().unwrap();
    c.disconnect().await.unwrap();

    // Read-only export: writes fail with EPERM, reads work.
    let (mut ro, export) = common::connect(&server, "ro").await;
    assert_ne!(export.transmission_flags & FLAG_READ_ONLY, 0);
    assert_eq!(
        ro.write(0, b"x", false).await.unwrap().unwrap_err().code,
        ErrorCode::Perm
    );
    let h = ro.session().trim(0, 4096);
    assert_eq!(ro.wait(h).await.unwrap().unwrap_err().code, ErrorCode::Perm);
    assert_eq!(ro.read(0, 4).await.unwrap().unwrap(), vec![0; 4]);
    ro.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

/// `NBD_CMD_BLOCK_STATUS` answers one chunk per selected context (`proto.md`),
/// also when only the `weir:exclusive` lease context was selected (it was
/// refused EINVAL: `nbdinfo --map=weir:exclusive=T` failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_status_answers_each_selected_context() {
    let dir = common::TempDir::new("bs-contexts");
    let server = common::start(dir.path()).await;
    for (contexts, expected) in [
        (
            vec!["weir:exclusive=bs-1".to_string()],
            vec![weir_nbd::LEASE_CONTEXT_ID],
        ),
        (
            vec![
                BASE_ALLOCATION.to_string(),
                "weir:exclusive=bs-2".to_string(),
            ],
            vec![weir_nbd::LEASE_CONTEXT_ID, weir_nbd::BASE_ALLOCATION_ID],
        ),
    ] {
        let config = ClientConfig {
            meta_contexts: contexts.clone(),
            ..ClientConfig::go("open")
        };
        // The previous round's lease is given back once its connection's teardown
        // is done, after its DISC: until then the lease context is not offered.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut c = loop {
            let (c, export) = NbdClient::connect(server.nbd_addr(), config.clone())
                .await
                .unwrap();
            if export.meta_contexts.len() == expected.len() || std::time::Instant::now() > deadline
            {
                break c;
            }
            c.disconnect().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        for req_one in [false, true] {
            let h = c.session().block_status(0, 1 << 20, req_one);
            let reply = c.wait(h).await.unwrap();
            let Ok(ReplyData::BlockStatus(got)) = reply else {
                panic!("{contexts:?}: {reply:?}")
            };
            let ids: Vec<u32> = got.iter().map(|(id, _)| *id).collect();
            assert_eq!(ids, expected, "{contexts:?}");
            let (_, lease) = &got[0];
            assert_eq!(
                lease,
                &vec![Extent {
                    length: 1 << 20,
                    flags: 0
                }]
            );
        }
        c.disconnect().await.unwrap();
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_open_follow_host_access_groups() {
    let dir = common::TempDir::new("access");
    let server = common::start(dir.path()).await;
    let names: Vec<String> = NbdClient::list(server.nbd_addr())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        ["open", "ro", "slow"],
        "hidden is not listed for 127.0.0.1"
    );
    let err = NbdClient::connect(server.nbd_addr(), ClientConfig::go("hidden"))
        .await
        .err()
        .unwrap();
    match err.downcast_ref::<ProtocolError>() {
        Some(ProtocolError::OptionRefused { reply, .. }) => assert_eq!(*reply, REP_ERR_UNKNOWN),
        other => panic!("unexpected {other:?} / {err}"),
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_on_one_connection() {
    let dir = common::TempDir::new("inflight");
    let server = common::start(dir.path()).await;
    let (mut c, _) = common::connect(&server, "open").await;
    let n = 300u64;
    let mut writes = vec![];
    for i in 0..n {
        let block = vec![(i % 256) as u8; 4096];
        writes.push(c.session().write(i * 4096, &block, false));
    }
    assert_eq!(c.session().in_flight(), n as usize);
    let mut done = 0;
    while done < n {
        let comp = c.next_completion().await.unwrap();
        assert!(writes.contains(&comp.handle));
        comp.result.unwrap();
        done += 1;
    }
    let reads: Vec<u64> = (0..n).map(|i| c.session().read(i * 4096, 4096)).collect();
    for _ in 0..n {
        let comp = c.next_completion().await.unwrap();
        let i = reads.iter().position(|&h| h == comp.handle).unwrap() as u64;
        assert_eq!(
            comp.result.unwrap(),
            ReplyData::Read(vec![(i % 256) as u8; 4096])
        );
    }
    // Simple (non-structured) replies too, on a second connection to the same volume.
    let config = ClientConfig {
        structured_replies: false,
        meta_contexts: vec![],
        ..ClientConfig::go("open")
    };
    let (mut simple, export) = NbdClient::connect(server.nbd_addr(), config).await.unwrap();
    assert!(!export.structured_replies);
    assert_eq!(
        simple.read(5 * 4096, 4096).await.unwrap().unwrap(),
        vec![5u8; 4096],
        "multi-conn sees the data"
    );
    c.disconnect().await.unwrap();
    simple.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_client_closes_only_its_own_connection() {
    let dir = common::TempDir::new("malformed");
    let server = common::start(dir.path()).await;
    let (mut good, _) = common::connect(&server, "open").await;
    // Garbage instead of client flags.
    let mut s = tokio::net::TcpStream::connect(server.nbd_addr())
        .await
        .unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).await.unwrap();
    s.write_all(b"\xff\xff\xff\xffgarbage").await.unwrap();
    let mut rest = vec![];
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty(), "server closed without replying");
    // A bad request magic after a good handshake (EXPORT_NAME, NO_ZEROES).
    let mut bad_stream = tokio::net::TcpStream::connect(server.nbd_addr())
        .await
        .unwrap();
    let mut g = [0u8; 18];
    bad_stream.read_exact(&mut g).await.unwrap();
    bad_stream
        .write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .await
        .unwrap();
    let mut opt = IHAVEOPT.to_be_bytes().to_vec();
    opt.extend(OPT_EXPORT_NAME.to_be_bytes());
    opt.extend(4u32.to_be_bytes());
    opt.extend(b"open");
    bad_stream.write_all(&opt).await.unwrap();
    let mut export_reply = [0u8; 10];
    bad_stream.read_exact(&mut export_reply).await.unwrap();
    assert_eq!(
        u64::from_be_bytes(export_reply[..8].try_into().unwrap()),
        16 << 20
    );
    let mut raw = weir_nbd::RequestHeader {
        flags: 0,
        command: CMD_READ,
        handle: 1,
        offset: 0,
        length: 512,
    }
    .encode();
    raw[0] ^= 0xff;
    bad_stream.write_all(&raw).await.unwrap();
    let mut rest = vec![];
    tokio::time::timeout(Duration::from_secs(5), bad_stream.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty(), "bad magic: closed without a reply");
    // The good connection is unaffected.
    good.write(0, b"still fine", false).await.unwrap().unwrap();
    assert_eq!(good.read(0, 10).await.unwrap().unwrap(), b"still fine");
    good.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iops_limit_holds_requests_back_and_set_policy_applies_live() {
    let dir = common::TempDir::new("qos");
    let server = common::start(dir.path()).await;
    let (mut c, _) = common::connect(&server, "slow").await;
    // 60 reads of 4 KiB against a 100 IOPS limit: at least ~0.5 s whatever the machine.
    let start = Instant::now();
    let handles: Vec<u64> = (0..60).map(|i| c.session().read(i * 4096, 4096)).collect();
    for _ in &handles {
        c.next_completion().await.unwrap().result.unwrap();
    }
    let limited = start.elapsed();
    assert!(
        limited >= Duration::from_millis(450),
        "limit not enforced: {limited:?}"
    );
    // Lift the limit through the admin API while requests are queued.
    let admin = server.admin_client();
    let handles: Vec<u64> = (0..200)
        .map(|i| c.session().read((i % 256) * 4096, 4096))
        .collect();
    c.send().await.unwrap();
    let r = admin
        .set_volume_policy("slow", "non-critical")
        .await
        .unwrap();
    assert_eq!(r.policy, "non-critical");
    let start = Instant::now();
    for _ in &handles {
        c.next_completion().await.unwrap().result.unwrap();
    }
    // 200 queued requests at 100 IOPS would need 2 s; the new policy has no limit.
    let lifted = start.elapsed();
    assert!(
        lifted < Duration::from_millis(1500),
        "policy change did not apply to queued requests: {lifted:?}"
    );
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_in_flight_requests_first() {
    let dir = common::TempDir::new("shutdown");
    let server = common::start(dir.path()).await;
    let (mut c, _) = common::connect(&server, "slow").await;
    let handles: Vec<u64> = (0..20)
        .map(|i| c.session().write(i * 4096, &[7u8; 4096], false))
        .collect();
    c.send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let stop = tokio::spawn(server.shutdown());
    for _ in &handles {
        c.next_completion().await.unwrap().result.unwrap();
    }
    stop.await.unwrap().unwrap();
    // After restart the data is there.
    let server = common::start(dir.path()).await;
    let (mut c, _) = common::connect(&server, "slow").await;
    assert_eq!(
        c.read(19 * 4096, 4096).await.unwrap().unwrap(),
        vec![7u8; 4096]
    );
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

/// Large READs of cached data leave by `sendfile(2)` (header, then the file range)
/// with `zero_copy_reads = "on"`, small ones as bytes: many of both in flight on
/// one connection must come back whole and in sync, with structured and with
/// simple replies, and after the page cache was dropped (the copying path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_large_and_small_reads_stay_in_sync() {
    large_and_small_reads_in_sync(weir_server::config::ZeroCopyReads::On).await;
}

/// The same with the default (`auto`): a client on this machine gets large READs
/// read into a buffer and copied, never by `sendfile(2)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_large_and_small_reads_stay_in_sync_copied() {
    large_and_small_reads_in_sync(weir_server::config::ZeroCopyReads::Auto).await;
}

async fn large_and_small_reads_in_sync(mode: weir_server::config::ZeroCopyReads) {
    let dir = common::TempDir::new("zerocopy");
    let mut config = common::config(dir.path());
    config.zero_copy_reads = mode;
    let server = weir_server::RunningServer::start(config)
        .await
        .expect("server starts");
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i % 253) as u8 ^ (i >> 20) as u8)
        .collect();
    let (mut c, _) = common::connect(&server, "open").await;
    for (i, chunk) in data.chunks(2 << 20).enumerate() {
        c.write((i as u64) << 21, chunk, false)
            .await
            .unwrap()
            .unwrap();
    }
    c.flush().await.unwrap().unwrap();
    // (offset, length): 1 MiB and 192 KiB reads between 4 KiB and 512-byte ones.
    let requests: Vec<(u64, u32)> = (0..24u64)
        .map(|i| match i % 4 {
            0 => ((i % 7) << 20, 1 << 20),
            1 => (i * 4096 + 512, 4096),
            2 => (((i % 5) << 20) + 12_288, 192 << 10),
            _ => (i * 777, 512),
        })
        .collect();
    let check = |c: &mut NbdClient| {
        requests
            .iter()
            .map(|&(offset, length)| (c.session().read(offset, length), offset, length))
            .collect::<Vec<_>>()
    };
    for structured in [true, false] {
        let mut config = ClientConfig::go("open");
        config.structured_replies = structured;
        if !structured {
            config.meta_contexts.clear();
        }
        let (mut c, _) = NbdClient::connect(server.nbd_addr(), config).await.unwrap();
        for round in 0..2 {
            if round == 1 {
                // Drop the file's pages: now the large reads are copied instead.
                let file = std::fs::File::open(dir.path().join("pools/default/open.img"))
                    .expect("volume file");
                use std::os::fd::AsRawFd;
                // SAFETY: advisory call on a descriptor we own.
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
            for (h, offset, length) in check(&mut c) {
                let got = match c.wait(h).await.unwrap().unwrap() {
                    ReplyData::Read(d) => d,
                    other => panic!("read reply {other:?}"),
                };
                let want = &data[offset as usize..offset as usize + length as usize];
                assert!(
                    got == want,
                    "structured={structured} round {round}: read {length} at {offset} differs"
                );
            }
        }
        assert_eq!(c.read(0, 16).await.unwrap().unwrap(), data[..16]);
    }
}
