//! Chapter 6.3, the OpenAI error shape. Every failure a client can cause becomes a 4xx status and a body
//! `{"error": {"message", "type", "param", "code"}}`, so OpenAI client libraries raise the
//! matching exception and a person reading the body learns which field to fix. Failures of
//! the server itself are 5xx in the same shape.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use phase6::Error;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error` for anything the client can fix.
    pub kind: &'static str,
    /// The request field at fault, as a path (`temperature`, `messages[1].content`).
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// A 400 about one field of the request.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..Self::bad_request(message)
        }
    }

    /// A 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    /// A 404 about a chunk id the store does not have, naming the field that gave it.
    pub fn chunk_not_found(param: &str, id: &str) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::not_found(format!(
                "{param}: no chunk {id:?} (never registered, deleted or evicted)"
            ))
            .with_code("chunk_not_found")
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
            .with_code("invalid_api_key")
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    pub fn timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("the request body did not arrive within {limit:?}"),
        )
    }

    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "the body must be sent as `Content-Type: application/json`",
        )
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "this method is not allowed on this path",
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The engine thread is gone or the engine cannot take the work now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// An engine error about a request that was not admitted; `prompt_param` names the field
    /// that held the prompt (`prompt` or `messages`).
    pub fn rejected(e: Error, prompt_param: &str) -> Self {
        match e {
            Error::InvalidSamplingParams {
                field,
                value,
                reason,
            } => Self::invalid(field, format!("{field} = {value}: {reason}")),
            Error::EmptyPrompt { .. } => Self::invalid(prompt_param, "the prompt is empty"),
            Error::PromptTooLong { len, max } => Self::invalid(
                prompt_param,
                format!("the prompt has {len} tokens; this model takes at most {max}"),
            )
            .with_code("context_length_exceeded"),
            Error::OutOfMemory(why) => Self::invalid(prompt_param, why),
            Error::Tokenizer(why) => Self::invalid(prompt_param, why),
            Error::ChunkNotFound(id) => Self::chunk_not_found(prompt_param, &id),
            Error::IncompatibleChunks(why) => Self::invalid(prompt_param, why),
            other => Self::internal(other.to_string()),
        }
    }

    /// The body clients read, also sent as an event when a stream fails half way.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_name_the_field() {
        let e = ApiError::rejected(
            Error::InvalidSamplingParams {
                field: "top_p",
                value: "0".into(),
                reason: "must be in (0, 1]",
            },
            "prompt",
        );
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("top_p"));
        assert_eq!(e.message, "top_p = 0: must be in (0, 1]");
        let e = ApiError::rejected(Error::PromptTooLong { len: 9, max: 4 }, "messages");
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert_eq!(e.code, Some("context_length_exceeded"));
        let e = ApiError::rejected(Error::Cuda("lost".into()), "prompt");
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.body()["error"]["type"], "server_error");
    }
}
