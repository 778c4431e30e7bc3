//! Server-sent events for `"stream": true`: every chunk is one `data: <json>` event and the
//! stream ends with `data: [DONE]`, the framing OpenAI clients read.
//!
//! The body is produced from the choices' event channels as events arrive, merged in the
//! order they come; each chunk names its choice by index. When a client disconnects, hyper
//! drops the body and with it the channels' receivers; the engine thread sees the closed
//! channels and aborts the requests, so their pages come back.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream, SelectAll};
use phase0::TokenId;
use serde_json::Value;

use crate::engine_thread::GenEvent;
use crate::openai::{Started, usage};
use phase6_http::Counts;
use phase6_openai::{Admitted, ApiError, ChoiceLogprobs, ResponseShape};
use tokio::sync::mpsc::UnboundedReceiver;

/// One event of the stream.
pub fn frame(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// How a streamed answer is written.
pub struct Choices {
    pub shape: ResponseShape,
    /// Choices per prompt.
    pub n: usize,
    pub logprobs: bool,
    pub include_usage: bool,
    /// The request's access-log record: the line is written once the stream is dropped.
    pub counts: Counts,
}

/// A choice's events tagged with its index; `None` once its channel closed.
type Tagged = (usize, Option<GenEvent>);

struct ChunkStream<F> {
    events: SelectAll<BoxStream<'static, Tagged>>,
    how: Choices,
    admitted: Vec<Admitted>,
    logprobs: Vec<ChoiceLogprobs>,
    name: F,
    /// Choices not finished yet, and the completion tokens of those that did.
    running: usize,
    completion_tokens: usize,
    /// Frames made but not yet sent.
    ready: VecDeque<Bytes>,
    done: bool,
}

/// A channel's events up to its last (`Finished` or `Failed`), or `None` if it closes first.
fn tagged(index: usize, rx: UnboundedReceiver<GenEvent>) -> BoxStream<'static, Tagged> {
    stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(e @ (GenEvent::Finished { .. } | GenEvent::Failed(_))) => {
                Some(((index, Some(e)), None))
            }
            Some(e) => Some(((index, Some(e)), Some(rx))),
            None => Some(((index, None), None)),
        }
    })
    .boxed()
}

impl<F: Fn(TokenId) -> String> ChunkStream<F> {
    fn push(&mut self, chunk: Value) {
        self.ready.push_back(frame(&chunk.to_string()));
    }

    fn end(&mut self) {
        self.ready.push_back(frame("[DONE]"));
        self.done = true;
    }

    /// Turns one event of choice `i` into frames.
    fn take(&mut self, (i, event): Tagged) {
        let shape = &self.how.shape;
        match event {
            Some(GenEvent::Delta {
                text,
                token,
                logprobs,
            }) => {
                let tokens: Vec<TokenId> = token.into_iter().collect();
                let lp = match logprobs {
                    Some(l) if self.how.logprobs => {
                        self.logprobs[i].push(&l, &self.name);
                        Some(self.logprobs[i].unsent(shape.endpoint))
                    }
                    _ => None,
                };
                if !text.is_empty()
                    || lp.is_some()
                    || (shape.return_token_ids && !tokens.is_empty())
                {
                    let chunk = shape.delta_chunk(i, &text, &tokens, lp);
                    self.push(chunk);
                }
            }
            Some(GenEvent::Finished {
                reason,
                completion_tokens,
            }) => {
                self.push(shape.finish_chunk(i, reason));
                self.completion_tokens += completion_tokens;
                self.how.counts.add_completion(completion_tokens);
                self.running -= 1;
                if self.running == 0 {
                    if self.how.include_usage {
                        let usage = usage(&self.admitted, self.how.n, self.completion_tokens);
                        self.push(self.how.shape.usage_chunk(usage));
                    }
                    self.end();
                }
            }
            Some(GenEvent::Failed(e)) => {
                self.push(e.body());
                self.end();
            }
            None => {
                self.push(ApiError::unavailable("the engine stopped").body());
                self.end();
            }
        }
    }
}

impl Choices {
    /// The streaming answer to admitted choices (index `i` is `choices[i]`).
    pub fn response(
        self,
        choices: Vec<Started>,
        name: impl Fn(TokenId) -> String + Send + 'static,
    ) -> Response {
        let mut events = SelectAll::new();
        let mut opening = Vec::new();
        let mut logprobs = Vec::new();
        let mut admitted = Vec::new();
        for (i, c) in choices.into_iter().enumerate() {
            events.push(tagged(i, c.generation.events));
            admitted.push(c.generation.admitted);
            opening.extend(self.shape.opening_chunk(i));
            if !c.echo.is_empty() {
                opening.push(self.shape.delta_chunk(i, &c.echo, &[], None));
            }
            logprobs.push(ChoiceLogprobs::after(c.echo.len()));
        }
        let mut chunks = ChunkStream {
            events,
            running: admitted.len(),
            admitted,
            logprobs,
            name,
            completion_tokens: 0,
            how: self,
            ready: VecDeque::new(),
            done: false,
        };
        for chunk in opening {
            chunks.push(chunk);
        }
        let frames = stream::unfold(chunks, |mut s| async move {
            loop {
                if let Some(f) = s.ready.pop_front() {
                    return Some((Ok::<_, Infallible>(f), s));
                }
                if s.done {
                    return None;
                }
                match s.events.next().await {
                    Some(tagged) => s.take(tagged),
                    None => return None,
                }
            }
        });
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(frames),
        )
            .into_response()
    }
}
