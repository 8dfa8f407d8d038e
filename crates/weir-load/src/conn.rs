//! A connection to a target: TCP, and TLS after `NBD_OPT_STARTTLS` for `nbds://`
//! targets; the NBD handshake over it; its read and write halves for the driver's
//! reader and writer tasks.
//!
//! Over TLS a request goes out with whatever else is ready at once: the writer hands
//! the session's whole output to rustls, which seals it in records of up to 16 KiB,
//! so a 4 KiB WRITE and its header share a record (libnbd sends the header and the
//! payload as two records, and two TCP segments).

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use weir_nbd::{ClientConfig, ClientExport, ClientGoal, ClientHandshake, ClientOutcome};
use weir_tls::rustls;

use crate::{LoadError, LoadOptions, Target};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The read half the reader task owns.
pub(crate) type ReadHalf = Box<dyn AsyncRead + Unpin>;
/// The write half the writer task owns.
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Unpin>;

/// Files for `nbds://` targets (`weir load --tls-ca`, `--tls-cert`, `--tls-key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: the CA the servers' certificates chain to (they must also name the
    /// target's host, as an IP address or DNS name).
    pub ca: std::path::PathBuf,
    /// PEM: the client's certificate and private key, its identity for the
    /// servers' access groups (`None`: no client certificate).
    pub cert_key: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// The TLS client configuration of each target (`None` for `nbd://` ones): from the
/// target's own `?tls-certificates=DIR` (libnbd's layout: `ca-cert.pem`, and
/// `client-cert.pem` with `client-key.pem` when both are there), else from
/// [`LoadOptions::tls`]. An `nbds://` target with neither, [`TlsFiles`] no target
/// uses, and files rustls cannot use are refused here, before anything connects.
pub(crate) fn tls_configs(
    opts: &LoadOptions,
) -> Result<Vec<Option<Arc<rustls::ClientConfig>>>, LoadError> {
    let mut used_options = false;
    let configs = opts
        .targets
        .iter()
        .map(|t| {
            if !t.tls {
                return Ok(None);
            }
            let (files, names) = match (&t.tls_certificates, &opts.tls) {
                (Some(dir), _) => (libnbd_layout(dir), URI_NAMES),
                (None, Some(files)) => {
                    used_options = true;
                    (files.clone(), OPTION_NAMES)
                }
                (None, None) => {
                    return Err(LoadError::InvalidOption(format!(
                        "{t}: an nbds:// target needs --tls-ca (the CA that signed the \
                         server's certificate) or ?tls-certificates=DIR"
                    )));
                }
            };
            client_config(&files, names).map(Some)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if opts.tls.is_some() && !used_options {
        return Err(LoadError::InvalidOption(
            "--tls-ca and --tls-cert are for nbds:// targets, and no target uses them (every \
             target is nbd:// or names its own ?tls-certificates=)"
                .into(),
        ));
    }
    Ok(configs)
}

/// A `tls-certificates` directory as libnbd reads it.
fn libnbd_layout(dir: &Path) -> TlsFiles {
    let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    TlsFiles {
        ca: dir.join("ca-cert.pem"),
        cert_key: (cert.exists() && key.exists()).then_some((cert, key)),
    }
}

/// What errors call the files: the command line's options, or the URI's directory.
const OPTION_NAMES: weir_tls::SettingNames = weir_tls::SettingNames {
    ca: "--tls-ca",
    cert: "--tls-cert",
    key: "--tls-key",
};
const URI_NAMES: weir_tls::SettingNames = weir_tls::SettingNames {
    ca: "tls-certificates",
    cert: "tls-certificates",
    key: "tls-certificates",
};

fn client_config(
    files: &TlsFiles,
    names: weir_tls::SettingNames,
) -> Result<Arc<rustls::ClientConfig>, LoadError> {
    let cert_key = files
        .cert_key
        .as_ref()
        .map(|(c, k)| (c.as_path(), k.as_path()));
    weir_tls::client_config(&files.ca, cert_key, names)
        .map_err(|e| LoadError::InvalidOption(e.to_string()))
}

/// A connected target: plain TCP or TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    /// rustls over a socket read [`weir_tls::TLS_READ_BUFFER`] bytes at a time.
    Tls(Box<TlsStream<BufReader<TcpStream>>>),
}

impl Stream {
    /// The halves for the reader and the writer task: a plain socket's owned halves
    /// (no lock), a TLS stream's `tokio::io::split` halves.
    pub(crate) fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Stream::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(r), Box::new(w))
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The socket addresses `target`'s host resolves to (IPv4-mapped IPv6 ones as
/// IPv4), looked up once: every connection goes to them.
pub(crate) async fn resolve(target: &Target) -> Result<Vec<std::net::SocketAddr>, String> {
    let addr = target.socket_address();
    let found = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host(&addr))
        .await
        .map_err(|_| format!("resolving {addr} timed out"))?
        .map_err(|e| format!("resolving {addr}: {e}"))?;
    let mut out: Vec<std::net::SocketAddr> = found
        .map(|a| std::net::SocketAddr::new(a.ip().to_canonical(), a.port()))
        .collect();
    out.dedup();
    if out.is_empty() {
        return Err(format!("{addr} resolves to no address"));
    }
    Ok(out)
}

/// Connects to `target` (at its `resolved` addresses) and negotiates its export (`NBD_OPT_GO`, structured
/// replies); an `nbds://` target first upgrades to TLS with `tls` and never
/// continues in plain text (a server that refuses STARTTLS fails the handshake).
/// Returns the stream, the export, and any bytes read past the handshake.
pub(crate) async fn handshake(
    target: &Target,
    resolved: &[std::net::SocketAddr],
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(Stream, ClientExport, Vec<u8>), String> {
    let addr = target.socket_address();
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(resolved))
        .await
        .map_err(|_| format!("connecting to {addr} timed out"))?
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut hs = ClientHandshake::new(ClientConfig {
        export_name: target.export.clone(),
        goal: ClientGoal::Go,
        structured_replies: true,
        meta_contexts: vec![],
        starttls: target.tls,
    });
    let work = negotiate(Stream::Plain(tcp), &mut hs, target, tls);
    let (stream, export) = tokio::time::timeout(CONNECT_TIMEOUT, work)
        .await
        .map_err(|_| {
            format!("no NBD handshake from {addr} within {CONNECT_TIMEOUT:?}: {NOT_NBD}")
        })??;
    let leftover = hs.take_leftover();
    Ok((stream, export, leftover))
}

/// What a handshake that never began may mean.
const NOT_NBD: &str =
    "is an NBD server listening there? (weir serve: NBD on port 10809, its admin API on 10810)";

/// The option haggling, with the TLS upgrade when the handshake asks for it.
async fn negotiate(
    mut stream: Stream,
    hs: &mut ClientHandshake,
    target: &Target,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(Stream, ClientExport), String> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut greeted = false;
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        if n == 0 && !greeted {
            return Err(format!(
                "the server closed the connection before any NBD greeting: {NOT_NBD}"
            ));
        }
        if n == 0 {
            return Err("the server closed the connection during the handshake".to_string());
        }
        greeted = true;
        let mut outcome = hs.input(&buf[..n]).map_err(|e| format!("handshake: {e}"))?;
        send(&mut stream, hs).await?;
        if outcome == Some(ClientOutcome::StartTls) {
            stream = start_tls(stream, target, tls).await?;
            outcome = hs.tls_started().map_err(|e| format!("handshake: {e}"))?;
            send(&mut stream, hs).await?;
        }
        match outcome {
            Some(ClientOutcome::Connected(export)) => return Ok((stream, export)),
            Some(other) => return Err(format!("handshake ended without an export: {other:?}")),
            None => {}
        }
    }
}

/// Writes what the handshake has to say.
async fn send(stream: &mut Stream, hs: &mut ClientHandshake) -> Result<(), String> {
    let out = hs.take_output();
    if !out.is_empty() {
        stream
            .write_all(&out)
            .await
            .and(stream.flush().await)
            .map_err(|e| format!("handshake: {e}"))?;
    }
    Ok(())
}

/// The TLS handshake on the plain stream, after the server acknowledged STARTTLS:
/// the server's certificate must chain to the CA and name the target's host.
async fn start_tls(
    stream: Stream,
    target: &Target,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Stream, String> {
    let (Stream::Plain(tcp), Some(config)) = (stream, tls) else {
        return Err("STARTTLS without a TLS configuration".to_string());
    };
    let name = rustls::pki_types::ServerName::try_from(target.host.clone())
        .map_err(|e| format!("{:?} is not a host name TLS can check: {e}", target.host))?;
    let connector = tokio_rustls::TlsConnector::from(config.clone());
    let buffered = BufReader::with_capacity(weir_tls::TLS_READ_BUFFER, tcp);
    let tls = connector
        .connect(name, buffered)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    Ok(Stream::Tls(Box::new(tls)))
}
