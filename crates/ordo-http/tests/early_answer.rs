//! Early answers over real sockets: a client that writes its whole body
//! before reading (no `Expect: 100-continue`) reads the status the server
//! decided before the body was read, and a body past the lingering bound
//! is not read forever, nor is the body of a client that stops writing.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ordo_core::{StoreError, StoreId, SystemClock};
use ordo_http::linger::LINGER_BYTES_MAX;
use ordo_http::{Metrics, Opener, Server, ServerConfig};

const MIB: usize = 1024 * 1024;
/// The piece of body written at a time.
const CHUNK_BYTES: usize = 64 * 1024;
/// The longest wait for one write or read of a test.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The identity the server names on every answer.
const STORE_ID: &str = "00112233445566778899aabbccddeeff";

/// A server on 127.0.0.1 (port 0) with the default bounds (an 8 MiB body)
/// and no store; stopped when dropped.
struct Served {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Served {
    fn start() -> Served {
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async move {
                let listener = ordo_http::bind("127.0.0.1:0".parse().unwrap()).expect("bind");
                bound_tx.send(listener.local_addr().unwrap()).unwrap();
                let opener: Opener = Arc::new(|| {
                    Err(StoreError::new(
                        ordo_core::ErrorKind::Other,
                        "this server has no store",
                    ))
                });
                let store_id = StoreId::new(STORE_ID).unwrap();
                let server = Server::new(
                    ServerConfig::default(),
                    opener,
                    &store_id,
                    Arc::new(Metrics::new()),
                    Arc::new(SystemClock),
                );
                server
                    .serve(listener, None, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Served {
            addr: bound_rx.recv().expect("the bound address"),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).expect("connect");
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream
    }

    /// The head of a relay's POST to `path` (see the client), framed by
    /// `framing` (`Content-Length: N` or `Transfer-Encoding: chunked`).
    fn head(&self, path: &str, framing: &str, extra: &str) -> String {
        format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             accept: */*\r\n{framing}\r\n{extra}\r\n",
            self.addr
        )
    }

    /// Connects and writes the head of a POST to `path` (see [`Self::head`]).
    fn post_head(&self, path: &str, framing: &str, extra: &str) -> TcpStream {
        let mut stream = self.connect();
        stream
            .write_all(self.head(path, framing, extra).as_bytes())
            .expect("the head is written");
        stream
    }
}

/// The framing of a body of `length` bytes.
fn content_length(length: usize) -> String {
    format!("content-length: {length}")
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes `bytes` of body in pieces (chunk-framed when `chunked`).
fn write_body(stream: &mut TcpStream, bytes: usize, chunked: bool) -> std::io::Result<()> {
    let piece = vec![b' '; CHUNK_BYTES];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK_BYTES);
        if chunked {
            stream.write_all(format!("{n:x}\r\n").as_bytes())?;
        }
        stream.write_all(&piece[..n])?;
        if chunked {
            stream.write_all(b"\r\n")?;
        }
        left -= n;
    }
    if chunked {
        stream.write_all(b"0\r\n\r\n")?;
    }
    stream.flush()
}

/// Reads the whole answer, up to the close that follows it (within
/// [`IO_TIMEOUT`] of the last byte).
fn read_answer(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .expect("the answer is read to its end");
    String::from_utf8_lossy(&answer).into_owned()
}

/// Posts to `path` a body of `length` bytes framed by its content-length,
/// writes the first `written` bytes of it and reads the answer to its end.
fn answer_to_body(path: &str, length: usize, written: usize) -> String {
    let served = Served::start();
    let mut stream = served.post_head(path, &content_length(length), "");
    write_body(&mut stream, written, false).expect("the body's bytes are written");
    read_answer(&mut stream)
}

#[track_caller]
fn assert_status(answer: &str, status: &str) {
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status} ")),
        "the answer: {answer:?}"
    );
}

#[track_caller]
fn assert_early_answer(answer: &str, status: &str) {
    assert_status(answer, status);
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "the connection closes after an early answer: {answer:?}"
    );
    assert!(
        answer
            .to_ascii_lowercase()
            .contains(&format!("\r\nordo-store-id: {STORE_ID}\r\n")),
        "an early answer names the consumer store: {answer:?}"
    );
}

#[test]
fn a_too_large_content_length_is_answered_413_after_the_whole_body_is_written() {
    assert_early_answer(&answer_to_body("/v1/events", 16 * MIB, 16 * MIB), "413");
}

#[test]
fn a_refusal_that_reads_no_body_is_read_after_the_whole_body_is_written() {
    assert_early_answer(&answer_to_body("/v1/nowhere", 16 * MIB, 16 * MIB), "404");
}

#[test]
fn a_client_that_stops_writing_its_body_reads_the_answer_and_the_close() {
    assert_early_answer(&answer_to_body("/v1/events", 16 * MIB, MIB), "413");
}

#[test]
fn a_chunked_body_found_too_large_while_read_is_answered_413_after_it_is_written() {
    let served = Served::start();
    let mut stream = served.post_head("/v1/events", "transfer-encoding: chunked", "");
    write_body(&mut stream, 16 * MIB, true).expect("the whole body is written");
    assert_early_answer(&read_answer(&mut stream), "413");
}

#[test]
fn a_client_that_expects_100_continue_reads_the_413_without_a_100() {
    let served = Served::start();
    let framing = content_length(16 * MIB);
    let mut stream = served.post_head("/v1/events", &framing, "expect: 100-continue\r\n");
    assert_early_answer(&read_answer(&mut stream), "413");
}

#[test]
fn a_body_past_the_lingering_bound_is_not_read_forever() {
    let served = Served::start();
    let budget = 8 * LINGER_BYTES_MAX as usize;
    let length = 4 * budget;
    let mut stream = served.post_head("/v1/events", &content_length(length), "");
    let written = write_body(&mut stream, budget, false);
    let error = written.expect_err("the server stops reading and closes the connection");
    assert!(
        !matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "the server closed the connection rather than leaving it open: {error}"
    );
    let mut rest = Vec::new();
    if let Err(error) = stream.read_to_end(&mut rest) {
        assert!(
            !matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "the connection ended: {error}"
        );
    }
}

/// Reads one answer framed by its `content-length`, leaving the
/// connection open.
fn read_one_answer(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("a head byte");
        answer.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .expect("a content-length")
        .trim()
        .parse()
        .expect("a length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("the body");
    answer.extend_from_slice(&body);
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn an_answer_after_the_whole_body_was_read_keeps_the_connection() {
    let served = Served::start();
    let mut stream = served.connect();
    let body = "{}";
    let head = served
        .head("/v1/events", &content_length(body.len()), "")
        .replace("application/json", "text/plain");
    stream
        .write_all(head.as_bytes())
        .expect("the head is written");
    stream
        .write_all(body.as_bytes())
        .expect("the body is written");
    let answer = read_one_answer(&mut stream);
    assert_status(&answer, "415");
    assert!(
        !answer.to_ascii_lowercase().contains("connection: close"),
        "the answer: {answer:?}"
    );
    let health = format!("GET /v1/health HTTP/1.1\r\nhost: {}\r\n\r\n", served.addr);
    stream
        .write_all(health.as_bytes())
        .expect("a second request is written");
    assert_status(&read_one_answer(&mut stream), "200");
}
