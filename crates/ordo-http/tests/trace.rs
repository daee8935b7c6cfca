//! Trace context over HTTP (HTTP.md, third release): the relay's client
//! sends its round's `traceparent` as a request header, and the server
//! records the request's header on its request span and each envelope's
//! on the span of its receive.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use ordo_core::{ConsumerHandle, ConsumerOps, Envelope, Receipt, StoreId, SystemClock, Transport};
use ordo_http::{ClientOptions, HttpTransport, Metrics, Opener, Server, ServerConfig};
use ordo_sqlite::{ConsumerDb, Schema};
use ordo_testkit::spans::SpanCapture;

const TRACED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const OTHER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

/// A server on 127.0.0.1 storing into the SQLite consumer at `path`.
struct Served {
    base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Served {
    fn start(path: PathBuf) -> Served {
        let open = move || ConsumerDb::open(&path, &Schema::new("app").expect("a domain name"));
        let store_id: StoreId = open().expect("open the consumer").store_id().clone();
        let opener: Opener = Arc::new(move || Ok(Box::new(open()?) as Box<dyn ConsumerHandle>));
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async move {
                let listener = ordo_http::bind("127.0.0.1:0".parse().unwrap()).expect("bind");
                bound_tx.send(listener.local_addr().unwrap()).unwrap();
                let config = ServerConfig::default();
                let metrics = Arc::new(Metrics::new());
                let server = Server::new(config, opener, &store_id, metrics, Arc::new(SystemClock));
                let stopped = async {
                    let _ = stopped.await;
                };
                server.serve(listener, None, stopped).await;
            });
        });
        let addr = bound_rx.recv().expect("the bound address");
        Served {
            base: format!("http://{addr}"),
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        let _ = self.thread.take().map(JoinHandle::join);
    }
}

fn event(flow_id: &str, traceparent: Option<&str>) -> Envelope {
    let text = format!(
        r#"{{"event_id":"{flow_id}-1","flow_id":"{flow_id}","seq":1,"schema_version":1,"type":"noted","payload":{{}}}}"#
    );
    let mut event = Envelope::parse_str(&text).expect("a well-formed envelope");
    if let Some(traceparent) = traceparent {
        event
            .headers
            .insert("traceparent".into(), traceparent.into());
    }
    event
}

/// The request spans' `traceparent` fields, in creation order.
fn request_traceparents(spans: &SpanCapture) -> Vec<Option<String>> {
    let requests = spans.named("request");
    let field = |s: &ordo_testkit::spans::CapturedSpan| s.field("traceparent").map(str::to_owned);
    requests.iter().map(field).collect()
}

/// One test: the capture is the process's, and the requests are told
/// apart by their order.
#[test]
fn the_round_traceparent_goes_over_as_a_header_and_every_span_records_its_own() {
    let spans = SpanCapture::global();
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(dir.path().join("consumer.db"));
    let mut client = HttpTransport::new(&served.base, None, &ClientOptions::default()).unwrap();
    let round = [
        event("a", None),
        event("b", Some("00-not-a-traceparent")),
        event("c", Some(TRACED)),
        event("d", Some(OTHER)),
    ];
    let receipts = client.deliver(None, &round).unwrap();
    assert_eq!(receipts, [Receipt::Accepted; 4]);
    // The client probes an earlier release's consumer once: that request
    // carries no traceparent; the round's POST carries the first
    // well-formed one of its events.
    let requests = request_traceparents(&spans);
    assert_eq!(
        requests.last(),
        Some(&Some(TRACED.to_owned())),
        "{requests:?}"
    );
    assert_eq!(
        spans.traceparents("receive_event"),
        [
            ("a-1".to_owned(), None),
            ("b-1".to_owned(), None),
            ("c-1".to_owned(), Some(TRACED.to_owned())),
            ("d-1".to_owned(), Some(OTHER.to_owned())),
        ]
    );

    let untraced = [event("e", None), event("f", Some("ff-bad"))];
    let before = request_traceparents(&spans).len();
    client.deliver(None, &untraced).unwrap();
    let requests = request_traceparents(&spans);
    assert_eq!(
        requests[before..],
        [None],
        "no well-formed traceparent, no header"
    );

    let single = [event("g", Some(OTHER))];
    client.deliver(None, &single).unwrap();
    let events = spans.named("events");
    let last = events.last().expect("an events span");
    assert_eq!(last.field("event_id"), Some("g-1"));
    assert_eq!(last.field("traceparent"), Some(OTHER));

    let health = format!("{}/v1/health", served.base);
    let zero_parent = "00-11111111111111111111111111111111-0000000000000000-01";
    let before = request_traceparents(&spans).len();
    for header in [zero_parent, TRACED] {
        let answer = reqwest::blocking::Client::new()
            .get(&health)
            .header("traceparent", header)
            .send()
            .unwrap();
        assert!(answer.status().is_success(), "{}", answer.status());
    }
    let requests = request_traceparents(&spans);
    assert_eq!(requests[before..], [None, Some(TRACED.to_owned())]);
}
