//! The engine thread: one OS thread owns the model and runs the step loop; HTTP handlers
//! reach it only through [`Command`]s on a channel.
//!
//! A thread of its own, because a step is long and CPU-bound (or waits on the GPU) and must
//! not stall the async runtime, and because the model may hold handles bound to the thread
//! that made them (a CUDA context): it is built on this thread and never leaves it. The loop
//! sleeps on the channel while there is no work; otherwise it takes every waiting command,
//! aborts the requests whose clients left, runs one step and hands each request its new
//! tokens. The tokens come through the engine's per-request stream channels, so a command
//! that steps the engine itself (registering a chunk prefills it) loses none.
//!
//! A request is answered twice: once on a oneshot channel when it is admitted or refused
//! (so an HTTP handler can still choose the status code), then with a stream of
//! [`GenEvent`]s. Dropping that stream's receiver is how a handler says the client is gone.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::thread;
use std::time::Instant;

use phase0::{SamplingParams, SeqId, TokenId};
use phase5::StreamEvent;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::oneshot;

use crate::active::{Active, Ended};
use crate::stats::{Counters, EngineStats};
use crate::stop::StopStrings;
use phase2::Tokenizer;
use phase6::{Device, Error, LogprobDriver, Logprobs, Prompt, TokenLogprobs};
use phase6_chunks::{ChunkConfig, ChunkLLM, ChunkType, ChunkedLLM, Composition};
use phase6_openai::request::fit_to_context;
use phase6_openai::{Admitted, ApiError, EngineInfo, Finish, PromptInput};

/// What the HTTP side may ask of the engine. Each variant that expects an answer carries
/// the channel to send it on.
pub enum Command {
    Generate(GenerateJob),
    Stats(oneshot::Sender<EngineStats>),
    /// A quick call into the model between two steps (the chunk endpoints): the closure
    /// sends its own answer.
    Run(Box<dyn FnOnce(&mut ChunkedLLM) + Send>),
    /// Ends every request in flight with this error (the end of a shutdown's grace period).
    AbortAll(ApiError),
}

/// A prompt as the engine thread takes it: already token ids (text and chats are tokenized by
/// the request's own task, [`EngineHandle::tokenize`]), or chunks to compose.
#[derive(Clone)]
pub enum EnginePrompt {
    Tokens(Vec<TokenId>),
    Chunks(Composition),
}

pub struct GenerateJob {
    pub request: Submit,
    pub admitted: oneshot::Sender<Result<Admitted, ApiError>>,
    pub events: UnboundedSender<GenEvent>,
}

/// What an admitted request receives, in order: deltas, then `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// New text (possibly empty while a character or a possible stop string is incomplete)
    /// and the token that produced it (`None` for held-back text released at the end), with
    /// its log-probabilities when the request asked for them.
    Delta {
        text: String,
        token: Option<TokenId>,
        logprobs: Option<TokenLogprobs>,
    },
    Finished {
        reason: Finish,
        completion_tokens: usize,
    },
    Failed(ApiError),
}

/// A request for the engine thread ([`EngineHandle::submit`]).
pub struct Submit {
    pub prompt: EnginePrompt,
    /// The request field the prompt came from, for error messages.
    pub param: &'static str,
    pub params: SamplingParams,
    /// Whether the client set `max_tokens` (see `phase6_openai::request::fit_to_context`).
    pub max_tokens_set: bool,
    pub stop: Vec<String>,
    /// Log-probabilities of each token and of this many alternatives.
    pub logprobs: Option<usize>,
}

/// An admitted request: its id, prompt size and the stream of its events.
pub struct Generation {
    pub admitted: Admitted,
    pub events: UnboundedReceiver<GenEvent>,
}

/// The HTTP side's end of the engine thread; clones share the one thread. The thread stops
/// when the last handle is dropped.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    info: Arc<EngineInfo>,
    /// The model's tokenizer, for the request tasks (`None`: prompts must be token ids).
    tokenizer: Option<Arc<Tokenizer>>,
    alive: Arc<AtomicBool>,
}

/// Clears the flag when the engine thread ends, however it ends.
struct AliveFlag(Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

fn stopped() -> ApiError {
    ApiError::unavailable("the engine has stopped")
}

impl EngineHandle {
    /// Starts the engine thread, builds the model on it with `build`, and returns once the
    /// model is ready (or with the error that kept it from loading).
    pub fn spawn<F>(build: F) -> Result<Self, Error>
    where
        F: FnOnce() -> Result<ChunkLLM, Error> + Send + 'static,
    {
        let (commands, inbox) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let alive = Arc::new(AtomicBool::new(true));
        let flag = AliveFlag(alive.clone());
        thread::Builder::new()
            .name("nano-engine".into())
            .spawn(move || {
                let _flag = flag;
                let model =
                    build().and_then(|llm| ChunkedLLM::from_llm(llm, ChunkConfig::default()));
                match model {
                    Ok(mut model) => {
                        // Log-probabilities need the logits on the host: the CPU runner's.
                        let logprobs = (model.llm().device() == Device::Cpu).then(|| {
                            let logprobs = Logprobs::default();
                            let driver = LogprobDriver::new(logprobs.clone());
                            model.llm_mut().set_driver(Box::new(driver));
                            logprobs
                        });
                        let llm = model.llm();
                        let pool = llm.kv_pool();
                        let info = EngineInfo {
                            max_model_len: llm.config().max_model_len,
                            kv_capacity_tokens: pool.num_pages() * pool.page_size(),
                            vocab_size: llm.model_config().vocab_size,
                            generation_config: llm.generation_config().clone(),
                            logprobs: logprobs.is_some(),
                        };
                        let tokenizer = llm.tokenizer().cloned();
                        let _ = ready_tx.send(Ok((info.clone(), tokenizer)));
                        EngineLoop::new(model, info, logprobs, inbox).run();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the engine thread: {e}")))?;
        let (info, tokenizer) = ready_rx.recv().map_err(|_| {
            Error::Internal("the engine thread ended while loading the model".into())
        })??;
        Ok(Self {
            commands,
            info: Arc::new(info),
            tokenizer: tokenizer.map(Arc::new),
            alive,
        })
    }

    /// The model's tokenizer, where it has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_deref()
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Sends a command that carries a reply channel and waits for the reply.
    pub async fn call<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())
    }

    /// Token ids of a text or chat prompt, computed on a blocking thread of the runtime: a
    /// megabyte of text keeps the tokenizer busy for hundreds of milliseconds, which neither
    /// the engine's steps nor the server's other connections should wait for.
    pub async fn tokenize(&self, prompt: PromptInput) -> Result<EnginePrompt, ApiError> {
        let param = prompt.param();
        let rejected = |e: phase2::Error| ApiError::rejected(Error::from(e), param);
        let text_or_chat = match prompt {
            PromptInput::Tokens(ids) => return Ok(EnginePrompt::Tokens(ids)),
            PromptInput::Chunks(c) => return Ok(EnginePrompt::Chunks(c)),
            other => other,
        };
        let Some(tokenizer) = self.tokenizer.clone() else {
            return Err(ApiError::rejected(Error::no_tokenizer(), param));
        };
        let ids = tokio::task::spawn_blocking(move || match text_or_chat {
            PromptInput::Text(text) => tokenizer.encode(&text),
            PromptInput::Chat(messages) => tokenizer.encode_chat(&messages, true),
            PromptInput::Tokens(_) | PromptInput::Chunks(_) => unreachable!("returned above"),
        })
        .await
        .map_err(|e| ApiError::rejected(Error::Internal(format!("tokenizer task: {e}")), param))?
        .map_err(rejected)?;
        Ok(EnginePrompt::Tokens(ids))
    }

    /// Queues a request whose prompt is tokenized ([`EngineHandle::tokenize`]); returns once
    /// the engine admitted it, or with why it did not.
    pub async fn submit(&self, job: Submit) -> Result<Generation, ApiError> {
        let (events_tx, events) = unbounded_channel();
        let admitted = self
            .call(|admitted| {
                Command::Generate(GenerateJob {
                    request: job,
                    admitted,
                    events: events_tx,
                })
            })
            .await??;
        Ok(Generation { admitted, events })
    }

    /// Ends every request in flight with `why`: streams get it as their last event.
    pub fn abort_all(&self, why: ApiError) {
        let _ = self.commands.send(Command::AbortAll(why));
    }

    pub async fn stats(&self) -> Result<EngineStats, ApiError> {
        self.call(Command::Stats).await
    }

    /// Runs `f` on the model between two steps and returns what it returned.
    pub async fn with_model<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&mut ChunkedLLM) -> T + Send + 'static,
    {
        self.call(|reply| {
            Command::Run(Box::new(move |model| {
                let _ = reply.send(f(model));
            }))
        })
        .await
    }
}

/// A request the engine took: what the client is told, and the engine's channel of its tokens.
struct Queued {
    admitted: Admitted,
    tokens: Receiver<StreamEvent>,
}

/// Every chunk of a composition exists and plays its part (the error names the field);
/// returns the composition's length in tokens, known before any K/V is computed.
fn check_composition(model: &ChunkedLLM, c: &Composition) -> Result<usize, ApiError> {
    let mut total = 0;
    let parts = std::iter::once((
        "system_id".to_string(),
        &c.system_id,
        ChunkType::SystemPrompt,
    ))
    .chain(
        c.context_ids
            .iter()
            .enumerate()
            .map(|(i, id)| (format!("context_ids[{i}]"), id, ChunkType::Context)),
    )
    .chain(std::iter::once((
        "query_id".to_string(),
        &c.query_id,
        ChunkType::Query,
    )));
    for (param, id, want) in parts {
        let chunk = model
            .get_chunk(id)
            .map_err(|_| ApiError::chunk_not_found(&param, id))?;
        if chunk.info.chunk_type != want {
            return Err(ApiError::invalid(
                param.clone(),
                format!(
                    "{param}: chunk {id} is a {} chunk, not a {want} chunk",
                    chunk.info.chunk_type
                ),
            ));
        }
        total += chunk.info.token_count;
    }
    Ok(total)
}

struct EngineLoop {
    model: ChunkedLLM,
    info: EngineInfo,
    inbox: Receiver<Command>,
    active: HashMap<SeqId, Active>,
    counters: Counters,
    /// Where the driver keeps log-probabilities (`None`: the backend gives none).
    logprobs: Option<Logprobs>,
}

impl EngineLoop {
    fn new(
        model: ChunkedLLM,
        info: EngineInfo,
        logprobs: Option<Logprobs>,
        inbox: Receiver<Command>,
    ) -> Self {
        Self {
            model,
            info,
            logprobs,
            inbox,
            active: HashMap::new(),
            counters: Counters::new(Instant::now()),
        }
    }

    fn run(mut self) {
        loop {
            if self.model.llm().is_finished() {
                match self.inbox.recv() {
                    Ok(command) => self.handle(command),
                    Err(_) => return,
                }
            }
            loop {
                match self.inbox.try_recv() {
                    Ok(command) => self.handle(command),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            self.drop_departed();
            if !self.model.llm().is_finished()
                && let Err(e) = self.model.llm_mut().step()
            {
                self.step_failed(e);
            }
            self.forward();
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Generate(job) => self.admit(job),
            Command::Stats(reply) => {
                let _ = reply.send(self.counters.snapshot(&self.model, Instant::now()));
            }
            Command::Run(f) => f(&mut self.model),
            Command::AbortAll(why) => self.end_all(why),
        }
    }

    /// Checks the prompt against the context and the pool (or builds the composition) and
    /// queues the request.
    fn queue(
        &mut self,
        prompt: EnginePrompt,
        param: &'static str,
        mut params: SamplingParams,
        max_tokens_set: bool,
    ) -> Result<Queued, ApiError> {
        let rejected = |e| ApiError::rejected(e, param);
        let info = &self.info;
        let ids = match prompt {
            EnginePrompt::Chunks(composition) => {
                let len = check_composition(&self.model, &composition)?;
                fit_to_context(&mut params, max_tokens_set, len, info, param)?;
                let q = self
                    .model
                    .add_request_from_chunks(&composition, params)
                    .map_err(rejected)?;
                return Ok(Queued {
                    admitted: Admitted {
                        id: q.id,
                        prompt_tokens: q.prompt_tokens,
                        cached_tokens: Some(q.cached_tokens),
                    },
                    tokens: q.events,
                });
            }
            EnginePrompt::Tokens(ids) => ids,
        };
        let prompt_tokens = ids.len();
        fit_to_context(&mut params, max_tokens_set, prompt_tokens, info, param)?;
        let (id, tokens) = self
            .model
            .llm_mut()
            .add_request_streaming(Prompt::Tokens(ids), params)
            .map_err(rejected)?;
        Ok(Queued {
            admitted: Admitted {
                id,
                prompt_tokens,
                cached_tokens: None,
            },
            tokens,
        })
    }

    fn admit(&mut self, job: GenerateJob) {
        let r = job.request;
        match self.queue(r.prompt, r.param, r.params, r.max_tokens_set) {
            Err(e) => {
                self.counters.rejected();
                let _ = job.admitted.send(Err(e));
            }
            Ok(Queued { admitted, tokens }) => {
                self.counters.admitted(admitted.prompt_tokens);
                if job.admitted.send(Ok(admitted)).is_err() {
                    self.model.llm_mut().abort(admitted.id);
                    self.counters.ended(Ended::ClientGone);
                    return;
                }
                let stops = StopStrings::new(r.stop);
                let logprobs = r.logprobs.and_then(|top| {
                    let handle = self.logprobs.clone()?;
                    handle.want(admitted.id, top);
                    Some(handle)
                });
                self.active.insert(
                    admitted.id,
                    Active::new(admitted.id, tokens, job.events, stops, logprobs),
                );
            }
        }
    }

    fn end(&mut self, id: SeqId, how: Ended) {
        if let Some(a) = self.active.remove(&id) {
            a.forget();
        }
        if how.needs_abort() {
            self.model.llm_mut().abort(id);
        }
        self.counters.ended(how);
    }

    /// Aborts the requests whose clients disconnected: their pages come back now.
    fn drop_departed(&mut self) {
        let gone: Vec<SeqId> = self
            .active
            .iter()
            .filter(|(_, a)| a.is_gone())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.end(id, Ended::ClientGone);
        }
    }

    /// Hands every request the tokens the engine produced for it.
    fn forward(&mut self) {
        let tokenizer = self.model.llm().tokenizer();
        let mut ended = Vec::new();
        let mut produced = 0;
        for (id, a) in &mut self.active {
            let before = a.completion_tokens();
            if let Some(how) = a.forward(tokenizer) {
                ended.push((*id, how));
            }
            produced += a.completion_tokens() - before;
        }
        self.counters.generated(produced, Instant::now());
        for (id, how) in ended {
            self.end(id, how);
        }
    }

    /// A step failed. Out of KV memory (admission keeps any one request within the pool, so
    /// only requests sharing it can get here), the newest request ends alone, as vLLM's
    /// scheduler would preempt it, and the others go on. Any other failure cannot be pinned
    /// on one request, so every request in flight ends with the error and gives its pages
    /// back; the loop itself goes on.
    fn step_failed(&mut self, e: Error) {
        if let Error::OutOfMemory(why) = &e
            && let Some(&newest) = self.active.keys().max()
        {
            eprintln!("nanoserve: out of KV memory ({why}); ending request {newest}");
            if let Some(a) = self.active.get(&newest) {
                a.fail(ApiError::unavailable(format!("out of KV memory: {why}")));
            }
            self.end(newest, Ended::Failed);
            return;
        }
        eprintln!(
            "nanoserve: engine step failed ({e}); ending the {} requests in flight",
            self.active.len()
        );
        self.end_all(ApiError::internal(format!("engine step failed: {e}")));
    }

    /// Ends every request in flight with `err` and gives their pages back.
    fn end_all(&mut self, err: ApiError) {
        for (id, a) in std::mem::take(&mut self.active) {
            a.fail(err.clone());
            a.forget();
            self.model.llm_mut().abort(id);
            self.counters.ended(Ended::Failed);
        }
    }
}
