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
//! `~/.postgresql/root.crt`, as libpq); `sslrootcert=system` trusts the
//! operating system's CAs and implies `verify-full`. `sslcert=FILE` and
//! `sslkey=FILE` name the client's certificate and its key (by default
//! `~/.postgresql/postgresql.crt` and `.key` when they exist), presented
//! when the server asks for one. A file named in a URL without `sslmode`
//! is refused: it would not be used.
//!
//! Invariant: this module only builds connections; it knows nothing of
//! ordo's tables or sessions.

mod files;
mod verify;

use std::path::PathBuf;
use std::sync::Arc;

use ordo_core::StoreError;
use percent_encoding::percent_decode_str;
use postgres::config::SslMode;
use postgres::{Client, Config, NoTls};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::ClientConfig;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::url::{is_postgres_url, url_host_start};
use files::invalid;
use verify::Lenient;

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

/// Each mode and its name in a URL.
const MODE_NAMES: [(TlsMode, &str); 5] = [
    (TlsMode::Disable, "disable"),
    (TlsMode::Prefer, "prefer"),
    (TlsMode::Require, "require"),
    (TlsMode::VerifyCa, "verify-ca"),
    (TlsMode::VerifyFull, "verify-full"),
];

impl TlsMode {
    fn parse(value: &str) -> Result<TlsMode, StoreError> {
        MODE_NAMES
            .iter()
            .find(|(_, name)| *name == value)
            .map(|(mode, _)| *mode)
            .ok_or_else(|| {
                invalid(format!(
                    "sslmode={value}: one of disable, prefer, require, verify-ca, verify-full"
                ))
            })
    }

    /// The mode as a URL names it.
    fn name(self) -> &'static str {
        MODE_NAMES
            .iter()
            .find(|(mode, _)| *mode == self)
            .map(|(_, name)| *name)
            .expect("every mode is named")
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
    /// Parses `url` (`postgres://` or `postgresql://`), its TLS
    /// parameters included; reads the CAs to trust and the client's
    /// certificate. An error is [`ErrorKind::InvalidInput`] and never
    /// holds the password.
    ///
    /// [`ErrorKind::InvalidInput`]: ordo_core::ErrorKind::InvalidInput
    pub fn parse(url: &str) -> Result<PgUrl, StoreError> {
        // The client also takes `key=value` strings, whose TLS parameters
        // this module would not see.
        if !is_postgres_url(url) {
            return Err(invalid(
                "not a PostgreSQL connection URL: it must start with postgres:// or postgresql://"
                    .into(),
            ));
        }
        let (rest, params) = take_tls_params(url)?;
        let mode = params.mode()?;
        let mut config = rest
            .parse::<Config>()
            .map_err(|e| invalid(format!("not a PostgreSQL connection URL: {e}")))?;
        // An `sslmode` the client read but this module did not would be
        // overridden below: refuse rather than weaken it.
        if config.get_ssl_mode() != Config::new().get_ssl_mode() {
            return Err(invalid(
                "sslmode: given in a form this URL's parser cannot read; write it as sslmode=MODE"
                    .into(),
            ));
        }
        config.ssl_mode(mode.ssl_mode());
        let tls = match mode {
            TlsMode::Disable => None,
            _ => Some(client_config(mode, &params)?),
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

/// Where the CAs to trust come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// A PEM file of CAs.
    File(PathBuf),
    /// The operating system's store (`sslrootcert=system`).
    System,
}

/// A URL's TLS parameters, as given.
#[derive(Debug, Default, PartialEq, Eq)]
struct TlsParams {
    mode: Option<TlsMode>,
    root: Option<Roots>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

impl TlsParams {
    /// The mode they ask for. As libpq, `sslrootcert=system` implies
    /// `verify-full` and refuses any other mode. Unlike libpq, a URL
    /// without `sslmode` connects without TLS, so a file named without
    /// one is refused rather than left unused.
    fn mode(&self) -> Result<TlsMode, StoreError> {
        match (self.mode, &self.root) {
            (None | Some(TlsMode::VerifyFull), Some(Roots::System)) => Ok(TlsMode::VerifyFull),
            (Some(mode), Some(Roots::System)) => Err(invalid(format!(
                "sslrootcert=system: checks the host name too, so it needs \
                 sslmode=verify-full (the default with it), not sslmode={}",
                mode.name()
            ))),
            (Some(mode), _) => Ok(mode),
            (None, _) => match self.named_file() {
                Some(name) => Err(invalid(format!(
                    "{name} without sslmode: a URL without sslmode connects without TLS; \
                     add sslmode=verify-full (or require, verify-ca, prefer)"
                ))),
                None => Ok(TlsMode::Disable),
            },
        }
    }

    /// The first file parameter given, by its name.
    fn named_file(&self) -> Option<&'static str> {
        if matches!(self.root, Some(Roots::File(_))) {
            Some("sslrootcert")
        } else if self.cert.is_some() {
            Some("sslcert")
        } else if self.key.is_some() {
            Some("sslkey")
        } else {
            None
        }
    }
}

/// `url` without its TLS parameters (`sslmode`, `sslrootcert`, `sslcert`,
/// `sslkey`), and their values.
fn take_tls_params(url: &str) -> Result<(String, TlsParams), StoreError> {
    // The parameters start at the first `?` of the host part, where the
    // client's parser finds them: both must see the same parameters.
    let host = url_host_start(url).unwrap_or(0);
    let Some(query_at) = url[host..].find('?').map(|i| host + i) else {
        return Ok((url.to_owned(), TlsParams::default()));
    };
    let (base, query) = (&url[..query_at], &url[query_at + 1..]);
    let (mut params, mut kept) = (TlsParams::default(), Vec::new());
    for param in query.split('&') {
        let (raw_key, value) = param.split_once('=').unwrap_or((param, ""));
        // Keys are decoded too, as the client's parser decodes them.
        let key = percent_decode_str(raw_key).decode_utf8_lossy();
        let key = key.as_ref();
        let decoded = || {
            percent_decode_str(value)
                .decode_utf8()
                .map(|v| v.into_owned())
                .map_err(|_| invalid(format!("{key}: not UTF-8 once decoded")))
        };
        match key {
            "sslmode" => params.mode = Some(TlsMode::parse(&decoded()?)?),
            "sslrootcert" => {
                params.root = Some(match decoded()?.as_str() {
                    "system" => Roots::System,
                    file => Roots::File(PathBuf::from(file)),
                })
            }
            "sslcert" => params.cert = Some(PathBuf::from(decoded()?)),
            "sslkey" => params.key = Some(PathBuf::from(decoded()?)),
            _ => kept.push(param),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, params))
}

/// The rustls client of `mode`: the server's certificate checked as the
/// mode and the CAs say, the client's certificate presented when there is
/// one.
fn client_config(mode: TlsMode, params: &TlsParams) -> Result<ClientConfig, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS: {e}")))?;
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let roots = match &params.root {
        Some(Roots::System) => Some(files::system_roots()?),
        Some(Roots::File(path)) => Some(files::read_roots(path)?),
        None => match files::roots_file(mode, None, home.as_deref())? {
            Some(path) => Some(files::read_roots(&path)?),
            None => None,
        },
    };
    let chain = match roots {
        None => None,
        Some(roots) => Some(
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| invalid(format!("sslrootcert: {e}")))?,
        ),
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, chain) {
        (TlsMode::VerifyFull, Some(chain)) => chain,
        (_, chain) => Arc::new(Lenient { chain, provider }),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let files = files::identity_files(
        params.cert.as_deref(),
        params.key.as_deref(),
        home.as_deref(),
    )?;
    let Some((cert, key)) = files else {
        return Ok(builder.with_no_client_auth());
    };
    let identity = files::read_identity(&cert, &key)?;
    builder
        .with_client_auth_cert(identity.chain, identity.key)
        .map_err(|e| {
            invalid(format!(
                "sslcert={}, sslkey={}: {e}",
                cert.display(),
                key.display()
            ))
        })
}
#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::{take_tls_params, PgUrl, Roots, TlsMode, TlsParams};

    /// The URL left and the mode, for URLs that must parse.
    fn mode_of(url: &str) -> (String, TlsMode) {
        let (rest, params) = take_tls_params(url).unwrap();
        (rest, params.mode().unwrap())
    }

    #[test]
    fn tls_parameters_are_taken_out_of_the_url() {
        let (rest, params) = take_tls_params(
            "postgres://u:p@h/d?sslmode=verify-full&connect_timeout=5&sslrootcert=%2Ftmp%2Fca.pem\
             &sslcert=%2Ftmp%2Fc.pem&sslkey=%2Ftmp%2Fk.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:p@h/d?connect_timeout=5");
        let expected = TlsParams {
            mode: Some(TlsMode::VerifyFull),
            root: Some(Roots::File(PathBuf::from("/tmp/ca.pem"))),
            cert: Some(PathBuf::from("/tmp/c.pem")),
            key: Some(PathBuf::from("/tmp/k.pem")),
        };
        assert_eq!(params, expected);
        assert_eq!(
            mode_of("postgres://h/d?sslmode=require"),
            ("postgres://h/d".into(), TlsMode::Require)
        );
        assert_eq!(
            mode_of("postgres://h/d"),
            ("postgres://h/d".into(), TlsMode::Disable)
        );
        assert_eq!(
            mode_of("postgres://u:p?w@h/d?sslmode=prefer"),
            ("postgres://u:p?w@h/d".into(), TlsMode::Prefer)
        );
        assert_eq!(
            mode_of("postgres://u:p?sslmode=require@h/d"),
            (
                "postgres://u:p?sslmode=require@h/d".into(),
                TlsMode::Disable
            )
        );
        assert_eq!(
            mode_of("postgres://u@h/d?sslmode=require&application_name=a@b"),
            (
                "postgres://u@h/d?application_name=a@b".into(),
                TlsMode::Require
            )
        );
        assert_eq!(
            mode_of("postgres://h/d?ssl%6Dode=verify-ca&sslrootcert=%2Fca.pem").1,
            TlsMode::VerifyCa
        );
        let error = take_tls_params("postgres://h/d?sslmode=always").unwrap_err();
        assert!(
            error.to_string().contains("sslmode=always: one of"),
            "{error}"
        );
    }

    #[test]
    fn only_urls_are_parsed() {
        // The client would read this string's sslmode, which this module
        // does not see.
        let error = PgUrl::parse("host=db sslmode=require").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("must start with postgres:// or postgresql://"),
            "{error}"
        );
        assert_eq!(
            PgUrl::parse("postgresql://h/d?sslmode=disable")
                .unwrap()
                .mode(),
            TlsMode::Disable
        );
    }

    #[test]
    fn the_system_store_means_verify_full() {
        let (_, params) = take_tls_params("postgres://h/d?sslrootcert=system").unwrap();
        assert_eq!(params.root, Some(Roots::System));
        assert_eq!(params.mode().unwrap(), TlsMode::VerifyFull);
        assert_eq!(
            mode_of("postgres://h/d?sslrootcert=system&sslmode=verify-full").1,
            TlsMode::VerifyFull
        );
        for weak in ["disable", "prefer", "require", "verify-ca"] {
            let url = format!("postgres://h/d?sslrootcert=system&sslmode={weak}");
            let (_, params) = take_tls_params(&url).unwrap();
            let error = params.mode().unwrap_err();
            assert!(
                error.to_string().contains(&format!(
                    "needs sslmode=verify-full (the default with it), not sslmode={weak}"
                )),
                "{error}"
            );
        }
    }

    #[test]
    fn a_file_named_without_sslmode_is_refused() {
        for (param, name) in [
            ("sslrootcert=%2Ftmp%2Fca.pem", "sslrootcert"),
            ("sslcert=%2Ftmp%2Fc.pem&sslkey=%2Ftmp%2Fk.pem", "sslcert"),
            ("sslkey=%2Ftmp%2Fk.pem", "sslkey"),
        ] {
            let (_, params) = take_tls_params(&format!("postgres://h/d?{param}")).unwrap();
            let error = params.mode().unwrap_err();
            assert!(
                error
                    .to_string()
                    .starts_with(&format!("{name} without sslmode")),
                "{param}: {error}"
            );
        }
        assert_eq!(
            mode_of("postgres://h/d?sslmode=disable&sslcert=%2Ftmp%2Fc.pem").1,
            TlsMode::Disable
        );
    }
}
