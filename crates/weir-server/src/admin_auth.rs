//! The admin API's checks, in front of every route ([`AdminGuard::serve`]):
//!
//! - **Host**: the `Host` header must name this server the way a person or a
//!   script would — an IP literal, `localhost`, or a name listed in
//!   `admin_hosts`. A web page that re-points its own DNS name at this machine
//!   (DNS rebinding) sends its own name and is refused (403).
//! - **Origin**: when present (browsers send it), it must be the same origin,
//!   `http://<Host>` or `https://<Host>` (behind a TLS proxy); a page on
//!   another origin is refused (403).
//! - **Token**: `Authorization: Bearer <token>`, compared in constant time (401
//!   without it). The token is made at first start — 32 random bytes, hex —
//!   in `<data_dir>/admin-token`, mode 0600, where the CLI finds it.
//! - **Content type**: a request with a body, and every POST, PUT and PATCH,
//!   must say `Content-Type: application/json` (415): an HTML form cannot.
//!
//! The checks run on a request's head, before its body is read
//! ([`AdminGuard::refuse_early`]): a refused client sends no body we take in.
//!
//! Error answers never carry absolute paths: the data directory becomes
//! `<data_dir>`, and in server errors (500: I/O) any other absolute path
//! `<path>`; the full message goes to the server log.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use weir_http::{Request, Response};

/// File in the data directory that holds the admin token.
pub const TOKEN_FILE: &str = "admin-token";
/// Environment variable the CLI reads the token from (before any file).
pub const TOKEN_ENV: &str = "WEIR_ADMIN_TOKEN";

const JSON: &str = "application/json";

/// Checks every admin request before it is routed.
pub struct AdminGuard {
    token: String,
    /// Host names accepted beside IP literals and `localhost` (lower case).
    hosts: Vec<String>,
    data_dir: String,
}

impl AdminGuard {
    /// Reads the token from `data_dir`, creating it on first start.
    pub fn open(data_dir: &Path, extra_hosts: &[String]) -> std::io::Result<AdminGuard> {
        Ok(AdminGuard {
            token: load_or_create_token(data_dir)?,
            hosts: extra_hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            data_dir: data_dir.display().to_string(),
        })
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// Checks `request`; answers it with `route` if it passes. Error answers
    /// (the checks' and the routes') lose their absolute paths.
    pub fn serve(&self, request: &Request, route: impl FnOnce(&Request) -> Response) -> Response {
        let response = match self.check(request) {
            Ok(()) => route(request),
            Err((status, message)) => error(status, &message),
        };
        self.scrubbed(response)
    }

    /// The answer to a request refused on its head alone (Host, Origin, token,
    /// content type), before its body is read; `None`: read the body and
    /// [`AdminGuard::serve`] it.
    pub fn refuse_early(&self, request: &Request) -> Option<Response> {
        let (status, message) = self.check(request).err()?;
        Some(self.scrubbed(error(status, &message)))
    }

    /// An error answer without absolute paths (a success as it is).
    fn scrubbed(&self, response: Response) -> Response {
        if response.status < 400 || response.content_type != JSON {
            return response;
        }
        let Ok(body) = serde_json::from_slice::<crate::admin::ErrorBody>(&response.body) else {
            return response;
        };
        // Server errors (I/O) lose every absolute path, client errors the data
        // directory (their other text is the client's own input).
        let scrubbed = if response.status >= 500 {
            scrub_paths(&body.error, &self.data_dir)
        } else if self.data_dir.len() > 1 {
            body.error.replace(&self.data_dir, "<data_dir>")
        } else {
            body.error.clone()
        };
        if scrubbed == body.error {
            return response;
        }
        // The full text of a server error is the operator's; a client error
        // echoes the client's input (a Host or Origin naming the data
        // directory), which must not fill the log.
        if response.status >= 500 {
            tracing::warn!(status = response.status, "admin API error: {}", body.error);
        }
        Response {
            headers: response.headers,
            ..error(response.status, &scrubbed)
        }
    }

    /// `Err((status, message))` for a request that must not reach a route.
    pub fn check(&self, request: &Request) -> Result<(), (u16, String)> {
        if request.header_count("host") != 1 {
            return Err((400, "exactly one Host header is required".into()));
        }
        let host = request.header("host").unwrap_or_default();
        if !self.host_allowed(host) {
            return Err((
                403,
                format!(
                    "Host {:?} is not this server's (use its address, localhost, or a name listed in admin_hosts)",
                    clip(host)
                ),
            ));
        }
        if let Some(origin) = request.header("origin") {
            // `https://` too: the dashboard behind a TLS-terminating proxy
            // that passes the Host on.
            let same = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|o| o.eq_ignore_ascii_case(host));
            if !same {
                return Err((
                    403,
                    format!("cross-origin request from {:?} refused", clip(origin)),
                ));
            }
        }
        let presented = request
            .header("authorization")
            .and_then(|a| {
                a.strip_prefix("Bearer ")
                    .or_else(|| a.strip_prefix("bearer "))
            })
            .map(str::trim);
        if !presented.is_some_and(|t| constant_time_eq(t.as_bytes(), self.token.as_bytes())) {
            return Err((
                401,
                format!(
                    "missing or wrong admin token: send Authorization: Bearer <token>; the token is in the file {TOKEN_FILE} of the server's data directory (the weir CLI reads it, or ${TOKEN_ENV})"
                ),
            ));
        }
        let needs_json =
            !request.body.is_empty() || matches!(request.method.as_str(), "POST" | "PUT" | "PATCH");
        if needs_json {
            let media = request
                .header("content-type")
                .and_then(|c| c.split(';').next())
                .map(|c| c.trim().to_ascii_lowercase());
            if media.as_deref() != Some(JSON) {
                return Err((
                    415,
                    "request bodies must be Content-Type: application/json".into(),
                ));
            }
        }
        Ok(())
    }

    /// Whether `request` names this server in one `Host` header (all the
    /// dashboard's static files need: they hold no data and no token).
    pub fn host_ok(&self, request: &Request) -> bool {
        request.header_count("host") == 1
            && self.host_allowed(request.header("host").unwrap_or_default())
    }

    fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        if name.is_empty() {
            return false;
        }
        name == "localhost"
            || name
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok()
            || self.hosts.contains(&name)
    }
}

/// The host part of a `Host` header value (`h`, `h:port`, `[v6]`, `[v6]:port`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => "",
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// A client's header value as an error message quotes it: at most 100
/// characters (a header may be 64 KiB).
fn clip(value: &str) -> String {
    const MAX: usize = 100;
    match value.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_string(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error(status: u16, message: &str) -> Response {
    let body = serde_json::to_vec(&crate::admin::ErrorBody {
        error: message.to_string(),
    })
    .unwrap_or_default();
    Response::new(status, JSON, body)
}

/// `text` with `data_dir` written `<data_dir>` and other absolute paths `<path>`.
pub fn scrub_paths(text: &str, data_dir: &str) -> String {
    let text = if data_dir.len() > 1 {
        text.replace(data_dir, "<data_dir>")
    } else {
        text.to_string()
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find('/') {
        let (before, from) = rest.split_at(i);
        out.push_str(before);
        // A path starts at a '/' that begins a word (after a space, quote, '(' …).
        let starts_word = before
            .chars()
            .last()
            .is_none_or(|c| c.is_whitespace() || "\"'(=:[".contains(c));
        let end = from
            .find(|c: char| c.is_whitespace() || "\"'),;]".contains(c))
            .unwrap_or(from.len());
        let word = &from[..end];
        if starts_word && word.len() > 1 {
            out.push_str("<path>");
            rest = &from[word.len()..];
        } else {
            out.push('/');
            rest = &from[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The token in `dir/admin-token`, made (mode 0600) if the file does not exist.
fn load_or_create_token(dir: &Path) -> std::io::Result<String> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(TOKEN_FILE);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut f) => {
            let token = new_token()?;
            f.write_all(format!("{token}\n").as_bytes())?;
            f.sync_all()?;
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mode = std::fs::metadata(&path)?.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(
                    "{} was readable by other users (mode {:o}): set to 0600",
                    path.display(),
                    mode & 0o777
                );
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            }
            read_token_file(dir)
        }
        Err(e) => Err(e),
    }
}

/// The admin token stored in the data directory `dir`.
pub fn read_token_file(dir: &Path) -> std::io::Result<String> {
    let path = dir.join(TOKEN_FILE);
    let text = std::fs::read_to_string(&path)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(token.to_string())
}

/// Where the CLI looks for the token file: `dir/admin-token`.
pub fn token_path(dir: &Path) -> PathBuf {
    dir.join(TOKEN_FILE)
}

/// 32 bytes from the kernel's random source, as hex (64 characters): the admin
/// token, and a gateway's lease tokens.
pub(crate) fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A loud warning when the admin API listens beyond loopback: the token then
/// crosses the network in clear text (plain HTTP).
pub fn warn_if_exposed(addr: SocketAddr) {
    if !addr.ip().is_loopback() {
        tracing::warn!(
            "the admin API listens on {addr}, beyond loopback: every request needs the admin \
             token, which travels in clear text over HTTP — reach it only over a trusted \
             network, an SSH tunnel or a TLS proxy, and keep admin_listen on 127.0.0.1 otherwise"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> (weir_testkit::TempDir, AdminGuard) {
        let dir = weir_testkit::TempDir::new("admin-guard");
        let g = AdminGuard::open(dir.path(), &["weir.example".to_string()]).unwrap();
        (dir, g)
    }

    fn request(method: &str, headers: &[(&str, &str)], body: &str) -> Request {
        Request {
            method: method.into(),
            path: "/v1/volumes".into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
            ..Request::default()
        }
    }

    #[test]
    fn token_is_made_once_private_and_kept() {
        let (dir, g) = guard();
        assert_eq!(g.token().len(), 64);
        let path = token_path(dir.path());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = AdminGuard::open(dir.path(), &[]).unwrap();
        assert_eq!(again.token(), g.token(), "kept across restarts");
        assert_eq!(read_token_file(dir.path()).unwrap(), g.token());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        AdminGuard::open(dir.path(), &[]).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "tightened");
        let (_d2, other) = guard();
        assert_ne!(other.token(), g.token());
    }

    #[test]
    fn requests_need_token_own_host_same_origin_and_json() {
        let (_dir, g) = guard();
        let bearer = format!("Bearer {}", g.token());
        let ok = |method: &str, extra: &[(&str, &str)], body: &str| {
            let mut h = vec![
                ("host", "127.0.0.1:10810"),
                ("authorization", bearer.as_str()),
            ];
            h.extend(extra);
            g.check(&request(method, &h, body))
        };
        assert_eq!(ok("GET", &[], ""), Ok(()));
        assert_eq!(
            ok(
                "POST",
                &[("content-type", "application/json; charset=utf-8")],
                "{}"
            ),
            Ok(())
        );
        assert_eq!(
            ok("GET", &[("origin", "http://127.0.0.1:10810")], ""),
            Ok(())
        );
        let status = |r: Result<(), (u16, String)>| r.unwrap_err().0;
        // No token, a wrong one, another scheme.
        let no_token = request("GET", &[("host", "127.0.0.1:10810")], "");
        assert_eq!(status(g.check(&no_token)), 401);
        let wrong = request(
            "GET",
            &[("host", "127.0.0.1:10810"), ("authorization", "Bearer 00")],
            "",
        );
        assert_eq!(status(g.check(&wrong)), 401);
        let basic = format!("Basic {}", g.token());
        let basic = request(
            "GET",
            &[("host", "127.0.0.1:10810"), ("authorization", &basic)],
            "",
        );
        assert_eq!(status(g.check(&basic)), 401);
        // Foreign Host (DNS rebinding), missing Host; allowed names.
        let at = |host: &str| {
            g.check(&request(
                "GET",
                &[("host", host), ("authorization", &bearer)],
                "",
            ))
        };
        assert_eq!(status(at("evil.example:10810")), 403);
        assert_eq!(status(at("")), 403);
        assert_eq!(at("localhost:10810"), Ok(()));
        assert_eq!(at("[::1]:10810"), Ok(()));
        assert_eq!(at("10.1.2.3"), Ok(()));
        assert_eq!(at("WEIR.example:80"), Ok(()), "admin_hosts");
        assert_eq!(
            status(g.check(&request("GET", &[("authorization", &bearer)], ""))),
            400
        );
        // Foreign or opaque Origin.
        assert_eq!(
            status(ok(
                "POST",
                &[("origin", "http://evil.example"), ("content-type", JSON)],
                "{}"
            )),
            403
        );
        assert_eq!(status(ok("GET", &[("origin", "null")], "")), 403);
        // The same host over https (a TLS proxy passing the Host on) is the same
        // origin; another host over https is not.
        assert_eq!(
            ok("GET", &[("origin", "https://127.0.0.1:10810")], ""),
            Ok(())
        );
        assert_eq!(
            status(ok("GET", &[("origin", "https://127.0.0.2:10810")], "")),
            403
        );
        // Bodies must be JSON; POST/PUT/PATCH always.
        assert_eq!(
            status(ok("POST", &[("content-type", "text/plain")], "{}")),
            415
        );
        assert_eq!(status(ok("POST", &[], "{}")), 415);
        assert_eq!(
            status(ok(
                "PATCH",
                &[("content-type", "application/x-www-form-urlencoded")],
                ""
            )),
            415
        );
        assert_eq!(status(ok("DELETE", &[], "x")), 415);
    }

    #[test]
    fn error_bodies_lose_absolute_paths() {
        let (dir, g) = guard();
        let data = dir.path().display().to_string();
        let leaky = format!("creating {data}/pools/p: Permission denied; also /etc/weir.toml (x)");
        let r = g.serve(
            &request(
                "GET",
                &[
                    ("host", "localhost"),
                    ("authorization", &format!("Bearer {}", g.token())),
                ],
                "",
            ),
            |_| error(500, &leaky),
        );
        let body = String::from_utf8(r.body).unwrap();
        assert_eq!(r.status, 500);
        assert!(!body.contains(&data) && !body.contains("/etc"), "{body}");
        assert!(
            body.contains("<data_dir>/pools/p") || body.contains("<data_dir>"),
            "{body}"
        );
        assert!(body.contains("<path>"), "{body}");
        // Client errors keep what the client sent (an API path), less the data dir.
        let r = g.serve(
            &request(
                "GET",
                &[
                    ("host", "localhost"),
                    ("authorization", &format!("Bearer {}", g.token())),
                ],
                "",
            ),
            |_| error(404, &format!("no such resource: /v1/x in {data}/meta")),
        );
        let body = String::from_utf8(r.body).unwrap();
        assert!(body.contains("/v1/x in <data_dir>/meta"), "{body}");
        assert_eq!(scrub_paths("1/2 and a/b", "/d"), "1/2 and a/b");
        assert_eq!(scrub_paths("in \"/d/x\"", "/d"), "in \"<data_dir>/x\"");
        assert_eq!(host_name("[::1]:80"), "[::1]");
        assert_eq!(host_name("h:80"), "h");
    }
}
