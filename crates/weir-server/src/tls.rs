//! NBD over TLS: the rustls server configuration (X.509 server certificate,
//! optional client certificates checked against a CA), the connection's stream
//! before and after `NBD_OPT_STARTTLS`, and the identity a client certificate
//! carries (its subject's Common Name, matched against access groups'
//! `identities`).
//!
//! rustls runs on the `ring` provider, TLS 1.3 and 1.2. TLS-PSK (which nbdkit
//! and qemu offer through GnuTLS) is not offered: rustls implements no external
//! pre-shared keys (only resumption), so clients use X.509 certificates.
//!
//! After the handshake the connection is split in a read and a write half
//! ([`ConnRead`], [`ConnWrite`]): a plain connection into tokio's owned TCP
//! halves (no lock), a TLS one with `tokio::io::split`. Only the plain write half
//! exposes its socket for `sendfile(2)` ([`ConnWrite::tcp`]); over TLS the data
//! has to pass through user space to be encrypted anyway.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use weir_nbd::TlsPolicy;
use weir_tls::{TLS_READ_BUFFER, load_certs, load_key, load_roots, provider};

use crate::config::{TlsMode, WeirConfig};

/// The server's TLS side: the NBD policy and, unless TLS is off, the acceptor.
#[derive(Clone, Default)]
pub struct NbdTls {
    policy: TlsPolicy,
    acceptor: Option<TlsAcceptor>,
    /// `tls_client_ca` is set: clients may present a certificate, whose subject
    /// CN is the identity access groups' `identities` match.
    client_certificates: bool,
}

impl NbdTls {
    /// Reads the certificate, key and client CA the configuration names.
    pub fn from_config(config: &WeirConfig) -> anyhow::Result<NbdTls> {
        let policy = match config.tls {
            TlsMode::Off => return Ok(NbdTls::default()),
            TlsMode::On => TlsPolicy::Optional,
            TlsMode::Require => TlsPolicy::Required,
        };
        let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
            anyhow::bail!("tls = {:?} needs tls_cert and tls_key", config.tls.name());
        };
        let server = server_config(cert, key, config.tls_client_ca.as_deref())?;
        Ok(NbdTls {
            policy,
            acceptor: Some(TlsAcceptor::from(Arc::new(server))),
            client_certificates: config.tls_client_ca.is_some(),
        })
    }

    pub fn policy(&self) -> TlsPolicy {
        self.policy
    }

    /// Whether a client can have an identity at all (`tls_client_ca` with TLS on).
    pub fn client_certificates(&self) -> bool {
        self.client_certificates
    }

    /// Runs the server side of the TLS handshake on a connection whose
    /// `NBD_OPT_STARTTLS` was just acknowledged.
    pub async fn accept(&self, conn: Conn) -> io::Result<Conn> {
        let (Some(acceptor), Conn::Plain(tcp)) = (&self.acceptor, conn) else {
            return Err(io::Error::other("TLS is not enabled or already active"));
        };
        // rustls reads the socket 4 KiB at a time: below it, a buffer that reads
        // it in large pieces (a 4 KiB WRITE is one record of ~4.1 KiB: two
        // system calls per request without it).
        let buffered = BufReader::with_capacity(TLS_READ_BUFFER, tcp);
        let tls = acceptor.accept(buffered).await?;
        Ok(Conn::Tls(Box::new(tls)))
    }
}

fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<rustls::ServerConfig> {
    let certs = load_certs(cert, "tls_cert")?;
    let key = load_key(key, "tls_key")?;
    // The server's order wins (AES-128 first, see `provider`).
    let provider = provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = load_roots(ca, "tls_client_ca")?;
            // A client without a certificate is still served (it has no identity,
            // so it reaches only volumes whose groups name no identities); one
            // with a certificate the CA did not sign fails the handshake.
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .allow_unauthenticated()
                    .build()
                    .with_context(|| format!("tls_client_ca {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .with_context(|| format!("tls_cert {} / tls_key", cert.display()))?;
    config.ignore_client_order = true;
    Ok(config)
}

/// A gateway's TLS towards its upstream (`upstream = "nbds://…"`): the upstream's
/// certificate must chain to `ca` and name the upstream's host; with `cert_key`
/// the gateway presents a client certificate (its identity for the upstream's
/// access groups).
pub fn upstream_client_config(
    ca: &Path,
    cert_key: Option<(&Path, &Path)>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let names = weir_tls::SettingNames {
        ca: "upstream_tls_ca",
        cert: "upstream_tls_cert",
        key: "upstream_tls_key",
    };
    Ok(weir_tls::client_config(ca, cert_key, names)?)
}

/// A TLS connection: rustls over a buffered socket.
pub type TlsTcp = TlsStream<BufReader<TcpStream>>;

/// A connection during the handshake: plain TCP, or TLS after STARTTLS.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsTcp>),
}

impl Conn {
    /// The verified client certificate's identity (subject CN), if any.
    pub fn identity(&self) -> Option<String> {
        match self {
            Conn::Plain(_) => None,
            Conn::Tls(t) => {
                let first = t.get_ref().1.peer_certificates()?.first()?;
                subject_common_name(first.as_ref())
            }
        }
    }

    /// The negotiated cipher suite (TLS only).
    pub fn cipher_suite(&self) -> Option<rustls::CipherSuite> {
        match self {
            Conn::Plain(_) => None,
            Conn::Tls(t) => Some(t.get_ref().1.negotiated_cipher_suite()?.suite()),
        }
    }

    /// The two halves for the transmission phase.
    pub fn split(self) -> (ConnRead, ConnWrite) {
        match self {
            Conn::Plain(tcp) => {
                let (r, w) = tcp.into_split();
                (ConnRead::Plain(r), ConnWrite::Plain(w))
            }
            Conn::Tls(tls) => {
                let (r, w) = tokio::io::split(*tls);
                (ConnRead::Tls(r), ConnWrite::Tls(w))
            }
        }
    }
}

/// The read half of a connection in transmission.
pub enum ConnRead {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<TlsTcp>),
}

/// The write half of a connection in transmission.
pub enum ConnWrite {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsTcp>),
}

impl ConnWrite {
    /// The socket, when bytes may go to it directly (`sendfile(2)`): plain TCP.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ConnWrite::Plain(w) => Some(w.as_ref()),
            ConnWrite::Tls(_) => None,
        }
    }
}

macro_rules! delegate_read {
    ($t:ty, $($v:ident),+) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }
    };
}

macro_rules! delegate_write {
    ($t:ty, $($v:ident),+) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_flush(cx),)+
                }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }
            fn is_write_vectored(&self) -> bool {
                match self {
                    $(Self::$v(s) => s.is_write_vectored(),)+
                }
            }
        }
    };
}

delegate_read!(Conn, Plain, Tls);
delegate_write!(Conn, Plain, Tls);
delegate_read!(ConnRead, Plain, Tls);
delegate_write!(ConnWrite, Plain, Tls);

/// One DER element: (tag, contents, what follows).
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The subject Common Name of a DER X.509 certificate (the last CN if several).
pub fn subject_common_name(cert: &[u8]) -> Option<String> {
    let (SEQUENCE, cert, _) = der(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = der(cert)? else {
        return None;
    };
    let mut fields = tbs;
    // [0] EXPLICIT version, if present.
    if fields.first() == Some(&0xa0) {
        fields = der(fields)?.2;
    }
    // serialNumber, signature, issuer, validity, then subject.
    for _ in 0..4 {
        fields = der(fields)?.2;
    }
    let (SEQUENCE, mut rdns, _) = der(fields)? else {
        return None;
    };
    let mut cn = None;
    while !rdns.is_empty() {
        let (SET, mut set, rest) = der(rdns)? else {
            return None;
        };
        rdns = rest;
        while !set.is_empty() {
            let (SEQUENCE, attr, rest) = der(set)? else {
                return None;
            };
            set = rest;
            let (0x06, oid, value) = der(attr)? else {
                return None;
            };
            if oid == OID_COMMON_NAME {
                // UTF8String, PrintableString, T61String, IA5String.
                let (tag, text, _) = der(value)?;
                if matches!(tag, 0x0c | 0x13 | 0x14 | 0x16) {
                    cn = Some(String::from_utf8_lossy(text).into_owned());
                }
            }
        }
    }
    cn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths_short_and_long() {
        assert_eq!(
            der(&[0x04, 2, 7, 8, 9]),
            Some((4, &[7u8, 8][..], &[9u8][..]))
        );
        let mut long = vec![0x04, 0x82, 0x01, 0x00];
        long.extend(vec![1u8; 256]);
        assert_eq!(der(&long).unwrap().1.len(), 256);
        assert_eq!(der(&[0x04, 5, 1]), None, "truncated");
        assert_eq!(der(&[0x04, 0x80]), None, "indefinite length");
    }

    /// A minimal certificate skeleton: tbs with version, serial, sigalg,
    /// issuer, validity, subject (O=acme, CN=`cn`).
    fn cert_with_subject(cn: &str) -> Vec<u8> {
        fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
            let mut v = vec![tag];
            if body.len() < 0x80 {
                v.push(body.len() as u8);
            } else {
                v.push(0x82);
                v.extend((body.len() as u16).to_be_bytes());
            }
            v.extend(body);
            v
        }
        let attr = |oid: &[u8], tag: u8, text: &str| {
            let mut a = tlv(0x06, oid);
            a.extend(tlv(tag, text.as_bytes()));
            tlv(SET, &tlv(SEQUENCE, &a))
        };
        let mut subject = attr(&[0x55, 0x04, 0x0a], 0x13, "acme");
        subject.extend(attr(OID_COMMON_NAME, 0x0c, cn));
        let mut tbs = tlv(0xa0, &tlv(0x02, &[2]));
        tbs.extend(tlv(0x02, &[1, 2, 3]));
        tbs.extend(tlv(SEQUENCE, &tlv(0x06, &[0x2a, 0x86])));
        tbs.extend(tlv(SEQUENCE, &attr(OID_COMMON_NAME, 0x0c, "issuer-ca")));
        tbs.extend(tlv(SEQUENCE, &[0x17, 0x00, 0x17, 0x00]));
        tbs.extend(tlv(SEQUENCE, &subject));
        tbs.extend(tlv(SEQUENCE, &[0u8; 200]));
        let mut cert = tlv(SEQUENCE, &tbs);
        cert.extend(tlv(SEQUENCE, &tlv(0x06, &[0x2a])));
        tlv(SEQUENCE, &cert)
    }

    #[test]
    fn common_name_is_read_from_the_subject_not_the_issuer() {
        let c = cert_with_subject("client-1");
        assert_eq!(subject_common_name(&c).as_deref(), Some("client-1"));
        assert_eq!(subject_common_name(&c[..c.len() - 10]), None);
        assert_eq!(subject_common_name(b"not a certificate"), None);
    }
}
