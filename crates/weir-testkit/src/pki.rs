//! Certificates for TLS tests, made per test run with the `openssl` command.

use std::path::Path;
use std::process::Command;

use crate::{TempDir, require_tool};

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        crate::output_text(&o)
    );
}

/// A CA, a server certificate for 127.0.0.1 and two client certificates, laid
/// out as qemu's and libnbd's `tls-creds-x509`/`tls-certificates` directories:
/// `server/` (ca-cert.pem, server-cert.pem, server-key.pem), `client1/` and
/// `client2/` (ca-cert.pem, client-cert.pem, client-key.pem; subject CNs
/// `client1` and `client2`), `anon/` (only ca-cert.pem: TLS without a client
/// certificate).
pub struct Pki {
    dir: TempDir,
}

impl Pki {
    pub fn new() -> Option<Pki> {
        if !require_tool("openssl", &["openssl"]) {
            return None;
        }
        let dir = TempDir::new("pki");
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
        let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
        args.extend(ec);
        args.extend([
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
            "-subj",
            "/CN=weir test CA",
        ]);
        openssl(d, &args);
        let sign = |name: &str, subject: &str, ext: &str| {
            let mut args = vec!["req", "-new", "-nodes"];
            args.extend(ec);
            let key = format!("{name}-key.pem");
            let csr = format!("{name}.csr");
            args.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
            openssl(d, &args);
            let ext_file = format!("{name}.ext");
            std::fs::write(d.join(&ext_file), ext).unwrap();
            let cert = format!("{name}-cert.pem");
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca-cert.pem",
                    "-CAkey",
                    "ca-key.pem",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &cert,
                    "-extfile",
                    &ext_file,
                ],
            );
        };
        sign(
            "server",
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        sign(
            "client1",
            "/O=weir/CN=client1",
            "extendedKeyUsage=clientAuth\n",
        );
        sign(
            "client2",
            "/O=weir/CN=client2",
            "extendedKeyUsage=clientAuth\n",
        );
        let copy = |from: &str, to_dir: &str, to: &str| {
            std::fs::create_dir_all(d.join(to_dir)).unwrap();
            std::fs::copy(d.join(from), d.join(to_dir).join(to)).unwrap();
        };
        for who in ["server", "client1", "client2", "anon"] {
            copy("ca-cert.pem", who, "ca-cert.pem");
        }
        copy("server-cert.pem", "server", "server-cert.pem");
        copy("server-key.pem", "server", "server-key.pem");
        for c in ["client1", "client2"] {
            copy(&format!("{c}-cert.pem"), c, "client-cert.pem");
            copy(&format!("{c}-key.pem"), c, "client-key.pem");
        }
        Some(Pki { dir })
    }

    pub fn path(&self, sub: &str) -> String {
        self.dir.join(sub).display().to_string()
    }

    /// `weir serve` configuration lines: TLS in `mode` with the server certificate
    /// and the client CA.
    pub fn weir_config(&self, mode: &str) -> String {
        let s = self.dir.join("server");
        format!(
            "tls = \"{mode}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\ntls_client_ca = \"{}\"\n",
            s.join("server-cert.pem").display(),
            s.join("server-key.pem").display(),
            s.join("ca-cert.pem").display()
        )
    }
}
