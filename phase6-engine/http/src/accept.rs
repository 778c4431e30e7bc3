//! Chapter 6.3: the accept loop. A connection is accepted only while one of
//! `max_connections` permits is free, so an attacker who opens thousands of idle connections
//! fills the kernel's backlog, not the process's file table; an accept error (the file table
//! full anyway, a connection reset before it was accepted) pauses accepting briefly instead
//! of ending the server. Each connection is served by hyper with the header timeout, through
//! a [`StallGuard`] for clients that stop reading.
//!
//! Shutdown: the listener closes, every connection is told to finish its request in flight
//! and close, and the caller's `on_deadline` runs if some are still open after the grace
//! period (the server then ends their requests with an error, which they get to send).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::{sleep, timeout};

use crate::{Limits, StallGuard};

/// How long accepting pauses after an accept error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// After `on_deadline`, how long the connections get to send what it gave them.
const FLUSH_AFTER_DEADLINE: Duration = Duration::from_secs(2);

/// How a shutdown went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every connection closed within the grace period.
    InTime,
    /// Some were still open at the deadline; `on_deadline` ran.
    AtDeadline,
}

/// Serves `app` on `listener` under `limits` until `shutdown` completes, then drains (see
/// the module documentation) and returns how.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
    on_deadline: impl FnOnce(),
) -> io::Result<Drained> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopped) = watch::channel(false);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("nanoserve: cannot accept a connection ({e}); pausing");
                    sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(StallGuard::new(stream, limits.idle_timeout));
        let conn = http.serve_connection(io, TowerToHyperService::new(app.clone()));
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stopped.wait_for(|s| *s) => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = stop.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if timeout(limits.shutdown_grace, permits.acquire_many(all))
        .await
        .is_ok()
    {
        return Ok(Drained::InTime);
    }
    on_deadline();
    let _ = timeout(FLUSH_AFTER_DEADLINE, permits.acquire_many(all)).await;
    Ok(Drained::AtDeadline)
}
