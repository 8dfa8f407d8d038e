//! The dashboard in a real headless browser (Debian's `chromium` driven by
//! `chromedriver` over the W3C WebDriver HTTP API): the page loads and signs in
//! with the admin token typed into its form, the charts draw from live data while
//! load runs, and a policy edited in the page (click Edit, type, Save) takes
//! effect on the volume's I/O. Screenshots go to `target/dashboard-test/`.
//! Prints `skipped: <why>` when Chromium or chromedriver cannot be had.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use weir_server::RunningServer;

const CONFIG: &str = r#"
[[pools]]
name = "default"
max_in_flight = 16

[[policies]]
name = "gold"
limit_iops = 100000
latency_target_ms = 20

[[volumes]]
name = "db"
size = "16MiB"
policy = "gold"

[[volumes]]
name = "desktops"
size = "16MiB"
policy = "non-critical"
"#;

/// Chromium's flags for a closed network, as root, without a display.
const CHROME_ARGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
];

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One WebDriver session on a chromedriver this test started.
struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: common::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http(
            self.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A JSON request to chromedriver (HTTP/1.1, one connection per request).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<Value> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let (head, body) = read_answer(&mut s)?;
    serde_json::from_slice(&body).map_err(|e| {
        std::io::Error::other(format!("{e}: {head} {}", String::from_utf8_lossy(&body)))
    })
}

/// An HTTP/1.1 answer with a `Content-Length` body (chromedriver keeps the
/// connection open whatever `Connection: close` says).
fn read_answer(s: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::other("connection closed in the headers"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .ok_or_else(|| std::io::Error::other(format!("no Content-Length in {head}")))?;
    while buf.len() < head_end + length {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::other("connection closed in the body"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok((head, buf[head_end..head_end + length].to_vec()))
}

impl Browser {
    fn start() -> Option<Browser> {
        for (tool, package) in [
            ("chromium", "chromium"),
            ("chromedriver", "chromium-driver"),
        ] {
            if !weir_testkit::require_tool(tool, &[package]) {
                return None;
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().ok()?;
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let profile = common::TempDir::new("chromium-profile");
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http(addr, "GET", "/status", None).is_err() {
            if Instant::now() > deadline {
                println!("skipped: chromedriver did not answer on {addr} within 30 s");
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut args: Vec<String> = CHROME_ARGS.iter().map(|s| s.to_string()).collect();
        args.push(format!(
            "--user-data-dir={}",
            browser._profile.path().display()
        ));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}
        }}});
        let answer = http(addr, "POST", "/session", Some(&caps)).ok()?;
        match answer["value"]["sessionId"].as_str() {
            Some(id) => browser.session = id.to_string(),
            None => {
                println!("skipped: chromium did not start under chromedriver: {answer}");
                return None;
            }
        }
        Some(browser)
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let answer = http(self.addr, method, &path, body.as_ref())
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert!(
            answer["value"]["error"].is_null(),
            "{method} {path}: {answer}"
        );
        answer["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    fn find(&self, css: &str) -> String {
        let v = self.call(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        v[ELEMENT].as_str().expect("element id").to_string()
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.call("POST", &format!("/element/{e}/click"), Some(json!({})));
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.call("POST", &format!("/element/{e}/clear"), Some(json!({})));
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// Runs `script` (a function body) in the page; its return value.
    fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Waits (60 s at most) until `script` returns true.
    fn wait_for(&self, what: &str, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.eval(script) != Value::Bool(true) {
            assert!(
                Instant::now() < deadline,
                "{what}: not within 60 s; page text: {}",
                self.eval("return document.body.innerText")
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn screenshot(&self, name: &str) {
        let png = self.call("GET", "/screenshot", None);
        let bytes = base64_decode(png.as_str().expect("base64 PNG"));
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/dashboard-test");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
        .map(value)
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | u32::from(d) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// Reads 4 KiB blocks of `volume` at queue depth 4 until the task is aborted.
fn start_load(server: &RunningServer, volume: &'static str) -> tokio::task::JoinHandle<()> {
    let addr = server.nbd_addr();
    tokio::spawn(async move {
        let load = common::ReadLoad {
            volume,
            from: None,
            queue_depth: 4,
            size_bytes: 4096,
            span_bytes: 16 << 20,
            seed: 7,
        };
        loop {
            load.run_for(addr, Duration::from_secs(3600)).await;
        }
    })
}

/// The live IOPS of `volume` (the sampler's last second).
async fn live_iops(server: &RunningServer, volume: &str) -> f32 {
    let live = server.admin_client().live_stats().await.unwrap();
    live.volumes
        .iter()
        .find(|v| v.name == volume)
        .map_or(0.0, |v| v.sample.iops)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_headless_browser() {
    let Some(browser) = tokio::task::spawn_blocking(Browser::start).await.unwrap() else {
        return;
    };
    let (_dir, server) = common::start_with("dashboard", CONFIG).await;
    let load = start_load(&server, "db");
    let page = format!("http://{}/", server.admin_addr());
    let token = server.admin_token().to_string();
    let browser = std::sync::Arc::new(browser);
    let (b, t) = (browser.clone(), token.clone());
    tokio::task::spawn_blocking(move || sign_in_and_watch_live_charts(&b, &page, &t))
        .await
        .unwrap();

    // The policy edit, by clicking and typing in the page.
    let before = live_iops(&server, "db").await;
    assert!(
        before > 300.0,
        "the load runs faster than the new limit: {before} IOPS"
    );
    let b = browser.clone();
    tokio::task::spawn_blocking(move || edit_policy_in_the_page(&b))
        .await
        .unwrap();
    let admin = server.admin_client();
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin.show_policy("gold").await.unwrap().limit_iops != Some(100.0) {
        assert!(
            Instant::now() < deadline,
            "the edit did not reach the server"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It takes effect: the volume's live rate falls to the new limit.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let iops = live_iops(&server, "db").await;
        if iops > 0.0 && iops <= 130.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {iops} IOPS under a 100 IOPS limit"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (b, t) = (browser.clone(), token.clone());
    tokio::task::spawn_blocking(move || the_page_keeps_its_footing(&b, &t))
        .await
        .unwrap();
    let b = browser.clone();
    tokio::task::spawn_blocking(move || {
        b.goto(&format!(
            "{}#volume/db",
            b.eval("return location.origin + '/'").as_str().unwrap()
        ));
        b.wait_for(
            "the latency chart with the new limit's history",
            "return window.weirCharts.length === 6 && window.weirCharts[0].data[0].length > 3",
        );
        b.screenshot("volume-after-edit.png");
    })
    .await
    .unwrap();
    load.abort();
    drop(browser);
    server.shutdown().await.unwrap();
}

fn sign_in_and_watch_live_charts(b: &Browser, page: &str, token: &str) {
    b.goto(page);
    b.wait_for(
        "the sign-in form",
        "return !document.getElementById('login').hidden",
    );
    b.type_into("#login-token", token);
    b.click("#login-go");
    b.wait_for(
        "the service levels view with a busy volume",
        "const m = document.getElementById('meeting'); return !!m && /of [1-9]/.test(m.textContent)",
    );
    b.wait_for(
        "the live IOPS chart drawn from several seconds",
        "const c = window.weirCharts[0]; return !!c && c.data[0].length >= 3 && c.data.slice(1).some(s => s.some(x => x > 0))",
    );
    b.screenshot("service-levels.png");
    b.click("a[data-view=volumes]");
    b.wait_for(
        "the volume table",
        "return document.body.innerText.includes('desktops')",
    );
    b.goto(&format!("{page}#volume/db"));
    b.wait_for(
        "the volume's charts with live points",
        "const c = window.weirCharts; return c.length === 6 && c[0].data[1].filter(x => x > 0).length >= 2 && c[2].data[2].some(x => x > 0)",
    );
    b.screenshot("volume-live.png");
}

/// Session 30's review of the page: an action's error stays readable through
/// the refreshes; a view left while its answer was on the way leaves nothing
/// behind; a malformed address shows the volume list; a `#token=` address
/// signs nobody in.
fn the_page_keeps_its_footing(b: &Browser, token: &str) {
    let origin = b.eval("return location.origin + '/'");
    let page = origin.as_str().unwrap();
    b.goto(&format!("{page}#volumes"));
    b.wait_for(
        "the create form",
        "return !!document.querySelector('#create-volume')",
    );
    b.type_into("#create-volume input[name=name]", "bad name!");
    b.click("#create-volume button[type=submit]");
    std::thread::sleep(Duration::from_millis(2500));
    let status = b.eval("return document.getElementById('status').textContent");
    assert!(
        status.as_str().unwrap().contains("create bad name!:"),
        "the error was replaced: {status}"
    );
    b.eval("location.hash = 'hosts'; setTimeout(() => { location.hash = 'groups'; }, 0); return 0");
    b.wait_for(
        "the access groups",
        "return !!document.querySelector('#groups-table')",
    );
    std::thread::sleep(Duration::from_millis(1500));
    let stale = b.eval("return document.querySelectorAll('#hosts-table').length");
    assert_eq!(stale.as_i64(), Some(0), "the hosts view left its table");
    b.goto(&format!("{page}#volume/%E0%A4%A"));
    b.wait_for(
        "the volume list for an unreadable name",
        "return !!document.querySelector('#volumes-table')",
    );
    b.goto("about:blank");
    b.goto(&format!("{page}#token=00ff"));
    b.wait_for(
        "the sign-in form, the link refused",
        "return !document.getElementById('login').hidden && location.hash === '#levels'",
    );
    let said = b.eval("return document.getElementById('login-error').textContent");
    assert!(said.as_str().unwrap().contains("paste the token"), "{said}");
    b.type_into("#login-token", token);
    b.click("#login-go");
    b.wait_for(
        "signed in again",
        "return document.getElementById('login').hidden",
    );
}

fn edit_policy_in_the_page(b: &Browser) {
    b.click("a[data-view=policies]");
    b.wait_for(
        "the policies table",
        "return !!document.querySelector('button[data-edit=gold]')",
    );
    b.click("button[data-edit=gold]");
    b.type_into("#policy-form input[name=limit_iops]", "100");
    b.click("#policy-save");
    b.wait_for(
        "the table showing the new limit",
        "return [...document.querySelectorAll('#policies-table tr')].some(r => r.cells[0].textContent === 'gold' && r.cells[3].textContent === '100')",
    );
    b.screenshot("policies-after-edit.png");
}
