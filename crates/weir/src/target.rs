//! Which admin API the CLI talks to (`--admin` / `WEIR_ADMIN`), sizes with
//! units, and confirmation of destructive commands.

use anyhow::{Context, Result, bail};
use std::io::{BufRead, IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};

/// The admin API's port when `--admin` names none.
pub const DEFAULT_ADMIN_PORT: u16 = 10810;

/// An admin API endpoint as the user named it, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminEndpoint {
    pub addr: SocketAddr,
    /// `host[:port]` as given: the `Host` header (the server's `admin_hosts`
    /// check accepts the names it lists, `localhost` and IP addresses).
    pub host_header: String,
    /// `http://host:port` for messages.
    pub url: String,
}

/// Parses `http://HOST[:PORT][/]`, `HOST[:PORT]` or `[IPv6][:PORT]` (default port
/// 10810) and resolves the host name.
pub fn parse_admin(text: &str) -> Result<AdminEndpoint> {
    let t = text.trim();
    if t.starts_with("https://") {
        bail!(
            "--admin {text:?}: the admin API speaks plain HTTP (put a TLS proxy in front of it and name the proxy, or use http://)"
        );
    }
    let rest = t.strip_prefix("http://").unwrap_or(t);
    if let Some((scheme, _)) = rest.split_once("://") {
        bail!("--admin {text:?}: scheme {scheme:?} is not http");
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains('/') || authority.contains('@') {
        bail!("--admin {text:?}: expected HOST[:PORT] or http://HOST[:PORT], e.g. storage1:10810");
    }
    let (host, port) = split_host_port(authority)
        .with_context(|| format!("--admin {text:?}: expected HOST[:PORT]"))?;
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .with_context(|| format!("--admin {text:?}: cannot resolve {host:?}"))?
        .next()
        .with_context(|| format!("--admin {text:?}: {host:?} has no address"))?;
    let shown_host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    Ok(AdminEndpoint {
        addr,
        host_header: format!("{shown_host}:{port}"),
        url: format!("http://{shown_host}:{port}"),
    })
}

fn split_host_port(authority: &str) -> Result<(String, u16)> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|&n| n > 0)
            .with_context(|| format!("bad port {p:?}"))
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').context("no closing ']'")?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host.to_string(), port(p)?)),
            None if after.is_empty() => Ok((host.to_string(), DEFAULT_ADMIN_PORT)),
            None => bail!("unexpected {after:?} after ']'"),
        };
    }
    match authority.matches(':').count() {
        0 => Ok((authority.to_string(), DEFAULT_ADMIN_PORT)),
        1 => {
            let (h, p) = authority.split_once(':').unwrap_or_default();
            if h.is_empty() {
                bail!("no host before ':'");
            }
            Ok((h.to_string(), port(p)?))
        }
        // A bare IPv6 address: no port.
        _ => Ok((authority.to_string(), DEFAULT_ADMIN_PORT)),
    }
}

/// A size with a unit (`--size`): `20G`/`20GiB` (2^30), `20GB` (10^9), `512M`,
/// `4K`, `1T`, `4096B`. A bare number is refused: `--size 5` meant 5 bytes.
pub fn parse_size_arg(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "{text:?} has no unit: write {t}G or {t}GiB for {t}×2^30 bytes, {t}GB for {t}×10^9, {t}M, {t}T, or {t}B for bytes"
        ));
    }
    let bytes = weir_server::parse_size(t)?;
    if bytes == 0 {
        return Err(format!("{text:?} is zero bytes"));
    }
    Ok(bytes)
}

/// Asks before a destructive action: `yes` (from `--yes`) goes ahead; a terminal
/// on standard input is asked `question [y/N]`; anything else is refused.
pub fn confirm(yes: bool, question: &str) -> Result<()> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!("{question} Refusing without --yes (standard input is not a terminal to ask on)");
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => bail!("not confirmed: nothing was changed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses_urls_and_host_names_parse() {
        let e = parse_admin("http://127.0.0.1:10810/").unwrap();
        assert_eq!(e.addr, "127.0.0.1:10810".parse().unwrap());
        assert_eq!(e.url, "http://127.0.0.1:10810");
        let e = parse_admin("127.0.0.1").unwrap();
        assert_eq!(e.addr.port(), DEFAULT_ADMIN_PORT);
        let e = parse_admin("localhost:9000").unwrap();
        assert_eq!(e.addr.port(), 9000);
        assert!(e.addr.ip().is_loopback());
        assert_eq!(e.host_header, "localhost:9000");
        let e = parse_admin("[::1]:9000").unwrap();
        assert_eq!(e.addr, "[::1]:9000".parse().unwrap());
        assert_eq!(e.url, "http://[::1]:9000");
        for bad in [
            "https://127.0.0.1",
            "ftp://x",
            "127.0.0.1:0",
            "127.0.0.1:http",
            "http://h/path",
            "",
        ] {
            assert!(parse_admin(bad).is_err(), "{bad}");
        }
        let e = parse_admin("https://h").unwrap_err().to_string();
        assert!(e.contains("plain HTTP"), "{e}");
    }

    #[test]
    fn sizes_need_a_unit() {
        let e = parse_size_arg("5").unwrap_err();
        assert!(e.contains("no unit") && e.contains("5GB"), "{e}");
        assert_eq!(parse_size_arg("5G"), Ok(5 << 30));
        assert_eq!(parse_size_arg("5GiB"), Ok(5 << 30));
        assert_eq!(parse_size_arg("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size_arg("4096B"), Ok(4096));
        assert!(parse_size_arg("0G").is_err());
        assert!(parse_size_arg("5 parsecs").is_err());
    }

    #[test]
    fn refusal_without_yes_and_terminal() {
        // `cargo test` gives the test no terminal on standard input.
        if !std::io::stdin().is_terminal() {
            let e = confirm(false, "Delete volume \"db\"?").unwrap_err();
            assert!(e.to_string().contains("--yes"), "{e}");
        }
        assert!(confirm(true, "Delete?").is_ok());
    }
}
