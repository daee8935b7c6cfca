//! Connection URLs and the TLS they ask for.
//!
//! The URL's `sslmode` has libpq's meanings, but an URL without one
//! connects without TLS (libpq would try TLS first, `prefer`):
//! - `disable`: no TLS;
//! - `prefer`: TLS when the server offers it, its certificate not checked;
//! - `require`: TLS or no connection, the certificate not checked (checked
//!   as for `verify-ca` when `sslrootcert` is given);
//! - `verify-ca`: TLS, the certificate signed by a CA of `sslrootcert`;
//! - `verify-full`: as `verify-ca`, and issued for the URL's host.
//!
//! `sslrootcert=FILE` names the PEM file of the CAs to trust (by default
//! `~/.postgresql/root.crt`, as libpq). Invariant: this module only builds
//! connections; it knows nothing of ordo's tables or sessions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ordo_core::{ErrorKind, StoreError};
use percent_encoding::percent_decode_str;
use postgres::config::SslMode;
use postgres::{Client, Config, NoTls};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

/// What a URL's `sslmode` asks of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS (also when the URL has no `sslmode`).
    Disable,
    /// TLS when the server offers it, the certificate not checked.
    Prefer,
    /// TLS or no connection, the certificate checked only against an
    /// `sslrootcert` given.
    Require,
    /// TLS, the certificate signed by a trusted CA.
    VerifyCa,
    /// TLS, the certificate signed by a trusted CA for the URL's host.
    VerifyFull,
}

impl TlsMode {
    fn parse(value: &str) -> Result<TlsMode, StoreError> {
        Ok(match value {
            "disable" => TlsMode::Disable,
            "prefer" => TlsMode::Prefer,
            "require" => TlsMode::Require,
            "verify-ca" => TlsMode::VerifyCa,
            "verify-full" => TlsMode::VerifyFull,
            other => {
                return Err(invalid(format!(
                    "sslmode={other}: one of disable, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }

    /// What the client library is told: it negotiates TLS, this module
    /// checks the certificate.
    fn ssl_mode(self) -> SslMode {
        match self {
            TlsMode::Disable => SslMode::Disable,
            TlsMode::Prefer => SslMode::Prefer,
            TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => SslMode::Require,
        }
    }
}

/// A connection URL, parsed: the client's settings and the TLS to use.
#[derive(Clone)]
pub struct PgUrl {
    config: Config,
    mode: TlsMode,
    tls: Option<ClientConfig>,
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config holds the password: not shown.
        f.debug_struct("PgUrl").field("mode", &self.mode).finish()
    }
}

impl PgUrl {
    /// Parses `url` (`postgres://` or `postgresql://`), its `sslmode` and
    /// `sslrootcert` included; reads the CAs to trust. An error is
    /// [`ErrorKind::InvalidInput`] and never holds the password.
    pub fn parse(url: &str) -> Result<PgUrl, StoreError> {
        let (rest, mode, root) = take_tls_params(url)?;
        let mut config = rest
            .parse::<Config>()
            .map_err(|e| invalid(format!("not a PostgreSQL connection URL: {e}")))?;
        config.ssl_mode(mode.ssl_mode());
        let tls = match mode {
            TlsMode::Disable => None,
            _ => Some(client_config(mode, root.as_deref())?),
        };
        Ok(PgUrl { config, mode, tls })
    }

    /// The client's settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The client's settings, to change (the database, the name).
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// What the URL asked of TLS.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// Connects, with TLS as the URL asked.
    pub fn connect(&self) -> Result<Client, postgres::Error> {
        match &self.tls {
            None => self.config.connect(NoTls),
            Some(tls) => self.config.connect(MakeRustlsConnect::new(tls.clone())),
        }
    }
}

fn invalid(message: String) -> StoreError {
    StoreError::new(ErrorKind::InvalidInput, message)
}

/// `url` without its `sslmode` and `sslrootcert` parameters, and their
/// values (no `sslmode`: [`TlsMode::Disable`]).
fn take_tls_params(url: &str) -> Result<(String, TlsMode, Option<PathBuf>), StoreError> {
    // The parameters start at the first `?` after the user part, which
    // ends at its last `@` (a password may hold `?`).
    let authority = url.find("://").map_or(0, |i| i + 3);
    let host = url[authority..]
        .rfind('@')
        .map_or(authority, |at| authority + at + 1);
    let Some(query_at) = url[host..].find('?').map(|i| host + i) else {
        return Ok((url.to_owned(), TlsMode::Disable, None));
    };
    let (base, query) = (&url[..query_at], &url[query_at + 1..]);
    let (mut mode, mut root, mut kept) = (TlsMode::Disable, None, Vec::new());
    for param in query.split('&') {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let decoded = || {
            percent_decode_str(value)
                .decode_utf8()
                .map(|v| v.into_owned())
                .map_err(|_| invalid(format!("{key}: not UTF-8 once decoded")))
        };
        match key {
            "sslmode" => mode = TlsMode::parse(&decoded()?)?,
            "sslrootcert" => root = Some(PathBuf::from(decoded()?)),
            _ => kept.push(param),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, mode, root))
}

/// The CAs file of a checked mode: `root`, or libpq's default under the
/// home directory `home` when it exists.
fn roots_file(
    mode: TlsMode,
    root: Option<&Path>,
    home: Option<&Path>,
) -> Result<Option<PathBuf>, StoreError> {
    if let Some(root) = root {
        return Ok(Some(root.to_owned()));
    }
    let default = home
        .map(|home| home.join(".postgresql/root.crt"))
        .filter(|path| path.is_file());
    match (mode, default) {
        (TlsMode::VerifyCa | TlsMode::VerifyFull, None) => Err(invalid(format!(
            "sslmode={}: needs sslrootcert=FILE, the PEM file of the CAs to trust \
             (or ~/.postgresql/root.crt)",
            if mode == TlsMode::VerifyCa {
                "verify-ca"
            } else {
                "verify-full"
            }
        ))),
        // As libpq: `require` with a CAs file checks as `verify-ca`.
        (TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull, Some(path)) => Ok(Some(path)),
        _ => Ok(None),
    }
}

fn read_roots(path: &Path) -> Result<RootCertStore, StoreError> {
    let cannot =
        |e: &dyn std::fmt::Display| invalid(format!("sslrootcert={}: {e}", path.display()));
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| cannot(&e))? {
        roots
            .add(cert.map_err(|e| cannot(&e))?)
            .map_err(|e| cannot(&e))?;
    }
    if roots.is_empty() {
        return Err(cannot(&"no certificate in the file"));
    }
    Ok(roots)
}

fn client_config(mode: TlsMode, root: Option<&Path>) -> Result<ClientConfig, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS: {e}")))?;
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let chain = match roots_file(mode, root, home.as_deref())? {
        None => None,
        Some(path) => Some(
            WebPkiServerVerifier::builder_with_provider(
                Arc::new(read_roots(&path)?),
                provider.clone(),
            )
            .build()
            .map_err(|e| invalid(format!("sslrootcert={}: {e}", path.display())))?,
        ),
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, chain) {
        (TlsMode::VerifyFull, Some(chain)) => chain,
        (_, chain) => Arc::new(Lenient { chain, provider }),
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// The modes short of `verify-full`: the certificate's chain is checked to
/// the CAs of `chain` when there are some (`verify-ca`, `require` with
/// CAs), never its host name; without CAs (`prefer`, `require`) the
/// session is encrypted and the certificate not checked. Either way the
/// handshake's signatures are checked against the certificate.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The name is checked last, after the chain: this error means the
        // chain is good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{roots_file, take_tls_params, TlsMode};

    #[test]
    fn tls_parameters_are_taken_out_of_the_url() {
        let (rest, mode, root) = take_tls_params(
            "postgres://u:p@h/d?sslmode=verify-full&connect_timeout=5&sslrootcert=%2Ftmp%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:p@h/d?connect_timeout=5");
        assert_eq!(mode, TlsMode::VerifyFull);
        assert_eq!(root.unwrap().to_str(), Some("/tmp/ca.pem"));
        let (rest, mode, root) = take_tls_params("postgres://h/d?sslmode=require").unwrap();
        assert_eq!(
            (rest.as_str(), mode, root),
            ("postgres://h/d", TlsMode::Require, None)
        );
        let (rest, mode, _) = take_tls_params("postgres://h/d").unwrap();
        assert_eq!((rest.as_str(), mode), ("postgres://h/d", TlsMode::Disable));
        let (rest, mode, _) = take_tls_params("postgres://u:p?w@h/d?sslmode=prefer").unwrap();
        assert_eq!(
            (rest.as_str(), mode),
            ("postgres://u:p?w@h/d", TlsMode::Prefer)
        );
        let (rest, mode, _) = take_tls_params("postgres://u:p?sslmode=require@h/d").unwrap();
        assert_eq!(
            (rest.as_str(), mode),
            ("postgres://u:p?sslmode=require@h/d", TlsMode::Disable)
        );
        let error = take_tls_params("postgres://h/d?sslmode=always").unwrap_err();
        assert!(
            error.to_string().contains("sslmode=always: one of"),
            "{error}"
        );
    }

    #[test]
    fn checked_modes_need_cas_to_trust() {
        let home = tempfile::tempdir().unwrap();
        for mode in [TlsMode::VerifyCa, TlsMode::VerifyFull] {
            let error = roots_file(mode, None, Some(home.path())).unwrap_err();
            assert!(
                error.to_string().contains("needs sslrootcert=FILE"),
                "{error}"
            );
        }
        assert_eq!(
            roots_file(TlsMode::Require, None, Some(home.path())).unwrap(),
            None
        );
        let given = Path::new("/etc/ca.pem");
        let found = roots_file(TlsMode::VerifyFull, Some(given), Some(home.path())).unwrap();
        assert_eq!(found.as_deref(), Some(given));
        let default = home.path().join(".postgresql/root.crt");
        std::fs::create_dir_all(default.parent().unwrap()).unwrap();
        std::fs::write(&default, "").unwrap();
        for mode in [TlsMode::Require, TlsMode::VerifyCa] {
            let found = roots_file(mode, None, Some(home.path())).unwrap();
            assert_eq!(found, Some(default.clone()), "{mode:?}");
        }
    }
}
