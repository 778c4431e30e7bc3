//! Chapter 6.3: from a request body to a [`GenerationRequest`]: the fields of `/v1/completions` and
//! `/v1/chat/completions`, their defaults (the model's `generation_config.json` where it sets
//! one, as vLLM does, else OpenAI's), and a 400 naming the field for anything this server
//! cannot do as asked.
//!
//! Unknown fields are ignored, as OpenAI-compatible servers do. Known features this server
//! lacks (penalties, tools, `best_of`, log-probabilities of an echoed prompt) are refused
//! instead: ignoring them would quietly give the client something else than it asked for.

use phase0::{SamplingParams, TokenId};
use phase2::ChatMessage;
use serde_json::Value;

use crate::api_types::{EngineInfo, GenerationRequest, PromptInput};
use crate::body::{JsonBody, kind_of};
use crate::errors::ApiError;
pub use crate::limits::RequestLimits;
use phase6_chunks::Composition;

/// OpenAI's default `max_tokens` for `/v1/completions` (chat defaults to the model's room);
/// either is capped by the model's `max_new_tokens`.
const COMPLETION_MAX_TOKENS: usize = 16;

/// OpenAI's range of `temperature`.
const MAX_TEMPERATURE: f32 = 2.0;

/// OpenAI's most alternatives per token: `logprobs` of `/v1/completions`, `top_logprobs` of chat.
const MAX_COMPLETION_LOGPROBS: u64 = 5;
const MAX_TOP_LOGPROBS: u64 = 20;

const UNSUPPORTED: [&str; 7] = [
    "best_of",
    "suffix",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "tools",
    "functions",
];

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

pub fn completion(
    body: &JsonBody,
    info: &EngineInfo,
    limits: &RequestLimits,
) -> Result<GenerationRequest, ApiError> {
    let prompts = limits.prompts(completion_prompts(body.raw("prompt"), info.vocab_size)?)?;
    let max_tokens = body.get::<usize>("max_tokens")?;
    let mut req = common(
        body,
        prompts,
        max_tokens,
        COMPLETION_MAX_TOKENS,
        info,
        limits,
    )?;
    req.logprobs = logprobs_on(info, completion_logprobs(body)?)?;
    req.echo = body.get("echo")?.unwrap_or(false);
    if req.echo && req.logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "echo with logprobs is not supported: this server does not compute the prompt's \
             log-probabilities",
        ));
    }
    Ok(req)
}

/// Log-probabilities asked of a backend that has none are a 400, never made-up numbers.
fn logprobs_on(info: &EngineInfo, asked: Option<usize>) -> Result<Option<usize>, ApiError> {
    if asked.is_some() && !info.logprobs {
        return Err(ApiError::invalid(
            "logprobs",
            "logprobs are not available on this server's backend: the CUDA runner samples on \
             the device and returns no log-probabilities (the CPU runner does)",
        ));
    }
    Ok(asked)
}

/// `logprobs` of `/v1/completions` (and of chunk generations): how many alternatives.
fn completion_logprobs(body: &JsonBody) -> Result<Option<usize>, ApiError> {
    match body.get::<u64>("logprobs")? {
        Some(k) if k > MAX_COMPLETION_LOGPROBS => Err(ApiError::invalid(
            "logprobs",
            format!("logprobs = {k}: must be in 0..={MAX_COMPLETION_LOGPROBS}"),
        )),
        k => Ok(k.map(|k| k as usize)),
    }
}

/// Chat's `logprobs: true` and `top_logprobs`; the latter only with the former, as OpenAI
/// requires.
fn chat_logprobs(body: &JsonBody) -> Result<Option<usize>, ApiError> {
    let asked = body.get::<bool>("logprobs")?.unwrap_or(false);
    let top = body.get::<u64>("top_logprobs")?;
    match top {
        Some(k) if k > MAX_TOP_LOGPROBS => Err(ApiError::invalid(
            "top_logprobs",
            format!("top_logprobs = {k}: must be in 0..={MAX_TOP_LOGPROBS}"),
        )),
        Some(k) if k > 0 && !asked => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        _ => Ok(asked.then_some(top.unwrap_or(0) as usize)),
    }
}

pub fn chat(
    body: &JsonBody,
    info: &EngineInfo,
    limits: &RequestLimits,
) -> Result<GenerationRequest, ApiError> {
    let messages = chat_messages(body.raw("messages"))?;
    let max_tokens = match body.get::<usize>("max_completion_tokens")? {
        Some(n) => Some(n),
        None => body.get::<usize>("max_tokens")?,
    };
    let mut req = common(
        body,
        vec![PromptInput::Chat(messages)],
        max_tokens,
        info.max_model_len,
        info,
        limits,
    )?;
    req.logprobs = logprobs_on(info, chat_logprobs(body)?)?;
    Ok(req)
}

/// `/v1/chunks/generate`: a composition of registered chunks by id, then the sampling fields
/// of `/v1/completions` (and its defaults).
pub fn chunk_generation(
    body: &JsonBody,
    info: &EngineInfo,
    limits: &RequestLimits,
) -> Result<GenerationRequest, ApiError> {
    let required = |name: &str| {
        body.get::<String>(name)?
            .ok_or_else(|| ApiError::invalid(name, format!("{name} is required")))
    };
    let composition = Composition {
        system_id: required("system_id")?,
        context_ids: limits.context_ids(body.get("context_ids")?.unwrap_or_default())?,
        query_id: required("query_id")?,
    };
    let max_tokens = body.get::<usize>("max_tokens")?;
    let mut req = common(
        body,
        vec![PromptInput::Chunks(composition)],
        max_tokens,
        COMPLETION_MAX_TOKENS,
        info,
        limits,
    )?;
    req.logprobs = logprobs_on(info, completion_logprobs(body)?)?;
    if body.get::<bool>("echo")?.unwrap_or(false) {
        return Err(ApiError::invalid(
            "echo",
            "echo is not supported for generations from chunks",
        ));
    }
    Ok(req)
}

/// The fields every generation shares; `max_tokens` is the request's, else the endpoint's
/// default capped by the model's.
fn common(
    body: &JsonBody,
    prompts: Vec<PromptInput>,
    max_tokens: Option<usize>,
    default_max_tokens: usize,
    info: &EngineInfo,
    limits: &RequestLimits,
) -> Result<GenerationRequest, ApiError> {
    refuse_unsupported(body)?;
    refuse_response_format(body.raw("response_format"))?;
    let n = limits.n(body.get::<u64>("n")?.unwrap_or(1))?;
    let model = &info.generation_config;
    let defaults = model.default_sampling_params();
    let params = SamplingParams {
        temperature: body.get("temperature")?.unwrap_or(defaults.temperature),
        top_p: body.get("top_p")?.unwrap_or(defaults.top_p),
        top_k: body.get("top_k")?.unwrap_or(defaults.top_k),
        max_tokens: max_tokens.unwrap_or(model.default_max_tokens(default_max_tokens)),
        ignore_eos: body.get("ignore_eos")?.unwrap_or(false),
        seed: body.get("seed")?,
        stop_token_ids: match body.raw("stop_token_ids") {
            Some(Value::Array(ids)) => token_ids("stop_token_ids", ids, info.vocab_size)?,
            _ => body.get("stop_token_ids")?.unwrap_or_default(),
        },
    };
    params
        .validate()
        .map_err(|e| ApiError::rejected(e.into(), prompts[0].param()))?;
    if params.temperature > MAX_TEMPERATURE {
        return Err(ApiError::invalid(
            "temperature",
            format!(
                "temperature = {}: must be in [0, {MAX_TEMPERATURE}]",
                params.temperature
            ),
        ));
    }
    Ok(GenerationRequest {
        model: body.get("model")?,
        prompts,
        n,
        params,
        max_tokens_set: max_tokens.is_some(),
        stop: limits.stop_strings(stop_strings(body.raw("stop"))?)?,
        stream: body.get("stream")?.unwrap_or(false),
        include_usage: include_usage(body.raw("stream_options"))?,
        return_token_ids: body.get("return_token_ids")?.unwrap_or(false),
        logprobs: None,
        echo: false,
    })
}

/// Whether a value asks for the feature (rather than restating its default).
fn asks_for(name: &str, v: &Value) -> bool {
    let default = if name == "best_of" { 1.0 } else { 0.0 };
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(default),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn refuse_unsupported(body: &JsonBody) -> Result<(), ApiError> {
    for name in UNSUPPORTED {
        if body.raw(name).is_some_and(|v| asks_for(name, v)) {
            return Err(ApiError::invalid(
                name,
                format!("{name} is not supported by this server"),
            ));
        }
    }
    Ok(())
}

/// `response_format` other than plain text would need constrained decoding, which this
/// server lacks: refused rather than ignored.
fn refuse_response_format(format: Option<&Value>) -> Result<(), ApiError> {
    match format.map(|f| f.get("type")) {
        None => Ok(()),
        Some(Some(Value::String(t))) if t == "text" => Ok(()),
        Some(_) => Err(ApiError::invalid(
            "response_format",
            "response_format: only {\"type\": \"text\"} is supported (no JSON mode or schema)",
        )),
    }
}

/// Fits `max_tokens` to the prompt, once its length is known: as vLLM does, a `max_tokens`
/// the client set that the context cannot hold is a 400, a default one is cut to the room
/// left. Either way the request must fit the KV pool on its own, or it could never finish.
pub fn fit_to_context(
    req_params: &mut SamplingParams,
    max_tokens_set: bool,
    prompt_tokens: usize,
    info: &EngineInfo,
    prompt_param: &str,
) -> Result<(), ApiError> {
    let max_len = info.max_model_len;
    let too_long = |total: usize| {
        ApiError::invalid(
            prompt_param,
            format!(
                "This model's maximum context length is {max_len} tokens. However, you requested \
                 {total} tokens ({prompt_tokens} in the prompt, {} in the completion). Please \
                 reduce the length of the prompt or completion.",
                req_params.max_tokens
            ),
        )
        .with_code("context_length_exceeded")
    };
    if prompt_tokens >= max_len {
        return Err(too_long(prompt_tokens + req_params.max_tokens));
    }
    let total = prompt_tokens + req_params.max_tokens;
    if total > max_len {
        if max_tokens_set {
            return Err(too_long(total));
        }
        req_params.max_tokens = max_len - prompt_tokens;
    }
    let need = prompt_tokens + req_params.max_tokens;
    if need > info.kv_capacity_tokens {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "the prompt ({prompt_tokens} tokens) and max_tokens ({}) need {need} KV slots; \
                 this server's KV cache holds {}",
                req_params.max_tokens, info.kv_capacity_tokens
            ),
        ));
    }
    Ok(())
}

fn include_usage(options: Option<&Value>) -> Result<bool, ApiError> {
    let Some(options) = options else {
        return Ok(false);
    };
    let Value::Object(o) = options else {
        return Err(ApiError::invalid(
            "stream_options",
            format!("stream_options must be an object, not {}", kind_of(options)),
        ));
    };
    match o.get("include_usage") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::invalid(
            "stream_options.include_usage",
            format!(
                "stream_options.include_usage must be a boolean, not {}",
                kind_of(other)
            ),
        )),
    }
}

fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(ApiError::invalid(
                    "stop",
                    format!("stop[{i}] must be a string, not {}", kind_of(other)),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "stop must be a string or a list of strings, not {}",
                    kind_of(other)
                ),
            ));
        }
    };
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    Ok(stops)
}

/// Token ids of the field `param`, each checked against the vocabulary.
pub fn token_ids(
    param: &str,
    items: &[Value],
    vocab_size: usize,
) -> Result<Vec<TokenId>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .filter(|&id| id < vocab_size as u64)
                .map(|id| id as TokenId)
                .ok_or_else(|| {
                    ApiError::invalid(
                        param,
                        format!(
                            "{param}[{i}] = {v}: token ids must be integers in 0..{vocab_size}"
                        ),
                    )
                })
        })
        .collect()
}

/// A string, a list of token ids, or a list of either (one prompt each).
fn completion_prompts(
    prompt: Option<&Value>,
    vocab_size: usize,
) -> Result<Vec<PromptInput>, ApiError> {
    match prompt {
        None => Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => Ok(vec![PromptInput::Text(s.clone())]),
        Some(Value::Array(items)) => match items.first() {
            None => Err(ApiError::invalid("prompt", "the prompt is empty")),
            Some(Value::String(_) | Value::Array(_)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(PromptInput::Text(s.clone())),
                    Value::Array(ids) if !ids.is_empty() => Ok(PromptInput::Tokens(token_ids(
                        &format!("prompt[{i}]"),
                        ids,
                        vocab_size,
                    )?)),
                    other => Err(ApiError::invalid(
                        format!("prompt[{i}]"),
                        format!(
                            "prompt[{i}] must be a string or a non-empty list of token ids, not {}",
                            kind_of(other)
                        ),
                    )),
                })
                .collect(),
            Some(_) => Ok(vec![PromptInput::Tokens(token_ids(
                "prompt", items, vocab_size,
            )?)]),
        },
        Some(other) => Err(ApiError::invalid(
            "prompt",
            format!(
                "prompt must be a string or a list of token ids, not {}",
                kind_of(other)
            ),
        )),
    }
}

/// A message's content: a string, or a list of text parts (joined).
fn content(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| {
                let text = part
                    .get("type")
                    .filter(|t| *t == "text")
                    .and_then(|_| part.get("text"))
                    .and_then(Value::as_str);
                text.ok_or_else(|| {
                    ApiError::invalid(
                        format!("{param}[{j}]"),
                        format!("{param}[{j}]: only {{\"type\": \"text\", \"text\": ...}} parts are supported"),
                    )
                })
            })
            .collect(),
        Some(other) => Err(ApiError::invalid(
            param,
            format!(
                "{param} must be a string or a list of text parts, not {}",
                kind_of(other)
            ),
        )),
    }
}

/// The `messages` of a chat request (or of `/tokenize`), each a role and its text, checked.
pub fn chat_messages(messages: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match messages {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("messages", "messages must not be empty"));
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ApiError::invalid(
                "messages",
                format!("messages must be a list, not {}", kind_of(other)),
            ));
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role_param = format!("messages[{i}].role");
            let role = match m.get("role") {
                Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
                Some(Value::String(r)) => {
                    return Err(ApiError::invalid(
                        role_param.clone(),
                        format!("{role_param} = {r:?}: expected one of {}", ROLES.join(", ")),
                    ));
                }
                _ => {
                    return Err(ApiError::invalid(
                        role_param.clone(),
                        format!("{role_param} is required and must be a string"),
                    ));
                }
            };
            let role = if role == "developer" { "system" } else { role };
            let text = content(m.get("content"), &format!("messages[{i}].content"))?;
            Ok(ChatMessage::new(role, text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use phase2::GenerationConfig;

    fn info() -> EngineInfo {
        EngineInfo {
            max_model_len: 100,
            vocab_size: 50,
            kv_capacity_tokens: 1000,
            generation_config: GenerationConfig::default(),
            logprobs: true,
        }
    }

    fn body(json: &str) -> JsonBody {
        JsonBody::parse(json.as_bytes()).unwrap()
    }

    fn param_of(json: &str) -> String {
        let b = body(json);
        let err = if b.raw("messages").is_some() {
            chat(&b, &info(), &RequestLimits::default())
        } else {
            completion(&b, &info(), &RequestLimits::default())
        }
        .unwrap_err();
        assert_eq!(err.status, 400, "{err:?}");
        err.param.unwrap_or_default()
    }

    #[test]
    fn defaults_are_openai_ones() {
        let r = completion(
            &body(r#"{"prompt": "hi"}"#),
            &info(),
            &RequestLimits::default(),
        )
        .unwrap();
        assert_eq!(r.prompts, vec![PromptInput::Text("hi".into())]);
        assert_eq!((r.n, r.logprobs, r.echo), (1, None, false));
        assert_eq!(r.params.max_tokens, 16);
        assert_eq!(r.params.temperature, 1.0);
        assert!(!r.stream && r.stop.is_empty());
        let r = chat(
            &body(r#"{"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "stop": "x", "stream": true, "stream_options": {"include_usage": true}}"#),
            &info(),
            &RequestLimits::default(),
        )
        .unwrap();
        assert_eq!(
            r.prompts,
            vec![PromptInput::Chat(vec![ChatMessage::new("system", "ab")])]
        );
        assert_eq!(r.params.max_tokens, 100);
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert!(r.stream && r.include_usage);
    }

    #[test]
    fn the_models_generation_config_fills_what_a_request_leaves_out() {
        let info = EngineInfo {
            generation_config: GenerationConfig {
                temperature: Some(0.6),
                top_k: Some(20),
                max_new_tokens: Some(50),
                ..GenerationConfig::default()
            },
            ..info()
        };
        let r = completion(
            &body(r#"{"prompt": "hi"}"#),
            &info,
            &RequestLimits::default(),
        )
        .unwrap();
        assert_eq!((r.params.temperature, r.params.top_p), (0.6, 1.0));
        assert_eq!((r.params.top_k, r.params.max_tokens), (20, 16));
        let chat_body = r#"{"messages": [{"role": "user", "content": "a"}]}"#;
        let r = chat(&body(chat_body), &info, &RequestLimits::default()).unwrap();
        assert_eq!(
            r.params.max_tokens, 50,
            "the model's cap under max_model_len"
        );
        let set = r#"{"prompt": "hi", "temperature": 0, "top_k": -1, "max_tokens": 80}"#;
        let r = completion(&body(set), &info, &RequestLimits::default()).unwrap();
        assert_eq!(
            (r.params.temperature, r.params.top_k, r.params.max_tokens),
            (0.0, -1, 80)
        );
    }

    #[test]
    fn prompts_take_every_openai_form() {
        let p = |json: &str| {
            completion(&body(json), &info(), &RequestLimits::default())
                .unwrap()
                .prompts
        };
        let text = |s: &str| PromptInput::Text(s.into());
        assert_eq!(p(r#"{"prompt": ["a"]}"#), vec![text("a")]);
        assert_eq!(
            p(r#"{"prompt": [1, 2]}"#),
            vec![PromptInput::Tokens(vec![1, 2])]
        );
        assert_eq!(
            p(r#"{"prompt": [[3]]}"#),
            vec![PromptInput::Tokens(vec![3])]
        );
        assert_eq!(
            p(r#"{"prompt": ["a", [4, 5], "b"]}"#),
            vec![text("a"), PromptInput::Tokens(vec![4, 5]), text("b")]
        );
    }

    #[test]
    fn every_bad_field_is_named() {
        assert_eq!(param_of(r#"{}"#), "prompt");
        assert_eq!(param_of(r#"{"prompt": 5}"#), "prompt");
        assert_eq!(param_of(r#"{"prompt": ["a", 3]}"#), "prompt[1]");
        assert_eq!(param_of(r#"{"prompt": [[1], [60]]}"#), "prompt[1]");
        assert_eq!(param_of(r#"{"prompt": [1, 50]}"#), "prompt");
        assert_eq!(param_of(r#"{"prompt": [1, -1]}"#), "prompt");
        assert_eq!(param_of(r#"{"prompt": "a", "n": 0}"#), "n");
        assert_eq!(param_of(r#"{"prompt": "a", "n": 17}"#), "n");
        assert_eq!(
            param_of(r#"{"prompt": "a", "temperature": -1}"#),
            "temperature"
        );
        assert_eq!(param_of(r#"{"prompt": "a", "top_p": 0}"#), "top_p");
        assert_eq!(param_of(r#"{"prompt": "a", "top_k": 0}"#), "top_k");
        assert_eq!(
            param_of(r#"{"prompt": "a", "max_tokens": 0}"#),
            "max_tokens"
        );
        assert_eq!(
            param_of(r#"{"prompt": "a", "max_tokens": "9"}"#),
            "max_tokens"
        );
        assert_eq!(param_of(r#"{"prompt": "a", "seed": -3}"#), "seed");
        assert_eq!(param_of(r#"{"prompt": "a", "stop": [""]}"#), "stop");
        assert_eq!(param_of(r#"{"prompt": "a", "stop": 3}"#), "stop");
        assert_eq!(param_of(r#"{"prompt": "a", "stream": "yes"}"#), "stream");
        assert_eq!(param_of(r#"{"prompt": "a", "logprobs": 6}"#), "logprobs");
        assert_eq!(param_of(r#"{"prompt": "a", "logprobs": true}"#), "logprobs");
        assert_eq!(
            param_of(r#"{"prompt": "a", "logprobs": 1, "echo": true}"#),
            "echo"
        );
        assert_eq!(
            param_of(r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#),
            "top_logprobs"
        );
        assert_eq!(
            param_of(
                r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}"#
            ),
            "top_logprobs"
        );
        assert_eq!(param_of(r#"{"prompt": "a", "best_of": 3}"#), "best_of");
        assert_eq!(
            param_of(r#"{"prompt": "a", "stream_options": {"include_usage": 1}}"#),
            "stream_options.include_usage"
        );
        assert_eq!(param_of(r#"{"messages": []}"#), "messages");
        assert_eq!(
            param_of(r#"{"messages": [{"role": "king", "content": "x"}]}"#),
            "messages[0].role"
        );
        assert_eq!(
            param_of(r#"{"messages": [{"role": "user", "content": 4}]}"#),
            "messages[0].content"
        );
        let r = chat(
            &body(r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 3, "n": 4}"#),
            &info(),
            &RequestLimits::default(),
        )
        .unwrap();
        assert_eq!((r.logprobs, r.n), (Some(3), 4));
        let gpu = EngineInfo {
            logprobs: false,
            ..info()
        };
        let asked = body(r#"{"prompt": "x", "logprobs": 0}"#);
        let err = completion(&asked, &gpu, &RequestLimits::default()).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("logprobs"));
        // Defaults restated are fine.
        completion(
            &body(r#"{"prompt": "a", "n": 1, "best_of": 1, "logprobs": null, "echo": false}"#),
            &info(),
            &RequestLimits::default(),
        )
        .unwrap();
    }
}
