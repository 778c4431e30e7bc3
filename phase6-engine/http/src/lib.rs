//! Chapter 6.3's connection layer: how the HTTP server meets the network when its clients
//! misbehave. `axum::serve` accepts every connection, waits forever for a request that never
//! completes and for a client that never reads, and drains without a deadline; a server any
//! program can reach needs each of those bounded.
//!
//! [`serve`] runs a router under [`Limits`]: at most `max_connections` connections (more wait
//! in the kernel's backlog, and an accept error such as "too many open files" only pauses
//! accepting), a request's headers within `header_timeout`, a client that accepts no byte of
//! an answer for `idle_timeout` dropped, and a shutdown that drains for `shutdown_grace`
//! before the caller ends what is left. [`stop_signal`] is the shutdown that `nanoserve serve`
//! waits for: SIGINT or SIGTERM, whichever comes first. [`AccessLog`] writes one line per
//! request, as a connection layer's log does.

mod accept;
mod access_log;
mod signals;
mod stall;

use std::time::Duration;

pub use accept::{Drained, serve};
pub use access_log::{AccessLog, Counts, log};
pub use signals::stop_signal;
pub use stall::StallGuard;

/// The limits of the connection layer; every one is a setting of `nanoserve serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more wait to be accepted until one closes.
    pub max_connections: usize,
    /// How long a client has to send a request's headers once it may send one: after it
    /// connects, and after each answer on a kept-alive connection (so it also bounds an idle
    /// connection).
    pub header_timeout: Duration,
    /// How long a client may accept no byte of an answer before its connection is dropped.
    pub idle_timeout: Duration,
    /// After the shutdown signal, how long requests in flight may run to their end.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}
