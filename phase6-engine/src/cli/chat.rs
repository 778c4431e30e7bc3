//! `nanoserve chat`: an interactive conversation that keeps its history.

use std::io::{BufRead, Write};

use clap::Args;
use phase2::ChatMessage;

use super::{ModelArgs, SamplingArgs};
use crate::error::Error;
use crate::prompt::Prompt;

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

const HELP: &str = "commands: /reset (forget the conversation), /exit";

pub fn run(args: ChatArgs) -> Result<(), Error> {
    let mut llm = args.model.load()?;
    let params = args.sampling.params();
    let opening: Vec<ChatMessage> = args
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.as_str()))
        .collect();
    let mut history = opening.clone();
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
        match line {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                history = opening.clone();
                eprintln!("(conversation cleared)");
                continue;
            }
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        let prompt = llm.apply_chat_template(&history)?;
        let mut answer = String::new();
        let mut stream = llm.generate_stream(Prompt::Text(prompt), params.clone())?;
        for piece in stream.by_ref() {
            let piece = piece?;
            let _ = write!(out, "{}", piece.text);
            let _ = out.flush();
            answer.push_str(&piece.text);
        }
        let _ = writeln!(out);
        history.push(ChatMessage::new("assistant", answer.trim_end()));
    }
}
