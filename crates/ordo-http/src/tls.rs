//! HTTPS: a rustls acceptor (ring provider) from PEM files.
//!
//! Invariant: only the certificate chain and key are read here; which
//! connections use them is the listener's.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
pub use tokio_rustls::TlsAcceptor;

/// An acceptor serving the certificate chain of `cert_path` with the
/// private key of `key_path` (both PEM), HTTP/1.1 only. A key file that
/// group or others may read is refused. The error names the file at fault.
pub fn acceptor(cert_path: &Path, key_path: &Path) -> Result<TlsAcceptor, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect())
        .map_err(|e| format!("cannot read certificates from {}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", cert_path.display()));
    }
    crate::auth::check_private(key_path).map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| format!("cannot read a private key from {}: {e}", key_path.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "{} and {} are not a usable certificate and key: {e}",
                cert_path.display(),
                key_path.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
