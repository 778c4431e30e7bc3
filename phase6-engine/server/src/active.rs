//! The engine thread's record of one request in flight: the engine's channel of its tokens,
//! the channel to the HTTP task that waits for its text, and what lies between the two: the
//! incremental decoder (tokens to text) and the stop-string matcher. Doing both here, on the
//! engine thread, means a stop string ends the request at the very token that completed it.

use std::sync::mpsc::{Receiver, TryRecvError};

use phase0::{FinishReason, SeqId};
use phase2::{StreamDecoder, Tokenizer};
use phase5::StreamEvent;
use phase6::Logprobs;
use tokio::sync::mpsc::UnboundedSender;

use crate::engine_thread::GenEvent;
use crate::stop::{Scan, StopStrings};
use phase6_openai::{ApiError, Finish};

/// How a request left the engine thread's care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The engine finished it (its pages are already back).
    Finished(Finish),
    /// A stop string matched; the engine must still abort it.
    StopString,
    /// Nobody listens any more; the engine must abort it.
    ClientGone,
    /// It failed and the client was told; the engine must abort it.
    Failed,
}

impl Ended {
    /// Whether the engine still holds the request.
    pub fn needs_abort(self) -> bool {
        !matches!(self, Ended::Finished(_))
    }
}

pub struct Active {
    id: SeqId,
    tokens: Receiver<StreamEvent>,
    events: UnboundedSender<GenEvent>,
    decoder: StreamDecoder,
    stops: StopStrings,
    completion_tokens: usize,
    /// Where this request's log-probabilities come from, when it asked for them.
    logprobs: Option<Logprobs>,
}

impl Active {
    pub fn new(
        id: SeqId,
        tokens: Receiver<StreamEvent>,
        events: UnboundedSender<GenEvent>,
        stops: StopStrings,
        logprobs: Option<Logprobs>,
    ) -> Self {
        Self {
            id,
            logprobs,
            tokens,
            events,
            decoder: StreamDecoder::new(true),
            stops,
            completion_tokens: 0,
        }
    }

    /// Tokens received so far (the stop-string cut does not change it).
    pub fn completion_tokens(&self) -> usize {
        self.completion_tokens
    }

    /// The HTTP side dropped its receiver: the client disconnected.
    pub fn is_gone(&self) -> bool {
        self.events.is_closed()
    }

    /// Passes on what the engine produced for this request since the last call; `Some` once
    /// the request is over.
    pub fn forward(&mut self, tokenizer: Option<&Tokenizer>) -> Option<Ended> {
        loop {
            match self.tokens.try_recv() {
                Ok(StreamEvent::Token(id)) => {
                    if let Some(end) = self.token(tokenizer, id) {
                        return Some(end);
                    }
                }
                Ok(StreamEvent::Finished(reason)) => return Some(self.finish(reason)),
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => {
                    self.fail(ApiError::internal("the engine dropped the request"));
                    return Some(Ended::Failed);
                }
            }
        }
    }

    fn token(&mut self, tokenizer: Option<&Tokenizer>, id: u32) -> Option<Ended> {
        self.completion_tokens += 1;
        let text = match tokenizer.map(|t| self.decoder.push(t, id)) {
            None => String::new(),
            Some(Ok(text)) => text,
            Some(Err(e)) => {
                self.fail(ApiError::internal(format!("cannot decode token {id}: {e}")));
                return Some(Ended::Failed);
            }
        };
        let (text, stopped) = match self.stops.push(&text) {
            Scan::Emit(text) => (text, false),
            Scan::Stopped(text) => (text, true),
        };
        let logprobs = self.logprobs.as_ref().and_then(|l| l.take(self.id));
        let sent = self.send(GenEvent::Delta {
            text,
            token: Some(id),
            logprobs,
        });
        if !sent {
            return Some(Ended::ClientGone);
        }
        if stopped {
            self.send(GenEvent::Finished {
                reason: Finish::Stop,
                completion_tokens: self.completion_tokens,
            });
            return Some(Ended::StopString);
        }
        None
    }

    fn finish(&mut self, reason: FinishReason) -> Ended {
        let reason = match reason {
            FinishReason::Length => Finish::Length,
            FinishReason::Eos | FinishReason::Stop => Finish::Stop,
            FinishReason::Aborted => {
                self.fail(ApiError::unavailable("the engine aborted the request"));
                return Ended::Failed;
            }
        };
        let rest = self.stops.flush();
        if !rest.is_empty() {
            self.send(GenEvent::Delta {
                text: rest,
                token: None,
                logprobs: None,
            });
        }
        self.send(GenEvent::Finished {
            reason,
            completion_tokens: self.completion_tokens,
        });
        Ended::Finished(reason)
    }

    /// The request left: its log-probabilities not taken yet are dropped.
    pub fn forget(&self) {
        if let Some(l) = &self.logprobs {
            l.forget(self.id);
        }
    }

    pub fn fail(&self, e: ApiError) {
        self.send(GenEvent::Failed(e));
    }

    fn send(&self, event: GenEvent) -> bool {
        self.events.send(event).is_ok()
    }
}
