//! Text to token ids and back, the ids that end a generation, and conversations as token ids.
//!
//! The `tokenizers` crate reads the same `tokenizer.json` as the Python library. Around it
//! this module adds what a server needs: the set of ids that end a generation (from
//! `tokenizer_config.json`, `generation_config.json`, `config.json`, and the token that closes
//! a turn in the model's chat template), the chat template itself (`chat_template.rs`), a
//! conversation's token ids in which text typed by a user never becomes a control token, and
//! an incremental decoder that streams text without splitting a multi-byte character.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::chat_template::{ChatTemplate, ControlTokens, unmark};
use crate::config::eos_ids;
use crate::error::Error;
use crate::generation_config::GenerationConfig;
use crate::model_files::{read_json, token_text};

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

/// Cloning is cheap enough to hand a server's request tasks their own copy (they tokenize while
/// the engine thread runs steps).
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` with special-token strings read as plain text; made on first use, as only
    /// conversations that contain such strings need it.
    plain: OnceLock<tokenizers::Tokenizer>,
    /// The ids of the tokens `tokenizer.json` marks special, and their strings.
    special_ids: HashSet<u32>,
    control: ControlTokens,
    chat_template: ChatTemplate,
    eos_ids: Vec<u32>,
    path: PathBuf,
}

impl Tokenizer {
    /// Loads `tokenizer.json`, the chat template, and the end-of-sequence ids named by the
    /// folder's config files and its chat template.
    pub fn from_dir(dir: &Path) -> Result<Self, Error> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::model_load(&path, "missing"));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::model_load(&path, e.to_string()))?;
        let tokenizer_config = read_json(&dir.join("tokenizer_config.json"))?;
        let mut eos = Vec::new();
        if let Some(text) = token_text(tokenizer_config.as_ref().and_then(|c| c.get("eos_token")))
            && let Some(id) = inner.token_to_id(&text)
        {
            eos.push(id);
        }
        eos.extend(GenerationConfig::from_dir(dir)?.eos_token_ids);
        if let Some(cfg) = read_json(&dir.join("config.json"))? {
            eos.extend(eos_ids(cfg.get("eos_token_id")));
        }
        let chat_template = ChatTemplate::from_dir(dir, tokenizer_config.as_ref())?;
        let special: Vec<(u32, String)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .collect();
        let mut tokenizer = Self {
            special_ids: special.iter().map(|(id, _)| *id).collect(),
            control: ControlTokens::new(special.into_iter().map(|(_, text)| text)),
            inner,
            plain: OnceLock::new(),
            chat_template,
            eos_ids: Vec::new(),
            path,
        };
        eos.extend(tokenizer.end_of_turn_id());
        eos.sort_unstable();
        eos.dedup();
        tokenizer.eos_ids = eos;
        Ok(tokenizer)
    }

    fn err(&self, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer(format!("{}: {e}", self.path.display()))
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        let enc = self.inner.encode(text, false).map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of `text` with every string read as plain text, special-token strings too.
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>, Error> {
        let plain = self.plain.get_or_init(|| {
            let mut plain = self.inner.clone();
            plain.set_encode_special_tokens(true);
            plain
        });
        let enc = plain.encode(text, false).map_err(|e| self.err(e))?;
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

    /// The model's chat template (ChatML for a folder that has none).
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat_template
    }

    /// A conversation as text, rendered by the model's chat template; with
    /// `add_generation_prompt` it ends with the opening of the assistant's turn. For display
    /// and tests: a prompt for the model is [`Tokenizer::encode_chat`]'s ids, since encoding
    /// this text would turn control-token strings typed by a user into control tokens.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.chat_template
            .render(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// A conversation's token ids: the template's own markers are control tokens, while
    /// special-token strings inside a message's content (a user typing `<|im_end|>`) are
    /// encoded as the plain text they are (`chat_template::user_text` says how).
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, Error> {
        let marked: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage::new(m.role.as_str(), self.control.mark(&m.content)))
            .collect();
        let rendered =
            self.chat_template
                .render(&marked, add_generation_prompt, &serde_json::Map::new())?;
        let (text, typed) = unmark(&rendered);
        let enc = self
            .inner
            .encode(text.as_str(), false)
            .map_err(|e| self.err(e))?;
        let mut typed = typed.into_iter().peekable();
        let mut ids = Vec::with_capacity(enc.len());
        for (&id, &(start, end)) in enc.get_ids().iter().zip(enc.get_offsets()) {
            while typed.next_if(|span| span.end <= start).is_some() {}
            let over_typed = self.special_ids.contains(&id)
                && typed
                    .peek()
                    .is_some_and(|span| start <= span.start && span.end <= end);
            if over_typed {
                ids.extend(self.encode_plain(&text[start..end])?);
            } else {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// The special token that closes a turn in the chat template (`<|im_end|>`, `<|eot_id|>`):
    /// the first token after an assistant message's content. A model whose config files forget
    /// it (Llama 3's first release listed only `<|end_of_text|>`) still stops at the end of its
    /// answer.
    fn end_of_turn_id(&self) -> Option<u32> {
        const PROBE: &str = "\u{F0000}";
        let chat = [
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", PROBE),
        ];
        let text = self.apply_chat_template(&chat, false).ok()?;
        let after = &text[text.find(PROBE)? + PROBE.len()..];
        let first = *self.encode(after).ok()?.first()?;
        self.special_ids.contains(&first).then_some(first)
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
