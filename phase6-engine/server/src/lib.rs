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
mod api_types;
mod auth;
mod body;
mod chunks;
mod engine_thread;
mod errors;
#[cfg(feature = "exercises")]
pub mod exercises;
mod metrics;
mod openai;
mod request;
mod routes;
mod sse;
mod stats;
mod stop;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tokio::net::{TcpListener, ToSocketAddrs};

pub use engine_thread::{EngineHandle, EngineInfo};
pub use errors::ApiError;
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
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            model_name: "tiny-shakespeare".into(),
            api_key: None,
            max_body_bytes: 1 << 20,
        }
    }
}

/// A bound listener and its routes; `run` serves until the process ends, `run_until` until a
/// shutdown signal.
pub struct Server {
    listener: TcpListener,
    app: Router,
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
            engine,
            model_name: Arc::from(options.model_name),
            api_key: options.api_key.map(Arc::from),
            max_body_bytes: options.max_body_bytes,
            started: openai::unix_now(),
        };
        Ok(Self {
            listener,
            app: routes::router(state),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub async fn run(self) -> io::Result<()> {
        axum::serve(self.listener, self.app).await
    }

    /// Serves until `shutdown` completes, then stops accepting connections and returns once
    /// every request in flight has been answered (streams run to their end).
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        axum::serve(self.listener, self.app)
            .with_graceful_shutdown(shutdown)
            .await
    }
}
