//! Chapter 6.3, the OpenAI wire format: what a parsed generation request asks for, and the JSON of the
//! answers and stream chunks of `/v1/completions` and `/v1/chat/completions`. Answers are
//! written with `json!`, so the shape a client receives can be read straight off the code.

use phase0::{SamplingParams, SeqId, TokenId};
use phase2::ChatMessage;
use serde_json::{Value, json};

use phase2::GenerationConfig;
use phase6_chunks::Composition;

/// The prompt of a request, before tokenization (which happens in the request's own task).
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<TokenId>),
    /// Rendered with the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Registered chunks, composed (`/v1/chunks/generate`).
    Chunks(Composition),
}

impl PromptInput {
    /// The request field the prompt came from, for error messages.
    pub fn param(&self) -> &'static str {
        match self {
            PromptInput::Text(_) | PromptInput::Tokens(_) => "prompt",
            PromptInput::Chat(_) => "messages",
            PromptInput::Chunks(_) => "context_ids",
        }
    }
}

/// What the server needs to know about the model before any request.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInfo {
    /// Longest prompt + output, clamped to the model.
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// Tokens the KV pool holds in all: no request may need more (prompt + `max_tokens`).
    pub kv_capacity_tokens: usize,
    /// The model's sampling defaults, for the fields a request leaves out.
    pub generation_config: GenerationConfig,
    /// Whether the backend gives log-probabilities (the CPU runner does; the CUDA runner
    /// samples on the device and gives none).
    pub logprobs: bool,
}

/// What the engine tells a request it took: its id and its prompt's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub id: SeqId,
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from chunks (`None` for plain prompts).
    pub cached_tokens: Option<usize>,
}

/// Why a choice ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the model's length limit.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// Everything a generation request asks for, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// The model the client named, if it named one.
    pub model: Option<String>,
    /// One prompt, or (`/v1/completions`) a list: each gets `n` choices.
    pub prompts: Vec<PromptInput>,
    /// Choices per prompt.
    pub n: usize,
    pub params: SamplingParams,
    /// Whether the client set `max_tokens` (else it is a default, cut to the room left).
    pub max_tokens_set: bool,
    /// Stop strings (never empty strings).
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    /// Extension (as in vLLM): each choice and chunk carries the generated token ids.
    pub return_token_ids: bool,
    /// Log-probabilities of each generated token and of this many alternatives.
    pub logprobs: Option<usize>,
    /// `/v1/completions`' `echo`: each choice's text starts with its prompt.
    pub echo: bool,
}

impl GenerationRequest {
    /// The parameters of choice `j` of a prompt. As vLLM does, a seeded request's choices
    /// are seeded `seed`, `seed + 1`, ... so they differ yet each can be reproduced; without a
    /// seed the engine gives each its own. Greedy choices are all the same.
    pub fn params_of_choice(&self, j: usize) -> SamplingParams {
        SamplingParams {
            seed: self.params.seed.map(|s| s.wrapping_add(j as u64)),
            ..self.params.clone()
        }
    }
}

/// One finished choice of an answer that did not stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub text: String,
    pub tokens: Vec<TokenId>,
    pub finish: Finish,
    /// In the endpoint's shape (`crate::ChoiceLogprobs`), when asked for.
    pub logprobs: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V came from chunks, for generations from chunks.
    pub cached_tokens: Option<usize>,
}

impl Usage {
    pub fn new(admitted: &Admitted, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens: admitted.prompt_tokens,
            completion_tokens,
            cached_tokens: admitted.cached_tokens,
        }
    }

    fn json(self) -> Value {
        let mut v = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        });
        if let Some(n) = self.cached_tokens {
            v["prompt_tokens_details"] = json!({ "cached_tokens": n });
        }
        v
    }
}

/// The parts every answer to one request shares: endpoint, id, creation time, model name.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseShape {
    pub endpoint: Endpoint,
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub return_token_ids: bool,
}

impl ResponseShape {
    fn envelope(&self, object: &str, choices: Vec<Value>, usage: Option<Usage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u.json();
        }
        v
    }

    fn with_tokens(&self, mut choice: Value, tokens: &[TokenId]) -> Value {
        if self.return_token_ids {
            choice["token_ids"] = json!(tokens);
        }
        choice
    }

    /// The whole answer of a request that did not stream: choice `i` has index `i`.
    pub fn complete(&self, choices: Vec<Choice>, usage: Usage) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::ChatCompletions => "chat.completion",
        };
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(index, c)| {
                let choice = match self.endpoint {
                    Endpoint::Completions => json!({
                        "index": index,
                        "text": c.text,
                        "logprobs": c.logprobs,
                        "finish_reason": c.finish.as_str(),
                    }),
                    Endpoint::ChatCompletions => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": c.logprobs,
                        "finish_reason": c.finish.as_str(),
                    }),
                };
                self.with_tokens(choice, &c.tokens)
            })
            .collect();
        self.envelope(object, choices, Some(usage))
    }

    fn chunk(&self, choices: Vec<Value>, usage: Option<Usage>) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::ChatCompletions => "chat.completion.chunk",
        };
        self.envelope(object, choices, usage)
    }

    /// The chunk a choice's stream opens with: chat announces the assistant's role.
    pub fn opening_chunk(&self, index: usize) -> Option<Value> {
        match self.endpoint {
            Endpoint::Completions => None,
            Endpoint::ChatCompletions => Some(self.chunk(
                vec![json!({
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                })],
                None,
            )),
        }
    }

    /// A chunk of choice `index` with new text, the tokens that made it and their
    /// log-probabilities when asked for.
    pub fn delta_chunk(
        &self,
        index: usize,
        text: &str,
        tokens: &[TokenId],
        logprobs: Option<Value>,
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => {
                json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": null})
            }
            Endpoint::ChatCompletions => json!({
                "index": index,
                "delta": {"content": text},
                "logprobs": logprobs,
                "finish_reason": null,
            }),
        };
        self.chunk(vec![self.with_tokens(choice, tokens)], None)
    }

    /// The chunk that ends choice `index`, with its reason.
    pub fn finish_chunk(&self, index: usize, finish: Finish) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": "", "logprobs": null, "finish_reason": finish.as_str(),
            }),
            Endpoint::ChatCompletions => json!({
                "index": index,
                "delta": {},
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
        };
        self.chunk(vec![choice], None)
    }

    /// The last chunk when the client asked for usage: no choices, the token counts.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        self.chunk(Vec::new(), Some(usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(endpoint: Endpoint) -> ResponseShape {
        ResponseShape {
            endpoint,
            id: "cmpl-1".into(),
            created: 7,
            model: "tiny".into(),
            return_token_ids: true,
        }
    }

    #[test]
    fn answers_have_the_openai_shape() {
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: None,
        };
        let choice = |text: &str, tokens: Vec<TokenId>, finish| Choice {
            text: text.into(),
            tokens,
            finish,
            logprobs: None,
        };
        let v = shape(Endpoint::Completions).complete(
            vec![
                choice("ab", vec![5, 6], Finish::Length),
                choice("c", vec![7], Finish::Stop),
            ],
            usage,
        );
        assert_eq!(v["choices"][1]["index"], 1);
        assert_eq!(v["choices"][1]["text"], "c");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "ab");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["choices"][0]["token_ids"], json!([5, 6]));
        assert_eq!(v["usage"]["total_tokens"], 5);
        let v = shape(Endpoint::ChatCompletions)
            .complete(vec![choice("ab", vec![], Finish::Stop)], usage);
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn chunks_have_the_openai_shape() {
        let chat = shape(Endpoint::ChatCompletions);
        let open = chat.opening_chunk(0).unwrap();
        assert_eq!(open["object"], "chat.completion.chunk");
        assert_eq!(open["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(
            chat.delta_chunk(0, "x", &[9], None)["choices"][0]["delta"]["content"],
            "x"
        );
        assert_eq!(
            chat.finish_chunk(2, Finish::Stop)["choices"][0]["delta"],
            json!({})
        );
        let u = chat.usage_chunk(Usage {
            prompt_tokens: 1,
            completion_tokens: 1,
            cached_tokens: Some(1),
        });
        assert_eq!(u["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["total_tokens"], 2);
        let text = shape(Endpoint::Completions);
        assert!(text.opening_chunk(0).is_none());
        let delta = text.delta_chunk(3, "y", &[], None);
        assert_eq!(delta["choices"][0]["token_ids"], json!([]));
        assert_eq!(delta["choices"][0]["index"], 3);
    }
}
