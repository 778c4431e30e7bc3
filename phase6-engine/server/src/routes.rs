//! The router: which path goes to which handler, which of them want the API key, the body
//! size limit, and OpenAI-shaped answers for unknown paths and methods.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::engine_thread::EngineHandle;
use crate::{auth, chunks, cors, metrics, openai, request_id, tokenize};
use phase6_openai::ApiError;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub engine: EngineHandle,
    /// The name clients give as `model` and `/v1/models` lists.
    pub model_name: Arc<str>,
    pub api_key: Option<Arc<str>>,
    pub max_body_bytes: usize,
    pub body_timeout: std::time::Duration,
    pub request_limits: Arc<phase6_openai::RequestLimits>,
    /// Unix seconds when the server started: the model's `created`, and part of answer ids.
    pub started: u64,
    /// Origins allowed cross-origin access (`crate::cors`).
    pub allowed_origins: Arc<[String]>,
    pub access_log: phase6_http::AccessLog,
}

/// The endpoints behind the API key.
fn api_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/v1/chunks", post(chunks::register).get(chunks::list))
        .route("/v1/chunks/generate", post(chunks::generate))
        .route("/v1/chunks/stats", get(chunks::stats))
        .route("/v1/chunks/{id}", get(chunks::get).delete(chunks::delete))
        .route("/metrics", get(metrics::metrics))
}

pub fn router(state: AppState) -> Router {
    let protected = api_routes().route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_api_key,
    ));
    Router::new()
        .route("/health", get(health))
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), cors::cors))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            request_id::tag,
        ))
        .layer(middleware::from_fn_with_state(
            state.access_log.clone(),
            phase6_http::log,
        ))
        .with_state(state)
}

/// 200 while the engine thread runs, 503 once it has stopped.
async fn health(State(app): State<AppState>) -> Response {
    if app.engine.is_alive() {
        (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response()
    } else {
        ApiError::unavailable("the engine has stopped").into_response()
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found(
        "no such endpoint; see /v1/completions, /v1/chat/completions, /v1/models, /v1/chunks, /tokenize, /detokenize, /health, /metrics",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}
