//! rustls configurations for NBD over TLS, shared by the server (`weir serve`), its
//! gateways' connections to a TLS upstream and `weir load`'s `nbds://` targets: the
//! PEM files (certificates, a CA, a private key), the crypto provider, and a client
//! configuration. No I/O besides reading those files; the connections are their
//! callers'.
//!
//! The provider is rustls's `ring` provider with TLS 1.3's AES-128-GCM suite put
//! first: GnuTLS clients (qemu, libnbd) and servers (nbdkit) put AES-256-GCM first,
//! which costs both ends about 40 % more per byte (14 AES rounds instead of 10) for
//! no security a storage link needs.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use rustls;

/// Socket bytes a TLS endpoint reads at once: rustls reads its socket 4 KiB at a
/// time, so each side puts a buffer this large below it (a 4 KiB WRITE or READ
/// reply is one record of ~4.1 KiB: two system calls per request without it).
pub const TLS_READ_BUFFER: usize = 256 * 1024;

/// A TLS file or setting that cannot be used, with the setting that names it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

impl TlsError {
    fn at(what: &str, path: &Path, why: impl std::fmt::Display) -> TlsError {
        TlsError(format!("{what} {}: {why}", path.display()))
    }
}

/// The rustls provider every Weir TLS endpoint uses (see the crate docs).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

/// The certificates of a PEM file (`what`: the setting that names it, for errors).
pub fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::at(what, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::at(what, path, "no certificate in the file"));
    }
    Ok(certs)
}

/// A root store of the CA certificates in a PEM file.
pub fn load_roots(path: &Path, what: &str) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(load_certs(path, what)?);
    if added == 0 {
        return Err(TlsError::at(what, path, "no usable CA certificate"));
    }
    Ok(roots)
}

/// The private key of a PEM file.
pub fn load_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::at(what, path, e))
}

/// The settings a client's TLS files come from, named in errors: the CA, the
/// client certificate and its key (`upstream_tls_ca`…, `--tls-ca`…).
#[derive(Clone, Copy, Debug)]
pub struct SettingNames {
    pub ca: &'static str,
    pub cert: &'static str,
    pub key: &'static str,
}

/// A client configuration: the server's certificate must chain to the CA in `ca`
/// (and name the host the caller connects to); with `cert_key` the client presents
/// that certificate (its identity for the server's access groups).
pub fn client_config(
    ca: &Path,
    cert_key: Option<(&Path, &Path)>,
    names: SettingNames,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = load_roots(ca, names.ca)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS protocol versions: {e}")))?
        .with_root_certificates(roots);
    let config = match cert_key {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = load_certs(cert, names.cert)?;
            let key = load_key(key, names.key)?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                TlsError(format!(
                    "{} {} / {}: {e}",
                    names.cert,
                    cert.display(),
                    names.key
                ))
            })?
        }
    };
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: SettingNames = SettingNames {
        ca: "--tls-ca",
        cert: "--tls-cert",
        key: "--tls-key",
    };

    fn temp(name: &str, text: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("weir-tls-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn aes_128_gcm_comes_first() {
        let p = provider();
        assert_eq!(
            p.cipher_suites[0].suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        );
        assert!(p.cipher_suites.len() > 1, "the other suites stay on offer");
    }

    #[test]
    fn unusable_files_are_refused_naming_the_setting_and_the_file() {
        let missing = Path::new("/nonexistent/ca.pem");
        let e = client_config(missing, None, NAMES).unwrap_err().to_string();
        assert!(e.starts_with("--tls-ca /nonexistent/ca.pem: "), "{e}");
        let empty = temp("empty.pem", "not a certificate\n");
        let e = client_config(&empty, None, NAMES).unwrap_err().to_string();
        assert!(
            e.contains("--tls-ca") && e.contains("no certificate in the file"),
            "{e}"
        );
        let _ = std::fs::remove_file(empty);
    }
}
