//! Host access groups: which client addresses may see and open a volume.

use std::net::IpAddr;

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

/// Whether `host` may reach a volume whose access groups resolve to `patterns`
/// (`None`: the volume names no group and is open to every host).
pub fn allowed(patterns: Option<&[HostPattern]>, host: IpAddr) -> bool {
    match patterns {
        None => true,
        Some(p) => p.iter().any(|p| p.matches(host)),
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
        assert!(allowed(None, ip("1.2.3.4")));
        assert!(!allowed(Some(&[]), ip("1.2.3.4")));
    }
}
