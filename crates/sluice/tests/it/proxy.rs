//! A loopback TCP proxy in front of ClickHouse that injects one fault into
//! the next INSERT it sees.
//!
//! - [`Fault::WithholdResponse`]: forward the whole request, let the server
//!   commit, swallow its response and keep the client waiting past its
//!   timeout, then close. The client cannot know the insert landed.
//! - [`Fault::DropRequest`]: close the connection instead of forwarding the
//!   request. Nothing reaches the server.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    WithholdResponse = 1,
    DropRequest = 2,
}

pub struct Proxy {
    pub url: String,
    armed: Arc<AtomicU8>,
    fired: Arc<AtomicU32>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`); faults hold for `hold`.
    pub async fn start(upstream: String, hold: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let armed = Arc::new(AtomicU8::new(0));
        let fired = Arc::new(AtomicU32::new(0));
        let (a, f) = (armed.clone(), fired.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (a, f, up) = (a.clone(), f.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&up).await {
                        pipe(client, server, a, f, hold).await;
                    }
                });
            }
        });
        Self { url, armed, fired }
    }

    /// The next INSERT gets `fault`.
    pub fn arm(&self, fault: Fault) {
        self.armed.store(fault as u8, Ordering::SeqCst);
    }

    pub fn fired(&self) -> u32 {
        self.fired.load(Ordering::SeqCst)
    }
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<AtomicU8>,
    fired: Arc<AtomicU32>,
    hold: Duration,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // Set once this connection carries a faulted insert.
    let mode = Arc::new(AtomicU8::new(0));
    let m = mode.clone();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if m.load(Ordering::SeqCst) == 0 && contains(chunk, b"query=INSERT") {
                let f = armed.swap(0, Ordering::SeqCst);
                if f != 0 {
                    m.store(f, Ordering::SeqCst);
                    fired.fetch_add(1, Ordering::SeqCst);
                }
            }
            if m.load(Ordering::SeqCst) == Fault::DropRequest as u8 {
                break;
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
        match mode.load(Ordering::SeqCst) {
            x if x == Fault::WithholdResponse as u8 => {
                // The server has answered: the insert is committed. Swallow
                // the answer and keep the client waiting, then hang up.
                tokio::time::sleep(hold).await;
                break;
            }
            x if x == Fault::DropRequest as u8 => break,
            _ => {
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    upstream.abort();
    let _ = cw.shutdown().await;
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
