//! Chapter 6.3: vLLM's `/tokenize` and `/detokenize`: the ids the model would see for a text or
//! a conversation (rendered with its chat template), and the text of ids, without generating.

use axum::Json;
use axum::extract::State;
use phase6_openai::request::{chat_messages, token_ids};
use phase6_openai::{ApiError, JsonBody, PromptInput};
use serde_json::{Value, json};

use crate::engine_thread::EnginePrompt;
use crate::routes::AppState;

/// `{"prompt": text}` or `{"messages": [...]}` (with the generation prompt, as a chat request
/// would send) -> `{"count", "max_model_len", "tokens"}`.
pub async fn tokenize(
    State(app): State<AppState>,
    body: JsonBody,
) -> Result<Json<Value>, ApiError> {
    let prompt = match (body.get::<String>("prompt")?, body.raw("messages")) {
        (Some(text), None) => PromptInput::Text(text),
        (None, Some(_)) => PromptInput::Chat(chat_messages(body.raw("messages"))?),
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give exactly one of prompt (text) and messages",
            ));
        }
    };
    let EnginePrompt::Tokens(ids) = app.engine.tokenize(prompt).await? else {
        unreachable!("text and chats become token ids")
    };
    Ok(Json(json!({
        "count": ids.len(),
        "max_model_len": app.engine.info().max_model_len,
        "tokens": ids,
    })))
}

/// `{"tokens": [...]}` -> `{"prompt": text}` (special tokens written out).
pub async fn detokenize(
    State(app): State<AppState>,
    body: JsonBody,
) -> Result<Json<Value>, ApiError> {
    let Some(Value::Array(items)) = body.raw("tokens") else {
        return Err(ApiError::invalid(
            "tokens",
            "tokens must be a list of token ids",
        ));
    };
    let ids = token_ids("tokens", items, app.engine.info().vocab_size)?;
    let tokenizer = app.engine.tokenizer().ok_or_else(|| {
        ApiError::invalid(
            "tokens",
            "this model has no tokenizer: there is no text to give",
        )
    })?;
    let text = tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(json!({"prompt": text})))
}
