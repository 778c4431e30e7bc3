//! `nanoserve serve`: the OpenAI-compatible HTTP server (see `phase6::server`). The model is
//! built on the engine thread; the HTTP side runs on a tokio runtime made here.

use clap::Args;

use super::ModelArgs;
use phase6::Error;
use phase6_server::{EngineHandle, ServeOptions, Server};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on every endpoint but /health
    #[arg(long)]
    pub api_key: Option<String>,
    /// The model name clients send and /v1/models lists [default: the model folder's name]
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Largest request body accepted, in bytes (larger ones get 413)
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

impl ServeArgs {
    fn model_name(&self) -> String {
        if let Some(name) = &self.served_model_name {
            return name.clone();
        }
        let path = match (&self.model.config, self.model.random_weights) {
            (Some(config), true) => config.with_extension(""),
            _ => self.model.model_dir(),
        };
        path.file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    }
}

/// Completes at the first Ctrl-C: the server stops accepting and finishes what is in flight.
/// A second Ctrl-C exits at once.
async fn stop_on_ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        // No signal handler could be installed: serve until the process is killed.
        std::future::pending::<()>().await;
    }
    eprintln!("stopping: finishing the requests in flight (Ctrl-C again quits now)");
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
}

pub fn run(args: ServeArgs) -> Result<(), Error> {
    let options = ServeOptions {
        model_name: args.model_name(),
        api_key: args.api_key.clone(),
        max_body_bytes: args.max_body_bytes,
    };
    let model = args.model.clone();
    let engine = EngineHandle::spawn(move || model.load())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_io()
        .thread_name("nano-http")
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the async runtime: {e}")))?;
    let (host, port) = (args.host.as_str(), args.port);
    runtime.block_on(async {
        let name = options.model_name.clone();
        let server = Server::bind((host, port), engine, options)
            .await
            .map_err(|e| Error::InvalidConfig(format!("cannot listen on {host}:{port}: {e}")))?;
        let addr = server
            .local_addr()
            .map_err(|e| Error::Internal(e.to_string()))?;
        eprintln!("serving {name} at http://{addr}/v1 (also /health, /metrics); Ctrl-C stops");
        server
            .run_until(stop_on_ctrl_c())
            .await
            .map_err(|e| Error::Internal(format!("server: {e}")))?;
        eprintln!("stopped: every request in flight was answered");
        Ok(())
    })
}
