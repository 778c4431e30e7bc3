//! Chapter 6.3: a request body as the handlers take it: declared JSON, read within the body
//! timeout and the size limit, then parsed as one JSON object (`phase6_openai::JsonBody`).
//!
//! The declared type matters for safety, not parsing: a web page may send a cross-site POST
//! without asking first only as `text/plain`, a form or multipart, so refusing every other
//! type than JSON keeps any page a user visits from driving a server on their machine.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use phase6_openai::{ApiError, JsonBody};

use crate::routes::AppState;

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let declared = req.headers().get(header::CONTENT_TYPE);
        if !declared.and_then(|v| v.to_str().ok()).is_some_and(is_json) {
            return Err(ApiError::unsupported_media_type());
        }
        let read = tokio::time::timeout(state.body_timeout, Bytes::from_request(req, state));
        let bytes = read
            .await
            .map_err(|_| ApiError::timeout(state.body_timeout))?
            .map_err(|r| match r.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(state.max_body_bytes),
                _ => ApiError::bad_request(r.body_text()),
            })?;
        Self::parse(&bytes)
    }
}

/// `application/json`, or a `+json` type, with any parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    let essence = essence.to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}
