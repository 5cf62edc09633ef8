//! A loopback TCP proxy in front of ClickHouse that injects faults by real
//! means, for the lab and the integration tests.
//!
//! Bytes flow client → proxy → server and back untouched, until a fault is
//! armed. The next INSERT seen on any connection then gets it:
//! - [`Fault::WithholdResponse`]: the whole request is forwarded, the server
//!   commits, its answer is swallowed and the client kept waiting for `hold`
//!   (past its timeout), then hung up on. The outcome is unknown to the
//!   client, but the rows are in.
//! - [`Fault::HoldRequest`]: the request is not forwarded; the client waits
//!   for `hold`, then is hung up on. The outcome is unknown, nothing landed.
//! - [`Fault::DropRequest`]: the connection is closed instead of forwarding.
//! - [`Fault::LateRequest`]: the request is held for `hold`, past the
//!   client's timeout, and then forwarded whole, as a load balancer, a
//!   server queue or TCP retransmission can deliver it after the client
//!   gave up. [`Proxy::late_every`] gives it to every n-th INSERT.
//! - [`Fault::SlowBody`]: the request's head and the first bytes of its
//!   body are forwarded at once, the rest `hold` later, as a slow client or
//!   network delivers a body: the server starts the query on the head, and
//!   the rows arrive after the client gave up.
//! - [`Fault::Answer`]: the request is taken whole and never forwarded;
//!   the proxy answers it itself with what [`Proxy::answer_next_insert`]
//!   set (a 413 of a body limit, a gateway's 502 page, a 200 carrying an
//!   exception), as a load balancer or gateway in front of ClickHouse does.
//! - [`Fault::AnswerWhileRunning`]: the request is forwarded but for its
//!   last bytes (the chunked body's end), the proxy answers the client
//!   itself at once, and the last bytes follow `hold` later: the server's
//!   query runs on after the client was refused, and commits.
//! - [`Fault::AnswerAfterCommit`]: the request is forwarded whole; the
//!   server's answer (it committed) is replaced by the proxy's own, as a
//!   gateway's response-phase rule does.
//!
//! [`Proxy::hold_reads`] gives [`Fault::HoldRequest`] to the next n
//! requests that are not INSERTs (a network blip on a read).
//! [`Proxy::set_down`] makes every connection fail at once, as an
//! unreachable server does. [`Proxy::slow_inserts`] forwards every INSERT
//! after a delay, as a busy server answers.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    WithholdResponse = 1,
    HoldRequest = 2,
    DropRequest = 3,
    LateRequest = 4,
    SlowBody = 5,
    Answer = 6,
    AnswerWhileRunning = 7,
    AnswerAfterCommit = 8,
}

#[derive(Default)]
struct State {
    armed: AtomicU8,
    fired: AtomicU32,
    down: AtomicBool,
    /// Every n-th INSERT is delivered late (0: none).
    late_every: AtomicU32,
    inserts: AtomicU32,
    /// Late requests not yet delivered to the server.
    late_pending: AtomicU32,
    /// Milliseconds every INSERT waits before it is forwarded.
    slow_ms: AtomicU64,
    /// Requests other than INSERTs still to hold.
    hold_reads: AtomicU32,
    /// When set, an armed fault waits for an INSERT whose request head
    /// holds these bytes.
    marker: std::sync::Mutex<Option<Vec<u8>>>,
    /// An armed fault stays armed: every INSERT gets it.
    sticky: AtomicBool,
    /// The whole HTTP response [`Fault::Answer`] gives.
    answer: std::sync::Mutex<Vec<u8>>,
}

pub struct Proxy {
    pub url: String,
    state: Arc<State>,
}

impl Proxy {
    /// Starts a proxy on 127.0.0.1 to `upstream` (`host:port`); faults last
    /// `hold`.
    pub async fn start(upstream: String, hold: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(State::default());
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if st.down.load(Ordering::SeqCst) {
                    st.fired.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                let (st, up) = (st.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&up).await {
                        pipe(client, server, st, hold).await;
                    }
                });
            }
        });
        Ok(Self { url, state })
    }

    /// The upstream of a ClickHouse URL: `http://host:port/` → `host:port`.
    pub fn upstream_of(url: &str) -> String {
        url.trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string()
    }

    /// From now on an armed fault waits for an INSERT whose request head
    /// (its URL: the query, its settings) holds `marker`.
    pub fn only_inserts_with(&self, marker: &[u8]) {
        *self.state.marker.lock().unwrap() = Some(marker.to_vec());
    }

    /// From now on an armed fault stays armed: every INSERT (that
    /// [`Self::only_inserts_with`] lets through) gets it, as a proxy's
    /// rule does.
    pub fn keep_armed(&self) {
        self.state.sticky.store(true, Ordering::SeqCst);
    }

    /// The next INSERT gets `fault`.
    pub fn arm(&self, fault: Fault) {
        self.state.armed.store(fault as u8, Ordering::SeqCst);
    }

    /// How many faults were injected (armed faults, and connections
    /// refused while down).
    pub fn fired(&self) -> u32 {
        self.state.fired.load(Ordering::SeqCst)
    }

    /// The next INSERT is answered by the proxy itself with `status` and
    /// `body` (and `headers`, each `Name: value`), and never reaches the
    /// server.
    pub fn answer_next_insert(&self, status: u16, headers: &[&str], body: &str) {
        self.answer_next_insert_as(Fault::Answer, status, headers, body);
    }

    /// As [`Self::answer_next_insert`], when `fault` says: instead of the
    /// server ([`Fault::Answer`]), while its query runs
    /// ([`Fault::AnswerWhileRunning`]) or once it committed
    /// ([`Fault::AnswerAfterCommit`]).
    pub fn answer_next_insert_as(&self, fault: Fault, status: u16, headers: &[&str], body: &str) {
        let reason = match status {
            200 => "OK",
            400 => "Bad Request",
            403 => "Forbidden",
            413 => "Payload Too Large",
            502 => "Bad Gateway",
            503 => "Service Unavailable",
            504 => "Gateway Timeout",
            _ => "Status",
        };
        let mut head = format!("HTTP/1.1 {status} {reason}\r\n");
        for h in headers {
            head.push_str(&format!("{h}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        *self.state.answer.lock().unwrap() = head.into_bytes();
        self.arm(fault);
    }

    /// Every `n`-th INSERT from now on is delivered late (0: none).
    pub fn late_every(&self, n: u32) {
        self.state.late_every.store(n, Ordering::SeqCst);
    }

    /// Late requests held and not yet delivered to the server.
    pub fn late_pending(&self) -> u32 {
        self.state.late_pending.load(Ordering::SeqCst)
    }

    /// Every INSERT from now on waits `d` before it is forwarded (zero:
    /// none); the answer comes back as usual.
    pub fn slow_inserts(&self, d: Duration) {
        self.state
            .slow_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Holds the next `n` requests that are not INSERTs for `hold`, then
    /// hangs up on them.
    pub fn hold_reads(&self, n: u32) {
        self.state.hold_reads.store(n, Ordering::SeqCst);
    }

    /// While down, every new connection is closed at once.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }
}

async fn pipe(client: TcpStream, server: TcpStream, st: Arc<State>, hold: Duration) {
    let (mut cr, cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // The upstream half answers the client itself for AnswerWhileRunning.
    let cw = Arc::new(tokio::sync::Mutex::new(cw));
    let cw_up = cw.clone();
    // Set once this connection carries a faulted insert.
    let mode = Arc::new(AtomicU8::new(0));
    let m = mode.clone();
    let s2 = st.clone();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if s2.down.load(Ordering::SeqCst) {
                break;
            }
            let request = chunk.starts_with(b"POST ") || chunk.starts_with(b"GET ");
            if m.load(Ordering::SeqCst) == 0
                && request
                && !contains(chunk, b"query=INSERT")
                && s2
                    .hold_reads
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                m.store(Fault::HoldRequest as u8, Ordering::SeqCst);
                s2.fired.fetch_add(1, Ordering::SeqCst);
            }
            if m.load(Ordering::SeqCst) == 0 && contains(chunk, b"query=INSERT") {
                let every = s2.late_every.load(Ordering::SeqCst);
                let nth = s2.inserts.fetch_add(1, Ordering::SeqCst) + 1;
                let marked = s2
                    .marker
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_none_or(|m| contains(chunk, m));
                let armed = match (marked, s2.sticky.load(Ordering::SeqCst)) {
                    (false, _) => 0,
                    (true, false) => s2.armed.swap(0, Ordering::SeqCst),
                    (true, true) => s2.armed.load(Ordering::SeqCst),
                };
                let f = match armed {
                    0 if every > 0 && nth.is_multiple_of(every) => Fault::LateRequest as u8,
                    f => f,
                };
                if f != 0 {
                    m.store(f, Ordering::SeqCst);
                    s2.fired.fetch_add(1, Ordering::SeqCst);
                }
                let slow = s2.slow_ms.load(Ordering::SeqCst);
                if f == 0 && slow > 0 {
                    s2.fired.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(slow)).await;
                }
            }
            match m.load(Ordering::SeqCst) {
                x if x == Fault::SlowBody as u8 => {
                    let head = chunk
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map_or(chunk.len(), |at| (at + 4 + 64).min(chunk.len()));
                    if sw.write_all(&chunk[..head]).await.is_err() {
                        break;
                    }
                    s2.late_pending.fetch_add(1, Ordering::SeqCst);
                    deliver_late(chunk[head..].to_vec(), &mut cr, &mut sw, hold).await;
                    s2.late_pending.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
                x if x == Fault::LateRequest as u8 => {
                    s2.late_pending.fetch_add(1, Ordering::SeqCst);
                    deliver_late(chunk.to_vec(), &mut cr, &mut sw, hold).await;
                    s2.late_pending.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
                x if x == Fault::DropRequest as u8 => break,
                x if x == Fault::Answer as u8 => {
                    // Take the whole request, then hang up on the server
                    // unasked.
                    whole_request(chunk.to_vec(), &mut cr).await;
                    break;
                }
                x if x == Fault::AnswerWhileRunning as u8 => {
                    let request = whole_request(chunk.to_vec(), &mut cr).await;
                    let cut = request.len().saturating_sub(END.len());
                    if sw.write_all(&request[..cut]).await.is_err() {
                        break;
                    }
                    let answer = s2.answer.lock().unwrap().clone();
                    {
                        let mut cw = cw_up.lock().await;
                        let _ = cw.write_all(&answer).await;
                        let _ = cw.shutdown().await;
                    }
                    tokio::time::sleep(hold).await;
                    let _ = sw.write_all(&request[cut..]).await;
                    // The server's answer goes nowhere: wait for it.
                    std::future::pending::<()>().await;
                }
                x if x == Fault::HoldRequest as u8 => {
                    tokio::time::sleep(hold).await;
                    break;
                }
                _ => {}
            }
            if sw.write_all(chunk).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match sr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if late(&mode) {
            // The client gave up long ago: the answer goes nowhere.
            continue;
        }
        match mode.load(Ordering::SeqCst) {
            m if m == Fault::WithholdResponse as u8 => {
                // The server has answered: the insert is committed. Swallow
                // the answer, keep the client waiting, then hang up.
                tokio::time::sleep(hold).await;
                break;
            }
            m if m == Fault::AnswerAfterCommit as u8 => {
                // The server has answered: the insert is committed. The
                // client gets the proxy's answer instead.
                let answer = st.answer.lock().unwrap().clone();
                let _ = cw.lock().await.write_all(&answer).await;
                break;
            }
            // The client was answered: the server's answer goes nowhere.
            m if m == Fault::AnswerWhileRunning as u8 => continue,
            0 => {
                let sent = cw.lock().await.write_all(&buf[..n]).await;
                if sent.is_err() {
                    break;
                }
            }
            _ => break,
        }
    }
    if late(&mode) {
        // The server answered a late request (or hung up): it is delivered.
        let _ = upstream.await;
    } else if mode.load(Ordering::SeqCst) == Fault::Answer as u8 {
        // The request is taken whole: the proxy answers it.
        let _ = upstream.await;
        let answer = st.answer.lock().unwrap().clone();
        let _ = cw.lock().await.write_all(&answer).await;
    } else {
        upstream.abort();
    }
    let _ = cw.lock().await.shutdown().await;
}

/// The end of a chunked request body: an empty chunk.
const END: &[u8] = b"0\r\n\r\n";

/// A request whose first bytes are `request`, read from the client to the
/// end of its chunked body.
async fn whole_request(
    mut request: Vec<u8>,
    client: &mut tokio::net::tcp::OwnedReadHalf,
) -> Vec<u8> {
    let mut buf = vec![0u8; 64 * 1024];
    while !request.ends_with(END) {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    request
}

/// Holds a request whose first bytes are `held` for `hold`, taking the rest
/// of it from the client meanwhile (the client may hang up), then sends it
/// to the server whole.
async fn deliver_late(
    mut held: Vec<u8>,
    client: &mut tokio::net::tcp::OwnedReadHalf,
    server: &mut tokio::net::tcp::OwnedWriteHalf,
    hold: Duration,
) {
    let until = tokio::time::Instant::now() + hold;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout_at(until, client.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => held.extend_from_slice(&buf[..n]),
            Ok(_) => {
                tokio::time::sleep_until(until).await;
                break;
            }
            Err(_) => break,
        }
    }
    let _ = server.write_all(&held).await;
}

/// Whether the connection carries a request delivered late, whole or in part.
fn late(mode: &AtomicU8) -> bool {
    let m = mode.load(Ordering::SeqCst);
    m == Fault::LateRequest as u8 || m == Fault::SlowBody as u8
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
