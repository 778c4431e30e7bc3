//! Chapter 6.3 (the connection layer): one access-log line per request, on stderr by default: method, path, status,
//! the request's id, its prompt and completion tokens (for generations) and how long it took.
//!
//! A stream's status is known when its headers go out, but its completion tokens and its
//! duration only when its last event has been sent. So the line is written when the request's
//! [`Record`] is dropped by its last holder: the middleware, once the handler answered, and a
//! stream's body, once the stream ended or its client left.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

/// Where the access log goes; clones write to the same place.
#[derive(Clone)]
pub struct AccessLog(Option<Arc<Mutex<Box<dyn Write + Send>>>>);

impl AccessLog {
    pub fn stderr() -> Self {
        Self::to_writer(std::io::stderr())
    }

    /// Lines go to `writer`, one `write` each (a test reads them back).
    pub fn to_writer(writer: impl Write + Send + 'static) -> Self {
        Self(Some(Arc::new(Mutex::new(Box::new(writer)))))
    }

    /// No access log.
    pub fn off() -> Self {
        Self(None)
    }

    fn write(&self, line: &str) {
        if let Some(w) = &self.0 {
            let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
            let _ = w.write_all(line.as_bytes());
            let _ = w.flush();
        }
    }
}

impl Default for AccessLog {
    fn default() -> Self {
        Self::stderr()
    }
}

impl fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "AccessLog(on)"
        } else {
            "AccessLog(off)"
        })
    }
}

impl PartialEq for AccessLog {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }
}

/// Token counts not set yet (a request that never reached the engine).
const UNSET: usize = usize::MAX;

/// One request's line, written when the last holder drops it.
pub struct Record {
    log: AccessLog,
    method: String,
    path: String,
    start: Instant,
    status: AtomicU16,
    request_id: OnceLock<String>,
    prompt_tokens: AtomicUsize,
    completion_tokens: AtomicUsize,
}

/// A request's record, as handlers find it among the request's extensions: they set its token counts.
#[derive(Clone)]
pub struct Counts(pub Arc<Record>);

impl Counts {
    /// Prompt tokens of every prompt of the request (each counted once, whatever `n` is).
    pub fn prompt(&self, n: usize) {
        self.0.prompt_tokens.store(n, Ordering::Relaxed);
    }

    /// Tokens of a choice that ended, added to those of the others.
    pub fn add_completion(&self, n: usize) {
        let _ = self
            .0
            .completion_tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(if c == UNSET { n } else { c + n })
            });
    }
}

fn count(n: usize) -> String {
    if n == UNSET {
        "-".into()
    } else {
        n.to_string()
    }
}

impl Record {
    /// The line, with the elapsed time given (the test masks it).
    pub fn line(&self, elapsed_secs: f64) -> String {
        format!(
            "access: {} {} {} request_id={} prompt_tokens={} completion_tokens={} elapsed={elapsed_secs:.3}s\n",
            self.method,
            self.path,
            self.status.load(Ordering::Relaxed),
            self.request_id.get().map_or("-", String::as_str),
            count(self.prompt_tokens.load(Ordering::Relaxed)),
            count(self.completion_tokens.load(Ordering::Relaxed)),
        )
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.log
            .write(&self.line(self.start.elapsed().as_secs_f64()));
    }
}

/// The header that names a request (the server's request-id layer sets it on every answer).
const REQUEST_ID: &str = "x-request-id";

/// The middleware; install it outside the request-id layer, so the answer already carries
/// the id the line names.
pub async fn log(State(log): State<AccessLog>, mut req: Request, next: Next) -> Response {
    let record = Arc::new(Record {
        log,
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        start: Instant::now(),
        status: AtomicU16::new(0),
        request_id: OnceLock::new(),
        prompt_tokens: AtomicUsize::new(UNSET),
        completion_tokens: AtomicUsize::new(UNSET),
    });
    req.extensions_mut().insert(Counts(record.clone()));
    let response = next.run(req).await;
    record
        .status
        .store(response.status().as_u16(), Ordering::Relaxed);
    if let Some(id) = response.headers().get(REQUEST_ID) {
        let _ = record
            .request_id
            .set(String::from_utf8_lossy(id.as_bytes()).into_owned());
    }
    response
}
