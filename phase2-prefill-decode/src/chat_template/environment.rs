//! The Jinja environment chat templates are written for: `transformers`' settings and the
//! names it adds, on minijinja.
//!
//! `transformers` renders with `trim_blocks` and `lstrip_blocks` on (a block tag takes its line
//! with it), the loop-controls extension (`{% break %}`), Python's string and dict methods
//! (`.strip()`, `.startswith()`, `.split()`, `.items()`: minijinja-contrib's `pycompat`), and
//! three additions: `raise_exception(msg)`, `strftime_now(fmt)` and its own `tojson`.

use std::fmt::Write;

use minijinja::{Environment, Error, ErrorKind};

use super::tojson::tojson;

/// The message of a template's `raise_exception(msg)`, kept apart from the engine's own
/// rendering errors so it can be reported as the template's words.
#[derive(Debug)]
pub(super) struct Raised(pub String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// The local time in a `strftime` format: Llama 3.2's template writes today's date with it.
fn strftime_now(format: &str) -> Result<String, Error> {
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format {format:?}"),
        )
    })?;
    Ok(out)
}

pub(super) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env
}
