//! `nanoserve chat`: an interactive conversation, plus the chunk API at the prompt.
//!
//! Plain lines are chat turns (the history goes through the chat template). Commands:
//! `/register <system|context|query> <text>`, `/chunks`, `/compose <system> [contexts...] : <query>`,
//! `/infer [text]` (continue the last composition from its K/V blocks), `/stats`, `/clear`,
//! `/reset`, `/exit`. Chunk ids may be abbreviated to any unique prefix.

use std::io::{BufRead, Write};

use clap::Args;
use phase2::ChatMessage;

use super::{ModelArgs, SamplingArgs};
use phase6::Error;
use phase6::Prompt;
use phase6_chunks::{ChunkConfig, ChunkFilter, ChunkType, ChunkedLLM, metadata_map};

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// A system message that opens the conversation
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

const HELP: &str = "chat: type a message. commands:
  /register <system|context|query> <text>   register a chunk (its K/V is prefilled)
  /chunks                                    list chunks
  /compose <system> [contexts...] : <query>  generate from chunks (ids or unique prefixes)
  /infer [text]                              continue the last composition from its K/V
  /stats                                     chunk and cache statistics
  /clear                                     delete every chunk
  /reset                                     forget the conversation
  /exit";

/// One chat session over the chunk API.
pub struct Session {
    pub chunks: ChunkedLLM,
    pub params: phase0::SamplingParams,
    opening: Vec<ChatMessage>,
    history: Vec<ChatMessage>,
}

impl Session {
    pub fn new(chunks: ChunkedLLM, params: phase0::SamplingParams, system: Option<&str>) -> Self {
        let opening: Vec<ChatMessage> = system
            .iter()
            .map(|s| ChatMessage::new("system", *s))
            .collect();
        Self {
            chunks,
            params,
            history: opening.clone(),
            opening,
        }
    }

    fn resolve(&self, prefix: &str) -> Result<String, Error> {
        let all = self.chunks.list_chunks(&ChunkFilter::default());
        let matches: Vec<&str> = all
            .iter()
            .map(|c| c.chunk_id.as_str())
            .filter(|id| id.starts_with(prefix))
            .collect();
        match matches.as_slice() {
            [one] => Ok(one.to_string()),
            [] => Err(Error::ChunkNotFound(prefix.to_string())),
            _ => Err(Error::IncompatibleChunks(format!(
                "{prefix:?} names {} chunks",
                matches.len()
            ))),
        }
    }

    /// Handles one input line and returns what to print (the answer or a command's output).
    pub fn handle(&mut self, line: &str, out: &mut dyn Write) -> Result<bool, Error> {
        let (cmd, rest) = line
            .split_once(' ')
            .map_or((line, ""), |(c, r)| (c, r.trim()));
        match cmd {
            "/exit" | "/quit" => return Ok(false),
            "/help" => writeln!(out, "{HELP}").ok(),
            "/reset" => {
                self.history = self.opening.clone();
                writeln!(out, "(conversation cleared)").ok()
            }
            "/register" => {
                let (kind, text) = rest.split_once(' ').ok_or_else(|| {
                    Error::IncompatibleChunks(
                        "usage: /register <system|context|query> <text>".into(),
                    )
                })?;
                let text = text.replace("\\n", "\n");
                let id = self.chunks.register_chunk(
                    &text,
                    kind.parse::<ChunkType>()?,
                    metadata_map::<String, String>([]),
                )?;
                writeln!(out, "registered {kind} chunk {}", &id[..12]).ok()
            }
            "/chunks" => {
                for c in self.chunks.list_chunks(&ChunkFilter::default()) {
                    let preview: String = c
                        .content_preview
                        .chars()
                        .take(40)
                        .collect::<String>()
                        .replace('\n', " ");
                    writeln!(
                        out,
                        "{}  {:<7} {:>5} tokens  used {}x  {preview}",
                        &c.chunk_id[..12],
                        c.chunk_type,
                        c.token_count,
                        c.access_count
                    )
                    .ok();
                }
                Some(())
            }
            "/compose" => {
                let (ids, query) = rest.split_once(':').ok_or_else(|| {
                    Error::IncompatibleChunks(
                        "usage: /compose <system> [contexts...] : <query>".into(),
                    )
                })?;
                let ids: Vec<String> = ids
                    .split_whitespace()
                    .map(|p| self.resolve(p))
                    .collect::<Result<_, _>>()?;
                let (system, contexts) = ids.split_first().ok_or_else(|| {
                    Error::IncompatibleChunks("a composition needs a system chunk".into())
                })?;
                let query = self.chunks.register_chunk(
                    &query.trim().replace("\\n", "\n"),
                    ChunkType::Query,
                    metadata_map::<String, String>([]),
                )?;
                let refs: Vec<&str> = contexts.iter().map(String::as_str).collect();
                let answer =
                    self.chunks
                        .generate_from_chunks(system, &refs, &query, self.params.clone())?;
                writeln!(
                    out,
                    "{}\n[{} prompt tokens, {} from chunk K/V; {}]",
                    answer.text, answer.prompt_tokens, answer.cached_tokens, answer.finish_reason
                )
                .ok()
            }
            "/infer" => {
                let answer = self
                    .chunks
                    .continue_conversation(&rest.replace("\\n", "\n"), self.params.clone())?;
                writeln!(
                    out,
                    "{}\n[{} prompt tokens, {} from K/V blocks]",
                    answer.text, answer.prompt_tokens, answer.cached_tokens
                )
                .ok()
            }
            "/stats" => {
                let s = self.chunks.get_chunk_stats();
                let c = self.chunks.cascade_stats();
                let pool = self.chunks.llm().engine().scheduler().pool();
                writeln!(
                    out,
                    "chunks {}, chunk K/V {:.1} of {:.1} MiB, hits {} misses {} (hit rate {:.0}%), evictions {}\ncascade: {} steps, {} tokens read once instead of per sequence\nKV pages used {} of {}",
                    s.total_chunks, s.memory_used_mb, s.memory_budget_mb, s.cache_hits, s.cache_misses, 100.0 * s.hit_rate, s.evictions, c.steps, c.tokens_saved, pool.num_used(), pool.num_pages()
                )
                .ok()
            }
            "/clear" => {
                let n = self.chunks.clear_chunks(None);
                writeln!(out, "deleted {n} chunks").ok()
            }
            _ if cmd.starts_with('/') => {
                writeln!(out, "unknown command {cmd}; /help lists them").ok()
            }
            _ => {
                self.history.push(ChatMessage::new("user", line));
                let prompt = self.chunks.llm().encode_chat(&self.history)?;
                let mut answer = String::new();
                let mut stream = self
                    .chunks
                    .llm_mut()
                    .generate_stream(Prompt::Tokens(prompt), self.params.clone())?;
                for piece in stream.by_ref() {
                    let piece = piece?;
                    let _ = write!(out, "{}", piece.text);
                    let _ = out.flush();
                    answer.push_str(&piece.text);
                }
                let _ = writeln!(out);
                self.history
                    .push(ChatMessage::new("assistant", answer.trim_end()));
                Some(())
            }
        };
        Ok(true)
    }
}

pub fn run(args: ChatArgs) -> Result<(), Error> {
    let llm = args.model.load()?;
    let chunks = ChunkedLLM::from_llm(llm, ChunkConfig::default())?;
    let params = args.sampling.params(chunks.llm().generation_config());
    let mut session = Session::new(chunks, params, args.system.as_deref());
    eprintln!("{HELP}");
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        let _ = write!(out, "> ");
        let _ = out.flush();
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| Error::Internal(e.to_string()))?
            == 0
        {
            return Ok(());
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match session.handle(line, &mut out) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => eprintln!("error: {e}"),
        }
    }
}
