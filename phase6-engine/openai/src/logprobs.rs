//! Chapter 6.3: log-probabilities in OpenAI's two shapes. `/v1/completions` gives parallel
//! lists (`tokens`, `token_logprobs`, `top_logprobs` as token -> logprob maps, `text_offset`);
//! `/v1/chat/completions` gives `content`, one object per token with its bytes and its
//! `top_logprobs` list. A stream carries the entries of its new tokens in each chunk.

use phase0::TokenId;
use phase6::TokenLogprobs;
use serde_json::{Map, Value, json};

use crate::api_types::Endpoint;

/// The floor vLLM writes for a probability of zero: JSON has no `-Infinity`.
const FLOOR: f32 = -9999.0;

fn finite(lp: f32) -> f32 {
    if lp.is_nan() { FLOOR } else { lp.max(FLOOR) }
}

/// One token's entry: its text, its log-probability and its alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
    /// Where the token starts in the choice's text (bytes, counting an echoed prompt).
    pub offset: usize,
}

/// The entries of one choice so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceLogprobs {
    entries: Vec<Entry>,
    /// Where the next token starts in the choice's text.
    offset: usize,
    /// Entries already sent in stream chunks.
    sent: usize,
}

impl ChoiceLogprobs {
    /// Offsets start after `echoed` bytes of prompt text.
    pub fn after(echoed: usize) -> Self {
        Self {
            offset: echoed,
            ..Self::default()
        }
    }

    /// Adds a token; `name` gives a token id's text.
    pub fn push(&mut self, lp: &TokenLogprobs, name: &dyn Fn(TokenId) -> String) {
        let token = name(lp.token);
        let entry = Entry {
            offset: self.offset,
            logprob: finite(lp.logprob),
            top: lp.top.iter().map(|&(t, p)| (name(t), finite(p))).collect(),
            token,
        };
        self.offset += entry.token.len();
        self.entries.push(entry);
    }

    /// Every entry, in the endpoint's shape (a whole answer).
    pub fn json(&self, endpoint: Endpoint) -> Value {
        render(endpoint, &self.entries)
    }

    /// The entries not sent yet, in the endpoint's shape (a stream chunk).
    pub fn unsent(&mut self, endpoint: Endpoint) -> Value {
        let new = &self.entries[self.sent..];
        self.sent = self.entries.len();
        render(endpoint, new)
    }
}

fn render(endpoint: Endpoint, entries: &[Entry]) -> Value {
    match endpoint {
        Endpoint::Completions => {
            let top: Vec<Value> = entries
                .iter()
                .map(|e| {
                    // As vLLM does, the sampled token is among its alternatives.
                    let mut m: Map<String, Value> =
                        e.top.iter().map(|(t, p)| (t.clone(), json!(p))).collect();
                    m.entry(e.token.clone()).or_insert(json!(e.logprob));
                    Value::Object(m)
                })
                .collect();
            json!({
                "tokens": entries.iter().map(|e| &e.token).collect::<Vec<_>>(),
                "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
            })
        }
        Endpoint::ChatCompletions => {
            let one = |t: &str, p: f32| json!({"token": t, "logprob": p, "bytes": t.as_bytes()});
            let content: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let mut v = one(&e.token, e.logprob);
                    v["top_logprobs"] = e.top.iter().map(|(t, p)| one(t, *p)).collect();
                    v
                })
                .collect();
            json!({ "content": content })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice() -> ChoiceLogprobs {
        let name = |t: TokenId| ["a", "bc", "d"][t as usize].to_string();
        let mut c = ChoiceLogprobs::after(3);
        for (token, logprob) in [(1, -0.5), (0, f32::NEG_INFINITY)] {
            let top = vec![(2, -0.1), (token, logprob)];
            c.push(
                &TokenLogprobs {
                    token,
                    logprob,
                    top,
                },
                &name,
            );
        }
        c
    }

    #[test]
    fn completions_get_parallel_lists() {
        let v = choice().json(Endpoint::Completions);
        assert_eq!(v["tokens"], json!(["bc", "a"]));
        assert_eq!(v["token_logprobs"], json!([-0.5, -9999.0]));
        assert_eq!(v["text_offset"], json!([3, 5]));
        assert_eq!(v["top_logprobs"][0], json!({"d": -0.1f32, "bc": -0.5}));
    }

    #[test]
    fn chat_gets_one_object_per_token_and_streams_send_each_once() {
        let mut c = choice();
        let v = c.json(Endpoint::ChatCompletions);
        let first = &v["content"][0];
        assert_eq!(first["token"], "bc");
        assert_eq!(first["bytes"], json!([98, 99]));
        assert_eq!(first["top_logprobs"][0]["token"], "d");
        assert_eq!(
            c.unsent(Endpoint::ChatCompletions)["content"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(c.unsent(Endpoint::ChatCompletions)["content"], json!([]));
    }
}
