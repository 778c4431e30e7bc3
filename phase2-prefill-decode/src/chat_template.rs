//! Chapter 2: a conversation laid out the way the model was trained to read one, by the model's
//! own chat template.
//!
//! A chat model learned its turns in one exact layout: ChatML's
//! `<|im_start|>user\n...<|im_end|>\n` for Qwen, `<|start_header_id|>user<|end_header_id|>\n\n
//! ...<|eot_id|>` for Llama 3, each with its own system prompt rules and generation prompt.
//! The layout ships with the model as a Jinja template, `chat_template` in
//! `tokenizer_config.json` (a string, or a list of `{name, template}` of which "default" is
//! used) or a `chat_template.jinja` file beside it, which wins, as in `transformers`. This
//! module renders it as `transformers`' `apply_chat_template` does; a folder without a
//! template gets ChatML.

mod environment;
mod tojson;
mod user_text;

use std::path::Path;

use minijinja::{Environment, Value};

use crate::error::Error;
use crate::model_files::token_text;
use crate::tokenizer::ChatMessage;
use environment::{Raised, environment};
pub(crate) use user_text::{ControlTokens, unmark};

/// The layout of a model that ships no template: ChatML, which the embedded model was trained
/// on.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
                      message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}\
                      {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The special-token names `transformers` hands every template (from `tokenizer_config.json`).
const SPECIAL_TOKEN_NAMES: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// A model's chat template, checked to compile, with the special tokens it may print.
#[derive(Clone)]
pub struct ChatTemplate {
    source: String,
    env: Environment<'static>,
    special_tokens: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// The template of a model folder: `chat_template.jinja`, else `chat_template` in
    /// `tokenizer_config` (the parsed `tokenizer_config.json`), else ChatML. Special tokens
    /// come from `tokenizer_config` either way.
    pub fn from_dir(
        dir: &Path,
        tokenizer_config: Option<&serde_json::Value>,
    ) -> Result<Self, Error> {
        let file = dir.join("chat_template.jinja");
        let config_path = dir.join("tokenizer_config.json");
        let (source, origin) = if file.exists() {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Error::model_load(&file, e.to_string()))?;
            (text, file)
        } else {
            match tokenizer_config.and_then(|c| c.get("chat_template")) {
                Some(field) => (named_default(field, &config_path)?, config_path),
                None => (CHATML.to_string(), config_path),
            }
        };
        let special_tokens = SPECIAL_TOKEN_NAMES
            .iter()
            .filter_map(|&name| Some((name, token_text(tokenizer_config?.get(name))?)))
            .collect();
        Self::new(source, special_tokens).map_err(|e| Error::model_load(origin, e))
    }

    fn new(source: String, special_tokens: Vec<(&'static str, String)>) -> Result<Self, String> {
        let env = environment();
        env.template_from_str(&source)
            .map_err(|e| format!("chat template does not compile: {e}"))?;
        Ok(Self {
            source,
            env,
            special_tokens,
        })
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. With `add_generation_prompt` the text ends with the opening of
    /// the assistant's turn, so the model writes the answer. `kwargs` are the extra variables
    /// some templates read (`enable_thinking` for Qwen3, `date_string` for Llama 3.1); they
    /// take precedence over the special tokens, as in `transformers`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, Error> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_iter([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let mut context: Vec<(&str, Value)> = vec![
            ("messages", Value::from(messages)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        for (name, text) in &self.special_tokens {
            context.push((name, Value::from(text.as_str())));
        }
        for (name, value) in kwargs {
            context.push((name, Value::from_serialize(value)));
        }
        self.env
            .template_from_str(&self.source)
            .and_then(|t| t.render(Value::from_iter(context)))
            .map_err(render_error)
    }
}

/// A `chat_template` field: the template itself, or the one named "default" of a list.
fn named_default(field: &serde_json::Value, path: &Path) -> Result<String, Error> {
    if let Some(text) = field.as_str() {
        return Ok(text.to_string());
    }
    let named = field.as_array().ok_or_else(|| {
        Error::model_load(
            path,
            "chat_template must be a string or a list of {name, template}",
        )
    })?;
    named
        .iter()
        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
        .and_then(|t| t.get("template")?.as_str())
        .map(String::from)
        .ok_or_else(|| Error::model_load(path, "chat_template lists no template named \"default\""))
}

/// A rendering failure as the caller should read it: the template's own words when it called
/// `raise_exception` (the conversation does not fit the model), else minijinja's account.
fn render_error(e: minijinja::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(Raised(message)) = s.downcast_ref::<Raised>() {
            return Error::Tokenizer(format!(
                "the model's chat template refused the conversation: {message}"
            ));
        }
        source = s.source();
    }
    Error::Tokenizer(format!("chat template: {e}"))
}
