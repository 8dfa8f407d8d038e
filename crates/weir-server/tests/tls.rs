//! NBD over TLS against real clients: nbdinfo (`nbds://`), qemu-io/qemu-img with a
//! `tls-creds-x509` object, nbdcopy; `tls = "require"` answering a plain client
//! without naming any export; client certificates mapped to access groups.
//! Certificates are made per test run with the `openssl` command; a missing tool
//! prints "skipped: <why>" and the test returns.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output};
use std::time::Duration;

use weir_nbd::consts::*;
use weir_server::RunningServer;
use weir_testkit::{Pki, TempDir, output_text as text, require_tool};

/// Runs `cmd args…` off the async runtime (the server runs on it).
async fn run(cmd: &str, args: &[&str]) -> Output {
    let cmd = cmd.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(&cmd)
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

/// Volumes: `open` (16 MiB, any client) and `only1` (1 MiB, any host but only
/// the TLS identity `client1`).
const VOLUMES: &str = r#"
[[access_groups]]
name = "client1-only"
hosts = ["*"]
identities = ["client1"]

[[volumes]]
name = "open"
size = "16MiB"
policy = "mission-critical"

[[volumes]]
name = "only1"
size = "1MiB"
policy = "non-critical"
access_groups = ["client1-only"]
"#;

async fn start(pki: &Pki, mode: &str) -> (TempDir, RunningServer) {
    common::start_with("tls", &format!("{}{VOLUMES}", pki.weir_config(mode))).await
}

/// `nbds://` URI of `export` with the client credentials in `pki/<creds>`.
fn nbds(server: &RunningServer, export: &str, pki: &Pki, creds: &str) -> String {
    format!(
        "nbds://{}/{export}?tls-certificates={}",
        server.nbd_addr(),
        pki.path(creds)
    )
}

/// Export names `nbdinfo --list` shows at `uri`, or `None` if it failed.
async fn listed(uri: &str) -> Option<Vec<String>> {
    let o = run("nbdinfo", &["--list", "--json", uri]).await;
    if !o.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    Some(
        v["exports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["export-name"].as_str().unwrap().to_string())
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tls_serves_nbdinfo_qemu_and_nbdcopy() {
    let Some(pki) = Pki::new() else { return };
    if !require_tool("nbdinfo", &[]) || !require_tool("qemu-io", &[]) {
        return;
    }
    let (dir, server) = start(&pki, "require").await;
    let addr = server.nbd_addr();

    // nbdinfo over TLS sees the export; in plain text it gets nothing.
    let o = run_ok(
        "nbdinfo",
        &["--json", &nbds(&server, "open", &pki, "client1")],
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exports"][0]["export-size"], 16 << 20, "{v}");
    assert_eq!(v["exports"][0]["can_multi_conn"], true, "{v}");
    let plain = run("nbdinfo", &[&format!("nbd://{addr}/open")]).await;
    assert!(!plain.status.success(), "{}", text(&plain));
    assert!(
        text(&plain).to_lowercase().contains("tls"),
        "{}",
        text(&plain)
    );

    // qemu-io with an X.509 credentials object: write a pattern, read it back.
    let object = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        pki.path("client1")
    );
    let image = format!(
        "driver=nbd,host=127.0.0.1,port={},export=open,tls-creds=tls0",
        addr.port()
    );
    let qemu_io = |cmds: &[&str]| {
        let mut args = vec!["--object", &object, "--image-opts"];
        for c in cmds {
            args.extend(["-c", c]);
        }
        args.push(&image);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let args = qemu_io(&["write -P 0x5a 1M 1M", "write -P 0xa5 4M 64k", "flush"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run_ok("qemu-io", &args).await;
    assert!(!text(&o).contains("failed"), "{}", text(&o));
    let args = qemu_io(&[
        "read -P 0x5a 1M 1M",
        "read -P 0xa5 4M 64k",
        "read -P 0 0 1M",
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run_ok("qemu-io", &args).await;
    assert!(!text(&o).contains("failed"), "{}", text(&o));

    // qemu-img reads the size and copies the image out over TLS.
    if require_tool("qemu-img", &[]) {
        let out = dir.join("qemu-copy.raw").display().to_string();
        let o = run_ok(
            "qemu-img",
            &[
                "convert",
                "--object",
                &object,
                "--image-opts",
                &image,
                "-O",
                "raw",
                &out,
            ],
        )
        .await;
        let copy = std::fs::read(&out).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
        assert_eq!(copy.len(), 16 << 20);
        assert!(copy[1 << 20..2 << 20].iter().all(|&b| b == 0x5a));
        assert!(
            copy[4 << 20..(4 << 20) + (64 << 10)]
                .iter()
                .all(|&b| b == 0xa5)
        );
    }

    // nbdcopy over several TLS connections, both ways.
    if require_tool("nbdcopy", &[]) {
        let src: Vec<u8> = (0..16u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        let src_path = dir.join("src.raw");
        let back_path = dir.join("back.raw");
        std::fs::write(&src_path, &src).unwrap();
        let uri = nbds(&server, "open", &pki, "client1");
        let (src_arg, back_arg) = (
            src_path.display().to_string(),
            back_path.display().to_string(),
        );
        run_ok("nbdcopy", &["--connections=4", "--flush", &src_arg, &uri]).await;
        run_ok("nbdcopy", &["--connections=4", &uri, &back_arg]).await;
        assert!(
            std::fs::read(&back_path).unwrap() == src,
            "TLS copy differs"
        );
    }
    server.shutdown().await.unwrap();
}

/// Reads one option reply: (option, type, data).
fn read_reply(s: &mut TcpStream) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), REPLY_MAGIC);
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut data = vec![0u8; len];
    s.read_exact(&mut data).unwrap();
    (
        u32::from_be_bytes(h[8..12].try_into().unwrap()),
        u32::from_be_bytes(h[12..16].try_into().unwrap()),
        data,
    )
}

fn option(s: &mut TcpStream, option: u32, data: &[u8]) {
    let mut o = IHAVEOPT.to_be_bytes().to_vec();
    o.extend(option.to_be_bytes());
    o.extend((data.len() as u32).to_be_bytes());
    o.extend(data);
    s.write_all(&o).unwrap();
}

/// A plain-text connection past the greeting and client flags.
fn plain_client(addr: std::net::SocketAddr) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    (s, greeting.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tls_reveals_no_export_to_a_client_that_skips_starttls() {
    let Some(pki) = Pki::new() else { return };
    let (_dir, server) = start(&pki, "require").await;
    let addr = server.nbd_addr();
    let received = tokio::task::spawn_blocking(move || {
        let (mut s, mut seen) = plain_client(addr);
        let go = {
            let mut d = 4u32.to_be_bytes().to_vec();
            d.extend(b"open");
            d.extend(0u16.to_be_bytes());
            d
        };
        let asks = [
            (OPT_LIST, vec![]),
            (OPT_INFO, go.clone()),
            (OPT_GO, go.clone()),
            (OPT_STRUCTURED_REPLY, vec![]),
            (OPT_LIST_META_CONTEXT, go.clone()),
        ];
        for (opt, data) in &asks {
            option(&mut s, *opt, data);
            let (o, t, d) = read_reply(&mut s);
            assert_eq!(
                (o, t),
                (*opt, REP_ERR_TLS_REQD),
                "{}",
                String::from_utf8_lossy(&d)
            );
            seen.extend(d);
        }
        // EXPORT_NAME cannot be refused: the server hangs up without a word.
        option(&mut s, OPT_EXPORT_NAME, b"open");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{rest:?}");
        seen
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&received);
    for name in ["open", "only1"] {
        assert!(!text.contains(name), "{name:?} revealed: {text:?}");
    }
    assert!(text.contains("TLS"), "{text:?}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_map_to_access_groups() {
    let Some(pki) = Pki::new() else { return };
    if !require_tool("nbdinfo", &[]) {
        return;
    }
    // TLS offered, not required: plain clients still reach what is open to them.
    let (_dir, server) = start(&pki, "on").await;
    let base = |creds: &str| {
        format!(
            "nbds://{}?tls-certificates={}",
            server.nbd_addr(),
            pki.path(creds)
        )
    };
    let plain = format!("nbd://{}", server.nbd_addr());
    assert_eq!(listed(&plain).await.unwrap(), ["open"]);
    assert_eq!(
        listed(&base("anon")).await.unwrap(),
        ["open"],
        "no certificate"
    );
    assert_eq!(listed(&base("client2")).await.unwrap(), ["open"]);
    assert_eq!(listed(&base("client1")).await.unwrap(), ["only1", "open"]);
    run_ok("nbdinfo", &[&nbds(&server, "only1", &pki, "client1")]).await;
    let other = run("nbdinfo", &[&nbds(&server, "only1", &pki, "client2")]).await;
    assert!(!other.status.success(), "{}", text(&other));
    let p = run("nbdinfo", &[&format!("{plain}/only1")]).await;
    assert!(!p.status.success(), "{}", text(&p));
    server.shutdown().await.unwrap();
}

/// A gateway in front of a TLS-only upstream (`upstream = "nbds://…"`): it
/// verifies the upstream's certificate against `upstream_tls_ca` and presents
/// client1's certificate, so it opens the volume only client1 may reach, and
/// data written through it is read back from the upstream by a TLS client.
/// Without TLS, with another identity, or with a CA that did not sign the
/// upstream's certificate, the gateway does not start, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_reaches_a_tls_only_upstream_with_its_client_certificate() {
    let Some(pki) = Pki::new() else { return };
    let (_sd, storage) = start(&pki, "require").await;
    let port = storage.nbd_addr().port();
    let ca = pki.path("server");
    let gateway = |scheme: &str, ca_of: &str, creds: &str| {
        let mut toml = format!(
            "[[pools]]\nname = \"gw\"\nupstream = \"{scheme}://127.0.0.1:{port}\"\n\
             upstream_connections = 2\n"
        );
        if scheme == "nbds" {
            toml += &format!("upstream_tls_ca = \"{ca_of}/ca-cert.pem\"\n");
            if creds != "anon" {
                let c = pki.path(creds);
                toml += &format!(
                    "upstream_tls_cert = \"{c}/client-cert.pem\"\n\
                     upstream_tls_key = \"{c}/client-key.pem\"\n"
                );
            }
        }
        toml + "[[volumes]]\nname = \"only1\"\npolicy = \"non-critical\"\npool = \"gw\"\n"
    };

    let (_gd, gw) = common::start_with("tls-gw", &gateway("nbds", &ca, "client1")).await;
    let (mut c, export) = common::connect(&gw, "only1").await;
    assert_eq!(
        export.size_bytes,
        1 << 20,
        "the size comes from the upstream"
    );
    let data: Vec<u8> = (0..256u32 << 10).map(|i| (i % 251) as u8).collect();
    c.write(64 << 10, &data, false).await.unwrap().unwrap();
    c.flush().await.unwrap().unwrap();
    let back = c.read(64 << 10, data.len() as u32).await.unwrap().unwrap();
    assert!(back == data, "read back through the gateway");
    c.disconnect().await.unwrap();
    gw.shutdown().await.unwrap();
    if require_tool("nbdcopy", &[]) {
        let dir = TempDir::new("tls-gw-check");
        let out = dir.join("only1.raw").display().to_string();
        let uri = nbds(&storage, "only1", &pki, "client1");
        run_ok("nbdcopy", &[&uri, &out]).await;
        let on_upstream = std::fs::read(&out).unwrap();
        assert!(on_upstream[64 << 10..(64 << 10) + data.len()] == data[..]);
    }

    let other_pki = Pki::new().unwrap();
    let other_ca = other_pki.path("server");
    for (scheme, ca_of, creds, says) in [
        ("nbd", &ca, "client1", "tls"),
        ("nbds", &ca, "client2", "only1"),
        ("nbds", &ca, "anon", "only1"),
        ("nbds", &other_ca, "client1", "certificate"),
    ] {
        let dir = TempDir::new("tls-gw-refused");
        let config = common::config_from(&gateway(scheme, ca_of, creds), dir.path());
        let e = match weir_server::RunningServer::start(config).await {
            Ok(s) => {
                s.shutdown().await.unwrap();
                panic!("{scheme} as {creds}: the gateway started")
            }
            Err(e) => format!("{e:#}"),
        };
        assert!(e.to_lowercase().contains(says), "{scheme} as {creds}: {e}");
    }
    storage.shutdown().await.unwrap();
}
