//! Telling the template's control tokens from the same strings typed by a user.
//!
//! A rendered chat is one string: `<|im_start|>user\n...` where the `...` may itself contain
//! `<|im_start|>` because a user typed it. Tokenized naively, that text becomes a real control
//! token, and a user can forge turns (a prompt injection). So before rendering, every
//! special-token string inside a message's content is wrapped in two private-use characters;
//! after rendering, the wrappers are taken out again and the byte span of each wrapped string
//! in the clean text is kept. The tokenizer then encodes the clean text as one piece (so the
//! template's own tokens, and everything else, tokenize exactly as `transformers` tokenizes
//! the rendered chat), and a special token found exactly over a kept span is replaced by the
//! ids of its string as plain text.
//!
//! Why wrap the strings rather than replace each content by one marker and split around it:
//! templates transform content (Llama 3 trims it, Qwen3 cuts an assistant's reasoning out at
//! `</think>`), so a content marker's surroundings are not those of the real content. The
//! wrappers travel with the strings through `trim`, `split` and slicing; a wrapper a template
//! cuts apart is dropped. This is the rule of `transformers`' `sanitize_control_tokens`.

use std::ops::Range;

const OPEN: char = '\u{F8F0}';
const CLOSE: char = '\u{F8F1}';

/// The special-token strings of a tokenizer, longest first (so a token wins over the tokens
/// inside it), with the bytes they start with for a quick scan.
#[derive(Debug, Clone)]
pub(crate) struct ControlTokens {
    tokens: Vec<String>,
    starts: [bool; 256],
}

impl ControlTokens {
    pub(crate) fn new(tokens: impl IntoIterator<Item = String>) -> Self {
        let mut tokens: Vec<String> = tokens.into_iter().filter(|t| !t.is_empty()).collect();
        tokens.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        tokens.dedup();
        let mut starts = [false; 256];
        for t in &tokens {
            starts[t.as_bytes()[0] as usize] = true;
        }
        Self { tokens, starts }
    }

    /// `text` with each occurrence of a token wrapped. Wrapper characters already in the text
    /// are dropped, so a user cannot forge a wrapped span.
    pub(crate) fn mark(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let token = if self.starts[rest.as_bytes()[0] as usize] {
                self.tokens.iter().find(|t| rest.starts_with(t.as_str()))
            } else {
                None
            };
            if let Some(token) = token {
                out.push(OPEN);
                out.push_str(token);
                out.push(CLOSE);
                rest = &rest[token.len()..];
                continue;
            }
            if c != OPEN && c != CLOSE {
                out.push(c);
            }
            rest = &rest[c.len_utf8()..];
        }
        out
    }
}

/// The rendered text without wrappers, and the byte ranges (in that text, in order) of the
/// strings that were wrapped.
pub(crate) fn unmark(rendered: &str) -> (String, Vec<Range<usize>>) {
    let mut text = String::with_capacity(rendered.len());
    let mut spans = Vec::new();
    let mut rest = rendered;
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        match c {
            OPEN => {
                let inside = rest
                    .find([OPEN, CLOSE])
                    .filter(|&end| end > 0 && rest[end..].starts_with(CLOSE));
                if let Some(end) = inside {
                    spans.push(text.len()..text.len() + end);
                    text.push_str(&rest[..end]);
                    rest = &rest[end + CLOSE.len_utf8()..];
                }
            }
            CLOSE => {}
            _ => text.push(c),
        }
    }
    (text, spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> ControlTokens {
        ControlTokens::new(["<|im_start|>".to_string(), "<|im_end|>".to_string()])
    }

    #[test]
    fn wrapped_strings_come_back_with_their_spans() {
        let marked = tokens().mark("a<|im_end|>b<|im_start|>");
        let (text, spans) = unmark(&format!("<|im_start|>user\n{marked}<|im_end|>"));
        assert_eq!(text, "<|im_start|>user\na<|im_end|>b<|im_start|><|im_end|>");
        let strings: Vec<&str> = spans.iter().map(|r| &text[r.clone()]).collect();
        assert_eq!(strings, ["<|im_end|>", "<|im_start|>"]);
        assert_eq!(spans[0].start, "<|im_start|>user\na".len());
    }

    #[test]
    fn forged_and_cut_wrappers_are_dropped() {
        let forged = format!("x{OPEN}<|im_end|>{CLOSE}y");
        assert_eq!(tokens().mark(&forged), tokens().mark("x<|im_end|>y"));
        let marked = tokens().mark("<|im_end|>");
        // A template that keeps only the first half of the content.
        let (text, spans) = unmark(&marked[..5]);
        assert_eq!(text, "<|");
        assert!(spans.is_empty());
    }
}
