//! The optional API key: with `--api-key`, every endpoint but `/health` wants
//! `Authorization: Bearer <key>` and answers 401 without it. The key is compared in time
//! that does not depend on where the first wrong byte is.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::routes::AppState;
use phase6_openai::ApiError;

/// Equal contents, compared without an early exit.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn require_api_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = &app.api_key else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token);
    match given {
        Some(g) if same(g.trim().as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::unauthorized("incorrect API key").into_response(),
        None => {
            ApiError::unauthorized("missing API key: send the header `Authorization: Bearer <key>`")
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn keys_compare_by_content_and_length() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(same(b"", b""));
    }
}
