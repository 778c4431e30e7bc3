//! Streaming one request: an iterator that steps the engine and yields text as it is produced.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};

use phase0::{FinishReason, SeqId, TokenId};
use phase2::{ModelRunner, StreamDecoder};
use phase5::StreamEvent;

use crate::error::Error;
use crate::llm::LLM;

/// One new token and the text it completes (empty while a multi-byte character is half done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPiece {
    pub token_id: TokenId,
    pub text: String,
}

/// Yields the pieces of one request; other requests in the engine advance too.
pub struct TokenStream<'a, R: ?Sized + ModelRunner = dyn ModelRunner> {
    llm: &'a mut LLM<R>,
    id: SeqId,
    rx: Receiver<StreamEvent>,
    decoder: StreamDecoder,
    finish_reason: Option<FinishReason>,
    mine: HashMap<SeqId, usize>,
}

impl<'a, R: ?Sized + ModelRunner> TokenStream<'a, R> {
    pub(crate) fn new(llm: &'a mut LLM<R>, id: SeqId, rx: Receiver<StreamEvent>) -> Self {
        Self {
            llm,
            id,
            rx,
            decoder: StreamDecoder::new(true),
            finish_reason: None,
            mine: HashMap::from([(id, 0)]),
        }
    }

    pub fn id(&self) -> SeqId {
        self.id
    }

    /// Why the request ended, once the iterator is exhausted.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish_reason
    }
}

impl<R: ?Sized + ModelRunner> Iterator for TokenStream<'_, R> {
    type Item = Result<StreamPiece, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.rx.try_recv() {
                Ok(StreamEvent::Token(token_id)) => {
                    let text = match self.llm.tokenizer() {
                        Some(t) => match self.decoder.push(t, token_id) {
                            Ok(text) => text,
                            Err(e) => return Some(Err(e.into())),
                        },
                        None => String::new(),
                    };
                    return Some(Ok(StreamPiece { token_id, text }));
                }
                Ok(StreamEvent::Finished(reason)) => {
                    self.finish_reason = Some(reason);
                    return None;
                }
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {
                    if let Err(e) = self.llm.step_for(&self.mine) {
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}
