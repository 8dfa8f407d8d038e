//! The admin API through `weir_server::admin::Client`, and persistence across
//! restarts.

mod common;

use weir_nbd::ClientConfig;
use weir_qos::Policy;
use weir_server::admin::{Client, ClientError};
use weir_server::nbd_client::NbdClient;
use weir_server::{RunningServer, VolumeCreate};

fn status(e: ClientError) -> u16 {
    status_of(e)
}

fn status_of(e: ClientError) -> u16 {
    match e {
        ClientError::Api { status, .. } => status,
        other => panic!("expected an API error, got {other}"),
    }
}

/// A non-critical volume of the default pool, open to every host.
fn plain_volume(name: &str, size_bytes: u64) -> VolumeCreate {
    VolumeCreate {
        name: name.into(),
        size_bytes,
        policy: "non-critical".into(),
        pool: None,
        access_groups: vec![],
        read_only: false,
        description: String::new(),
        cache: Default::default(),
    }
}

/// A client of `volume` holding its `weir:exclusive` lease with `token`.
async fn lease_holder(server: &RunningServer, volume: &str, token: &str) -> NbdClient {
    let leased = ClientConfig {
        meta_contexts: vec![format!("weir:exclusive={token}")],
        ..ClientConfig::go(volume)
    };
    let (holder, export) = NbdClient::connect(server.nbd_addr(), leased).await.unwrap();
    assert!(export.export_info().exclusive_lease.is_some());
    holder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_and_policies_through_the_admin_client() {
    let dir = common::TempDir::new("admin");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();

    let names: Vec<String> = admin
        .list_volumes()
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["hidden", "open", "ro", "slow"]);

    // Policies: built-ins plus the configured one; create, show, delete.
    let policies: Vec<String> = admin
        .list_policies()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert!(
        policies.contains(&"mission-critical".to_string())
            && policies.contains(&"slow100".to_string())
    );
    let mut gold = Policy::best_effort("gold");
    gold.reservation_iops = Some(500.0);
    gold.limit_iops = Some(5000.0);
    assert_eq!(admin.create_policy(&gold).await.unwrap(), gold);
    assert_eq!(status(admin.create_policy(&gold).await.unwrap_err()), 409);
    assert_eq!(admin.show_policy("gold").await.unwrap(), gold);
    assert_eq!(
        admin.show_policy("policy-1").await.unwrap().name,
        "mission-critical",
        "alias"
    );
    let mut bad = Policy::best_effort("bad");
    bad.limit_iops = Some(1.0);
    assert_eq!(status(admin.create_policy(&bad).await.unwrap_err()), 400);
    assert_eq!(
        status(admin.delete_policy("mission-critical").await.unwrap_err()),
        409
    );

    // Volumes: create, show, resize, set policy, stats, delete.
    let req = VolumeCreate {
        name: "db".into(),
        size_bytes: 1 << 20,
        policy: "gold".into(),
        pool: None,
        access_groups: vec!["loopback".into()],
        read_only: false,
        description: "test db".into(),
        cache: Default::default(),
    };
    let created = admin.create_volume(&req).await.unwrap();
    assert_eq!(
        (
            created.name.as_str(),
            created.size_bytes,
            created.pool.as_str()
        ),
        ("db", 1 << 20, "default")
    );
    assert_eq!(status(admin.create_volume(&req).await.unwrap_err()), 409);
    let bad_policy = VolumeCreate {
        name: "x".into(),
        policy: "nope".into(),
        ..req.clone()
    };
    assert_eq!(
        status(admin.create_volume(&bad_policy).await.unwrap_err()),
        400
    );
    let bad_name = VolumeCreate {
        name: "../etc".into(),
        ..req.clone()
    };
    assert_eq!(
        status(admin.create_volume(&bad_name).await.unwrap_err()),
        400
    );
    let bad_group = VolumeCreate {
        name: "y".into(),
        access_groups: vec!["nope".into()],
        ..req.clone()
    };
    assert_eq!(
        status(admin.create_volume(&bad_group).await.unwrap_err()),
        400
    );
    assert_eq!(
        status(admin.delete_policy("gold").await.unwrap_err()),
        409,
        "policy in use"
    );
    assert_eq!(admin.show_volume("db").await.unwrap(), created);
    assert_eq!(status(admin.show_volume("nope").await.unwrap_err()), 404);

    // The new volume is served at once.
    let (mut c, export) = common::connect(&server, "db").await;
    assert_eq!(export.size_bytes, 1 << 20);
    c.write(0, &[3u8; 8192], false).await.unwrap().unwrap();
    c.read(0, 4096).await.unwrap().unwrap();

    let grown = admin.resize_volume("db", 2 << 20).await.unwrap();
    assert_eq!(grown.size_bytes, 2 << 20);
    assert_eq!(
        status(admin.resize_volume("db", 1 << 20).await.unwrap_err()),
        400,
        "no shrinking"
    );
    assert_eq!(
        status(admin.resize_volume("db", u64::MAX).await.unwrap_err()),
        400,
        "past a file offset's range: the caller's mistake, not a server error"
    );
    let (_, export) = common::connect(&server, "db").await;
    assert_eq!(
        export.size_bytes,
        2 << 20,
        "new connections see the new size"
    );

    assert_eq!(
        admin
            .set_volume_policy("db", "policy-2")
            .await
            .unwrap()
            .policy,
        "business-critical"
    );
    assert_eq!(
        status(admin.set_volume_policy("db", "nope").await.unwrap_err()),
        400
    );

    let stats = admin.volume_stats("db").await.unwrap();
    assert_eq!(stats.counters.write_ios, 1);
    assert_eq!(stats.counters.read_ios, 1);
    assert_eq!(stats.counters.write_bytes, 8192);
    assert_eq!(stats.dispatched_ios, 2);
    assert!(stats.mean_latency_ms > 0.0);
    // The pool's gate: idle now, its depth limit at max_in_flight (16).
    assert_eq!(stats.pool.in_flight, 0);
    assert_eq!(stats.pool.max_in_flight, 16);
    assert!(
        (1..=16).contains(&stats.pool.depth_limit),
        "{:?}",
        stats.pool
    );
    let pools = admin.list_pools().await.unwrap();
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0].name, "default");
    assert!(pools[0].qos && pools[0].device.is_none() && pools[0].host_windows.is_empty());
    assert_eq!(pools[0].gauges.max_in_flight, 16);

    let metrics = admin.metrics().await.unwrap();
    assert!(
        metrics.contains("weir_pool_in_flight{pool=\"default\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_pool_depth_limit{pool=\"default\"} 16"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_volume_ios_total{volume=\"db\",op=\"write\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_host_bytes_total{host=\"127.0.0.1\",op=\"write\"} 8192"),
        "{metrics}"
    );
    assert!(metrics.contains("# TYPE weir_volume_latency_seconds histogram"));

    // Deleting fails the open connection's further requests, not the server.
    admin.delete_volume("db").await.unwrap();
    assert_eq!(status(admin.show_volume("db").await.unwrap_err()), 404);
    assert!(c.read(0, 4096).await.unwrap().is_err());
    admin.delete_policy("gold").await.unwrap();
    assert_eq!(status(admin.show_policy("gold").await.unwrap_err()), 404);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_and_data_survive_a_restart() {
    let dir = common::TempDir::new("persist");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    let mut p = Policy::best_effort("silver");
    p.limit_mbps = Some(100.0);
    admin.create_policy(&p).await.unwrap();
    let req = VolumeCreate {
        name: "kept".into(),
        size_bytes: 1 << 20,
        policy: "silver".into(),
        pool: Some("default".into()),
        access_groups: vec![],
        read_only: false,
        description: String::new(),
        cache: Default::default(),
    };
    admin.create_volume(&req).await.unwrap();
    admin
        .set_volume_policy("open", "non-critical")
        .await
        .unwrap();
    let (mut c, _) = common::connect(&server, "kept").await;
    c.write(4096, b"persistent", true).await.unwrap().unwrap();
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
    assert!(dir.path().join("weir-meta.json").exists());
    assert!(dir.path().join("pools/default/kept.img").exists());

    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    assert_eq!(admin.show_volume("kept").await.unwrap().policy, "silver");
    assert_eq!(
        admin.show_volume("open").await.unwrap().policy,
        "non-critical",
        "API change kept over config"
    );
    assert_eq!(admin.show_policy("silver").await.unwrap(), p);
    let (mut c, _) = common::connect(&server, "kept").await;
    assert_eq!(c.read(4096, 10).await.unwrap().unwrap(), b"persistent");
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_groups_decide_who_sees_a_volume() {
    use weir_server::config::AccessGroupConfig;
    let dir = common::TempDir::new("groups");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    let names: Vec<String> = admin
        .list_access_groups()
        .await
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(names, ["far", "loopback"]);
    let lab = AccessGroupConfig {
        name: "lab".into(),
        hosts: vec!["192.168.0.0/16".into()],
        identities: vec![],
    };
    assert_eq!(admin.put_access_group(&lab).await.unwrap(), lab);
    let bad = AccessGroupConfig {
        name: "bad".into(),
        hosts: vec!["not-an-ip".into()],
        identities: vec![],
    };
    assert_eq!(status(admin.put_access_group(&bad).await.unwrap_err()), 400);
    // Identities on a server without tls_client_ca: refused, as in the config.
    let ids = AccessGroupConfig {
        name: "ids".into(),
        hosts: vec!["*".into()],
        identities: vec!["backup-1".into()],
    };
    let e = admin.put_access_group(&ids).await.unwrap_err();
    assert!(e.to_string().contains("tls_client_ca"), "{e}");
    assert_eq!(status(e), 400);
    let req = VolumeCreate {
        access_groups: vec!["lab".into()],
        ..plain_volume("labvol", 1 << 20)
    };
    admin.create_volume(&req).await.unwrap();
    let visible = |l: Vec<weir_nbd::ExportListing>| l.into_iter().any(|e| e.name == "labvol");
    assert!(
        !visible(NbdClient::list(server.nbd_addr()).await.unwrap()),
        "127.0.0.1 is not in lab"
    );
    assert!(
        NbdClient::connect(server.nbd_addr(), ClientConfig::go("labvol"))
            .await
            .is_err()
    );
    // Add loopback to the group: the volume appears for new connections.
    let lab2 = AccessGroupConfig {
        name: "lab".into(),
        hosts: vec!["192.168.0.0/16".into(), "127.0.0.1".into()],
        identities: vec![],
    };
    admin.put_access_group(&lab2).await.unwrap();
    assert!(visible(NbdClient::list(server.nbd_addr()).await.unwrap()));
    common::connect(&server, "labvol").await;
    assert_eq!(
        status(admin.delete_access_group("lab").await.unwrap_err()),
        409,
        "group in use"
    );
    // Re-point the volume at the "far" group only: it disappears again; read-only sticks.
    let change = weir_server::VolumeUpdate {
        access_groups: Some(vec!["far".into()]),
        read_only: Some(true),
        description: Some("moved".into()),
        cache: None,
    };
    let r = admin.update_volume("labvol", &change).await.unwrap();
    assert_eq!(
        (r.access_groups, r.read_only, r.description.as_str()),
        (vec!["far".to_string()], true, "moved")
    );
    assert!(!visible(NbdClient::list(server.nbd_addr()).await.unwrap()));
    let bad = weir_server::VolumeUpdate {
        access_groups: Some(vec!["nope".into()]),
        ..Default::default()
    };
    assert_eq!(
        status(admin.update_volume("labvol", &bad).await.unwrap_err()),
        400
    );
    let open_all = weir_server::VolumeUpdate {
        access_groups: Some(vec![]),
        ..Default::default()
    };
    admin.update_volume("labvol", &open_all).await.unwrap();
    let (_, export) = common::connect(&server, "labvol").await;
    assert!(
        export.export_info().read_only(),
        "no groups: open to every host; read-only kept"
    );
    admin.delete_volume("labvol").await.unwrap();
    admin.delete_access_group("lab").await.unwrap();
    assert_eq!(
        status(admin.show_access_group("lab").await.unwrap_err()),
        404
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn unreachable_admin_api_is_a_clear_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = Client::new(addr).list_volumes().await.unwrap_err();
    assert!(
        e.to_string().contains("cannot reach the weir admin API"),
        "{e}"
    );
}

/// Sends a raw HTTP/1.1 request; returns (status, body).
async fn raw_http(addr: std::net::SocketAddr, head: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{head}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_refuses_no_token_foreign_origin_foreign_host_and_non_json() {
    let dir = common::TempDir::new("admin-guard");
    let server = common::start(dir.path()).await;
    let addr = server.admin_addr();
    let token = server.admin_token().to_string();
    // The token file: in the data directory, private to the server's user.
    let file = dir.path().join("admin-token");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let host = format!("Host: {addr}");
    let auth = format!("Authorization: Bearer {token}");
    let create = r#"{"name": "csrf", "size_bytes": 1048576, "policy": "non-critical"}"#;

    // What a web page the operator opens could send: a "simple" cross-origin POST
    // (text/plain, no custom header) — refused, and nothing is created.
    let (status, body) = raw_http(
        addr,
        &format!(
            "POST /v1/volumes HTTP/1.1\r\n{host}\r\nOrigin: http://evil.example\r\nContent-Type: text/plain"
        ),
        create,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    // Without the token, even from the right host and with JSON.
    let (status, body) = raw_http(
        addr,
        &format!("POST /v1/volumes HTTP/1.1\r\n{host}\r\nContent-Type: application/json"),
        create,
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("admin-token"), "{body}");
    let (status, _) = raw_http(addr, &format!("GET /metrics HTTP/1.1\r\n{host}"), "").await;
    assert_eq!(status, 401, "metrics need the token too");
    // A wrong token.
    let (status, _) = raw_http(
        addr,
        &format!(
            "GET /v1/volumes HTTP/1.1\r\n{host}\r\nAuthorization: Bearer {}",
            "0".repeat(64)
        ),
        "",
    )
    .await;
    assert_eq!(status, 401);
    // With the token: a foreign Origin, a foreign Host (DNS rebinding), text/plain.
    let (status, body) = raw_http(
        addr,
        &format!("GET /v1/volumes HTTP/1.1\r\n{host}\r\n{auth}\r\nOrigin: https://evil.example"),
        "",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = raw_http(
        addr,
        &format!(
            "GET /v1/volumes HTTP/1.1\r\nHost: rebind.evil.example:{}\r\n{auth}",
            addr.port()
        ),
        "",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = raw_http(
        addr,
        &format!("POST /v1/volumes HTTP/1.1\r\n{host}\r\n{auth}\r\nContent-Type: text/plain"),
        create,
    )
    .await;
    assert_eq!(status, 415, "{body}");
    let admin = server.admin_client();
    assert!(
        admin
            .list_volumes()
            .await
            .unwrap()
            .iter()
            .all(|v| v.name != "csrf"),
        "a refused request created a volume"
    );
    // The same request done right; a same-origin browser request passes too.
    let (status, body) = raw_http(
        addr,
        &format!(
            "POST /v1/volumes HTTP/1.1\r\n{host}\r\n{auth}\r\nOrigin: http://{addr}\r\nContent-Type: application/json"
        ),
        create,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    // Behind a TLS-terminating proxy that passes the Host on, the page's origin
    // is https://HOST: the same origin.
    let (status, body) = raw_http(
        addr,
        &format!("GET /v1/volumes HTTP/1.1\r\n{host}\r\n{auth}\r\nOrigin: https://{addr}"),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A refused header is quoted clipped (it may be 64 KiB).
    let (status, body) = raw_http(
        addr,
        &format!(
            "GET /v1/volumes HTTP/1.1\r\n{host}\r\n{auth}\r\nOrigin: http://{}",
            "A".repeat(50_000)
        ),
        "",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.len() < 300, "{} bytes", body.len());
    // A client without the token is answered on its head: its body is never
    // waited for (nor a 100 Continue sent), and the connection closes.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/volumes HTTP/1.1\r\n{host}\r\nContent-Type: application/json\r\n\
             Expect: 100-continue\r\nContent-Length: 2000000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("not answered before its body")
            .unwrap();
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 401"), "{text}");
        assert!(!text.contains("100 Continue"), "{text}");
    }
    // A misspelt or unknown field is refused (422), not ignored: `readonly` for
    // `read_only` once created a writable volume and changed nothing on PATCH.
    let json = format!("{host}\r\n{auth}\r\nContent-Type: application/json");
    for (head, body) in [
        (
            format!("POST /v1/volumes HTTP/1.1\r\n{json}"),
            r#"{"name": "typo", "size_bytes": 1048576, "policy": "non-critical", "readonly": true}"#,
        ),
        (
            format!("PATCH /v1/volumes/csrf HTTP/1.1\r\n{json}"),
            r#"{"readonly": true}"#,
        ),
        (
            format!("POST /v1/volumes/csrf/resize HTTP/1.1\r\n{json}"),
            r#"{"size_bytes": 2097152, "shrink": true}"#,
        ),
    ] {
        let (status, answer) = raw_http(addr, &head, body).await;
        assert_eq!(status, 422, "{head}: {answer}");
        assert!(answer.contains("unknown field"), "{answer}");
    }
    let csrf = admin.show_volume("csrf").await.unwrap();
    assert!(!csrf.read_only && csrf.size_bytes == 1048576, "{csrf:?}");
    assert!(admin.show_volume("typo").await.is_err());
    let (status, _) = raw_http(
        addr,
        &format!(
            "GET /metrics HTTP/1.1\r\nHost: localhost:{}\r\n{auth}",
            addr.port()
        ),
        "",
    )
    .await;
    assert_eq!(status, 200);
    // The client without a token is refused.
    let e = weir_server::admin::Client::new(addr)
        .list_volumes()
        .await
        .unwrap_err();
    assert_eq!(status_of(e), 401);
    // The token survives a restart.
    server.shutdown().await.unwrap();
    let server = common::start(dir.path()).await;
    assert_eq!(server.admin_token(), token);
    server.shutdown().await.unwrap();
}

/// A client still connected to a volume that is deleted gets ESHUTDOWN ("volume
/// was deleted"), and its connection ends (it got EIO for as long as it stayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_volume_s_connections_are_told_and_closed() {
    let dir = common::TempDir::new("admin-delete-open");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    admin
        .create_volume(&plain_volume("d", 1 << 20))
        .await
        .unwrap();
    let (mut c, _) = common::connect(&server, "d").await;
    c.write(0, &[5u8; 4096], false).await.unwrap().unwrap();
    admin.delete_volume("d").await.unwrap();
    let e = c.read(0, 4096).await.unwrap().unwrap_err();
    assert_eq!(e.code, weir_nbd::ErrorCode::Shutdown, "{e}");
    assert!(e.message.contains("deleted"), "{e}");
    // Then the server closes: a later request finds the connection gone.
    let closed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match c.read(0, 4096).await {
                Err(_) => return,
                Ok(r) => assert!(r.is_err()),
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection stayed open");
    server.shutdown().await.unwrap();
}

/// A resize whose metadata cannot be written (a full disk; here its temporary
/// file's name taken by a directory) fails and leaves the volume as it was: the
/// file is not left grown behind metadata that says otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_that_cannot_be_recorded_changes_nothing() {
    let dir = common::TempDir::new("admin-resize-fail");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    admin
        .create_volume(&plain_volume("r", 1 << 20))
        .await
        .unwrap();
    let file = find_file(dir.path(), "r.img").expect("the volume's file");
    let blocker = dir.path().join("weir-meta.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let e = admin.resize_volume("r", 4 << 20).await.unwrap_err();
    assert_eq!(status(e), 500);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 1 << 20);
    assert_eq!(admin.show_volume("r").await.unwrap().size_bytes, 1 << 20);
    std::fs::remove_dir(&blocker).unwrap();
    let grown = admin.resize_volume("r", 4 << 20).await.unwrap();
    assert_eq!(grown.size_bytes, 4 << 20);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 4 << 20);
    assert!(!blocker.exists(), "no temporary file left behind");
    server.shutdown().await.unwrap();
}

fn find_file(dir: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir(dir).ok()? {
        let p = e.ok()?.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_errors_carry_no_absolute_paths() {
    let dir = common::TempDir::new("admin-paths");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    // A directory where the metadata's temporary file goes: every change that
    // persists fails with an I/O error naming that path (root included).
    let blocker = dir.path().join("weir-meta.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    match admin
        .create_policy(&Policy::best_effort("blocked"))
        .await
        .unwrap_err()
    {
        ClientError::Api { status, message } => {
            assert_eq!(status, 500, "{message}");
            let data = dir.path().display().to_string();
            assert!(!message.contains(&data), "{message}");
            assert!(
                !message.contains("/tmp") && !message.contains("weir-meta.json.tmp/"),
                "{message}"
            );
            assert!(
                message.contains("<data_dir>/weir-meta.json.tmp"),
                "{message}"
            );
        }
        other => panic!("{other}"),
    }
    std::fs::remove_dir(&blocker).unwrap();
    admin
        .create_policy(&Policy::best_effort("unblocked"))
        .await
        .unwrap();
    server.shutdown().await.unwrap();
}

/// A create whose file cannot be sized (a size no file system holds) fails and
/// leaves no file behind: the file used to stay, owned by no volume, and every
/// later create of the name was refused 409 ("a file … already exists").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_whose_file_cannot_be_sized_leaves_no_file_behind() {
    let dir = common::TempDir::new("admin-unsized");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    let mut req = plain_volume("huge", u64::MAX);
    for size in [u64::MAX, 1 << 62] {
        req.size_bytes = size;
        let e = admin.create_volume(&req).await.unwrap_err();
        // The request is at fault: a 400 saying why (it was a 500).
        assert!(
            e.to_string().contains("size") || e.to_string().contains("bytes"),
            "{e}"
        );
        assert_eq!(status(e), 400, "size {size}");
    }
    let files: Vec<_> = std::fs::read_dir(dir.path().join("pools/default"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!files.contains(&"huge.img".to_string()), "{files:?}");
    req.size_bytes = 1 << 20;
    assert_eq!(admin.create_volume(&req).await.unwrap().size_bytes, 1 << 20);
    server.shutdown().await.unwrap();
}

/// A volume deleted while a client holds its `weir:exclusive` lease, then
/// created again: the new volume is writable at once. The old connection's lease
/// (kept by name) used to refuse every write to the new volume EPERM for as long
/// as that connection stayed open; the old connection is now closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_a_deleted_volume_does_not_hold_a_new_one_of_its_name() {
    let dir = common::TempDir::new("admin-lease-delete");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    let req = plain_volume("again", 1 << 20);
    admin.create_volume(&req).await.unwrap();
    let mut holder = lease_holder(&server, "again", "old-holder").await;
    holder.write(0, &[1; 4096], false).await.unwrap().unwrap();
    admin.delete_volume("again").await.unwrap();
    admin.create_volume(&req).await.unwrap();
    let (mut other, _) = common::connect(&server, "again").await;
    let t = std::time::Instant::now();
    other.write(0, &[2; 4096], false).await.unwrap().unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(1),
        "waited {:?}",
        t.elapsed()
    );
    assert_eq!(other.read(0, 4096).await.unwrap().unwrap(), vec![2; 4096]);
    // The old holder's connection is closed.
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        holder.read(0, 4096).await
    })
    .await
    .expect("the old holder's connection closes");
    assert!(closed.is_err(), "{closed:?}");
    server.shutdown().await.unwrap();
}

/// A lease holder that reads none of its replies is still disconnected by
/// `break-lease`, within the lease's grace (its connection used to stay open,
/// its writer blocked, until the client read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_lease_closes_a_holder_that_reads_nothing() {
    let dir = common::TempDir::new("admin-lease-deaf");
    let server = common::start(dir.path()).await;
    let admin = server.admin_client();
    let req = plain_volume("deaf", 64 << 20);
    admin.create_volume(&req).await.unwrap();
    let mut holder = lease_holder(&server, "deaf", "deaf-holder").await;
    let open = || common::sample(&server, "weir_connections");
    assert_eq!(open(), 1);
    for i in 0..128u64 {
        holder.session().read((i % 64) << 20, 1 << 20);
    }
    holder.send().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let broken = admin.break_lease("deaf").await.unwrap();
    assert_eq!(broken.holder.as_deref(), Some("127.0.0.1"));
    let t = std::time::Instant::now();
    while open() > 0 {
        assert!(
            t.elapsed() < weir_server::lease::LEASE_GRACE * 3,
            "the deaf holder's connection stayed open"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    println!("closed {:?} after the break", t.elapsed());
    drop(holder);
    server.shutdown().await.unwrap();
}

/// 400 connections to the admin port from one address, each sending half a request
/// head and nothing more. The admin API used to keep every one open (19,900 of
/// them left the NBD listener 79 descriptors); now one address keeps at most
/// `Limits::ADMIN.max_per_address`, the rest get a 503 and are closed at once, and
/// NBD clients and other operators are served meanwhile.
/// A TCP connection to `addr` from 127.0.0.2 (another client address on loopback).
async fn connect_from_127_0_0_2(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// An operator's `GET /v1/volumes` from 127.0.0.1 (with the token) gets a 200.
async fn assert_operator_served(server: &weir_server::RunningServer) {
    let addr = server.admin_addr();
    let token = server.admin_token().to_string();
    let (status, body) = raw_http(
        addr,
        &format!("GET /v1/volumes HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}"),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_connection_flood_is_capped_and_hurts_no_one_else() {
    use tokio::io::AsyncWriteExt;
    let dir = common::TempDir::new("admin-flood");
    let server = common::start(dir.path()).await;
    let addr = server.admin_addr();
    let mut flood = Vec::new();
    for _ in 0..400 {
        let mut s = connect_from_127_0_0_2(addr).await;
        let _ = s
            .write_all(b"GET /v1/volumes HTTP/1.1\r\nHost: x\r\n")
            .await;
        flood.push(s);
    }
    // Within a fraction of the 10 s head deadline: a connection with nothing to
    // read (not a 503, not closed) is one the server keeps.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut sink = [0u8; 512];
    let closed = flood
        .iter()
        .filter(|s| !matches!(s.try_read(&mut sink), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
        .count();
    let kept = flood.len() - closed;
    assert!(
        kept <= weir_http::Limits::ADMIN.max_per_address && kept < flood.len() / 4,
        "{kept} of the flood's connections still open"
    );
    // An NBD client and an operator elsewhere are served.
    let (mut nbd, _) = common::connect(&server, "open").await;
    let read = nbd.read(0, 4096).await.expect("NBD read beside the flood");
    assert_eq!(read.expect("read answered").len(), 4096);
    assert_operator_served(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_connection_caps_come_from_the_config() {
    use tokio::io::AsyncWriteExt;
    let toml = format!(
        "admin_max_connections = 8\nadmin_max_connections_per_host = 2\n{}",
        common::TEST_CONFIG
    );
    let (_dir, server) = common::start_with("admin-caps", &toml).await;
    let addr = server.admin_addr();
    // Two half-sent heads from 127.0.0.2 are kept; the third gets a 503 at once.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from_127_0_0_2(addr).await;
        s.write_all(b"GET /v1/volumes HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut third = connect_from_127_0_0_2(addr).await;
    let mut reply = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut third, &mut reply),
    )
    .await
    .expect("the third connection from one address is answered at once");
    read.unwrap();
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    // Another address is served.
    assert_operator_served(&server).await;
    drop(held);
}
