//! The chunk API: register reusable pieces of context once, compose them per request.
//!
//! Agents and RAG systems send the same system prompt and documents again and again with a new
//! question. `ChunkedLLM` keeps each registered piece (a *chunk*) with its token ids and K/V
//! pages, and builds a request as a list of KV segments: the system prompt's, each context's,
//! then the request's own pages for the query and the answer. Nothing is re-tokenized and only
//! what is new is computed. Requests of a batch that share segments are attended with cascade
//! attention (see [`crate::cascade`]). Two composition modes (docs/ARCHITECTURE.md, "The chunk
//! API"): `Exact` output equals plain generation of the same tokens; `Independent` reuses each
//! chunk's own K/V anywhere.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::{Duration, SystemTime};

use phase0::{SamplingParams, SeqId, TokenId};
use phase1::BlockTable;
use phase5::{FinishedRequest, StreamEvent};
use sha2::{Digest, Sha256};

use phase2::{ModelConfig, Tokenizer, Weights};
use phase6::{Error, LLM, ParamsList, Prompt, TokenStream};

use crate::ChunkRunner;
use crate::cascade::CascadeStats;
use crate::cpu::chunk_cpu_runner;
use crate::store::{ChainNode, ChunkStore, Item, StoredChunk};
use crate::types::{
    Chunk, ChunkConfig, ChunkFilter, ChunkInfo, ChunkOutput, ChunkStats, ChunkType, Composition,
    CompositionMode, CompositionPreview, KvBlocks,
};

/// A request over existing K/V pages: the segments it reads (holders added while it runs, so
/// only its own pages are freed when it ends) and the tokens to compute after them.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualSequence {
    pub blocks: KvBlocks,
    pub new_tokens: Vec<TokenId>,
}

impl VirtualSequence {
    /// Every token of the sequence: those of the blocks, then the new ones.
    pub fn prompt(&self) -> Vec<TokenId> {
        let mut p = self.blocks.tokens.clone();
        p.extend_from_slice(&self.new_tokens);
        p
    }
}

/// A generation from chunks that is queued in the engine (see
/// [`ChunkedLLM::add_request_from_chunks`]).
#[derive(Debug)]
pub struct QueuedFromChunks {
    pub id: SeqId,
    /// Its tokens as they are produced, then its finish reason.
    pub events: Receiver<StreamEvent>,
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from chunks.
    pub cached_tokens: usize,
}

/// The engine of chapter 6.1 over a [`ChunkRunner`], with the chunk store on top.
pub type ChunkLLM = LLM<dyn ChunkRunner>;

pub struct ChunkedLLM {
    llm: ChunkLLM,
    config: ChunkConfig,
    store: ChunkStore,
    hits: u64,
    misses: u64,
    /// The last composition or inference, kept as blocks for `/infer`-style continuation. It
    /// holds one holder of each of its pages.
    conversation: Option<KvBlocks>,
    registrations: u64,
}

/// Loads a model folder and starts the engine on the CPU chunk runner ([`crate::CascadeCpuRunner`]).
pub fn cpu_chunk_llm(
    model_dir: impl AsRef<Path>,
    config: phase6::Config,
) -> Result<ChunkLLM, Error> {
    let dir = model_dir.as_ref();
    let model_config = ModelConfig::from_file(&dir.join("config.json"))?;
    let weights = Weights::open(dir)?;
    let tokenizer = Tokenizer::from_dir(dir)?;
    let runner = chunk_cpu_runner(model_config.clone(), &weights, &config)?;
    LLM::from_runner(runner, model_config, Some(tokenizer), config)
}

fn chunk_hash(chunk_type: ChunkType, content: &[u8], salt: Option<u64>) -> String {
    let mut h = Sha256::new();
    h.update(chunk_type.as_str().as_bytes());
    h.update([0u8]);
    h.update(content);
    if let Some(s) = salt {
        h.update(s.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl ChunkedLLM {
    /// Loads a model folder and starts the engine with the chunk API on top.
    pub fn new(model_dir: impl AsRef<Path>, config: ChunkConfig) -> Result<Self, Error> {
        let llm = cpu_chunk_llm(model_dir, config.engine.clone())?;
        Self::from_llm(llm, config)
    }

    /// The chunk API over an engine that is already running.
    pub fn from_llm(llm: ChunkLLM, config: ChunkConfig) -> Result<Self, Error> {
        if !(config.chunk_memory_ratio > 0.0 && config.chunk_memory_ratio <= 1.0) {
            return Err(Error::InvalidConfig(format!(
                "chunk_memory_ratio = {}: must be in (0, 1]",
                config.chunk_memory_ratio
            )));
        }
        if config.max_chunks == 0 {
            return Err(Error::InvalidConfig("max_chunks must be at least 1".into()));
        }
        Ok(Self {
            llm,
            config,
            store: ChunkStore::default(),
            hits: 0,
            misses: 0,
            conversation: None,
            registrations: 0,
        })
    }

    pub fn llm(&self) -> &ChunkLLM {
        &self.llm
    }

    pub fn llm_mut(&mut self) -> &mut ChunkLLM {
        &mut self.llm
    }

    pub fn config(&self) -> &ChunkConfig {
        &self.config
    }

    /// What cascade planning found in the steps run so far.
    pub fn cascade_stats(&self) -> CascadeStats {
        self.llm.engine().runner().cascade_stats()
    }

    fn pool(&mut self) -> &mut phase1::KvPool {
        self.llm.kv_pool_mut()
    }

    fn page_size(&self) -> usize {
        self.llm.kv_pool().page_size()
    }

    fn budget_pages(&self) -> usize {
        let pages = self.llm.kv_pool().num_pages();
        (pages as f64 * self.config.chunk_memory_ratio as f64) as usize
    }

    /// Makes room for `pages` more pages (and one more chunk when `new_chunk`), evicting least
    /// recently used chunk K/V that is not pinned.
    fn make_room(
        &mut self,
        pages: usize,
        new_chunk: bool,
        pinned: &HashSet<Item>,
    ) -> Result<(), Error> {
        let (budget, max) = (self.budget_pages(), self.config.max_chunks);
        let mut store = std::mem::take(&mut self.store);
        let ok = store.make_room(self.pool(), pages, budget, new_chunk, max, pinned);
        self.store = store;
        if ok {
            Ok(())
        } else {
            Err(Error::OutOfMemory(format!(
                "chunk K/V needs {pages} more pages; {} of the {budget}-page chunk budget are held by chunks in use",
                self.store.pages_held()
            )))
        }
    }

    /// Runs requests to the end (they batch together) and returns them in order.
    fn run(
        &mut self,
        requests: Vec<(Vec<TokenId>, SamplingParams, Vec<BlockTable>, bool)>,
    ) -> Result<Vec<FinishedRequest>, Error> {
        let mut mine = std::collections::HashMap::new();
        for (i, (prompt, params, shared, keep)) in requests.into_iter().enumerate() {
            match self
                .llm
                .engine_mut()
                .add_request_with_kv(prompt, params, shared, keep)
            {
                Ok(id) => {
                    mine.insert(id, i);
                }
                Err(e) => {
                    for id in mine.keys() {
                        self.llm.abort(*id);
                    }
                    return Err(e.into());
                }
            }
        }
        let mut done: Vec<Option<FinishedRequest>> = vec![None; mine.len()];
        let mut remaining = mine.len();
        while remaining > 0 {
            let (_, own) = self.llm.step_for(&mine)?;
            for f in own {
                let i = mine[&f.id];
                done[i] = Some(f);
                remaining -= 1;
            }
        }
        Ok(done
            .into_iter()
            .map(|f| f.expect("every request finished"))
            .collect())
    }

    /// Computes `tokens`' K/V after `shared` segments, into pages of its own that the store
    /// keeps (a prefill whose single sampled token is thrown away).
    fn prefill_segment(
        &mut self,
        prefix: Vec<TokenId>,
        shared: Vec<BlockTable>,
    ) -> Result<BlockTable, Error> {
        let params = SamplingParams::greedy()
            .with_max_tokens(1)
            .with_ignore_eos(true);
        let done = self.run(vec![(prefix, params, shared, true)])?;
        done.into_iter()
            .next()
            .and_then(|f| f.kv)
            .ok_or_else(|| Error::Internal("a chunk prefill returned no K/V".into()))
    }

    /// Registers a chunk and returns its id (hex SHA-256 of type and content). Registration is
    /// prefill: a system prompt's K/V (and in independent mode a context's) is computed now.
    pub fn register_chunk(
        &mut self,
        content: &str,
        chunk_type: ChunkType,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, Error> {
        let id = chunk_hash(chunk_type, content.as_bytes(), None);
        self.register(id, content, None, chunk_type, metadata)
    }

    /// [`ChunkedLLM::register_chunk`] for text whose tokens the caller already has (what the
    /// model's tokenizer gives for `content`): the same chunk and id, but no tokenizing here, so
    /// a caller that owns this model on a busy thread can tokenize on another.
    pub fn register_chunk_tokenized(
        &mut self,
        content: &str,
        tokens: Vec<TokenId>,
        chunk_type: ChunkType,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, Error> {
        let id = chunk_hash(chunk_type, content.as_bytes(), None);
        self.register(id, content, Some(tokens), chunk_type, metadata)
    }

    /// Registers a chunk given as token ids (for models without a tokenizer, or text that was
    /// tokenized elsewhere); its id hashes the type and the ids.
    pub fn register_chunk_tokens(
        &mut self,
        tokens: &[TokenId],
        chunk_type: ChunkType,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, Error> {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let id = chunk_hash(chunk_type, &bytes, None);
        let content = match self.llm.tokenizer() {
            Some(t) => t.decode(tokens, false)?,
            None => format!("<{} tokens>", tokens.len()),
        };
        self.register(id, &content, Some(tokens.to_vec()), chunk_type, metadata)
    }

    /// Stores a chunk under `id` (a fresh id when deduplication is off and `id` is taken),
    /// tokenizing its content unless its tokens are given, and computes its own K/V now if it
    /// has any: a system prompt always, a context in independent mode.
    fn register(
        &mut self,
        mut id: String,
        content: &str,
        tokens: Option<Vec<TokenId>>,
        chunk_type: ChunkType,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, Error> {
        // BEGIN SOLUTION
        if self.store.chunks.contains_key(&id) {
            if self.config.enable_deduplication {
                self.store.touch(&id);
                return Ok(id);
            }
            self.registrations += 1;
            id = chunk_hash(chunk_type, id.as_bytes(), Some(self.registrations));
        }
        let tokens = match tokens {
            Some(t) => t,
            None => self.llm.encode(&Prompt::Text(content.to_string()))?,
        };
        if tokens.is_empty() {
            return Err(Error::IncompatibleChunks(
                "a chunk needs some content".into(),
            ));
        }
        if tokens.len() >= self.llm.config().max_model_len {
            return Err(Error::PromptTooLong {
                len: tokens.len(),
                max: self.llm.config().max_model_len - 1,
            });
        }
        self.make_room(0, true, &HashSet::new())?;
        let now = SystemTime::now();
        let info = ChunkInfo {
            chunk_id: id.clone(),
            chunk_type,
            content_preview: content.chars().take(80).collect(),
            token_count: tokens.len(),
            metadata,
            created_at: now,
            last_accessed: now,
            access_count: 0,
        };
        let last_used = self.store.tick();
        self.store.chunks.insert(
            id.clone(),
            StoredChunk {
                info,
                content: content.to_string(),
                tokens,
                kv: None,
                last_used,
            },
        );
        // A system prompt always starts at position 0; in independent mode a context's own
        // K/V is reused anywhere. Exact contexts and queries are computed in place.
        let own_kv = matches!(
            (chunk_type, self.config.mode),
            (ChunkType::SystemPrompt, _) | (ChunkType::Context, CompositionMode::Independent)
        );
        if own_kv
            && let Err(e) = self.compute_own_kv(&id, &HashSet::from([Item::Chunk(id.clone())]))
        {
            let mut store = std::mem::take(&mut self.store);
            store.remove_chunk(self.pool(), &id);
            self.store = store;
            return Err(e);
        }
        Ok(id)
        // END SOLUTION
    }

    fn compute_own_kv(&mut self, id: &str, pinned: &HashSet<Item>) -> Result<(), Error> {
        let tokens = self.store.chunks[id].tokens.clone();
        self.make_room(tokens.len().div_ceil(self.page_size()), false, pinned)?;
        let kv = self.prefill_segment(tokens, Vec::new())?;
        self.store.chunks.get_mut(id).expect("pinned chunk").kv = Some(kv);
        Ok(())
    }

    fn chunk_of(&self, id: &str, want: ChunkType) -> Result<&StoredChunk, Error> {
        let c = self
            .store
            .chunks
            .get(id)
            .ok_or_else(|| Error::ChunkNotFound(id.to_string()))?;
        if c.info.chunk_type != want {
            return Err(Error::IncompatibleChunks(format!(
                "chunk {id} is a {} chunk where a {want} chunk is needed",
                c.info.chunk_type
            )));
        }
        Ok(c)
    }

    /// Every chunk of a composition exists and has the right type.
    fn check(&self, c: &Composition) -> Result<(), Error> {
        self.chunk_of(&c.system_id, ChunkType::SystemPrompt)?;
        for id in &c.context_ids {
            self.chunk_of(id, ChunkType::Context)?;
        }
        self.chunk_of(&c.query_id, ChunkType::Query)?;
        Ok(())
    }

    /// The chain key of context `j` of a composition (exact mode) or of its shifted copy
    /// (independent mode).
    fn chain_key(&self, c: &Composition, j: usize, offset: usize) -> Vec<String> {
        match self.config.mode {
            CompositionMode::Exact => std::iter::once(&c.system_id)
                .chain(&c.context_ids[..=j])
                .cloned()
                .collect(),
            CompositionMode::Independent => vec![format!("@{offset}"), c.context_ids[j].clone()],
        }
    }

    /// The segments of a composition (computing what is missing) and its prompt tokens:
    /// system, contexts and query.
    fn build(
        &mut self,
        c: &Composition,
        pinned: &mut HashSet<Item>,
    ) -> Result<(Vec<BlockTable>, Vec<TokenId>), Error> {
        // BEGIN SOLUTION
        self.check(c)?;
        pinned.insert(Item::Chunk(c.system_id.clone()));
        pinned.extend(c.context_ids.iter().map(|id| Item::Chunk(id.clone())));
        pinned.insert(Item::Chunk(c.query_id.clone()));

        if self.store.chunks[&c.system_id].kv.is_none() {
            self.misses += 1;
            self.compute_own_kv(&c.system_id, pinned)?;
        } else {
            self.hits += 1;
        }
        self.store.touch(&c.system_id);
        let system = &self.store.chunks[&c.system_id];
        let mut segments = vec![system.kv.clone().expect("computed above")];
        let mut tokens = system.tokens.clone();

        for j in 0..c.context_ids.len() {
            let ctx_id = c.context_ids[j].clone();
            self.store.touch(&ctx_id);
            let key = self.chain_key(c, j, tokens.len());
            pinned.insert(Item::Chain(key.clone()));
            let ctx_tokens = self.store.chunks[&ctx_id].tokens.clone();
            if self.store.chains.contains_key(&key) {
                self.hits += 1;
                let now = self.store.tick();
                self.store.chains.get_mut(&key).expect("present").last_used = now;
            } else {
                self.misses += 1;
                let kv = match self.config.mode {
                    CompositionMode::Exact => {
                        // This context after exactly this prefix: prefill it on the segments.
                        self.make_room(ctx_tokens.len().div_ceil(self.page_size()), false, pinned)?;
                        let mut prefix = tokens.clone();
                        prefix.extend_from_slice(&ctx_tokens);
                        self.prefill_segment(prefix, segments.clone())?
                    }
                    CompositionMode::Independent => {
                        // The context's own K/V, keys turned to where it now starts.
                        if self.store.chunks[&ctx_id].kv.is_none() {
                            self.compute_own_kv(&ctx_id, pinned)?;
                        }
                        let own = self.store.chunks[&ctx_id]
                            .kv
                            .clone()
                            .expect("computed above");
                        self.make_room(own.pages().len(), false, pinned)?;
                        let mut moved = BlockTable::new();
                        moved
                            .append_tokens(self.pool(), own.num_tokens())
                            .map_err(phase2::Error::from)?;
                        let shift = tokens.len() as i64;
                        if let Err(e) = self
                            .llm
                            .engine_mut()
                            .runner_mut()
                            .copy_kv(&own, &moved, shift)
                        {
                            moved.release(self.pool()).map_err(phase2::Error::from)?;
                            return Err(e.into());
                        }
                        moved
                    }
                };
                let last_used = self.store.tick();
                let depends_on = key
                    .iter()
                    .filter(|k| !k.starts_with('@'))
                    .cloned()
                    .collect();
                self.store.chains.insert(
                    key.clone(),
                    ChainNode {
                        kv,
                        depends_on,
                        last_used,
                    },
                );
            }
            segments.push(self.store.chains[&key].kv.clone());
            tokens.extend_from_slice(&ctx_tokens);
        }
        self.store.touch(&c.query_id);
        tokens.extend_from_slice(&self.store.chunks[&c.query_id].tokens);
        Ok((segments, tokens))
        // END SOLUTION
    }

    fn output(
        &self,
        f: &FinishedRequest,
        cached: usize,
        chunk_ids: Vec<String>,
    ) -> Result<ChunkOutput, Error> {
        Ok(ChunkOutput {
            text: self.llm.decode(&f.output)?,
            token_ids: f.output.clone(),
            finish_reason: f.reason,
            prompt_tokens: f.prompt_len,
            cached_tokens: cached,
            completion_tokens: f.output.len(),
            chunk_ids,
        })
    }

    /// Replaces the kept conversation; `own` is already ours, the shared pages get a holder.
    fn keep_conversation(
        &mut self,
        mut segments: Vec<BlockTable>,
        own: Option<BlockTable>,
        tokens: Vec<TokenId>,
    ) {
        // Hold the new segments before letting go of the old conversation: they may be its.
        for seg in &segments {
            for &p in seg.pages() {
                self.pool().share(p).expect("segments in use are allocated");
            }
        }
        self.drop_conversation();
        segments.extend(own);
        self.conversation = Some(KvBlocks { segments, tokens });
    }

    fn drop_conversation(&mut self) {
        if let Some(c) = self.conversation.take() {
            for seg in &c.segments {
                self.pool()
                    .free_all(seg.pages())
                    .expect("the conversation holds its pages once");
            }
        }
    }

    /// Generates from one composition; its K/V is kept as the conversation.
    pub fn generate_from_chunks(
        &mut self,
        system_id: &str,
        context_ids: &[&str],
        query_id: &str,
        params: SamplingParams,
    ) -> Result<ChunkOutput, Error> {
        let comp = Composition::new(system_id, context_ids, query_id);
        let mut pinned = HashSet::new();
        let (segments, tokens) = self.build(&comp, &mut pinned)?;
        let cached: usize = segments.iter().map(BlockTable::num_tokens).sum();
        let f = self
            .run(vec![(tokens.clone(), params, segments.clone(), true)])?
            .pop()
            .expect("one request");
        let out = self.output(&f, cached, comp_ids(&comp))?;
        let mut all = tokens;
        all.extend_from_slice(&f.output);
        self.keep_conversation(segments, f.kv, all);
        Ok(out)
    }

    /// Generates from several compositions in one batch: requests sharing a system prompt or
    /// contexts read those pages through cascade attention.
    pub fn batch_generate_from_chunks(
        &mut self,
        compositions: &[Composition],
        params: impl Into<ParamsList>,
    ) -> Result<Vec<ChunkOutput>, Error> {
        let params = params.into().expand(compositions.len())?;
        let mut pinned = HashSet::new();
        let mut requests = Vec::new();
        let mut cached = Vec::new();
        for (c, p) in compositions.iter().zip(params) {
            let (segments, tokens) = self.build(c, &mut pinned)?;
            cached.push(segments.iter().map(BlockTable::num_tokens).sum());
            requests.push((tokens, p, segments, false));
        }
        let done = self.run(requests)?;
        done.iter()
            .zip(compositions)
            .zip(cached)
            .map(|((f, c), n)| self.output(f, n, comp_ids(c)))
            .collect()
    }

    /// Queues a generation from one composition without running it, for a caller that runs
    /// the step loop itself (the HTTP server): the request joins the batch like any other and
    /// its tokens come on the returned channel. Missing chunk K/V is computed first. The
    /// request holds the chunk pages it reads until it ends, so deleting a chunk meanwhile is
    /// safe; nothing is kept as the conversation.
    pub fn add_request_from_chunks(
        &mut self,
        c: &Composition,
        params: SamplingParams,
    ) -> Result<QueuedFromChunks, Error> {
        let (segments, tokens) = self.build(c, &mut HashSet::new())?;
        let cached_tokens = segments.iter().map(BlockTable::num_tokens).sum();
        let prompt_tokens = tokens.len();
        let engine = self.llm.engine_mut();
        let id = engine.add_request_with_kv(tokens, params, segments, false)?;
        let events = engine.subscribe(id).expect("just queued");
        Ok(QueuedFromChunks {
            id,
            events,
            prompt_tokens,
            cached_tokens,
        })
    }

    /// Pages the chunk API holds: chunk and chain K/V and the kept conversation.
    pub fn kv_pages_held(&self) -> usize {
        self.store.pages_held() + self.conversation.as_ref().map_or(0, KvBlocks::num_pages)
    }

    /// What a composition would cost and which parts are ready, without running it.
    pub fn preview_composition(&self, c: &Composition) -> Result<CompositionPreview, Error> {
        self.check(c)?;
        let (mut cached, mut to_compute) = (Vec::new(), Vec::new());
        let system = &self.store.chunks[&c.system_id];
        let mut total = system.tokens.len();
        if system.kv.is_some() {
            cached.push(c.system_id.clone())
        } else {
            to_compute.push(c.system_id.clone())
        }
        for (j, id) in c.context_ids.iter().enumerate() {
            let key = self.chain_key(c, j, total);
            if self.store.chains.contains_key(&key) {
                cached.push(id.clone());
            } else {
                to_compute.push(id.clone());
            }
            total += self.store.chunks[id].tokens.len();
        }
        total += self.store.chunks[&c.query_id].tokens.len();
        to_compute.push(c.query_id.clone());
        Ok(CompositionPreview {
            total_tokens: total,
            num_levels: c.context_ids.len() + 2,
            memory_bytes: total * self.llm.engine().runner().kv_layout().bytes_per_token(),
            cached,
            to_compute,
        })
    }

    /// Registers the texts as chunks, generates, and deletes the chunks it created unless
    /// `persist_chunks`. The output lists the chunk ids (system, contexts, query).
    pub fn generate(
        &mut self,
        system_prompt: &str,
        context: &[&str],
        query: &str,
        params: SamplingParams,
        persist_chunks: bool,
    ) -> Result<ChunkOutput, Error> {
        let existed = |s: &Self, t: ChunkType, text: &str| {
            s.store
                .chunks
                .contains_key(&chunk_hash(t, text.as_bytes(), None))
        };
        let mut created = Vec::new();
        let mut register = |s: &mut Self, text: &str, t: ChunkType| -> Result<String, Error> {
            let new = !existed(s, t, text);
            let id = s.register_chunk(text, t, BTreeMap::new())?;
            if new {
                created.push(id.clone());
            }
            Ok(id)
        };
        let result = (|| {
            let system = register(self, system_prompt, ChunkType::SystemPrompt)?;
            let mut contexts = Vec::new();
            for c in context {
                contexts.push(register(self, c, ChunkType::Context)?);
            }
            let q = register(self, query, ChunkType::Query)?;
            let refs: Vec<&str> = contexts.iter().map(String::as_str).collect();
            self.generate_from_chunks(&system, &refs, &q, params)
        })();
        if !persist_chunks {
            for id in &created {
                let _ = self.delete_chunk(id);
            }
        }
        result
    }

    pub fn list_chunks(&self, filter: &ChunkFilter) -> Vec<ChunkInfo> {
        self.store.list(filter.chunk_type, &filter.metadata)
    }

    pub fn get_chunk(&self, id: &str) -> Result<Chunk, Error> {
        let c = self
            .store
            .chunks
            .get(id)
            .ok_or_else(|| Error::ChunkNotFound(id.to_string()))?;
        Ok(Chunk {
            info: c.info.clone(),
            content: c.content.clone(),
        })
    }

    /// Deletes a chunk; its pages (and those of chains built on it) go back to the pool, except
    /// while a running request still reads them (it holds them until it ends).
    pub fn delete_chunk(&mut self, id: &str) -> Result<(), Error> {
        let mut store = std::mem::take(&mut self.store);
        let removed = store.remove_chunk(self.pool(), id);
        self.store = store;
        removed
            .map(|_| ())
            .ok_or_else(|| Error::ChunkNotFound(id.to_string()))
    }

    /// Deletes every chunk, or every chunk of one type; returns how many.
    pub fn clear_chunks(&mut self, chunk_type: Option<ChunkType>) -> usize {
        let ids: Vec<String> = self
            .store
            .list(chunk_type, &[])
            .into_iter()
            .map(|c| c.chunk_id)
            .collect();
        ids.iter()
            .filter(|id| self.delete_chunk(id).is_ok())
            .count()
    }

    /// Deletes chunks not used for `max_age`; returns how many.
    pub fn evict_unused_chunks(&mut self, max_age: Duration) -> usize {
        let now = SystemTime::now();
        let old: Vec<String> = self
            .store
            .chunks
            .values()
            .filter(|c| {
                now.duration_since(c.info.last_accessed)
                    .is_ok_and(|age| age >= max_age)
            })
            .map(|c| c.info.chunk_id.clone())
            .collect();
        let n = old
            .iter()
            .filter(|id| self.delete_chunk(id).is_ok())
            .count();
        self.store.evictions += n as u64;
        n
    }

    pub fn get_chunk_stats(&self) -> ChunkStats {
        let page_bytes = self
            .llm
            .engine()
            .runner()
            .kv_layout()
            .page_bytes(self.page_size());
        let mb = |pages: usize| (pages * page_bytes) as f64 / (1 << 20) as f64;
        let lookups = self.hits + self.misses;
        ChunkStats {
            total_chunks: self.store.chunks.len(),
            memory_used_mb: mb(self.store.pages_held()),
            memory_budget_mb: mb(self.budget_pages()),
            cache_hits: self.hits,
            cache_misses: self.misses,
            hit_rate: if lookups == 0 {
                0.0
            } else {
                self.hits as f64 / lookups as f64
            },
            evictions: self.store.evictions,
        }
    }

    /// A chunk's own K/V (system prompts; in independent mode contexts too).
    pub fn get_chunk_blocks(&self, id: &str) -> Result<KvBlocks, Error> {
        let c = self
            .store
            .chunks
            .get(id)
            .ok_or_else(|| Error::ChunkNotFound(id.to_string()))?;
        let kv = c.kv.clone().ok_or_else(|| {
            Error::IncompatibleChunks(format!(
                "chunk {id} has no K/V of its own ({} chunks in {:?} mode are computed per composition)",
                c.info.chunk_type, self.config.mode
            ))
        })?;
        Ok(KvBlocks {
            segments: vec![kv],
            tokens: c.tokens.clone(),
        })
    }

    /// The own K/V of every chunk that has one, by id.
    pub fn get_active_chunk_blocks(&self) -> Vec<(String, KvBlocks)> {
        let mut out: Vec<(String, KvBlocks)> = self
            .store
            .chunks
            .keys()
            .filter_map(|id| self.get_chunk_blocks(id).ok().map(|b| (id.clone(), b)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The K/V of the last composition or inference (prompt and answer).
    pub fn get_conversation_blocks(&self) -> Option<KvBlocks> {
        self.conversation.clone()
    }

    /// Checks blocks handed in from outside and builds the request over them.
    fn virtual_sequence(
        &self,
        existing: &[BlockTable],
        existing_token_count: usize,
        new_tokens: &[TokenId],
    ) -> Result<VirtualSequence, Error> {
        let blocks = KvBlocks {
            segments: existing.to_vec(),
            // The tokens behind foreign blocks are unknown; they are never recomputed.
            tokens: vec![0; existing_token_count],
        };
        if blocks.num_kv_tokens() != existing_token_count {
            return Err(Error::IncompatibleChunks(format!(
                "the blocks hold {} tokens, not {existing_token_count}",
                blocks.num_kv_tokens()
            )));
        }
        if new_tokens.is_empty() {
            return Err(Error::EmptyPrompt { index: 0 });
        }
        Ok(VirtualSequence {
            blocks,
            new_tokens: new_tokens.to_vec(),
        })
    }

    /// Runs new tokens on existing K/V blocks (a chunk's, a conversation's, or any pages the
    /// caller holds) without recomputing them. The result becomes the kept conversation.
    pub fn infer_from_blocks(
        &mut self,
        existing: &[BlockTable],
        existing_token_count: usize,
        new_tokens: &[TokenId],
        params: SamplingParams,
    ) -> Result<ChunkOutput, Error> {
        let vs = self.virtual_sequence(existing, existing_token_count, new_tokens)?;
        self.run_virtual(vs, params)
    }

    fn run_virtual(
        &mut self,
        vs: VirtualSequence,
        params: SamplingParams,
    ) -> Result<ChunkOutput, Error> {
        let prompt = vs.prompt();
        let cached = vs.blocks.num_kv_tokens();
        let f = self
            .run(vec![(
                prompt.clone(),
                params,
                vs.blocks.segments.clone(),
                true,
            )])?
            .pop()
            .expect("one request");
        let out = self.output(&f, cached, Vec::new())?;
        let mut all = prompt;
        all.extend_from_slice(&f.output);
        self.keep_conversation(vs.blocks.segments, f.kv, all);
        Ok(out)
    }

    /// Streams new tokens run on existing K/V blocks.
    pub fn infer_from_blocks_stream(
        &mut self,
        existing: &[BlockTable],
        existing_token_count: usize,
        new_tokens: &[TokenId],
        params: SamplingParams,
    ) -> Result<TokenStream<'_, dyn ChunkRunner>, Error> {
        let vs = self.virtual_sequence(existing, existing_token_count, new_tokens)?;
        let id: SeqId = self.llm.engine_mut().add_request_with_kv(
            vs.prompt(),
            params,
            vs.blocks.segments,
            false,
        )?;
        self.llm.stream_existing(id)
    }

    /// Continues the kept conversation with more text (the chat's `/infer`): only the new
    /// tokens (and the last answer token) are computed.
    pub fn continue_conversation(
        &mut self,
        text: &str,
        params: SamplingParams,
    ) -> Result<ChunkOutput, Error> {
        let blocks = self.conversation.clone().ok_or_else(|| {
            Error::IncompatibleChunks("no conversation yet: compose or infer first".into())
        })?;
        let new_tokens = self.llm.encode(&Prompt::Text(text.to_string()))?;
        self.run_virtual(VirtualSequence { blocks, new_tokens }, params)
    }

    /// Frees every page the chunk API holds (chunks, chains, the conversation).
    pub fn clear_all(&mut self) {
        self.drop_conversation();
        let mut store = std::mem::take(&mut self.store);
        store.clear(self.pool());
        self.store = store;
    }
}

fn comp_ids(c: &Composition) -> Vec<String> {
    std::iter::once(&c.system_id)
        .chain(&c.context_ids)
        .chain(std::iter::once(&c.query_id))
        .cloned()
        .collect()
}

impl Drop for ChunkedLLM {
    fn drop(&mut self) {
        self.clear_all();
    }
}
