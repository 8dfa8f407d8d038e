//! `nbd://HOST[:PORT]/EXPORT` target addresses (`nbds://`: over TLS, optionally with
//! libnbd's `?tls-certificates=DIR`).

use crate::LoadError;
use std::fmt;
use std::path::PathBuf;

/// Default NBD port (IANA).
pub const DEFAULT_NBD_PORT: u16 = 10809;

/// One NBD export to drive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// Export name (empty: the server's default export).
    pub export: String,
    /// `nbds://`: TLS (`NBD_OPT_STARTTLS`) before anything else, never plain text.
    pub tls: bool,
    /// `?tls-certificates=DIR` (as libnbd's URIs): the directory with `ca-cert.pem`
    /// and, for a client certificate, `client-cert.pem` and `client-key.pem`.
    pub tls_certificates: Option<PathBuf>,
}

impl Target {
    /// Parses `nbd://HOST[:PORT][/EXPORT]` (IPv6 as `nbd://[::1]:10809/x`), or the
    /// same with `nbds://` for TLS. As in libnbd's URIs a `?` starts the query; the one
    /// parameter taken is `tls-certificates=DIR` (with `nbds://`).
    pub fn parse(uri: &str) -> Result<Target, LoadError> {
        let bad = |why: &str| LoadError::InvalidTarget {
            target: uri.to_string(),
            message: why.to_string(),
        };
        let uri_text = uri.trim();
        let (tls, rest) = match uri_text.strip_prefix("nbds://") {
            Some(rest) => (true, rest),
            None => (
                false,
                uri_text.strip_prefix("nbd://").ok_or_else(|| {
                    bad("must start with nbd:// or nbds:// (nbd://HOST[:PORT]/EXPORT)")
                })?,
            ),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let mut tls_certificates = None;
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            match param.split_once('=') {
                Some(("tls-certificates", dir)) if tls && !dir.is_empty() => {
                    tls_certificates = Some(PathBuf::from(dir));
                }
                Some(("tls-certificates", _)) if tls => {
                    return Err(bad("tls-certificates needs a directory"));
                }
                Some(("tls-certificates", _)) => {
                    return Err(bad("tls-certificates is for nbds:// (TLS) addresses"));
                }
                _ => {
                    return Err(bad(&format!(
                        "unknown query parameter {param:?} (weir load takes tls-certificates=DIR)"
                    )));
                }
            }
        }
        let (authority, export) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6.find(']').ok_or_else(|| bad("unclosed [ in the host"))?;
            let host = &v6[..end];
            let after = &v6[end + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(bad("unexpected text after the IPv6 address")),
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("missing host"));
        }
        let port = match port {
            None => DEFAULT_NBD_PORT,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad(&format!("port {p:?} is not a number 1-65535")))?,
        };
        if export.len() > 4096 {
            return Err(bad("export name longer than 4096 bytes"));
        }
        Ok(Target {
            host: host.to_string(),
            port,
            export: export.to_string(),
            tls,
            tls_certificates,
        })
    }

    /// Parses a comma-separated list of targets (the CLI's `--target`).
    pub fn parse_list(list: &str) -> Result<Vec<Target>, LoadError> {
        let targets = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Target::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if targets.is_empty() {
            return Err(LoadError::InvalidOption(
                "--target: give at least one nbd://HOST[:PORT]/EXPORT (or nbds://)".into(),
            ));
        }
        Ok(targets)
    }

    /// `host:port` as `TcpStream::connect` takes it.
    pub fn socket_address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "nbds" } else { "nbd" };
        write!(f, "{scheme}://{}/{}", self.socket_address(), self.export)
    }
}

/// The target of each VM's disk, given the VMs' `volume`s in order: the target
/// whose export has that name, else the next one in turn (round-robin over all the
/// targets, counting only the VMs placed that way). `targets` is not empty.
pub(crate) fn assign_targets<'a>(
    volumes: impl IntoIterator<Item = Option<&'a str>>,
    targets: &[Target],
) -> Vec<u32> {
    let n = targets.len() as u32;
    let mut turn = 0u32;
    volumes
        .into_iter()
        .map(
            |volume| match volume.and_then(|v| targets.iter().position(|t| t.export == v)) {
                Some(t) => t as u32,
                None => {
                    let t = turn % n;
                    turn += 1;
                    t
                }
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vms_go_to_their_volumes_export_else_round_robin() {
        let targets = Target::parse_list("nbd://h/a, nbd://h/b, nbd://h/c").unwrap();
        let volumes = [
            None,
            Some("c"),
            None,
            Some("nope"), // no such export: its turn, like a VM without a volume
            None,
            Some("a"),
            None,
        ];
        assert_eq!(
            assign_targets(volumes, &targets),
            // The VMs without a match take 0, 1, 2, 0, 1 in turn.
            vec![0, 2, 1, 2, 0, 0, 1]
        );
        let one = Target::parse_list("nbd://h/x").unwrap();
        assert_eq!(assign_targets([None, Some("y"), None], &one), vec![0, 0, 0]);
    }

    #[test]
    fn parses_host_port_export_forms() {
        let t = Target::parse("nbd://127.0.0.1:10900/vol-a").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.export.as_str()),
            ("127.0.0.1", 10900, "vol-a")
        );
        let t = Target::parse("nbd://localhost").unwrap();
        assert_eq!((t.port, t.export.as_str()), (DEFAULT_NBD_PORT, ""));
        let t = Target::parse("nbd://[::1]:99/x/y").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.export.as_str()),
            ("::1", 99, "x/y")
        );
        assert_eq!(t.to_string(), "nbd://[::1]:99/x/y");
        let l = Target::parse_list("nbd://a/x, nbd://b:1/y").unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[1].port, 1);
        assert!(!l[0].tls);
        let t = Target::parse("nbds://127.0.0.1/vol").unwrap();
        assert!(t.tls);
        assert_eq!(t.to_string(), "nbds://127.0.0.1:10809/vol");
        assert_ne!(t, Target::parse("nbd://127.0.0.1/vol").unwrap());
        let t = Target::parse("nbds://h/vol?tls-certificates=/etc/pki/weir").unwrap();
        assert_eq!(
            (t.export.as_str(), t.tls_certificates),
            ("vol", Some(PathBuf::from("/etc/pki/weir")))
        );
        assert_eq!(
            Target::parse("nbds://h?tls-certificates=d").unwrap().export,
            ""
        );
    }

    #[test]
    fn rejects_bad_uris_with_reasons() {
        for (uri, why) in [
            ("http://x/y", "nbd:// or nbds://"),
            ("nbds:///x", "missing host"),
            ("nbd://h/x?tls-certificates=/d", "is for nbds://"),
            ("nbds://h/x?tls-certificates=", "needs a directory"),
            ("nbds://h/x?socket=/run/nbd", "unknown query parameter"),
            ("nbd:///x", "missing host"),
            ("nbd://h:0/x", "not a number"),
            ("nbd://h:abc/x", "not a number"),
            ("nbd://[::1/x", "unclosed"),
        ] {
            let e = Target::parse(uri).unwrap_err().to_string();
            assert!(e.contains(why), "{uri}: {e}");
        }
        assert!(Target::parse_list(" , ").is_err());
    }
}
