use super::*;
use axum::http::HeaderValue;

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const OTHER: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
const NOW_S: i64 = 1_700_000_000;
const BODY: &[u8] = br#"[{"event_id":"f-1"}]"#;

fn ring(text: &str) -> KeyRing {
    KeyRing::parse(text, Path::new("keys")).expect("a valid key file")
}

fn headers(ring: &KeyRing, key_id: &str, timestamp_s: i64, body: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in signature_headers(ring, key_id, timestamp_s, "POST", "/v1/events", body)
        .expect("a known key id")
    {
        map.insert(name, HeaderValue::from_str(&value).expect("ASCII"));
    }
    map
}

/// Produced independently of this crate with OpenSSL 3.0:
///
/// ```sh
/// H=$(printf '%s' '[{"event_id":"f-1"}]' | openssl dgst -sha256 -r | cut -d' ' -f1)
/// printf 'k1\n1700000000\nPOST\n/v1/events\n%s' "$H" \
///   | openssl dgst -sha256 -mac HMAC -macopt hexkey:0001...1e1f -binary | base64
/// ```
///
/// (`H` is c75d945b42aaefbb5341aa49916f184ee3fe2ea18e7fec538b63a01dddc5388e.)
#[test]
fn signature_matches_an_independent_computation() {
    let secret = hex::decode(KEY).unwrap();
    assert_eq!(
        sign("k1", &secret, NOW_S, "POST", "/v1/events", BODY),
        "v1=D8Ne5wwB2Coepx8Y8EntPGnumnmINmBCaDsQL+2whcI="
    );
}

#[test]
fn a_signed_request_verifies() {
    let ring = ring(&format!("# comment\n\nk1 {KEY}\n"));
    let map = headers(&ring, "k1", NOW_S, BODY);
    assert_eq!(
        ring.verify(&map, "POST", "/v1/events", BODY, NOW_S + 300),
        Ok(Verified {
            key_id: "k1".to_owned(),
            producer: None
        })
    );
}

#[test]
fn every_change_to_the_request_is_refused() {
    let ring = ring(&format!("k1 {KEY}\n"));
    let map = headers(&ring, "k1", NOW_S, BODY);
    let verify = |method, path, body: &[u8]| ring.verify(&map, method, path, body, NOW_S);
    assert_eq!(verify("PUT", "/v1/events", BODY), Err(AuthError::NoMatch));
    assert_eq!(verify("POST", "/v1/other", BODY), Err(AuthError::NoMatch));
    assert_eq!(verify("POST", "/v1/events", b"[]"), Err(AuthError::NoMatch));
}

#[test]
fn a_timestamp_outside_the_window_is_refused() {
    let ring = ring(&format!("k1 {KEY}\n"));
    let map = headers(&ring, "k1", NOW_S, BODY);
    for now_s in [NOW_S + 301, NOW_S - 301] {
        assert_eq!(
            ring.verify(&map, "POST", "/v1/events", BODY, now_s),
            Err(AuthError::OutsideWindow {
                timestamp_s: NOW_S,
                now_s
            })
        );
    }
}

#[test]
fn unknown_key_ids_and_missing_headers_are_refused() {
    let ring_one = ring(&format!("k1 {KEY}\n"));
    let ring_two = ring(&format!("k2 {KEY}\n"));
    let map = headers(&ring_two, "k2", NOW_S, BODY);
    assert_eq!(
        ring_one.verify(&map, "POST", "/v1/events", BODY, NOW_S),
        Err(AuthError::UnknownKeyId)
    );
    for name in [HEADER_KEY_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE] {
        let mut map = headers(&ring_one, "k1", NOW_S, BODY);
        map.remove(name);
        assert_eq!(
            ring_one.verify(&map, "POST", "/v1/events", BODY, NOW_S),
            Err(AuthError::Missing(name))
        );
    }
}

#[test]
fn rotation_accepts_either_secret_and_several_values() {
    let old = ring(&format!("k1 {KEY}\n"));
    let new = ring(&format!("k1 {OTHER}\n"));
    let both = ring(&format!("k1 {KEY}\nk1 {OTHER}\n"));
    for signer in [&old, &new, &both] {
        let map = headers(signer, "k1", NOW_S, BODY);
        assert!(both.verify(&map, "POST", "/v1/events", BODY, NOW_S).is_ok());
    }
    let map = headers(&both, "k1", NOW_S, BODY);
    let value = map[HEADER_SIGNATURE].to_str().unwrap();
    assert_eq!(value.split(' ').count(), 2);
    assert!(old.verify(&map, "POST", "/v1/events", BODY, NOW_S).is_ok());
    assert!(new.verify(&map, "POST", "/v1/events", BODY, NOW_S).is_ok());
}

#[test]
fn malformed_signatures_and_timestamps_are_refused() {
    let ring = ring(&format!("k1 {KEY}\n"));
    for (name, value) in [
        (HEADER_SIGNATURE, "v2=abc"),
        (HEADER_SIGNATURE, "v1=***"),
        (HEADER_TIMESTAMP, "-5"),
        (HEADER_TIMESTAMP, "12.5"),
    ] {
        let mut map = headers(&ring, "k1", NOW_S, BODY);
        map.insert(name, HeaderValue::from_static(value));
        let refused = ring.verify(&map, "POST", "/v1/events", BODY, NOW_S);
        assert!(
            matches!(refused, Err(AuthError::Malformed { header, .. }) if header == name),
            "{name}: {value}: {refused:?}"
        );
    }
}

#[test]
fn key_file_errors_name_the_line() {
    let cases = [
        (format!("k1 {KEY}\nk2\n"), "line 2", "two or three fields"),
        (format!("\n# c\nk1 {}\n", &KEY[..62]), "line 3", "32 to"),
        ("k1 zz\n".to_string(), "line 1", "not hex"),
        (format!("k1 {KEY} extra\n"), "line 1", "not producer=NAME"),
        (
            format!("k1 {KEY} producer=a b\n"),
            "line 1",
            "more than three fields",
        ),
        (
            format!("k1 {KEY} producer=\n"),
            "line 1",
            "a producer name must match",
        ),
        (
            format!("k1 {KEY} producer=Orders\n"),
            "line 1",
            "a producer name must match",
        ),
        (
            format!("k1 {KEY} producer=a\n\nk1 {OTHER} producer=b\n"),
            "line 3",
            "key id k1 is bound to producer b here but to producer a on line 1",
        ),
        (
            format!("k1 {KEY} producer=a\nk1 {OTHER}\n"),
            "line 2",
            "key id k1 is bound to no producer here but to producer a on line 1",
        ),
        (
            format!("k1 {KEY}\nk1 {OTHER} producer=a\n"),
            "line 2",
            "key id k1 is bound to producer a here but to no producer on line 1",
        ),
    ];
    for (text, line, rule) in cases {
        let error = KeyRing::parse(&text, Path::new("keys.txt"))
            .expect_err("refused")
            .to_string();
        assert!(
            error.contains("keys.txt") && error.contains(line) && error.contains(rule),
            "{error}"
        );
    }
    let error = KeyRing::parse("# only a comment\n", Path::new("k")).expect_err("refused");
    assert!(matches!(error, KeyFileError::Empty { .. }), "{error}");
}

#[test]
fn a_refused_line_never_shows_its_secret_or_a_field_after_it() {
    for text in [
        format!("k1 {KEY} {OTHER}\n"),
        format!("k1 {KEY} producer=a {OTHER}\n"),
    ] {
        let error = KeyRing::parse(&text, Path::new("keys"))
            .expect_err("refused")
            .to_string();
        assert!(!error.contains(KEY) && !error.contains(OTHER), "{error}");
    }
}

#[test]
fn keys_bound_to_a_producer_name_it_in_every_line_and_verify_as_bound() {
    let ring = ring(&format!(
        "k1 {KEY} producer=orders\nk1 {OTHER}   producer=orders\nk2 {KEY}\n"
    ));
    assert_eq!(ring.secrets("k1").map(<[Secret]>::len), Some(2));
    assert_eq!(
        ring.producer("k1").map(ProducerName::as_str),
        Some("orders")
    );
    assert_eq!(ring.producer("k2"), None);
    assert_eq!(ring.producer("k9"), None);
    assert_eq!(ring.unbound().collect::<Vec<_>>(), ["k2"]);
    for (key_id, producer) in [("k1", Some("orders")), ("k2", None)] {
        let map = headers(&ring, key_id, NOW_S, BODY);
        let verified = ring.verify(&map, "POST", "/v1/events", BODY, NOW_S);
        assert_eq!(
            verified,
            Ok(Verified {
                key_id: key_id.to_owned(),
                producer: producer.map(|p| ProducerName::new(p).unwrap()),
            })
        );
    }
}

#[cfg(unix)]
#[test]
fn a_key_file_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, format!("k1 {KEY}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let error = KeyRing::load(&path).expect_err("refused").to_string();
    assert!(error.contains("0644") && error.contains("keys"), "{error}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(KeyRing::load(&path).unwrap().secrets("k1").is_some());
}
