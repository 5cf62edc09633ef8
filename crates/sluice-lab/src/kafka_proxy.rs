//! A loopback TCP proxy in front of a Kafka broker that loses produce
//! acknowledgements, for the `producer-retry` scenario, refuses offset
//! commits, or cuts one client off from its group coordinator and holds its
//! fetches, for `coordinator-partition`.
//!
//! Bytes flow client → proxy → broker and back as Kafka frames (a 4-byte
//! big-endian length, then the message). The proxy notes the correlation id
//! of every Produce request (API key 0); while [`KafkaProxy::drop_acks`] is
//! on, the broker's answers to them are swallowed. The broker has stored the
//! records, the client never hears so: its delivery times out and the
//! application puts the records in its retry table — which is how the
//! documents' pipeline got a second copy of a record at a new offset.
//!
//! While [`KafkaProxy::refuse_commits`] is on, an OffsetCommit request (API
//! key 8) never reaches the broker: the proxy closes that connection, as a
//! coordinator that went away would. The client's commit fails; its other
//! connections (fetches, metadata) carry on.
//!
//! While [`KafkaProxy::cut_off_group`] names a client id, every group
//! request from that client (OffsetCommit, OffsetFetch, FindCoordinator,
//! JoinGroup, Heartbeat, LeaveGroup, SyncGroup: API keys 8 to 14) is
//! swallowed: it never reaches the broker and is never answered, as in a
//! network partition between a member and its group coordinator only. Its
//! fetches and metadata requests go through.
//!
//! While [`KafkaProxy::hold_fetches`] names a client id, that client's Fetch
//! requests (API key 1) wait in the proxy: the broker does not see them,
//! and the client hears nothing until the hold ends, when they go on as
//! sent and are answered with what the log holds then. Its other requests on
//! that connection wait behind them, as on a stalled network path; its other
//! connections (the group coordinator's) carry on. The records a client was
//! kept from are in the broker all along: nothing races a producer.
//!
//! The broker must advertise the proxy's address, so that clients come back
//! through it after the metadata request.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct State {
    dropping: AtomicBool,
    dropped: AtomicU32,
    refusing: AtomicBool,
    refused: AtomicU32,
    cut_off: Mutex<Option<String>>,
    swallowed: AtomicU32,
    /// The client whose fetches wait, if any.
    holding: watch::Sender<Option<String>>,
    /// Fetch requests held so far, and held right now.
    held: AtomicU32,
    waiting: AtomicU32,
}

impl Default for State {
    fn default() -> Self {
        Self {
            dropping: AtomicBool::default(),
            dropped: AtomicU32::default(),
            refusing: AtomicBool::default(),
            refused: AtomicU32::default(),
            cut_off: Mutex::default(),
            swallowed: AtomicU32::default(),
            holding: watch::Sender::new(None),
            held: AtomicU32::default(),
            waiting: AtomicU32::default(),
        }
    }
}

pub struct KafkaProxy {
    /// `127.0.0.1:port`, to advertise and to bootstrap from.
    pub addr: String,
    state: Arc<State>,
}

impl KafkaProxy {
    /// Listens on `listener` and forwards to `upstream` (`host:port`).
    pub fn start(listener: TcpListener, upstream: String) -> std::io::Result<Self> {
        let addr = listener.local_addr()?.to_string();
        let state = Arc::new(State::default());
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (st, up) = (st.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&up).await {
                        pipe(client, server, st).await;
                    }
                });
            }
        });
        Ok(Self { addr, state })
    }

    /// While on, answers to Produce requests are lost.
    pub fn drop_acks(&self, on: bool) {
        self.state.dropping.store(on, Ordering::SeqCst);
    }

    /// How many Produce answers were lost.
    pub fn dropped(&self) -> u32 {
        self.state.dropped.load(Ordering::SeqCst)
    }

    /// While on, an OffsetCommit request closes its connection instead.
    pub fn refuse_commits(&self, on: bool) {
        self.state.refusing.store(on, Ordering::SeqCst);
    }

    /// How many OffsetCommit requests were refused.
    pub fn refused(&self) -> u32 {
        self.state.refused.load(Ordering::SeqCst)
    }

    /// Swallows every group request from the client with this
    /// `client.id` (none with `None`).
    pub fn cut_off_group(&self, client_id: Option<&str>) {
        *self.state.cut_off.lock().unwrap_or_else(|x| x.into_inner()) = client_id.map(String::from);
    }

    /// How many group requests were swallowed.
    pub fn swallowed(&self) -> u32 {
        self.state.swallowed.load(Ordering::SeqCst)
    }

    /// Holds every Fetch request from the client with this `client.id` in
    /// the proxy until called with another (or `None`), which sends the
    /// held ones on.
    pub fn hold_fetches(&self, client_id: Option<&str>) {
        self.state.holding.send_replace(client_id.map(String::from));
    }

    /// How many Fetch requests were held.
    pub fn held(&self) -> u32 {
        self.state.held.load(Ordering::SeqCst)
    }

    /// How many Fetch requests wait in the proxy right now. Once one does,
    /// the client's previous fetch has been answered (a client has one
    /// fetch in flight per broker) and the broker hears of none since.
    pub fn fetches_waiting(&self) -> u32 {
        self.state.waiting.load(Ordering::SeqCst)
    }
}

impl Drop for KafkaProxy {
    /// Nothing stays held once nobody can end the hold.
    fn drop(&mut self) {
        self.hold_fetches(None);
    }
}

/// Whether `frame` is a request with an API key in `apis` from `client`.
fn is_request_of(frame: &[u8], apis: std::ops::RangeInclusive<i16>, client: &str) -> bool {
    // Request header v1+: api_key i16, api_version i16, correlation_id i32,
    // client_id as an i16 length and its bytes.
    if frame.len() < 14 || !apis.contains(&i16::from_be_bytes([frame[4], frame[5]])) {
        return false;
    }
    let n = i16::from_be_bytes([frame[12], frame[13]]);
    usize::try_from(n).is_ok_and(|n| frame.get(14..14 + n) == Some(client.as_bytes()))
}

/// Whether `frame` is a group request (API keys 8 to 14) from `client`.
fn is_group_request_of(frame: &[u8], client: &str) -> bool {
    is_request_of(frame, 8..=14, client)
}

/// Whether `frame` is a Fetch request (API key 1) from `client`.
fn is_fetch_of(frame: &[u8], client: &str) -> bool {
    is_request_of(frame, FETCH..=FETCH, client)
}

/// A broker of its own (an Apache Kafka node) that advertises a [`KafkaProxy`] in front of
/// it, and the stack that reaches it through the proxy.
pub struct ProxiedBroker {
    pub broker: super::fixture::PrivateBroker,
    pub proxy: KafkaProxy,
    pub stack: super::fixture::Stack,
}

impl ProxiedBroker {
    /// Starts both; the stack's ClickHouse is `clickhouse_url`.
    pub async fn start(clickhouse_url: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let front = listener.local_addr()?.to_string();
        let broker = super::fixture::PrivateBroker::start_advertising(Some(front)).await?;
        let proxy = KafkaProxy::start(listener, broker.brokers())?;
        let stack = super::fixture::Stack {
            brokers: proxy.addr.clone(),
            clickhouse_url: clickhouse_url.to_string(),
        };
        Ok(Self {
            broker,
            proxy,
            stack,
        })
    }
}

const PRODUCE: i16 = 0;
const FETCH: i16 = 1;
const OFFSET_COMMIT: i16 = 8;

async fn pipe(client: TcpStream, server: TcpStream, st: Arc<State>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let produce: Arc<Mutex<HashSet<i32>>> = Arc::default();
    let (p, s) = (produce.clone(), st.clone());
    let cut = tokio_util::sync::CancellationToken::new();
    let c = cut.clone();
    let upstream = tokio::spawn(async move {
        while let Some(frame) = read_frame(&mut cr).await {
            // Request header: api_key i16, api_version i16, correlation_id i32.
            let api = (frame.len() >= 12).then(|| i16::from_be_bytes([frame[4], frame[5]]));
            if api == Some(OFFSET_COMMIT) && s.refusing.load(Ordering::SeqCst) {
                s.refused.fetch_add(1, Ordering::SeqCst);
                c.cancel();
                return;
            }
            let cut_off = s.cut_off.lock().unwrap_or_else(|x| x.into_inner()).clone();
            if cut_off.is_some_and(|c| is_group_request_of(&frame, &c)) {
                s.swallowed.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            let held = |h: &Option<String>| h.as_ref().is_some_and(|c| is_fetch_of(&frame, c));
            if held(&s.holding.borrow()) {
                s.held.fetch_add(1, Ordering::SeqCst);
                let _waiting = Waiting::new(&s.waiting);
                // The sender lives in `s`: the wait ends only with the hold
                // (or with the connection, which aborts this task).
                let _ = s.holding.subscribe().wait_for(|h| !held(h)).await;
            }
            if api == Some(PRODUCE) {
                let id = i32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
                p.lock().unwrap_or_else(|x| x.into_inner()).insert(id);
            }
            if write_frame(&mut sw, &frame).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    });
    loop {
        let frame = tokio::select! {
            f = read_frame(&mut sr) => f,
            _ = cut.cancelled() => None,
        };
        let Some(frame) = frame else {
            break;
        };
        // Response header: correlation_id i32.
        let id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let was_produce = produce
            .lock()
            .unwrap_or_else(|x| x.into_inner())
            .remove(&id);
        if was_produce && st.dropping.load(Ordering::SeqCst) {
            st.dropped.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        if write_frame(&mut cw, &frame).await.is_err() {
            break;
        }
    }
    upstream.abort();
    // With both halves of the client's socket dropped, it is closed.
    let _ = cw.shutdown().await;
}

/// Counts a held request while it waits, however the wait ends.
struct Waiting<'a>(&'a AtomicU32);

impl<'a> Waiting<'a> {
    fn new(n: &'a AtomicU32) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One frame, length prefix included; `None` at the end of the stream.
async fn read_frame(r: &mut OwnedReadHalf) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await.ok()?;
    let n = u32::from_be_bytes(len) as usize;
    if !(4..=256 << 20).contains(&n) {
        return None;
    }
    let mut frame = vec![0u8; 4 + n];
    frame[..4].copy_from_slice(&len);
    r.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

async fn write_frame(w: &mut OwnedWriteHalf, frame: &[u8]) -> std::io::Result<()> {
    w.write_all(frame).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A request frame (header v1): `api`, version 0, `correlation`, `client`.
    fn request(api: i16, correlation: i32, client: &str) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend(api.to_be_bytes());
        body.extend(0i16.to_be_bytes());
        body.extend(correlation.to_be_bytes());
        body.extend((client.len() as i16).to_be_bytes());
        body.extend(client.as_bytes());
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend(body);
        frame
    }

    /// The correlation id of the next answer on `r`, if one comes in time.
    async fn answer(r: &mut OwnedReadHalf, within: Duration) -> Option<i32> {
        let f = tokio::time::timeout(within, read_frame(r)).await.ok()??;
        Some(i32::from_be_bytes([f[4], f[5], f[6], f[7]]))
    }

    #[tokio::test]
    async fn a_held_fetch_reaches_the_broker_only_once_released() {
        // A "broker" that answers every request with its correlation id.
        let broker = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = broker.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((s, _)) = broker.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.into_split();
                    while let Some(f) = read_frame(&mut r).await {
                        let mut a = 4u32.to_be_bytes().to_vec();
                        a.extend(&f[8..12]);
                        if w.write_all(&a).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = KafkaProxy::start(front, upstream).unwrap();
        proxy.hold_fetches(Some("a"));
        let (mut ar, mut aw) = TcpStream::connect(&proxy.addr).await.unwrap().into_split();
        let (mut br, mut bw) = TcpStream::connect(&proxy.addr).await.unwrap().into_split();
        aw.write_all(&request(FETCH, 1, "a")).await.unwrap();
        bw.write_all(&request(FETCH, 2, "b")).await.unwrap();
        // Another client's fetch goes on; the held one's does not.
        assert_eq!(answer(&mut br, Duration::from_secs(5)).await, Some(2));
        while proxy.fetches_waiting() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(answer(&mut ar, Duration::from_millis(300)).await, None);
        // Nor do its other requests on that connection, behind it.
        aw.write_all(&request(3, 3, "a")).await.unwrap();
        assert_eq!(answer(&mut ar, Duration::from_millis(300)).await, None);
        proxy.hold_fetches(None);
        assert_eq!(answer(&mut ar, Duration::from_secs(5)).await, Some(1));
        assert_eq!(answer(&mut ar, Duration::from_secs(5)).await, Some(3));
        assert_eq!((proxy.held(), proxy.fetches_waiting()), (1, 0));
    }
}
