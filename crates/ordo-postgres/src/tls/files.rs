//! The files a URL's TLS parameters name, found and read: the CAs to
//! trust (`sslrootcert`, or the system's store) and the client's
//! certificate and key (`sslcert`, `sslkey`), with libpq's defaults under
//! `~/.postgresql`.
//!
//! Invariant: every error here is [`ErrorKind::InvalidInput`] naming the
//! parameter and the file; nothing here connects.

use std::path::{Path, PathBuf};

use ordo_core::{ErrorKind, StoreError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use super::TlsMode;

/// libpq's default files, under the home directory.
const DEFAULT_ROOTS: &str = ".postgresql/root.crt";
const DEFAULT_CERT: &str = ".postgresql/postgresql.crt";
const DEFAULT_KEY: &str = ".postgresql/postgresql.key";

pub(super) fn invalid(message: String) -> StoreError {
    StoreError::new(ErrorKind::InvalidInput, message)
}

/// The file `name` under `home`, when it is a file.
fn default_file(home: Option<&Path>, name: &str) -> Option<PathBuf> {
    home.map(|home| home.join(name))
        .filter(|path| path.is_file())
}

/// The CAs file of a checked mode: `root`, or libpq's default under the
/// home directory `home` when it exists.
pub(super) fn roots_file(
    mode: TlsMode,
    root: Option<&Path>,
    home: Option<&Path>,
) -> Result<Option<PathBuf>, StoreError> {
    if let Some(root) = root {
        return Ok(Some(root.to_owned()));
    }
    match (mode, default_file(home, DEFAULT_ROOTS)) {
        (TlsMode::VerifyCa | TlsMode::VerifyFull, None) => Err(invalid(format!(
            "sslmode={}: needs sslrootcert=FILE, the PEM file of the CAs to trust \
             (or ~/{DEFAULT_ROOTS}), or sslrootcert=system",
            mode.name()
        ))),
        // As libpq: `require` with a CAs file checks as `verify-ca`.
        (TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull, Some(path)) => Ok(Some(path)),
        _ => Ok(None),
    }
}

/// The CAs of the PEM file `path`, one at least.
pub(super) fn read_roots(path: &Path) -> Result<RootCertStore, StoreError> {
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

/// The CAs the operating system trusts (`sslrootcert=system`), one at
/// least. `SSL_CERT_FILE` and `SSL_CERT_DIR` name other ones, as for
/// OpenSSL.
pub(super) fn system_roots() -> Result<RootCertStore, StoreError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (_, unparsable) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
        return Err(invalid(format!(
            "sslrootcert=system: the system's store holds no usable CA \
             ({unparsable} unusable; {})",
            if errors.is_empty() {
                "no error reading it".to_owned()
            } else {
                errors.join("; ")
            }
        )));
    }
    Ok(roots)
}

/// The client's certificate and key files: those given, or libpq's
/// defaults under `home` when the certificate's exists. `None`: no client
/// certificate.
pub(super) fn identity_files(
    cert: Option<&Path>,
    key: Option<&Path>,
    home: Option<&Path>,
) -> Result<Option<(PathBuf, PathBuf)>, StoreError> {
    let cert = match (cert, key) {
        (Some(cert), _) => cert.to_owned(),
        (None, Some(key)) => {
            return Err(invalid(format!(
                "sslkey={}: needs sslcert=FILE, the client certificate it is the key of",
                key.display()
            )))
        }
        (None, None) => match default_file(home, DEFAULT_CERT) {
            Some(cert) => cert,
            None => return Ok(None),
        },
    };
    let key = match key {
        Some(key) => key.to_owned(),
        None => default_file(home, DEFAULT_KEY).ok_or_else(|| {
            invalid(format!(
                "sslcert={}: needs sslkey=FILE, its private key (or ~/{DEFAULT_KEY})",
                cert.display()
            ))
        })?,
    };
    Ok(Some((cert, key)))
}

/// A client certificate's chain and private key, read from PEM files.
pub(super) struct Identity {
    pub(super) chain: Vec<CertificateDer<'static>>,
    pub(super) key: PrivateKeyDer<'static>,
}

/// Reads the certificate chain `cert` and its key `key`, which only its
/// owner may read (see [`check_key_access`]).
pub(super) fn read_identity(cert: &Path, key: &Path) -> Result<Identity, StoreError> {
    let cannot = |e: &dyn std::fmt::Display| invalid(format!("sslcert={}: {e}", cert.display()));
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cannot(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cannot(&e))?;
    if chain.is_empty() {
        return Err(cannot(&"no certificate in the file"));
    }
    check_key_access(key)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        invalid(format!(
            "sslkey={}: {e} (an unencrypted PKCS#8, PKCS#1 or SEC1 key in PEM)",
            key.display()
        ))
    })?;
    Ok(Identity { chain, key })
}

/// As libpq: a private key must be a file that neither its owner's group
/// nor others may use (`0600` or less), except that root's may be read by
/// its group (`0640`).
#[cfg(unix)]
pub(super) fn check_key_access(key: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let metadata =
        std::fs::metadata(key).map_err(|e| invalid(format!("sslkey={}: {e}", key.display())))?;
    if !metadata.is_file() {
        return Err(invalid(format!("sslkey={}: not a file", key.display())));
    }
    let mode = metadata.mode() & 0o777;
    let forbidden = if metadata.uid() == 0 { 0o037 } else { 0o077 };
    if mode & forbidden != 0 {
        return Err(invalid(format!(
            "sslkey={}: its group or others have access (mode {mode:04o}); allow u=rw (0600) \
             or less, or u=rw,g=r (0640) when root owns it",
            key.display()
        )));
    }
    Ok(())
}

#[cfg(not(unix))]
pub(super) fn check_key_access(_key: &Path) -> Result<(), StoreError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{check_key_access, identity_files, roots_file, TlsMode};

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

    #[test]
    fn a_client_certificate_is_the_one_given_or_libpqs_default() {
        let home = tempfile::tempdir().unwrap();
        let (cert, key) = (Path::new("/etc/c.pem"), Path::new("/etc/k.pem"));
        assert_eq!(identity_files(None, None, Some(home.path())).unwrap(), None);
        let both = identity_files(Some(cert), Some(key), Some(home.path())).unwrap();
        assert_eq!(both, Some((cert.to_owned(), key.to_owned())));
        let error = identity_files(None, Some(key), Some(home.path())).unwrap_err();
        assert!(error.to_string().contains("needs sslcert=FILE"), "{error}");
        let error = identity_files(Some(cert), None, Some(home.path())).unwrap_err();
        assert!(error.to_string().contains("needs sslkey=FILE"), "{error}");
        let dir = home.path().join(".postgresql");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("postgresql.crt"), "").unwrap();
        let error = identity_files(None, None, Some(home.path())).unwrap_err();
        assert!(error.to_string().contains("needs sslkey=FILE"), "{error}");
        std::fs::write(dir.join("postgresql.key"), "").unwrap();
        let defaults = identity_files(None, None, Some(home.path())).unwrap();
        assert_eq!(
            defaults,
            Some((dir.join("postgresql.crt"), dir.join("postgresql.key")))
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_key_its_group_or_others_may_use_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pem");
        std::fs::write(&key, "").unwrap();
        let root_owned = std::fs::metadata(&key).map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.uid() == 0
        });
        let group_may = if root_owned.unwrap() { 0o640 } else { 0o600 };
        let cases = [
            (0o600, true),
            (0o700, true),
            (0o400, true),
            (group_may, true),
            (0o644, false),
            (0o660, false),
            (0o604, false),
        ];
        for (mode, ok) in cases {
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
            let result = check_key_access(&key);
            assert_eq!(result.is_ok(), ok, "mode {mode:o}: {result:?}");
            if let Err(error) = result {
                assert!(
                    error
                        .to_string()
                        .contains("its group or others have access"),
                    "{error}"
                );
            }
        }
        let error = check_key_access(dir.path()).unwrap_err();
        assert!(error.to_string().contains("not a file"), "{error}");
    }
}
