//! Chapter 6.3: an OpenAI-compatible HTTP server over the engine (`nanoserve serve`).
//!
//! Endpoints: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`, the
//! chunk API under `/v1/chunks`, `GET /health` and `GET /metrics` (Prometheus text).
//!
//! ```text
//!  HTTP clients ──> axum handlers (tokio runtime) ──Command──> engine thread (owns the model)
//!                        ^                                        | step, step, step ...
//!                        └──── admitted / GenEvent (text, finish) ┘
//! ```
//!
//! The async side parses and checks requests and writes answers; the engine thread owns the
//! model and runs the continuous-batching loop, so every request in flight shares its batch.
//! The only links between the two are channels: commands in, events out. A client that goes
//! away drops its end of the event channel, which is how the engine learns to abort it.

mod active;
mod auth;
mod body;
mod chunks;
mod cors;
mod engine_thread;
#[cfg(feature = "exercises")]
pub mod exercises;
mod metrics;
mod openai;
mod request_id;
mod routes;
mod sse;
mod stats;
mod stop;
mod tokenize;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::{TcpListener, ToSocketAddrs};

pub use engine_thread::EngineHandle;
pub use phase6_http::{AccessLog, Drained, Limits};
pub use phase6_openai::{ApiError, EngineInfo, RequestLimits};
pub use stats::{EngineStats, FinishCounts};

use routes::AppState;

/// How the server presents itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    /// The name clients give as `model` and `/v1/models` lists.
    pub model_name: String,
    /// When set, every endpoint but `/health` wants `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Larger bodies are refused with 413.
    pub max_body_bytes: usize,
    /// How long a client has to send a request's body once its headers came (408 after).
    pub body_timeout: Duration,
    /// What one request may ask for: stop strings, context ids.
    pub requests: RequestLimits,
    /// The connection layer's limits: connections, header and idle timeouts, shutdown grace.
    pub limits: Limits,
    /// Web origins whose pages may call the server (`*`: any); none by default.
    pub allowed_origins: Vec<String>,
    /// One line per request (`phase6_http::AccessLog`); stderr by default.
    pub access_log: AccessLog,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            model_name: "tiny-shakespeare".into(),
            api_key: None,
            max_body_bytes: 1 << 20,
            body_timeout: Duration::from_secs(30),
            requests: RequestLimits::default(),
            limits: Limits::default(),
            allowed_origins: Vec::new(),
            access_log: AccessLog::default(),
        }
    }
}

/// A bound listener and its routes; `run` serves until the process ends, `run_until` until a
/// shutdown signal.
pub struct Server {
    listener: TcpListener,
    app: Router,
    engine: EngineHandle,
    limits: Limits,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port; see [`Server::local_addr`]).
    pub async fn bind(
        addr: impl ToSocketAddrs,
        engine: EngineHandle,
        options: ServeOptions,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let state = AppState {
            engine: engine.clone(),
            model_name: Arc::from(options.model_name),
            api_key: options.api_key.map(Arc::from),
            max_body_bytes: options.max_body_bytes,
            body_timeout: options.body_timeout,
            request_limits: Arc::new(options.requests),
            allowed_origins: options.allowed_origins.into(),
            access_log: options.access_log,
            started: openai::unix_now(),
        };
        Ok(Self {
            listener,
            app: routes::router(state),
            engine,
            limits: options.limits,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub async fn run(self) -> io::Result<Drained> {
        self.run_until(std::future::pending()).await
    }

    /// Serves until `shutdown` completes, then stops accepting connections and lets every
    /// request in flight run to its end for the shutdown grace period; the requests still
    /// running then end with an error (a last error event for a stream), and it returns.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> io::Result<Drained> {
        let engine = self.engine;
        phase6_http::serve(self.listener, self.app, &self.limits, shutdown, move || {
            engine.abort_all(ApiError::unavailable(
                "the server is shutting down: the request did not finish within the grace period",
            ))
        })
        .await
    }
}
