//! The history store through a running server: `/v1/stats` shows the last second
//! of every volume while load runs, `/v1/volumes/{name}/history` answers
//! `since=1h`, also after a restart, and errors are clear.

mod common;

use std::time::{Duration, Instant};

use weir_server::RunningServer;
use weir_server::admin::ClientError;

/// Polls `/v1/stats` until `volume` shows I/O (the sampler's second needs a
/// previous one: at most a few seconds; the bound is generous for loaded CI).
async fn wait_for_live_io(server: &RunningServer, volume: &str) -> f32 {
    let admin = server.admin_client();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let live = admin.live_stats().await.unwrap();
        if let Some(v) = live.volumes.iter().find(|v| v.name == volume)
            && v.sample.iops > 0.0
        {
            assert_eq!(v.policy, "mission-critical");
            assert_eq!(v.latency_target_ms, Some(10.0));
            return v.sample.iops;
        }
        assert!(
            Instant::now() < deadline,
            "no live I/O for {volume}: {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads until the sampler has seen them, then a little longer.
async fn load_until_sampled(server: &RunningServer) {
    let (mut c, _) = common::connect(server, "open").await;
    let reader = tokio::spawn(async move {
        loop {
            if c.read(0, 4096).await.is_err() {
                break;
            }
        }
    });
    wait_for_live_io(server, "open").await;
    reader.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_answers_since_1h_after_a_restart() {
    let dir = common::TempDir::new("history");
    let server = common::start(dir.path()).await;
    load_until_sampled(&server).await;
    let admin = server.admin_client();
    let before = admin.volume_history("open", 3600, 1).await.unwrap();
    assert_eq!(before.tier, "1s");
    assert!(
        before.points.iter().any(|p| p.sample.iops > 0.0),
        "{before:?}"
    );
    server.shutdown().await.unwrap();

    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    let after = admin.volume_history("open", 3600, 1).await.unwrap();
    for p in before.points.iter().filter(|p| p.sample.iops > 0.0) {
        assert!(after.points.contains(p), "{p:?} lost in the restart");
    }
    // Coarser steps average what is there.
    let minutes = admin.volume_history("open", 3600, 60).await.unwrap();
    assert_eq!(minutes.step_s, 60);
    assert!(minutes.points.iter().any(|p| p.sample.iops > 0.0));
    // A day: the minute tier once it holds a row, the seconds until then.
    let day = admin.volume_history("open", 86_400, 3600).await.unwrap();
    assert!(matches!(day.tier.as_str(), "1m" | "1s"), "{day:?}");
    assert!(!day.points.is_empty(), "{day:?}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_errors_are_clear() {
    let dir = common::TempDir::new("history-errors");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    let status = |e: ClientError| match e {
        ClientError::Api { status, message } => (status, message),
        other => panic!("{other}"),
    };
    let (code, _) = status(admin.volume_history("nope", 60, 1).await.unwrap_err());
    assert_eq!(code, 404);
    let fresh = admin.volume_history("ro", 60, 1).await.unwrap();
    assert!(fresh.points.iter().all(|p| p.sample.iops == 0.0));
    let token = server.admin_token().to_string();
    let get = |path: &str| {
        let (addr, path, token) = (server.admin_addr(), path.to_string(), token.clone());
        async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
            );
            tokio::io::AsyncWriteExt::write_all(&mut s, head.as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out)
                .await
                .unwrap();
            out
        }
    };
    let r = get("/v1/volumes/open/history?since=1w").await;
    assert!(
        r.starts_with("HTTP/1.1 400") && r.contains("duration"),
        "{r}"
    );
    for q in ["bogus=1", "foo=bar"] {
        // An unknown key is named as such, whatever its value.
        let r = get(&format!("/v1/volumes/open/history?{q}")).await;
        assert!(
            r.starts_with("HTTP/1.1 400") && r.contains("unknown query"),
            "{r}"
        );
    }
    let r = get("/v1/volumes/open/history?since=2h&step=5m").await;
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("\"step_s\":300"),
        "{r}"
    );
    server.shutdown().await.unwrap();
}
