//! `nanoserve serve`: the OpenAI-compatible HTTP server (see `phase6::server`). The model is
//! built on the engine thread; the HTTP side runs on a tokio runtime made here.

use std::time::Duration;

use clap::Args;

use super::ModelArgs;
use phase6::Error;
use phase6_server::{
    AccessLog, Drained, EngineHandle, Limits, RequestLimits, ServeOptions, Server,
};

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
    /// A web origin whose pages may call the server (repeat for more; `*` for any); none by
    /// default, so no web page can read the server's answers
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Largest request body accepted, in bytes (larger ones get 413)
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Connections served at once; more wait to be accepted
    #[arg(long, default_value_t = Limits::default().max_connections, value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u32).range(1..), |n| n as usize))]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers (after connecting or after the
    /// previous answer, so it also closes idle connections)
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's body once its headers came (408 after)
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout: u64,
    /// Seconds a client may accept no byte of an answer before its connection is dropped
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: u64,
    /// Seconds the requests in flight may run after SIGINT or SIGTERM; the rest then end
    /// with an error
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..))]
    pub shutdown_grace: u64,
    /// Stop strings one request may give
    #[arg(long, default_value_t = RequestLimits::default().max_stop_strings)]
    pub max_stop_strings: usize,
    /// Bytes of one stop string
    #[arg(long, default_value_t = RequestLimits::default().max_stop_string_bytes)]
    pub max_stop_string_bytes: usize,
    /// Context chunks one /v1/chunks/generate may compose
    #[arg(long, default_value_t = RequestLimits::default().max_context_ids)]
    pub max_context_ids: usize,
    /// Choices one request may ask for per prompt (`n`)
    #[arg(long, default_value_t = RequestLimits::default().max_n)]
    pub max_n: usize,
    /// Prompts in one /v1/completions request (a list of prompts)
    #[arg(long, default_value_t = RequestLimits::default().max_prompts)]
    pub max_prompts: usize,
    /// Write no access-log line (one per request on stderr by default)
    #[arg(long)]
    pub disable_access_log: bool,
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

/// Completes at the first SIGINT or SIGTERM: the server stops accepting and finishes what is
/// in flight. A second signal exits at once.
async fn stop_on_signal(grace: Duration) {
    phase6_http::stop_signal().await;
    eprintln!(
        "stopping: finishing the requests in flight for up to {grace:?} (a second signal quits now)"
    );
    tokio::spawn(async {
        phase6_http::stop_signal().await;
        std::process::exit(130);
    });
}

pub fn run(args: ServeArgs) -> Result<(), Error> {
    let options = ServeOptions {
        model_name: args.model_name(),
        api_key: args.api_key.clone(),
        max_body_bytes: args.max_body_bytes,
        allowed_origins: args.allowed_origins.clone(),
        access_log: if args.disable_access_log {
            AccessLog::off()
        } else {
            AccessLog::stderr()
        },
        body_timeout: Duration::from_secs(args.body_timeout),
        requests: RequestLimits {
            max_stop_strings: args.max_stop_strings,
            max_stop_string_bytes: args.max_stop_string_bytes,
            max_context_ids: args.max_context_ids,
            max_n: args.max_n,
            max_prompts: args.max_prompts,
        },
        limits: Limits {
            max_connections: args.max_connections,
            header_timeout: Duration::from_secs(args.header_timeout),
            idle_timeout: Duration::from_secs(args.idle_timeout),
            shutdown_grace: Duration::from_secs(args.shutdown_grace),
        },
    };
    let options_grace = options.limits.shutdown_grace;
    let model = args.model.clone();
    let engine = EngineHandle::spawn(move || model.load())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
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
        let grace = options_grace;
        let drained = server
            .run_until(stop_on_signal(grace))
            .await
            .map_err(|e| Error::Internal(format!("server: {e}")))?;
        match drained {
            Drained::InTime => eprintln!("stopped: every request in flight was answered"),
            Drained::AtDeadline => {
                eprintln!("stopped: the requests still running after {grace:?} ended with an error")
            }
        }
        Ok(())
    })
}
