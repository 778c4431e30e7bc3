//! The chunk endpoints, mirroring `ChunkedLLM`: register (`POST /v1/chunks`), list with
//! filters (`GET /v1/chunks?type=context&metadata.source=wiki`), read and delete one
//! (`GET`/`DELETE /v1/chunks/{id}`), generate from a composition (`POST
//! /v1/chunks/generate`, streamed or not) and the store's counters (`GET /v1/chunks/stats`).
//!
//! Registration, listing and deletion are quick calls into the model on the engine thread (a
//! chunk's text is tokenized before, on the request's own task, as a prompt is);
//! a generation from chunks is queued like any other request and shares the batch.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::engine_thread::EnginePrompt;
use crate::openai;
use crate::routes::AppState;
use phase6_chunks::{ChunkFilter, ChunkInfo, ChunkType};
use phase6_http::Counts;
use phase6_openai::{ApiError, Endpoint, JsonBody, PromptInput, kind_of, request};

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn info_json(c: &ChunkInfo) -> Value {
    json!({
        "id": c.chunk_id,
        "object": "chunk",
        "chunk_type": c.chunk_type.as_str(),
        "content_preview": c.content_preview,
        "token_count": c.token_count,
        "metadata": c.metadata,
        "created_at": unix_secs(c.created_at),
        "last_accessed": unix_secs(c.last_accessed),
        "access_count": c.access_count,
    })
}

fn chunk_type(param: &str, s: &str) -> Result<ChunkType, ApiError> {
    s.parse().map_err(|_| {
        ApiError::invalid(
            param,
            format!("{param} = {s:?}: expected system, context or query"),
        )
    })
}

/// The text of a chunk with its token ids (computed on the request's task, like a prompt's),
/// or token ids alone (for text tokenized elsewhere).
enum Content {
    Text(String, Vec<phase0::TokenId>),
    Tokens(Vec<phase0::TokenId>),
}

fn metadata(body: &JsonBody) -> Result<BTreeMap<String, String>, ApiError> {
    let Some(v) = body.raw("metadata") else {
        return Ok(BTreeMap::new());
    };
    let Value::Object(fields) = v else {
        return Err(ApiError::invalid(
            "metadata",
            format!("metadata must be an object, not {}", kind_of(v)),
        ));
    };
    fields
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(ApiError::invalid(
                format!("metadata.{k}"),
                format!("metadata.{k} must be a string, not {}", kind_of(other)),
            )),
        })
        .collect()
}

/// `POST /v1/chunks`: `{"chunk_type", "content" | "token_ids", "metadata"?}`. Registration
/// computes a system prompt's K/V at once; registering the same content again returns the
/// same chunk.
pub async fn register(
    State(app): State<AppState>,
    body: JsonBody,
) -> Result<Json<Value>, ApiError> {
    let kind = match body.get::<String>("chunk_type")? {
        Some(s) => chunk_type("chunk_type", &s)?,
        None => return Err(ApiError::invalid("chunk_type", "chunk_type is required")),
    };
    let content = match (body.get::<String>("content")?, body.raw("token_ids")) {
        (Some(text), None) => {
            let as_content = |e: ApiError| ApiError {
                param: Some("content".into()),
                ..e
            };
            let tokens = app.engine.tokenize(PromptInput::Text(text.clone()));
            let EnginePrompt::Tokens(ids) = tokens.await.map_err(as_content)? else {
                unreachable!("text becomes token ids")
            };
            Content::Text(text, ids)
        }
        (None, Some(Value::Array(ids))) => Content::Tokens(request::token_ids(
            "token_ids",
            ids,
            app.engine.info().vocab_size,
        )?),
        (None, Some(other)) => {
            return Err(ApiError::invalid(
                "token_ids",
                format!("token_ids must be a list, not {}", kind_of(other)),
            ));
        }
        _ => {
            return Err(ApiError::invalid(
                "content",
                "give exactly one of content (text) and token_ids",
            ));
        }
    };
    let param = match content {
        Content::Text(..) => "content",
        Content::Tokens(_) => "token_ids",
    };
    let metadata = metadata(&body)?;
    let info = app
        .engine
        .with_model(move |m| {
            let id = match content {
                Content::Text(text, ids) => m.register_chunk_tokenized(&text, ids, kind, metadata),
                Content::Tokens(ids) => m.register_chunk_tokens(&ids, kind, metadata),
            }?;
            m.get_chunk(&id).map(|c| c.info)
        })
        .await?
        .map_err(|e| ApiError::rejected(e, param))?;
    Ok(Json(info_json(&info)))
}

/// The filter of `GET /v1/chunks`: `type=<kind>` and any number of `metadata.<key>=<value>`.
fn filter(query: Option<&str>) -> Result<ChunkFilter, ApiError> {
    let mut filter = ChunkFilter::default();
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if key == "type" {
            filter.chunk_type = Some(chunk_type("type", &value)?);
        } else if let Some(name) = key.strip_prefix("metadata.") {
            filter.metadata.push((name.to_string(), value.into_owned()));
        } else {
            return Err(ApiError::invalid(
                key.as_ref(),
                format!(
                    "unknown filter {key:?}: use type=<system|context|query> or metadata.<key>=<value>"
                ),
            ));
        }
    }
    Ok(filter)
}

pub async fn list(
    State(app): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let filter = filter(query.as_deref())?;
    let chunks = app
        .engine
        .with_model(move |m| m.list_chunks(&filter))
        .await?;
    let data: Vec<Value> = chunks.iter().map(info_json).collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

fn chunk_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(id)| id)
        .map_err(|r| ApiError::invalid("id", r.body_text()))
}

pub async fn get(
    State(app): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = chunk_id(path)?;
    let lookup = id.clone();
    let chunk = app
        .engine
        .with_model(move |m| m.get_chunk(&lookup))
        .await?
        .map_err(|_| ApiError::chunk_not_found("id", &id))?;
    let mut v = info_json(&chunk.info);
    v["content"] = json!(chunk.content);
    Ok(Json(v))
}

/// Pages of the chunk go back to the pool, except while a running request still reads them.
pub async fn delete(
    State(app): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = chunk_id(path)?;
    let lookup = id.clone();
    app.engine
        .with_model(move |m| m.delete_chunk(&lookup))
        .await?
        .map_err(|_| ApiError::chunk_not_found("id", &id))?;
    Ok(Json(json!({"id": id, "object": "chunk", "deleted": true})))
}

/// `POST /v1/chunks/generate`: `{"system_id", "context_ids", "query_id"}` and the fields of
/// `/v1/completions`; answers as `/v1/completions` does, with the prompt tokens served from
/// chunk K/V in `usage.prompt_tokens_details.cached_tokens`.
pub async fn generate(
    State(app): State<AppState>,
    Extension(counts): Extension<Counts>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let req = request::chunk_generation(&body, app.engine.info(), &app.request_limits)?;
    openai::generate(&app, req, Endpoint::Completions, counts).await
}

pub async fn stats(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    let s = app.engine.with_model(|m| m.get_chunk_stats()).await?;
    Ok(Json(json!({
        "object": "chunk_stats",
        "total_chunks": s.total_chunks,
        "memory_used_mb": s.memory_used_mb,
        "memory_budget_mb": s.memory_budget_mb,
        "cache_hits": s.cache_hits,
        "cache_misses": s.cache_misses,
        "hit_rate": s.hit_rate,
        "evictions": s.evictions,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_read_from_the_query_string() {
        let f = filter(Some("type=context&metadata.source=act%201&metadata.k=v")).unwrap();
        assert_eq!(f.chunk_type, Some(ChunkType::Context));
        assert_eq!(
            f.metadata,
            vec![
                ("source".to_string(), "act 1".to_string()),
                ("k".to_string(), "v".to_string())
            ]
        );
        assert_eq!(filter(None).unwrap(), ChunkFilter::default());
        let typo = filter(Some("tpye=query")).unwrap_err();
        assert_eq!(typo.param.as_deref(), Some("tpye"));
        let bad = filter(Some("type=preface")).unwrap_err();
        assert_eq!(bad.param.as_deref(), Some("type"));
    }
}
