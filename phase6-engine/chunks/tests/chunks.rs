//! The chunk API on the embedded model: exact compositions equal plain generation token for
//! token (alone and batched with cascade attention), chunks are deduplicated, evicted least
//! recently used and never while pinned, deletion frees their pages, direct inference from KV
//! blocks equals recomputation, and every misuse is a clear error.

use std::collections::BTreeMap;
use std::time::Duration;

use phase6::{Config, Device, Error, LLM, Prompt, SamplingParams};
use phase6_chunks::{
    ChunkConfig, ChunkFilter, ChunkType, ChunkedLLM, Composition, CompositionMode, metadata_map,
};

const SYSTEM: &str = "You are the Chorus. Speak in verse of Verona and its two households.\n";
const CTX_A: &str =
    "Two households, both alike in dignity,\nIn fair Verona, where we lay our scene,\n";
const CTX_B: &str =
    "From ancient grudge break to new mutiny,\nWhere civil blood makes civil hands unclean.\n";
const QUERY: &str = "ROMEO:\n";

fn engine_config() -> Config {
    Config {
        device: Device::Cpu,
        kvcache_block_size: 16,
        cpu_kv_cache_bytes: 32 << 20,
        max_model_len: 2048,
        seed: Some(0),
        ..Config::default()
    }
}

fn chunked(mode: CompositionMode) -> ChunkedLLM {
    let config = ChunkConfig {
        mode,
        engine: engine_config(),
        ..ChunkConfig::default()
    };
    ChunkedLLM::new(phase6::default_model_dir(), config).unwrap()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams::greedy()
        .with_max_tokens(n)
        .with_ignore_eos(true)
}

fn none() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn free_pages(c: &ChunkedLLM) -> usize {
    c.llm().engine().scheduler().pool().num_free()
}

/// Greedy tokens of plain generation of the concatenated chunk tokens.
fn plain(texts: &[&str], n: usize) -> Vec<u32> {
    let mut llm = LLM::new(phase6::default_model_dir(), engine_config()).unwrap();
    let mut ids = Vec::new();
    for t in texts {
        ids.extend(llm.tokenizer().unwrap().encode(t).unwrap());
    }
    llm.generate(&[Prompt::Tokens(ids)], greedy(n), false)
        .unwrap()
        .remove(0)
        .token_ids
}

#[test]
fn exact_composition_equals_plain_generation_alone_and_batched() {
    let mut c = chunked(CompositionMode::Exact);
    let sys = c
        .register_chunk(SYSTEM, ChunkType::SystemPrompt, none())
        .unwrap();
    let a = c.register_chunk(CTX_A, ChunkType::Context, none()).unwrap();
    let b = c.register_chunk(CTX_B, ChunkType::Context, none()).unwrap();
    let q = c.register_chunk(QUERY, ChunkType::Query, none()).unwrap();

    let expected_ab = plain(&[SYSTEM, CTX_A, CTX_B, QUERY], 12);
    let out = c
        .generate_from_chunks(&sys, &[&a, &b], &q, greedy(12))
        .unwrap();
    assert_eq!(out.token_ids, expected_ab);
    let query_len = c.llm().tokenizer().unwrap().encode(QUERY).unwrap().len();
    assert_eq!(
        out.prompt_tokens,
        out.cached_tokens + query_len,
        "only the query was computed"
    );
    // Second time: every part is a cache hit.
    let before = c.get_chunk_stats();
    let again = c
        .generate_from_chunks(&sys, &[&a, &b], &q, greedy(12))
        .unwrap();
    assert_eq!(again.token_ids, expected_ab);
    let after = c.get_chunk_stats();
    assert_eq!(after.cache_hits - before.cache_hits, 3);
    assert_eq!(after.cache_misses, before.cache_misses);

    // A batch sharing the system prompt and context A: cascade attention, same tokens.
    let expected_a = plain(&[SYSTEM, CTX_A, QUERY], 12);
    let expected_b = plain(&[SYSTEM, CTX_B, QUERY], 12);
    let batch = vec![
        Composition::new(&sys, &[&a], &q),
        Composition::new(&sys, &[&a, &b], &q),
        Composition::new(&sys, &[&b], &q),
        Composition::new(&sys, &[&a], &q),
    ];
    let outs = c.batch_generate_from_chunks(&batch, greedy(12)).unwrap();
    assert_eq!(outs[0].token_ids, expected_a);
    assert_eq!(outs[1].token_ids, expected_ab);
    assert_eq!(outs[2].token_ids, expected_b);
    assert_eq!(outs[3].token_ids, expected_a);
    let cascade = c.cascade_stats();
    assert!(cascade.steps > 0 && cascade.tokens_saved > 0, "{cascade:?}");
}

#[test]
fn registration_dedup_listing_deletion_and_memory() {
    let mut c = chunked(CompositionMode::Exact);
    let start = free_pages(&c);
    let sys = c
        .register_chunk(
            SYSTEM,
            ChunkType::SystemPrompt,
            metadata_map([("team", "chorus")]),
        )
        .unwrap();
    assert_eq!(sys.len(), 64, "hex SHA-256");
    assert!(
        free_pages(&c) < start,
        "registration is prefill: the system prompt holds pages"
    );
    assert_eq!(
        c.register_chunk(SYSTEM, ChunkType::SystemPrompt, none())
            .unwrap(),
        sys,
        "deduplicated"
    );
    let ctx = c
        .register_chunk(
            CTX_A,
            ChunkType::Context,
            metadata_map([("team", "prologue")]),
        )
        .unwrap();
    assert_ne!(
        c.register_chunk(SYSTEM, ChunkType::Context, none())
            .unwrap(),
        sys,
        "the type is part of the id"
    );

    let all = c.list_chunks(&ChunkFilter::default());
    assert_eq!(all.len(), 3);
    let systems = c.list_chunks(&ChunkFilter {
        chunk_type: Some(ChunkType::SystemPrompt),
        metadata: vec![],
    });
    assert_eq!(systems.len(), 1);
    assert_eq!(
        systems[0].access_count, 1,
        "the duplicate registration counted as an access"
    );
    let prologue = c.list_chunks(&ChunkFilter {
        chunk_type: None,
        metadata: vec![("team".into(), "prologue".into())],
    });
    assert_eq!(prologue[0].chunk_id, ctx);
    let full = c.get_chunk(&ctx).unwrap();
    assert_eq!(full.content, CTX_A);
    assert!(full.info.content_preview.len() <= 80);

    c.delete_chunk(&sys).unwrap();
    assert!(matches!(c.delete_chunk(&sys), Err(Error::ChunkNotFound(_))));
    assert_eq!(c.clear_chunks(Some(ChunkType::Context)), 2);
    assert_eq!(c.get_chunk_stats().total_chunks, 0);
    c.clear_all();
    c.llm_mut().engine_mut().scheduler_mut().clear_cache();
    assert_eq!(free_pages(&c), start, "every page back");

    let config = ChunkConfig {
        enable_deduplication: false,
        engine: engine_config(),
        ..ChunkConfig::default()
    };
    let mut plain_ids = ChunkedLLM::new(phase6::default_model_dir(), config).unwrap();
    let x = plain_ids
        .register_chunk(QUERY, ChunkType::Query, none())
        .unwrap();
    let y = plain_ids
        .register_chunk(QUERY, ChunkType::Query, none())
        .unwrap();
    assert_ne!(
        x, y,
        "without deduplication every registration is a new chunk"
    );
}

#[test]
fn eviction_is_lru_within_the_budget_and_max_chunks() {
    let config = ChunkConfig {
        max_chunks: 3,
        engine: engine_config(),
        ..ChunkConfig::default()
    };
    let mut c = ChunkedLLM::new(phase6::default_model_dir(), config).unwrap();
    let q1 = c.register_chunk("first", ChunkType::Query, none()).unwrap();
    let q2 = c
        .register_chunk("second", ChunkType::Query, none())
        .unwrap();
    let q3 = c.register_chunk("third", ChunkType::Query, none()).unwrap();
    c.get_chunk(&q1).unwrap();
    c.register_chunk("first", ChunkType::Query, none()).unwrap(); // q1 used again
    let q4 = c
        .register_chunk("fourth", ChunkType::Query, none())
        .unwrap();
    let left: Vec<String> = c
        .list_chunks(&ChunkFilter::default())
        .into_iter()
        .map(|i| i.chunk_id)
        .collect();
    assert!(left.contains(&q1) && left.contains(&q3) && left.contains(&q4));
    assert!(
        !left.contains(&q2),
        "the least recently used chunk went first"
    );
    assert_eq!(c.get_chunk_stats().evictions, 1);
    std::thread::sleep(Duration::from_millis(20));
    c.register_chunk("fourth", ChunkType::Query, none())
        .unwrap();
    assert_eq!(
        c.evict_unused_chunks(Duration::from_millis(15)),
        2,
        "q1 and q3 are older than 15 ms"
    );

    // A page budget too small for a long system prompt: a clear out-of-memory error.
    let tiny = ChunkConfig {
        chunk_memory_ratio: 0.001,
        engine: engine_config(),
        ..ChunkConfig::default()
    };
    let mut t = ChunkedLLM::new(phase6::default_model_dir(), tiny).unwrap();
    let long = SYSTEM.repeat(20);
    let err = t
        .register_chunk(&long, ChunkType::SystemPrompt, none())
        .unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
    assert_eq!(
        t.list_chunks(&ChunkFilter::default()).len(),
        0,
        "a failed registration leaves nothing"
    );
}

#[test]
fn misuse_is_a_clear_error() {
    let mut c = chunked(CompositionMode::Exact);
    let sys = c
        .register_chunk(SYSTEM, ChunkType::SystemPrompt, none())
        .unwrap();
    let ctx = c.register_chunk(CTX_A, ChunkType::Context, none()).unwrap();
    let q = c.register_chunk(QUERY, ChunkType::Query, none()).unwrap();
    let err = c
        .generate_from_chunks(&ctx, &[], &q, greedy(2))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "incompatible chunks: chunk {ctx} is a context chunk where a system chunk is needed"
        )
    );
    let err = c
        .generate_from_chunks(&sys, &[&q], &q, greedy(2))
        .unwrap_err();
    assert!(matches!(err, Error::IncompatibleChunks(_)));
    let err = c
        .generate_from_chunks(&sys, &[], "feedface", greedy(2))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "chunk feedface not found (never registered, deleted or evicted)"
    );
    assert!(
        matches!(c.get_chunk_blocks(&ctx), Err(Error::IncompatibleChunks(_))),
        "exact contexts have no own K/V"
    );
    assert!(matches!(
        c.continue_conversation("more", greedy(2)),
        Err(Error::IncompatibleChunks(_))
    ));
    let blocks = c.get_chunk_blocks(&sys).unwrap();
    let err = c
        .infer_from_blocks(
            &blocks.segments,
            blocks.num_kv_tokens() + 1,
            &[5],
            greedy(2),
        )
        .unwrap_err();
    assert!(matches!(err, Error::IncompatibleChunks(_)), "{err}");
    assert!(matches!(
        c.infer_from_blocks(&blocks.segments, blocks.num_kv_tokens(), &[], greedy(2)),
        Err(Error::EmptyPrompt { .. })
    ));
    let err = "sidebar".parse::<ChunkType>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "incompatible chunks: unknown chunk type \"sidebar\" (system, context or query)"
    );
}

#[test]
fn direct_inference_from_blocks_and_conversations_equal_recomputation() {
    let mut c = chunked(CompositionMode::Exact);
    let sys = c
        .register_chunk(SYSTEM, ChunkType::SystemPrompt, none())
        .unwrap();
    let q = c.register_chunk(QUERY, ChunkType::Query, none()).unwrap();

    // New tokens run on the system prompt's own pages.
    let blocks = c.get_chunk_blocks(&sys).unwrap();
    let tokens = c.llm().tokenizer().unwrap().encode(QUERY).unwrap();
    let out = c
        .infer_from_blocks(
            &blocks.segments,
            blocks.num_kv_tokens(),
            &tokens,
            greedy(10),
        )
        .unwrap();
    assert_eq!(out.token_ids, plain(&[SYSTEM, QUERY], 10));
    assert_eq!(out.cached_tokens, blocks.num_kv_tokens());

    // A composition, then a follow-up on its kept K/V: equal to generating the whole text.
    let first = c.generate_from_chunks(&sys, &[], &q, greedy(6)).unwrap();
    let follow = c.continue_conversation("\nJULIET:\n", greedy(6)).unwrap();
    let mut whole = c.llm().tokenizer().unwrap().encode(SYSTEM).unwrap();
    whole.extend(c.llm().tokenizer().unwrap().encode(QUERY).unwrap());
    whole.extend(&first.token_ids);
    whole.extend(c.llm().tokenizer().unwrap().encode("\nJULIET:\n").unwrap());
    let mut llm = LLM::new(phase6::default_model_dir(), engine_config()).unwrap();
    let expected = llm
        .generate(&[Prompt::Tokens(whole)], greedy(6), false)
        .unwrap()
        .remove(0);
    assert_eq!(follow.token_ids, expected.token_ids);
    let conv = c.get_conversation_blocks().unwrap();
    assert_eq!(
        conv.tokens.len(),
        conv.num_kv_tokens() + 1,
        "the last answer token has no K/V yet"
    );

    // Streaming from blocks gives the same tokens as the blocking call.
    let streamed: Vec<u32> = c
        .infer_from_blocks_stream(
            &blocks.segments,
            blocks.num_kv_tokens(),
            &tokens,
            greedy(10),
        )
        .unwrap()
        .map(|p| p.unwrap().token_id)
        .collect();
    assert_eq!(streamed, out.token_ids);

    // Deleting the chunk while the conversation holds its pages keeps them alive.
    let free_before = free_pages(&c);
    c.delete_chunk(&sys).unwrap();
    assert_eq!(
        free_pages(&c),
        free_before,
        "the conversation still holds the system pages"
    );
    c.continue_conversation("\nROMEO:\n", greedy(3)).unwrap();
}

#[test]
fn independent_mode_reuses_chunk_kv_anywhere() {
    let mut c = chunked(CompositionMode::Independent);
    let sys = c
        .register_chunk(SYSTEM, ChunkType::SystemPrompt, none())
        .unwrap();
    let a = c.register_chunk(CTX_A, ChunkType::Context, none()).unwrap();
    let b = c.register_chunk(CTX_B, ChunkType::Context, none()).unwrap();
    let q = c.register_chunk(QUERY, ChunkType::Query, none()).unwrap();
    assert!(
        c.get_chunk_blocks(&a).is_ok(),
        "registration computed the context's own K/V"
    );
    // With no context, independent and exact are the same computation.
    let alone = c.generate_from_chunks(&sys, &[], &q, greedy(8)).unwrap();
    assert_eq!(alone.token_ids, plain(&[SYSTEM, QUERY], 8));
    // Contexts in either order run from their own K/V; nothing of theirs is prefilled again.
    let misses = c.get_chunk_stats().cache_misses;
    let ab = c
        .generate_from_chunks(&sys, &[&a, &b], &q, greedy(8))
        .unwrap();
    let ba = c
        .generate_from_chunks(&sys, &[&b, &a], &q, greedy(8))
        .unwrap();
    assert_eq!(ab.completion_tokens, 8);
    assert_eq!(ba.completion_tokens, 8);
    let query_len = c.llm().tokenizer().unwrap().encode(QUERY).unwrap().len();
    assert_eq!(ab.cached_tokens, ab.prompt_tokens - query_len);
    let preview = c
        .preview_composition(&Composition::new(&sys, &[&a, &b], &q))
        .unwrap();
    assert_eq!(preview.cached, vec![sys.clone(), a.clone(), b.clone()]);
    assert_eq!(preview.to_compute, vec![q.clone()]);
    assert_eq!(preview.num_levels, 4);
    assert_eq!(
        c.get_chunk_stats().cache_misses - misses,
        4,
        "each context turned once per position"
    );
}
