//! TLS to the server as the URL's `sslmode` asks, against the test server
//! (which must have `ssl = on`, as Debian's PostgreSQL has, with a
//! certificate for `localhost`).

mod support;

use std::sync::Arc;

use ordo_core::{ErrorKind, SystemClock};
use ordo_postgres::{PgOptions, PgProducer, PgUrl, TlsMode};
use ordo_reservation::producer_schema;
use support::{admin_client, fresh_database, session_ssl};

/// The server's certificate file, after checking that it offers TLS.
fn server_certificate(target: &str) -> String {
    let mut client = admin_client(target);
    let ssl: String = client.query_one("SHOW ssl", &[]).unwrap().get(0);
    assert_eq!(
        ssl, "on",
        "these tests need a server with ssl = on at {target}"
    );
    client.query_one("SHOW ssl_cert_file", &[]).unwrap().get(0)
}

/// Whether the sessions named `application_name` use TLS (`None`: there
/// is no such session).
fn encrypted(target: &str, application_name: &str) -> Option<bool> {
    session_ssl(&mut admin_client(target), application_name).map(|row| row.get("ssl"))
}

fn with_params(target: &str, params: &str) -> String {
    format!("{target}?{params}")
}

fn open(target: &str, name: &str) -> Result<PgProducer, ordo_core::StoreError> {
    let options = PgOptions {
        application_name: Some(name.into()),
        // The refused opens name a schema of their own, to check that
        // nothing was created.
        schema: name.ends_with("-bad").then(|| name.replace('-', "_")),
        ..PgOptions::default()
    };
    PgProducer::open_with(target, &producer_schema(), Arc::new(SystemClock), &options)
}

#[test]
fn a_store_uses_tls_when_the_url_requires_it_and_not_without_sslmode() {
    let (_dir, target) = fresh_database();
    server_certificate(&target);
    let secured = open(&with_params(&target, "sslmode=require"), "ordo-tls-require").unwrap();
    assert_eq!(encrypted(&target, "ordo-tls-require"), Some(true));
    let plain = open(&target, "ordo-tls-none").unwrap();
    assert_eq!(encrypted(&target, "ordo-tls-none"), Some(false));
    let preferred = open(&with_params(&target, "sslmode=prefer"), "ordo-tls-prefer").unwrap();
    assert_eq!(encrypted(&target, "ordo-tls-prefer"), Some(true));
    drop((secured, plain, preferred));
}

#[test]
fn verify_full_checks_the_host_name_and_verify_ca_only_the_chain() {
    let (_dir, target) = fresh_database();
    let root = server_certificate(&target);
    let by_name = target.replacen("127.0.0.1", "localhost", 1);
    let checked = |base: &str, mode: &str| {
        PgUrl::parse(&with_params(
            base,
            &format!("sslmode={mode}&sslrootcert={root}"),
        ))
        .unwrap()
        .connect()
    };
    let mut client = checked(&by_name, "verify-full").expect("the certificate is for localhost");
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(ssl);
    if by_name != target {
        let error = checked(&target, "verify-full")
            .err()
            .expect("refused: not issued for 127.0.0.1");
        let text = format!("{error}: {:?}", std::error::Error::source(&error));
        assert!(text.contains("Certificate"), "{text}");
        checked(&target, "verify-ca").expect("verify-ca does not check the name");
    }
}

#[test]
fn a_certificate_of_another_ca_is_refused() {
    let (_dir, target) = fresh_database();
    server_certificate(&target);
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, other_ca()).unwrap();
    let checked = format!("sslmode=verify-ca&sslrootcert={}", other.display());
    for params in [checked.clone(), checked.replace("verify-ca", "require")] {
        let parsed = PgUrl::parse(&with_params(&target, &params)).unwrap();
        let error = parsed
            .connect()
            .err()
            .expect("refused: an untrusted certificate");
        let text = format!("{error}: {:?}", std::error::Error::source(&error));
        assert!(text.contains("Certificate"), "{params}: {text}");
    }
}

#[test]
fn bad_tls_parameters_are_refused_before_connecting() {
    let (_dir, target) = fresh_database();
    let cases = [
        ("sslmode=always", "sslmode=always: one of"),
        (
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            "sslrootcert=/nonexistent/ca.pem",
        ),
    ];
    for (params, words) in cases {
        let result = open(&with_params(&target, params), "ordo-tls-bad");
        let error = result.err().expect("refused");
        assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
        assert!(error.to_string().contains(words), "{params}: {error}");
        assert_eq!(
            encrypted(&target, "ordo-tls-bad"),
            None,
            "{params}: it connected"
        );
    }
    let schema: bool = admin_client(&target)
        .query_one("SELECT to_regnamespace('ordo_tls_bad') IS NOT NULL", &[])
        .unwrap()
        .get(0);
    assert!(!schema, "nothing is created");
    assert_eq!(PgUrl::parse(&target).unwrap().mode(), TlsMode::Disable);
}

/// A self-signed certificate for `localhost` that is not the server's: as
/// the CA to trust, it signed nothing the server holds.
fn other_ca() -> String {
    rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .expect("a certificate")
        .cert
        .pem()
}
