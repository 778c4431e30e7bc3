//! The OpenAI endpoints: `/v1/completions`, `/v1/chat/completions` and `/v1/models`. A
//! generation handler checks the request, hands it to the engine thread, and answers with
//! the whole text once it is done or, with `"stream": true`, with a stream of chunks.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::access_log::Counts;
use crate::engine_thread::{GenEvent, Generation};
use crate::routes::AppState;
use crate::sse;
use phase6_openai::{
    ApiError, Endpoint, GenerationRequest, JsonBody, ResponseShape, Usage, request,
};

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub async fn completions(
    State(app): State<AppState>,
    Extension(counts): Extension<Counts>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let req = request::completion(&body, app.engine.info(), &app.request_limits)?;
    generate(&app, req, Endpoint::Completions, counts).await
}

pub async fn chat_completions(
    State(app): State<AppState>,
    Extension(counts): Extension<Counts>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let req = request::chat(&body, app.engine.info(), &app.request_limits)?;
    generate(&app, req, Endpoint::ChatCompletions, counts).await
}

/// The one model this server serves, as OpenAI describes a model.
fn model_object(app: &AppState) -> Value {
    json!({
        "id": &*app.model_name,
        "object": "model",
        "created": app.started,
        "owned_by": "nano-serving",
        "max_model_len": app.engine.info().max_model_len,
    })
}

/// The model the request names does not exist here: OpenAI's 404.
fn unknown_model(app: &AppState, model: &str) -> ApiError {
    let err = ApiError::not_found(format!(
        "the model {model:?} does not exist; this server serves {:?}",
        app.model_name
    ));
    ApiError {
        param: Some("model".into()),
        ..err.with_code("model_not_found")
    }
}

pub async fn models(State(app): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&app)]}))
}

/// `GET /v1/models/{id}`: the model, or OpenAI's 404 for another name.
pub async fn model(
    State(app): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id == *app.model_name {
        Ok(Json(model_object(&app)))
    } else {
        Err(unknown_model(&app, &id))
    }
}

pub async fn generate(
    app: &AppState,
    req: GenerationRequest,
    endpoint: Endpoint,
    counts: Counts,
) -> Result<Response, ApiError> {
    if let Some(model) = &req.model
        && **model != *app.model_name
    {
        return Err(unknown_model(app, model));
    }
    let generation = app
        .engine
        .generate(req.prompt, req.params, req.max_tokens_set, req.stop)
        .await?;
    counts.prompt(generation.admitted.prompt_tokens);
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::ChatCompletions => "chatcmpl",
    };
    let shape = ResponseShape {
        endpoint,
        id: format!("{prefix}-{:x}-{}", app.started, generation.admitted.id),
        created: unix_now(),
        model: app.model_name.to_string(),
        return_token_ids: req.return_token_ids,
    };
    if req.stream {
        Ok(sse::response(generation, shape, req.include_usage, counts))
    } else {
        collect(generation, shape, counts).await
    }
}

/// Waits for the whole answer. If the client leaves first, this future is dropped with the
/// receiver, and the engine thread aborts the request.
async fn collect(
    mut generation: Generation,
    shape: ResponseShape,
    counts: Counts,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(event) = generation.events.recv().await {
        match event {
            GenEvent::Delta { text: t, token } => {
                text.push_str(&t);
                tokens.extend(token);
            }
            GenEvent::Finished {
                reason,
                completion_tokens,
            } => {
                counts.add_completion(completion_tokens);
                let usage = Usage::new(&generation.admitted, completion_tokens);
                return Ok(Json(shape.complete(&text, &tokens, reason, usage)).into_response());
            }
            GenEvent::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::unavailable("the engine stopped"))
}
