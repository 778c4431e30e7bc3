//! Text to token ids and back, end-of-sequence ids, and the chat template's role markers.
//!
//! The `tokenizers` crate reads the same `tokenizer.json` as the Python library. Around it
//! this module adds what a server needs: the set of ids that end a generation (from
//! `tokenizer_config.json`, `generation_config.json` and `config.json`), a ChatML template
//! (`<|im_start|>role\ncontent<|im_end|>\n`, the format of Qwen models and of the tiny model),
//! and an incremental decoder that streams text without splitting a multi-byte character.

use std::path::{Path, PathBuf};

use crate::config::eos_ids;
use crate::error::Error;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_ids: Vec<u32>,
    path: PathBuf,
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>, Error> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::model_load(path, e.to_string()))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::model_load(path, format!("bad JSON: {e}")))
}

/// The content of a special-token field: a string, or an object with a "content" string.
fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` and the end-of-sequence ids named by the folder's config files.
    pub fn from_dir(dir: &Path) -> Result<Self, Error> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::model_load(&path, "missing"));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::model_load(&path, e.to_string()))?;
        let mut eos = Vec::new();
        if let Some(cfg) = read_json(&dir.join("tokenizer_config.json"))?
            && let Some(text) = token_text(cfg.get("eos_token"))
            && let Some(id) = inner.token_to_id(&text)
        {
            eos.push(id);
        }
        for file in ["generation_config.json", "config.json"] {
            if let Some(cfg) = read_json(&dir.join(file))? {
                eos.extend(eos_ids(cfg.get("eos_token_id")));
            }
        }
        eos.sort_unstable();
        eos.dedup();
        Ok(Self {
            inner,
            eos_ids: eos,
            path,
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer(format!("{}: {e}", self.path.display()))
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        let enc = self.inner.encode(text, false).map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, Error> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| self.err(e))
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Ids that end a generation unless `ignore_eos` is set.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Renders a conversation in ChatML; with `add_generation_prompt` it ends with the opening
    /// of the assistant's turn, so the model writes the answer.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> String {
        let mut s = String::new();
        for m in messages {
            s.push_str(&format!(
                "<|im_start|>{}\n{}<|im_end|>\n",
                m.role, m.content
            ));
        }
        if add_generation_prompt {
            s.push_str("<|im_start|>assistant\n");
        }
        s
    }
}

/// Incremental detokenisation: a byte-level BPE token may hold half of a UTF-8 character, so
/// the text of the new tokens is emitted only once it decodes cleanly (no U+FFFD at its end).
/// Decoding a short window before the new tokens keeps leading spaces right.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// Tokens before this index have been emitted.
    read: usize,
    skip_special: bool,
}

impl StreamDecoder {
    pub fn new(skip_special: bool) -> Self {
        Self {
            skip_special,
            ..Self::default()
        }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, Error> {
        self.ids.push(id);
        let before = tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let now = tokenizer.decode(&self.ids[self.prefix..], self.skip_special)?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.starts_with(&before) {
            let piece = now[before.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(piece)
        } else {
            Ok(String::new())
        }
    }
}
