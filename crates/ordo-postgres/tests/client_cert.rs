//! Client certificates (`sslcert`, `sslkey`) and the system's CAs
//! (`sslrootcert=system`), against a server of the test's own that
//! authenticates by certificate alone (`pg_hba.conf`: `hostssl ... cert`):
//! the shared server's settings are not changed.
//!
//! One test in this binary: it sets `HOME`, `SSL_CERT_FILE` and
//! `SSL_CERT_DIR` first, with no other thread running, so that libpq's
//! default files and the system's store are the test's own.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ordo_core::{ErrorKind, StoreError, SystemClock};
use ordo_postgres::postgres::{Client, NoTls};
use ordo_postgres::{PgOptions, PgProducer, PgUrl};
use ordo_reservation::producer_schema;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use support::own_server::{OwnServer, Setup};
use support::session_ssl;

/// A CA and a certificate it signed, in PEM.
struct Pair {
    cert: String,
    key: String,
}

/// A CA, and the server's and the client's certificates it signed.
struct Pki {
    ca: String,
    server: Pair,
    client: Pair,
}

fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("a CA").pem();
    (cert, Issuer::new(params, key))
}

fn signed(issuer: &Issuer<'static, KeyPair>, names: &[&str], common_name: &str) -> Pair {
    let key = KeyPair::generate().expect("a key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("params");
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let cert = params.signed_by(&key, issuer).expect("a certificate").pem();
    Pair {
        cert,
        key: key.serialize_pem(),
    }
}

/// The certificates, the server's issued for the host `server_name`.
fn pki(server_name: &str) -> Pki {
    let (ca, issuer) = ca("ordo test CA");
    Pki {
        server: signed(&issuer, &[server_name], server_name),
        client: signed(&issuer, &[], "postgres"),
        ca,
    }
}

/// A server that takes TLS connections from loopback (IPv4 and IPv6) only with a
/// certificate of `pki`'s CA for the role's name.
fn start(pki: &Pki) -> OwnServer {
    OwnServer::start(&Setup {
        settings: &[
            ("ssl", "on"),
            ("ssl_cert_file", "$DIR/server.crt"),
            ("ssl_key_file", "$DIR/server.key"),
            ("ssl_ca_file", "$DIR/ca.crt"),
        ],
        hba:
            "local all all trust\nhostssl all all 127.0.0.1/32 cert\nhostssl all all ::1/128 cert\n",
        files: &[
            ("server.crt", &pki.server.cert),
            ("server.key", &pki.server.key),
            ("ca.crt", &pki.ca),
        ],
    })
}

/// Writes `contents` to `name` in `dir`, readable by its owner only.
fn private_file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn open(url: &str, name: &str) -> Result<PgProducer, StoreError> {
    let options = PgOptions {
        application_name: Some(name.into()),
        ..PgOptions::default()
    };
    PgProducer::open_with(url, &producer_schema(), Arc::new(SystemClock), &options)
}

/// The subject of the client certificate of the session named
/// `application_name`, asked over the server's Unix socket.
fn client_dn(server: &OwnServer, application_name: &str) -> Option<String> {
    let socket = format!(
        "host={} port={} user=postgres dbname=postgres",
        server.dir().display(),
        server.port
    );
    let mut admin = Client::connect(&socket, NoTls).expect("connect over the socket");
    session_ssl(&mut admin, application_name).and_then(|row| row.get("client_dn"))
}

/// The whole error, its causes included.
fn text(error: &StoreError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[test]
fn client_certificates_and_the_systems_cas() {
    let home = tempfile::tempdir().unwrap();
    let (unrelated, _) = ca("an unrelated CA");
    let system_store = private_file(home.path(), "system-cas.pem", &unrelated);
    std::env::set_var("HOME", home.path());
    std::env::set_var("SSL_CERT_FILE", &system_store);
    std::env::remove_var("SSL_CERT_DIR");
    a_server_that_asks_for_a_client_certificate_gets_the_one_the_url_names();
    the_systems_cas_are_trusted_with_sslrootcert_system();
}

fn a_server_that_asks_for_a_client_certificate_gets_the_one_the_url_names() {
    let pki = pki("127.0.0.1");
    let server = start(&pki);
    let files = tempfile::tempdir().unwrap();
    let roots = private_file(files.path(), "ca.pem", &pki.ca);
    let cert = private_file(files.path(), "client.pem", &pki.client.cert);
    let key = private_file(files.path(), "client.key", &pki.client.key);
    let base = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        roots.display()
    );

    let with_cert = format!("{base}&sslcert={}&sslkey={}", cert.display(), key.display());
    let store = open(&with_cert, "ordo-client-cert").expect("the certificate is accepted");
    assert_eq!(
        client_dn(&server, "ordo-client-cert").as_deref(),
        Some("/CN=postgres")
    );
    drop(store);

    // Without a certificate the server refuses the role: it is what
    // authenticates the session.
    let error = open(&base, "ordo-client-none").err().expect("refused");
    assert_ne!(error.kind(), ErrorKind::InvalidInput, "{}", text(&error));
    assert!(
        text(&error).contains("requires a valid client certificate (SQLSTATE 28000)"),
        "{}",
        text(&error)
    );

    // A certificate of another CA: the handshake fails.
    let (_, other) = ca("another CA");
    let stranger = signed(&other, &[], "postgres");
    let other_cert = private_file(files.path(), "other.pem", &stranger.cert);
    let other_key = private_file(files.path(), "other.key", &stranger.key);
    let with_other = format!(
        "{base}&sslcert={}&sslkey={}",
        other_cert.display(),
        other_key.display()
    );
    let error = open(&with_other, "ordo-client-other")
        .err()
        .expect("refused");
    assert_ne!(error.kind(), ErrorKind::InvalidInput, "{}", text(&error));
    assert_eq!(client_dn(&server, "ordo-client-other"), None);

    // A key the certificate is not of: refused before connecting.
    let with_wrong_key = format!(
        "{base}&sslcert={}&sslkey={}",
        cert.display(),
        other_key.display()
    );
    let error = PgUrl::parse(&with_wrong_key).expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{}", text(&error));
    assert!(text(&error).contains("KeyMismatch"), "{}", text(&error));
}

fn the_systems_cas_are_trusted_with_sslrootcert_system() {
    let pki = pki("localhost");
    let server = start(&pki);
    let files = tempfile::tempdir().unwrap();
    let cert = private_file(files.path(), "client.pem", &pki.client.cert);
    let key = private_file(files.path(), "client.key", &pki.client.key);
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslrootcert=system&sslcert={}&sslkey={}",
        server.port,
        cert.display(),
        key.display()
    );
    // The system's store (here: the unrelated CA of SSL_CERT_FILE) does
    // not hold the test's CA.
    let parsed = PgUrl::parse(&url).expect("the system's store is read");
    let error = parsed.connect().err().expect("refused: an unknown CA");
    let cause = format!("{error}: {:?}", std::error::Error::source(&error));
    assert!(cause.contains("UnknownIssuer"), "{cause}");
    // OpenSSL's variable names the store: the CA is in it, and the host
    // name is checked (verify-full).
    let ca = private_file(files.path(), "ca.pem", &pki.ca);
    std::env::set_var("SSL_CERT_FILE", &ca);
    let store = open(&url, "ordo-system-cas").expect("trusted through SSL_CERT_FILE");
    assert_eq!(
        client_dn(&server, "ordo-system-cas").as_deref(),
        Some("/CN=postgres")
    );
    drop(store);
    let by_other_name = url.replace("localhost", "127.0.0.1");
    let error = PgUrl::parse(&by_other_name)
        .unwrap()
        .connect()
        .err()
        .expect("refused: not issued for that address");
    let cause = format!("{error}: {:?}", std::error::Error::source(&error));
    assert!(cause.contains("NotValidForName"), "{cause}");
}
