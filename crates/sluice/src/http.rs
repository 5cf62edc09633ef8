//! `/metrics`, `/health` and `/ready` over HTTP/1.1.
//!
//! In: a listen address, the installed [`Metrics`] and a readiness flag the
//! sink raises once it has reached both ends and joined its group (and
//! lowers when it stops). Out: Prometheus text on `GET /metrics`; `200 ok`
//! on `/health` while the process serves; `200 ready` or `503 not ready` on
//! `/ready`. Served until `shutdown` resolves.

use crate::telemetry::Metrics;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Binds `listen` and serves the endpoints in the background.
pub(crate) async fn serve(
    listen: SocketAddr,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {listen} for /metrics: {e}"),
        )
    })?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        tokio::pin!(shutdown);
        loop {
            let conn = tokio::select! {
                c = listener.accept() => c,
                _ = &mut shutdown => return,
            };
            let Ok((stream, _)) = conn else { continue };
            let (metrics, ready) = (metrics.clone(), ready.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let resp = answer(req.uri().path(), &metrics, &ready);
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(bound)
}

fn answer(path: &str, metrics: &Metrics, ready: &AtomicBool) -> Response<Full<Bytes>> {
    let (status, body, kind) = match path {
        "/metrics" => (
            StatusCode::OK,
            metrics.render(),
            "text/plain; version=0.0.4",
        ),
        "/health" => (StatusCode::OK, "ok\n".into(), "text/plain"),
        "/ready" if ready.load(Ordering::SeqCst) => {
            (StatusCode::OK, "ready\n".into(), "text/plain")
        }
        "/ready" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready\n".into(),
            "text/plain",
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /health or /ready\n".into(),
            "text/plain",
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(kind) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}
