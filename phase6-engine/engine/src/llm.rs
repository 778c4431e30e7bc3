//! `LLM`: the engine's public API, in the shape nano-vllm and vLLM users know.
//!
//! `generate` takes prompts (text or token ids) and sampling params (one for all, or one per
//! prompt) and returns one output per prompt, in order. The step API (`add_request`, `step`,
//! `is_finished`, `abort`) exposes the loop underneath for callers that interleave requests,
//! and `generate_stream` yields text as it is produced. Everything runs on the continuous-
//! batching engine of chapter 5, over the CPU runner (`LLM::new`) or any runner a later
//! chapter hands to `LLM::from_runner`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use phase0::{SamplingParams, SeqId, TokenId};
use phase2::{ChatMessage, GenerationConfig, ModelConfig, ModelRunner, Tokenizer, Weights};
use phase5::{Batching, Engine, FinishedRequest, SchedulerConfig, StepOutput, StreamEvent};

use crate::config::{Config, Device, KvCacheDtype};
use crate::driver::{OneStepAtATime, StepDriver};
use crate::error::Error;
use crate::prompt::{Output, ParamsList, Prompt};
use crate::runner::{Runner, cpu_runner};
use crate::stream::TokenStream;

/// What `LLM::step` returns: the requests that finished (id, generated ids) and the signed
/// token count of the step.
pub type StepResult = (Vec<(SeqId, Vec<TokenId>)>, isize);

/// The engine with its tokenizer and config. `R` is the runner's type: any runner by default;
/// a later chapter that needs more of its runner names a narrower trait object.
pub struct LLM<R: ?Sized + ModelRunner = dyn ModelRunner> {
    engine: Engine<Box<R>>,
    driver: Box<dyn StepDriver<R>>,
    tokenizer: Option<Tokenizer>,
    generation_config: GenerationConfig,
    config: Config,
    model_config: ModelConfig,
    device: Device,
    startup: String,
    /// Requests that finished while `generate` or a stream was stepping for its own requests:
    /// they belong to the next `step` caller.
    held: Vec<FinishedRequest>,
}

impl LLM {
    /// Loads a Hugging Face model folder (config, safetensors, tokenizer, generation config)
    /// and starts the engine.
    pub fn new(model_dir: impl AsRef<Path>, config: Config) -> Result<Self, Error> {
        let dir = model_dir.as_ref();
        config.validate()?;
        let model_config = ModelConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::open(dir)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        let mut llm = Self::with_weights(model_config, &weights, Some(tokenizer), config)?;
        llm.set_generation_config(GenerationConfig::from_dir(dir)?);
        Ok(llm)
    }

    /// Starts the engine on weights at hand (e.g. random weights of a published
    /// architecture) on the CPU; without a tokenizer, prompts must be token ids.
    pub fn with_weights(
        model_config: ModelConfig,
        weights: &Weights,
        tokenizer: Option<Tokenizer>,
        config: Config,
    ) -> Result<Self, Error> {
        config.validate()?;
        config.validate_for(&model_config)?;
        if config.tensor_parallel_size > 1 {
            return Err(Error::InvalidConfig(format!(
                "tensor_parallel_size = {}: LLM::new runs one CPU runner; a tensor-parallel \
                 runner is started with LLM::from_runner",
                config.tensor_parallel_size
            )));
        }
        if config.kv_cache_dtype != KvCacheDtype::Auto {
            return Err(Error::InvalidConfig(format!(
                "kv_cache_dtype = {}: LLM::new runs the f32 CPU runner; the FP8 runner is \
                 started with LLM::from_runner",
                config.kv_cache_dtype
            )));
        }
        if let Device::Cuda(n) = config.device {
            return Err(Error::Cuda(format!(
                "cuda:{n} asked for, but LLM::new runs the CPU runner: the CUDA runner is \
                 started by `nanoserve` built with `--features cuda`"
            )));
        }
        let Runner {
            runner,
            device,
            report,
        } = cpu_runner(model_config.clone(), weights, &config)?;
        Self::from_runner(
            Runner {
                runner: runner as Box<dyn ModelRunner>,
                device,
                report,
            },
            model_config,
            tokenizer,
            config,
        )
    }
}

impl<R: ?Sized + ModelRunner> LLM<R> {
    /// Starts the engine over a runner built by the caller; steps run one at a time until
    /// [`LLM::set_driver`] says otherwise.
    pub fn from_runner(
        runner: Runner<R>,
        model_config: ModelConfig,
        tokenizer: Option<Tokenizer>,
        mut config: Config,
    ) -> Result<Self, Error> {
        config.validate()?;
        config.validate_for(&model_config)?;
        config.max_model_len = config
            .max_model_len
            .min(model_config.max_position_embeddings);
        let mut eos = model_config.eos_token_ids.clone();
        if let Some(t) = &tokenizer {
            eos.extend_from_slice(t.eos_token_ids());
        }
        eos.sort_unstable();
        eos.dedup();
        let scheduler = SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_num_seqs: config.max_num_seqs,
            chunk_size: config.chunked_prefill_size,
            enable_prefix_caching: config.enable_prefix_caching,
            batching: Batching::Continuous,
            max_model_len: config.max_model_len,
        };
        let seed = config.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let startup = format!(
            "{}; {} parameters; max_model_len {}",
            runner.report,
            model_config.num_parameters(),
            config.max_model_len
        );
        let engine = Engine::new(runner.runner, scheduler, eos, seed)?;
        Ok(Self {
            engine,
            driver: Box::new(OneStepAtATime),
            tokenizer,
            generation_config: GenerationConfig::default(),
            device: runner.device,
            config,
            model_config,
            startup,
            held: Vec::new(),
        })
    }

    /// Replaces how steps are run (see [`StepDriver`]); call it before the first request.
    pub fn set_driver(&mut self, driver: Box<dyn StepDriver<R>>) {
        self.driver = driver;
    }

    /// The model's `generation_config.json`, whose sampling values are the defaults of requests
    /// that set none (empty until set: [`LLM::new`] reads the folder's).
    pub fn set_generation_config(&mut self, generation_config: GenerationConfig) {
        self.generation_config = generation_config;
    }

    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation_config
    }

    /// The params of a request that sets nothing: the engine's defaults with the model's
    /// `generation_config.json` values in their place (vLLM's `get_default_sampling_params`).
    pub fn default_sampling_params(&self) -> SamplingParams {
        self.generation_config.default_sampling_params()
    }

    /// What the engine took at start: device, KV pages and tokens, memory.
    pub fn startup_report(&self) -> &str {
        &self.startup
    }

    /// The config in force (`max_model_len` clamped to the model).
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.model_config
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    pub fn engine(&self) -> &Engine<Box<R>> {
        &self.engine
    }

    pub fn engine_mut(&mut self) -> &mut Engine<Box<R>> {
        &mut self.engine
    }

    /// The engine's KV pages, for K/V a caller keeps outside any request (the chunk API keeps
    /// registered chunks there): allocate from it and give back what you took.
    pub fn kv_pool(&self) -> &phase1::KvPool {
        self.engine.scheduler().pool()
    }

    pub fn kv_pool_mut(&mut self) -> &mut phase1::KvPool {
        self.engine.scheduler_mut().pool_mut()
    }

    /// One step of the engine, through the driver.
    fn run_step(&mut self) -> Result<StepOutput, Error> {
        Ok(self.driver.step(&mut self.engine)?)
    }

    /// No request waiting or running, and no step in flight.
    fn idle(&self) -> bool {
        self.engine.is_finished() && !self.driver.in_flight()
    }

    fn require_tokenizer(&self) -> Result<&Tokenizer, Error> {
        self.tokenizer.as_ref().ok_or_else(Error::no_tokenizer)
    }

    /// Token ids of a prompt.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<TokenId>, Error> {
        match prompt {
            Prompt::Tokens(ids) => Ok(ids.clone()),
            Prompt::Text(text) => Ok(self.require_tokenizer()?.encode(text)?),
        }
    }

    /// Text of generated ids (special tokens left out); empty without a tokenizer.
    pub fn decode(&self, ids: &[TokenId]) -> Result<String, Error> {
        match &self.tokenizer {
            Some(t) => Ok(t.decode(ids, true)?),
            None => Ok(String::new()),
        }
    }

    /// A conversation rendered by the model's chat template, ending with the opening of the
    /// assistant's turn: for display. The prompt of a chat request is [`LLM::encode_chat`].
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, Error> {
        Ok(self
            .require_tokenizer()?
            .apply_chat_template(messages, true)?)
    }

    /// A conversation's prompt ids, ending with the opening of the assistant's turn; control
    /// tokens typed inside a message are text, not markers (see `phase2::Tokenizer::encode_chat`).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<TokenId>, Error> {
        Ok(self.require_tokenizer()?.encode_chat(messages, true)?)
    }

    /// Queues a request; it runs in the next steps.
    pub fn add_request(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
    ) -> Result<SeqId, Error> {
        let ids = self.encode(&prompt.into())?;
        Ok(self.engine.add_request(ids, params)?)
    }

    /// Queues a request and returns a channel of its tokens and finish reason.
    pub fn add_request_streaming(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
    ) -> Result<(SeqId, Receiver<StreamEvent>), Error> {
        let ids = self.encode(&prompt.into())?;
        Ok(self.engine.add_request_streaming(ids, params)?)
    }

    /// Runs one step. Returns the requests that finished (id and generated ids) and the number
    /// of tokens processed: positive for a step with prefill, negative for a decode-only step
    /// (nano-vllm's convention, which its throughput display relies on).
    pub fn step(&mut self) -> Result<StepResult, Error> {
        // BEGIN SOLUTION
        let mut finished: Vec<(SeqId, Vec<TokenId>)> =
            self.held.drain(..).map(|f| (f.id, f.output)).collect();
        if self.idle() {
            return Ok((finished, 0));
        }
        let out = self.run_step()?;
        let num_tokens = if out.num_prefill_tokens > 0 {
            (out.num_prefill_tokens + out.num_decode_tokens) as isize
        } else {
            -(out.num_decode_tokens as isize)
        };
        finished.extend(out.finished.into_iter().map(|f| (f.id, f.output)));
        Ok((finished, num_tokens))
        // END SOLUTION
    }

    /// Runs one step and returns everything it did (tokens, finished requests with timings).
    pub fn step_output(&mut self) -> Result<StepOutput, Error> {
        self.run_step()
    }

    /// True when no request is waiting or running (and none is held for `step`).
    pub fn is_finished(&self) -> bool {
        self.idle() && self.held.is_empty()
    }

    /// Cancels a request; its pages come back. False if it is unknown or already finished.
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.engine.abort(id).is_some()
    }

    /// The output of a finished request, with its text.
    pub fn output_of(&self, f: &FinishedRequest) -> Result<Output, Error> {
        Ok(Output {
            text: self.decode(&f.output)?,
            token_ids: f.output.clone(),
            finish_reason: f.reason,
            prompt_tokens: f.prompt_len,
            completion_tokens: f.output.len(),
        })
    }

    /// Steps the engine for one caller's requests; other finished requests are held for `step`.
    pub fn step_for(
        &mut self,
        mine: &HashMap<SeqId, usize>,
    ) -> Result<(StepOutput, Vec<FinishedRequest>), Error> {
        // BEGIN SOLUTION
        let mut out = self.run_step()?;
        let (own, others): (Vec<_>, Vec<_>) = out
            .finished
            .drain(..)
            .partition(|f| mine.contains_key(&f.id));
        self.held.extend(others);
        Ok((out, own))
        // END SOLUTION
    }

    /// Generates a completion for every prompt and returns them in prompt order. With
    /// `use_progress`, a progress bar shows finished prompts and prefill/decode tokens/s.
    pub fn generate<P: Into<Prompt> + Clone>(
        &mut self,
        prompts: &[P],
        params: impl Into<ParamsList>,
        use_progress: bool,
    ) -> Result<Vec<Output>, Error> {
        let params = params.into().expand(prompts.len())?;
        let mut mine: HashMap<SeqId, usize> = HashMap::new();
        for (i, (p, sp)) in prompts.iter().zip(params).enumerate() {
            match self.add_request(p.clone(), sp) {
                Ok(id) => {
                    mine.insert(id, i);
                }
                Err(e) => {
                    for id in mine.keys() {
                        self.engine.abort(*id);
                    }
                    return Err(match e {
                        Error::EmptyPrompt { .. } => Error::EmptyPrompt { index: i },
                        other => other,
                    });
                }
            }
        }
        let bar = if use_progress {
            let bar = ProgressBar::with_draw_target(
                Some(prompts.len() as u64),
                ProgressDrawTarget::stderr(),
            );
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}] {msg}")
                    .expect("valid template"),
            );
            bar
        } else {
            ProgressBar::hidden()
        };
        let mut results: Vec<Option<Output>> = vec![None; prompts.len()];
        let mut remaining = prompts.len();
        let (mut prefill_rate, mut decode_rate) = (0.0, 0.0);
        while remaining > 0 {
            let t = Instant::now();
            let (out, own) = self.step_for(&mine)?;
            let secs = t.elapsed().as_secs_f64().max(1e-9);
            if out.num_prefill_tokens > 0 {
                prefill_rate = (out.num_prefill_tokens + out.num_decode_tokens) as f64 / secs;
            } else {
                decode_rate = out.num_decode_tokens as f64 / secs;
            }
            bar.set_message(format!(
                "prefill {prefill_rate:.0} tok/s, decode {decode_rate:.0} tok/s"
            ));
            for f in own {
                results[mine[&f.id]] = Some(self.output_of(&f)?);
                remaining -= 1;
                bar.inc(1);
            }
        }
        bar.finish();
        Ok(results
            .into_iter()
            .map(|o| o.expect("every prompt finished"))
            .collect())
    }

    /// A stream of a request already queued (e.g. one over existing K/V blocks).
    pub fn stream_existing(&mut self, id: SeqId) -> Result<TokenStream<'_, R>, Error> {
        let rx = self.engine.subscribe(id).ok_or(Error::UnknownRequest(id))?;
        Ok(TokenStream::new(self, id, rx))
    }

    /// Queues one prompt and returns an iterator over its text as it is produced.
    pub fn generate_stream(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
    ) -> Result<TokenStream<'_, R>, Error> {
        let (id, rx) = self.add_request_streaming(prompt, params)?;
        Ok(TokenStream::new(self, id, rx))
    }
}
