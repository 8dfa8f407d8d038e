//! Host access groups: which clients may see and open a volume — by address,
//! and (with TLS client certificates) by identity.

use std::net::IpAddr;

use crate::config::AccessGroupConfig;

/// Who is asking: the client's address and, over TLS with a verified client
/// certificate, its identity (the certificate's subject CN).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Peer<'a> {
    pub host: IpAddr,
    pub identity: Option<&'a str>,
}

/// One access group, parsed: its host patterns and required identities.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupRule {
    pub hosts: Vec<HostPattern>,
    /// Empty: any client from the hosts; else one of these identities too.
    pub identities: Vec<String>,
}

impl GroupRule {
    /// A group being declared (config, admin API): as [`GroupRule::parse`], and a
    /// host or identity listed twice is refused as the slip it is (`10.0.0.1` and
    /// `10.0.0.1/32` are the same host). Groups already stored are read with
    /// `parse`, which takes repeats as they were accepted before.
    pub fn parse_new(group: &AccessGroupConfig) -> Result<GroupRule, String> {
        let rule = GroupRule::parse(group)?;
        for (i, h) in rule.hosts.iter().enumerate() {
            if let Some(first) = rule.hosts[..i].iter().position(|p| p == h) {
                let (a, b) = (group.hosts[first].trim(), group.hosts[i].trim());
                let also = if a == b {
                    String::new()
                } else {
                    format!(" (also as {b:?})")
                };
                return Err(format!("host {a:?} is listed twice{also}"));
            }
        }
        for (i, id) in group.identities.iter().enumerate() {
            if group.identities[..i].contains(id) {
                return Err(format!("identity {id:?} is listed twice"));
            }
        }
        Ok(rule)
    }

    pub fn parse(group: &AccessGroupConfig) -> Result<GroupRule, String> {
        let hosts = group
            .hosts
            .iter()
            .map(|h| HostPattern::parse(h))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(bad) = group
            .identities
            .iter()
            .find(|i| i.is_empty() || i.len() > 256)
        {
            return Err(format!(
                "identity {bad:?} must be 1-256 characters (a certificate's subject CN)"
            ));
        }
        Ok(GroupRule {
            hosts,
            identities: group.identities.clone(),
        })
    }

    /// Whether `peer` is in this group: from one of its hosts and, when the
    /// group names identities, holding one of them.
    pub fn admits(&self, peer: Peer<'_>) -> bool {
        self.hosts.iter().any(|p| p.matches(peer.host))
            && (self.identities.is_empty() || peer.identities_match(&self.identities))
    }
}

impl Peer<'_> {
    fn identities_match(&self, allowed: &[String]) -> bool {
        self.identity
            .is_some_and(|id| allowed.iter().any(|a| a == id))
    }
}

/// One entry of an access group: any host, one address, or a CIDR block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HostPattern {
    Any,
    Net { addr: IpAddr, prefix_len: u8 },
}

impl HostPattern {
    /// `*`, `10.1.2.3`, `10.0.0.0/8`, `::1`, `fd00::/8`.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let t = text.trim();
        if t == "*" {
            return Ok(HostPattern::Any);
        }
        let (addr_text, prefix) = match t.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (t, None),
        };
        let addr: IpAddr = addr_text
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{text:?} has a prefix length outside 0-{max}")),
            },
        };
        Ok(HostPattern::Net {
            addr: canonical(addr),
            prefix_len,
        })
    }

    pub fn matches(&self, host: IpAddr) -> bool {
        let host = canonical(host);
        match *self {
            HostPattern::Any => true,
            HostPattern::Net { addr, prefix_len } => match (addr, host) {
                (IpAddr::V4(a), IpAddr::V4(h)) => {
                    let mask = if prefix_len == 0 {
                        0
                    } else {
                        u32::MAX << (32 - prefix_len)
                    };
                    u32::from(a) & mask == u32::from(h) & mask
                }
                (IpAddr::V6(a), IpAddr::V6(h)) => {
                    let mask = if prefix_len == 0 {
                        0
                    } else {
                        u128::MAX << (128 - prefix_len)
                    };
                    u128::from(a) & mask == u128::from(h) & mask
                }
                _ => false,
            },
        }
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) compare as IPv4.
pub fn canonical(addr: IpAddr) -> IpAddr {
    addr.to_canonical()
}

/// Whether `peer` may reach a volume whose access groups are `groups` (`None`:
/// the volume names no group and is open to every client).
pub fn allowed(groups: Option<&[&GroupRule]>, peer: Peer<'_>) -> bool {
    match groups {
        None => true,
        Some(g) => g.iter().any(|g| g.admits(peer)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn patterns_match_addresses_and_blocks() {
        let p = HostPattern::parse("10.1.0.0/16").unwrap();
        assert!(p.matches(ip("10.1.200.3")));
        assert!(!p.matches(ip("10.2.0.1")));
        assert!(
            p.matches(ip("::ffff:10.1.0.9")),
            "IPv4-mapped IPv6 counts as IPv4"
        );
        let one = HostPattern::parse("127.0.0.1").unwrap();
        assert!(one.matches(ip("127.0.0.1")) && !one.matches(ip("127.0.0.2")));
        let v6 = HostPattern::parse("fd00::/8").unwrap();
        assert!(
            v6.matches(ip("fd12::1")) && !v6.matches(ip("fe80::1")) && !v6.matches(ip("10.0.0.1"))
        );
        assert!(HostPattern::parse("*").unwrap().matches(ip("8.8.8.8")));
        assert!(
            HostPattern::parse("0.0.0.0/0")
                .unwrap()
                .matches(ip("1.2.3.4"))
        );
        assert!(HostPattern::parse("10.0.0.0/33").is_err());
        assert!(HostPattern::parse("host.example").is_err());
        let anyone = Peer {
            host: ip("1.2.3.4"),
            identity: None,
        };
        assert!(allowed(None, anyone));
        assert!(!allowed(Some(&[]), anyone));
    }

    #[test]
    fn groups_with_identities_need_host_and_identity() {
        let group = |hosts: &[&str], ids: &[&str]| {
            GroupRule::parse(&AccessGroupConfig {
                name: "g".into(),
                hosts: hosts.iter().map(|s| s.to_string()).collect(),
                identities: ids.iter().map(|s| s.to_string()).collect(),
            })
            .unwrap()
        };
        let peer = |host: &str, identity: Option<&'static str>| Peer {
            host: ip(host),
            identity,
        };
        let backup = group(&["10.0.0.0/8"], &["backup"]);
        assert!(backup.admits(peer("10.1.1.1", Some("backup"))));
        assert!(!backup.admits(peer("10.1.1.1", None)), "no certificate");
        assert!(!backup.admits(peer("10.1.1.1", Some("other"))));
        assert!(
            !backup.admits(peer("192.168.1.1", Some("backup"))),
            "wrong host"
        );
        let lab = group(&["*"], &[]);
        assert!(lab.admits(peer("192.168.1.1", None)));
        // Any group of the volume admitting the peer is enough.
        assert!(allowed(Some(&[&backup, &lab]), peer("192.168.1.1", None)));
        assert!(!allowed(Some(&[&backup]), peer("192.168.1.1", None)));
        assert!(
            GroupRule::parse(&AccessGroupConfig {
                name: "g".into(),
                hosts: vec!["*".into()],
                identities: vec![String::new()],
            })
            .is_err()
        );
    }

    /// A host or identity listed twice is refused when a group is declared, and
    /// read as it is from stored metadata (written before repeats were refused).
    #[test]
    fn repeats_are_refused_when_declared() {
        let g = |hosts: &[&str], ids: &[&str]| AccessGroupConfig {
            name: "g".into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            identities: ids.iter().map(|i| i.to_string()).collect(),
        };
        let same = g(&["10.0.0.1", "10.0.0.2", "10.0.0.1/32"], &[]);
        let err = GroupRule::parse_new(&same).unwrap_err();
        assert!(
            err.contains("\"10.0.0.1\"") && err.contains("twice"),
            "{err}"
        );
        assert!(GroupRule::parse(&same).is_ok());
        let ids = g(&["*"], &["backup", "backup"]);
        assert!(
            GroupRule::parse_new(&ids)
                .unwrap_err()
                .contains("\"backup\"")
        );
        // Overlapping is not repeating: a block and one of its hosts.
        assert!(GroupRule::parse_new(&g(&["10.0.0.0/8", "10.0.0.1"], &[])).is_ok());
    }
}
