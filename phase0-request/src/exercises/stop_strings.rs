//! Exercise 0.2: stop strings, found in streamed text.
//!
//! Build: a [`StopStrings`] filter that sits between the detokenizer and the user. It takes
//! the output text piece by piece as tokens are decoded and passes it on, except that it
//! holds back any tail that could be the start of a stop string, and when a stop string
//! appears it cuts the text just before it and reports that the request is done.
//!
//! Why: users stop on text (`"\n\n"`, `"User:"`), and one word may span several tokens, so
//! only the layer that sees decoded text can tell; the OpenAI API's `stop` parameter (vLLM's
//! `stop` strings) works this way, leaving the stop string out of the answer.
//!
//! Checked by `cargo test -p phase0 --features exercises --test exercises stop_strings`.

use crate::Error;

/// What a call to [`StopStrings::push`] lets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Text that can be shown now: it can no longer become part of a stop string.
    pub text: String,
    /// A stop string was found: the output ends here (later pieces are dropped).
    pub stopped: bool,
}

/// A stream filter for a request's stop strings.
#[derive(Debug, Clone)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet released: a proper prefix of some stop string.
    held: String,
    stopped: bool,
}

impl StopStrings {
    /// A filter for these stop strings. An empty stop string would match everywhere, so it
    /// is an `InvalidSamplingParams` error naming the field `"stop"`.
    pub fn new(stops: Vec<String>) -> Result<Self, Error> {
        if let Some(i) = stops.iter().position(String::is_empty) {
            return Err(Error::InvalidSamplingParams {
                field: "stop",
                value: format!("stop[{i}] = \"\""),
                reason: "a stop string must not be empty",
            });
        }
        Ok(Self {
            stops,
            held: String::new(),
            stopped: false,
        })
    }

    /// Text held back so far.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Takes the next piece of decoded text. Releases everything that can no longer be part
    /// of a stop string; once a stop string is complete, releases the text before it and
    /// stops (the one that completed first; of several ending at the same place, the
    /// longest). After a stop every piece is dropped.
    pub fn push(&mut self, piece: &str) -> Released {
        if !cfg!(feature = "solutions") {
            todo!("exercise 0.2: release text, hold back a possible stop-string start, stop");
        }
        // BEGIN SOLUTION
        if self.stopped {
            return Released {
                text: String::new(),
                stopped: true,
            };
        }
        let mut text = std::mem::take(&mut self.held);
        text.push_str(piece);
        // The stop string completed first wins (the longest one, if several end together).
        let first_end = self
            .stops
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|at| (at + s.len(), at)))
            .min();
        if let Some((_, at)) = first_end {
            text.truncate(at);
            self.stopped = true;
            return Released {
                text,
                stopped: true,
            };
        }
        // Hold back the longest tail that some stop string starts with.
        let keep = (1..=text.len())
            .rev()
            .filter(|&n| text.is_char_boundary(text.len() - n))
            .find(|&n| {
                let tail = &text[text.len() - n..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(0);
        self.held = text.split_off(text.len() - keep);
        Released {
            text,
            stopped: false,
        }
        // END SOLUTION
    }

    /// The request ended for another reason (EOS, length): the held text is released.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
