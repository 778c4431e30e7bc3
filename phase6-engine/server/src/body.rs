//! Chapter 6.3: a request body as the handlers take it: read within the body timeout and the
//! size limit, then parsed as one JSON object (`phase6_openai::JsonBody`).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use phase6_openai::{ApiError, JsonBody};

use crate::routes::AppState;

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
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
