use super::*;

const GOOD: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

#[test]
fn well_formed_traceparents_parse_and_print_as_given() {
    let later = format!("{}-what-comes-later", GOOD.replacen("00", "cc", 1));
    for text in [
        GOOD,
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
        "fe-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-ff",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        &later,
    ] {
        let parsed = TraceParent::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(parsed.to_string(), text);
        assert_eq!(text.parse::<TraceParent>().unwrap(), parsed);
    }
    let parsed = TraceParent::parse(GOOD).unwrap();
    assert_eq!(parsed.version(), "00");
    assert_eq!(parsed.trace_id(), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(parsed.parent_id(), "b7ad6b7169203331");
    assert_eq!((parsed.flags(), parsed.sampled()), (1, true));
    let unsampled = TraceParent::parse(&GOOD.replace("-01", "-00")).unwrap();
    assert!(!unsampled.sampled());
}

#[test]
fn ill_formed_traceparents_are_refused_with_their_rule() {
    let zero_trace = format!("00-{}-b7ad6b7169203331-01", "0".repeat(32));
    let zero_parent = format!("00-0af7651916cd43dd8448eb211c80319c-{}-01", "0".repeat(16));
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "at least 55"),
        (GOOD[..54].to_owned(), "at least 55"),
        (format!("{GOOD}-"), "exactly 55"),
        (format!("{GOOD}0"), "exactly 55"),
        (GOOD.replacen("00", "ff", 1), "not ff"),
        (GOOD.replacen("00", "0g", 1), "version is lowercase hex"),
        (GOOD.to_uppercase(), "lowercase hex"),
        (GOOD.replace("0af7", "0AF7"), "trace id is lowercase hex"),
        (GOOD.replace("b7ad", "B7AD"), "parent id is lowercase hex"),
        (GOOD.replace("-01", "-0x"), "flags is lowercase hex"),
        (zero_trace, "trace id is not all zero"),
        (zero_parent, "parent id is not all zero"),
        (GOOD.replacen('-', "_", 1), "the form"),
        (GOOD.replace("-b7", "_b7"), "the form"),
        (format!("cc{}x", &GOOD[2..]), "after a '-'"),
        (format!("{}é", &GOOD[..54]), "ASCII"),
        (format!(" {}", &GOOD[..54]), "the form"),
    ];
    for (text, rule) in cases {
        let error = TraceParent::parse(&text).expect_err(&text);
        assert!(error.to_string().contains(rule), "{text:?}: {error}");
    }
}

#[test]
fn an_events_traceparent_is_its_well_formed_header() {
    let body =
        r#"{"event_id":"f-1","flow_id":"f","seq":1,"schema_version":1,"type":"t","payload":{}}"#;
    let mut event = Envelope::parse_str(body).unwrap();
    assert_eq!(event.traceparent(), None);
    event
        .headers
        .insert(TRACEPARENT.into(), "00-ab-cd-01".into());
    assert_eq!(event.traceparent(), None, "ill-formed: ignored");
    let mut traced = event.clone();
    traced.headers.insert(TRACEPARENT.into(), GOOD.into());
    assert_eq!(
        traced.traceparent(),
        Some(TraceParent::parse(GOOD).unwrap())
    );
    let round = [event.clone(), traced.clone(), event];
    assert_eq!(first_traceparent(&round), traced.traceparent());
    assert_eq!(first_traceparent(&round[2..]), None);
}

#[test]
fn ids_given_as_numbers_make_a_version_00_traceparent() {
    let made = TraceParent::from_ids(0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331, 1);
    assert_eq!(made.unwrap().as_str(), GOOD);
    assert_eq!(TraceParent::from_ids(0, 1, 1), None);
    assert_eq!(TraceParent::from_ids(1, 0, 1), None);
}

#[test]
fn an_append_writes_the_given_traceparent_over_the_callers_headers() {
    let given = TraceParent::parse(GOOD).unwrap();
    let mut headers = Headers::new();
    headers.insert("x-id".into(), "7".into());
    headers.insert(TRACEPARENT.into(), "old".into());
    let written = appended_headers(&headers, Some(&given));
    assert_eq!(written[TRACEPARENT], GOOD);
    assert_eq!(written["x-id"], "7");
    assert_eq!(appended_headers(&headers, None), headers);
}
