//! `nanoserve generate`: one prompt streams its text as it is produced; several run as one batch
//! and print in order.

use std::io::Write;

use clap::Args;

use super::{ModelArgs, SamplingArgs};
use phase6::Error;
use phase6::Prompt;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Prompts (each one is a request)
    #[arg(required = true)]
    pub prompts: Vec<String>,
    /// Wrap each prompt in the chat template as a user message
    #[arg(long)]
    pub chat: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: GenerateArgs) -> Result<(), Error> {
    let mut llm = args.model.load()?;
    let params = args.sampling.params(llm.generation_config());
    let prompts: Vec<Prompt> = if args.chat {
        args.prompts
            .iter()
            .map(|p| {
                let user = [phase2::ChatMessage::new("user", p.as_str())];
                llm.encode_chat(&user).map(Prompt::Tokens)
            })
            .collect::<Result<_, _>>()?
    } else {
        args.prompts.iter().cloned().map(Prompt::Text).collect()
    };
    if prompts.len() == 1 {
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{}", args.prompts[0]);
        let mut stream = llm.generate_stream(prompts[0].clone(), params)?;
        for piece in stream.by_ref() {
            let _ = write!(out, "{}", piece?.text);
            let _ = out.flush();
        }
        let reason = stream
            .finish_reason()
            .map(|r| r.to_string())
            .unwrap_or_default();
        let _ = writeln!(out);
        eprintln!("[finished: {reason}]");
        return Ok(());
    }
    let outputs = llm.generate(&prompts, params, true)?;
    for (prompt, out) in args.prompts.iter().zip(outputs) {
        println!(
            "--- {} tokens, {} ---\n{prompt}{}\n",
            out.completion_tokens, out.finish_reason, out.text
        );
    }
    Ok(())
}
