//! Server-sent events for `"stream": true`: every chunk is one `data: <json>` event and the
//! stream ends with `data: [DONE]`, the framing OpenAI clients read.
//!
//! The body is produced from the request's event channel as events arrive. When a client
//! disconnects, hyper drops the body and with it the channel's receiver; the engine thread
//! sees the closed channel and aborts the request, so its pages come back.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::access_log::Counts;
use crate::engine_thread::{GenEvent, Generation};
use phase6_openai::{Admitted, ApiError, ResponseShape, Usage};

/// One event of the stream.
pub fn frame(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

struct ChunkStream {
    events: UnboundedReceiver<GenEvent>,
    shape: ResponseShape,
    admitted: Admitted,
    include_usage: bool,
    /// The request's access-log record: the line is written once the stream is dropped.
    counts: Counts,
    /// Frames made but not yet sent.
    ready: VecDeque<Bytes>,
    done: bool,
}

impl ChunkStream {
    fn push(&mut self, chunk: Value) {
        self.ready.push_back(frame(&chunk.to_string()));
    }

    fn end(&mut self) {
        self.ready.push_back(frame("[DONE]"));
        self.done = true;
    }

    /// Turns one event (or the end of the channel) into frames.
    fn take(&mut self, event: Option<GenEvent>) {
        match event {
            Some(GenEvent::Delta { text, token }) => {
                if !text.is_empty() || (self.shape.return_token_ids && token.is_some()) {
                    self.push(self.shape.delta_chunk(&text, token));
                }
            }
            Some(GenEvent::Finished {
                reason,
                completion_tokens,
            }) => {
                self.counts.add_completion(completion_tokens);
                self.push(self.shape.finish_chunk(reason));
                if self.include_usage {
                    self.push(
                        self.shape
                            .usage_chunk(Usage::new(&self.admitted, completion_tokens)),
                    );
                }
                self.end();
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

/// The streaming answer to an admitted request.
pub fn response(
    generation: Generation,
    shape: ResponseShape,
    include_usage: bool,
    counts: Counts,
) -> Response {
    let mut chunks = ChunkStream {
        counts,
        events: generation.events,
        admitted: generation.admitted,
        include_usage,
        ready: VecDeque::new(),
        done: false,
        shape,
    };
    if let Some(open) = chunks.shape.opening_chunk() {
        chunks.push(open);
    }
    let frames = stream::unfold(chunks, |mut s| async move {
        loop {
            if let Some(f) = s.ready.pop_front() {
                return Some((Ok::<_, Infallible>(f), s));
            }
            if s.done {
                return None;
            }
            let event = s.events.recv().await;
            s.take(event);
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
