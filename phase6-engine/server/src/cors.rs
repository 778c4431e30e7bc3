//! Chapter 6.3: cross-origin access, off unless asked for. A web page may only read a local
//! server's answers (or send it JSON at all: that needs a preflight) when the server names the
//! page's origin; with `--allowed-origin` the server does, for those origins alone.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::routes::AppState;

/// The request's `Origin` when the server allows it (`*` allows every origin).
fn allowed(app: &AppState, req: &Request) -> Option<HeaderValue> {
    let origin = req.headers().get(header::ORIGIN)?;
    let name = origin.to_str().ok()?;
    app.allowed_origins
        .iter()
        .any(|o| o == "*" || o == name)
        .then(|| origin.clone())
}

pub async fn cors(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let Some(origin) = allowed(&app, &req) else {
        return next.run(req).await;
    };
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type, x-request-id"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        r
    } else {
        next.run(req).await
    };
    let h = response.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("x-request-id"),
    );
    h.append(header::VARY, HeaderValue::from_static("origin"));
    response
}
