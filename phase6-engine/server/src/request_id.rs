//! Chapter 6.3: `X-Request-Id` on every answer, the client's own or one made here, so a client's
//! logs and the server's can name the same request (as vLLM's server does).

use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

use crate::routes::AppState;

const HEADER: &str = "x-request-id";

/// Requests answered so far: with the start time, a made-up id unique to this server's run.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The id a client sent, if it is a short run of visible ASCII; otherwise a new one.
fn id_for(req: &Request, started: u64) -> HeaderValue {
    req.headers()
        .get(HEADER)
        .filter(|v| {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(|| {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            HeaderValue::from_str(&format!("req-{started:x}-{n:x}")).expect("ASCII")
        })
}

pub async fn tag(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let id = id_for(&req, app.started);
    let mut response = next.run(req).await;
    response.headers_mut().insert(HEADER, id);
    response
}
