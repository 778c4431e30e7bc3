//! Reading the small JSON files of a Hugging Face model folder (`tokenizer_config.json`,
//! `generation_config.json`, `config.json`'s extra fields): a missing file is no error, a broken
//! one is, and names the file.

use std::path::Path;

use crate::error::Error;

/// The parsed file, or `None` when the folder has no such file.
pub(crate) fn read_json(path: &Path) -> Result<Option<serde_json::Value>, Error> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::model_load(path, e.to_string()))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::model_load(path, format!("bad JSON: {e}")))
}

/// The content of a special-token field of `tokenizer_config.json`: a string, or an object with
/// a "content" string (`{"content": "<|eot_id|>", "lstrip": false, ...}`).
pub(crate) fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}
