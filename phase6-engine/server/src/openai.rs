//! The OpenAI endpoints: `/v1/completions`, `/v1/chat/completions` and `/v1/models`. A
//! generation handler checks the request, hands it to the engine thread, and answers with
//! the whole text once it is done or, with `"stream": true`, with a stream of chunks.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::engine_thread::{GenEvent, Generation, Submit};
use crate::routes::AppState;
use crate::sse;
use futures_util::future::try_join_all;
use phase0::TokenId;
use phase6_http::Counts;
use phase6_openai::{
    Admitted, ApiError, Choice, ChoiceLogprobs, Endpoint, GenerationRequest, JsonBody, PromptInput,
    ResponseShape, Usage, request,
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

/// One choice in flight: its generation, and the prompt text it starts with (`echo`).
pub struct Started {
    pub generation: Generation,
    pub echo: String,
}

/// The text a token id stands for in log-probabilities (vLLM's `token_id:<id>` without a
/// tokenizer).
pub fn token_namer(app: &AppState) -> impl Fn(TokenId) -> String + Send + Sync + 'static {
    let engine = app.engine.clone();
    move |id| match engine.tokenizer().map(|t| t.decode(&[id], false)) {
        Some(Ok(text)) => text,
        _ => format!("token_id:{id}"),
    }
}

/// Tokenizes every prompt on the request's task and queues its `n` choices, all at once (the
/// engine admits them between two steps); index `i * n + j` is choice `j` of prompt `i`, as
/// OpenAI numbers them. If one is refused, the others are dropped, which aborts them.
async fn start(app: &AppState, req: &GenerationRequest) -> Result<Vec<Started>, ApiError> {
    let mut submits = Vec::new();
    for prompt in &req.prompts {
        let echo = match (req.echo, prompt) {
            (false, _) => String::new(),
            (true, PromptInput::Text(text)) => text.clone(),
            (true, PromptInput::Tokens(ids)) => match app.engine.tokenizer() {
                Some(t) => t
                    .decode(ids, false)
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
                None => String::new(),
            },
            (true, _) => String::new(),
        };
        let param = prompt.param();
        let tokens = app.engine.tokenize(prompt.clone()).await?;
        for j in 0..req.n {
            let job = Submit {
                prompt: tokens.clone(),
                param,
                params: req.params_of_choice(j),
                max_tokens_set: req.max_tokens_set,
                stop: req.stop.clone(),
                logprobs: req.logprobs,
            };
            let echo = echo.clone();
            submits.push(async move {
                let generation = app.engine.submit(job).await?;
                Ok::<_, ApiError>(Started { generation, echo })
            });
        }
    }
    try_join_all(submits).await
}

/// The usage of a request's choices: each prompt counted once, every choice's completion.
pub fn usage(admitted: &[Admitted], n: usize, completion_tokens: usize) -> Usage {
    Usage {
        prompt_tokens: admitted.iter().step_by(n).map(|a| a.prompt_tokens).sum(),
        completion_tokens,
        cached_tokens: admitted[0].cached_tokens,
    }
}

fn admitted(choices: &[Started]) -> Vec<Admitted> {
    choices.iter().map(|c| c.generation.admitted).collect()
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
    let choices = start(app, &req).await?;
    counts.prompt(usage(&admitted(&choices), req.n, 0).prompt_tokens);
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::ChatCompletions => "chatcmpl",
    };
    let shape = ResponseShape {
        endpoint,
        id: format!(
            "{prefix}-{:x}-{}",
            app.started, choices[0].generation.admitted.id
        ),
        created: unix_now(),
        model: app.model_name.to_string(),
        return_token_ids: req.return_token_ids,
    };
    let name = token_namer(app);
    if req.stream {
        let stream = sse::Choices {
            shape,
            n: req.n,
            logprobs: req.logprobs.is_some(),
            include_usage: req.include_usage,
            counts,
        };
        Ok(stream.response(choices, name))
    } else {
        collect(choices, req.n, req.logprobs.is_some(), shape, counts, &name).await
    }
}

/// Waits for every choice's whole answer. If the client leaves first, this future is dropped
/// with the receivers, and the engine thread aborts the requests.
async fn collect(
    choices: Vec<Started>,
    n: usize,
    logprobs: bool,
    shape: ResponseShape,
    counts: Counts,
    name: &(dyn Fn(TokenId) -> String + Sync),
) -> Result<Response, ApiError> {
    let admitted = admitted(&choices);
    let endpoint = shape.endpoint;
    let whole = choices
        .into_iter()
        .map(|c| collect_choice(c, logprobs.then_some(endpoint), name));
    let done = try_join_all(whole).await?;
    let completion_tokens = done.iter().map(|(_, c)| c).sum();
    counts.add_completion(completion_tokens);
    let usage = usage(&admitted, n, completion_tokens);
    let choices = done.into_iter().map(|(c, _)| c).collect();
    Ok(Json(shape.complete(choices, usage)).into_response())
}

/// One choice to its end, and its completion tokens; log-probabilities in `logprobs`' shape.
async fn collect_choice(
    started: Started,
    logprobs: Option<Endpoint>,
    name: &(dyn Fn(TokenId) -> String + Sync),
) -> Result<(Choice, usize), ApiError> {
    let Started {
        mut generation,
        echo: mut text,
    } = started;
    let mut lp = logprobs.map(|_| ChoiceLogprobs::after(text.len()));
    let mut tokens = Vec::new();
    while let Some(event) = generation.events.recv().await {
        match event {
            GenEvent::Delta {
                text: t,
                token,
                logprobs: l,
            } => {
                text.push_str(&t);
                tokens.extend(token);
                if let (Some(lp), Some(l)) = (&mut lp, l) {
                    lp.push(&l, name);
                }
            }
            GenEvent::Finished {
                reason,
                completion_tokens,
            } => {
                let logprobs = lp.zip(logprobs).map(|(l, e)| l.json(e));
                let choice = Choice {
                    text,
                    tokens,
                    finish: reason,
                    logprobs,
                };
                return Ok((choice, completion_tokens));
            }
            GenEvent::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::unavailable("the engine stopped"))
}
