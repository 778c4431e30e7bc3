//! Tensor parallelism on CPU ranks against one rank: the logits of every fixture model within
//! 1e-5 relative error for 2 and 4 ranks (a different order of additions, nothing more), the same
//! bits on every run, the same greedy tokens through the engine and the chunk API, and sharded
//! == unsharded on random shapes (proptest).

use std::collections::BTreeMap;

use phase1::{BlockTable, KvPool};
use phase2::Tokenizer;
use phase2::{
    CpuRunner, ForwardBatch, ForwardSeq, Model, ModelConfig, ModelRunner, SampleSpec, Weights,
    models_dir,
};
use phase6::{Config, Device, LLM, Prompt, SamplingParams};
use phase6_chunks::{ChunkConfig, ChunkType, ChunkedLLM, CompositionMode};
use phase6_tp::{TpCpuRunner, check_split, tp_cpu_runner};
use proptest::prelude::*;

/// One prefill step of `prompt` on a fresh runner's pages: the last position's logits.
fn prefill_logits(runner: &mut dyn ModelRunner, prompt: &[u32]) -> Vec<f32> {
    let mut pool = KvPool::new(runner.num_pages(), runner.page_size()).unwrap();
    let mut table = BlockTable::new();
    table.append_tokens(&mut pool, prompt.len()).unwrap();
    let batch = ForwardBatch {
        seqs: vec![ForwardSeq {
            seq_id: 0,
            tokens: prompt.to_vec(),
            start_pos: 0,
            kv: vec![table],
            sample: Some(SampleSpec::greedy()),
        }],
    };
    runner.forward(&batch).unwrap().data
}

/// ‖a − b‖ / ‖b‖.
fn rel_error(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn logits_of_every_fixture_model_match_one_rank() {
    let fixtures = models_dir().join("fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut checked = 0;
    for file in files {
        let fixture = phase2::Fixture::read(&file).unwrap();
        let dir = models_dir().join(&fixture.model_dir);
        let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let weights = Weights::open(&dir).unwrap();
        let model = Model::from_weights(config.clone(), &weights).unwrap();
        let prompt = &fixture.case("passage-200").unwrap().prompt;
        let pages = prompt.len().div_ceil(16) + 1;
        let one = prefill_logits(&mut CpuRunner::new(model, pages, 16), prompt);
        for tp in [2, 4] {
            if check_split(&config, tp).is_err() {
                continue;
            }
            let mut runner = TpCpuRunner::new(&config, &weights, tp, pages, 16).unwrap();
            let logits = prefill_logits(&mut runner, prompt);
            let err = rel_error(&logits, &one);
            assert!(
                err < 1e-5,
                "{} tp {tp}: relative error {err:.1e}",
                file.display()
            );
            // The ranks add in rank order: the same bits every run.
            let mut again = TpCpuRunner::new(&config, &weights, tp, pages, 16).unwrap();
            assert_eq!(prefill_logits(&mut again, prompt), logits);
            eprintln!("{}: tp {tp}: logits error {err:.1e}", file.display());
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} model/tp pairs checked");
}

fn engine_config(tp: usize) -> Config {
    Config {
        device: Device::Cpu,
        tensor_parallel_size: tp,
        kvcache_block_size: 16,
        cpu_kv_cache_bytes: 16 << 20,
        max_model_len: 1024,
        seed: Some(0),
        ..Config::default()
    }
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams::greedy()
        .with_max_tokens(n)
        .with_ignore_eos(true)
}

/// The embedded model's engine over `tp` CPU ranks.
fn tp_llm(tp: usize) -> phase6_chunks::ChunkLLM {
    let dir = phase6::default_model_dir();
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = Weights::open(&dir).unwrap();
    let runner = tp_cpu_runner(config.clone(), &weights, &engine_config(tp)).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    LLM::from_runner(runner, config, Some(tokenizer), engine_config(tp)).unwrap()
}

#[test]
fn the_engine_gives_the_same_tokens_on_one_two_and_four_ranks() {
    let prompts: Vec<Prompt> = ["ROMEO:", "JULIET:\nO Romeo, Romeo!", "KING:"]
        .into_iter()
        .map(Prompt::from)
        .collect();
    let mut one = LLM::new(phase6::default_model_dir(), engine_config(1)).unwrap();
    let expected: Vec<_> = one
        .generate(&prompts, greedy(24), false)
        .unwrap()
        .into_iter()
        .map(|o| o.token_ids)
        .collect();
    for tp in [2, 4] {
        let mut llm = tp_llm(tp);
        let out: Vec<_> = llm
            .generate(&prompts, greedy(24), false)
            .unwrap()
            .into_iter()
            .map(|o| o.token_ids)
            .collect();
        assert_eq!(out, expected, "tp {tp}");
        // A rank holds 1/tp of the model's 2 KV heads, or one copied head past 2 ranks: the same
        // byte budget holds 2x the pages at 2 ranks and still 2x at 4.
        let pages = llm.engine().scheduler().pool().num_pages();
        assert_eq!(pages, one.engine().scheduler().pool().num_pages() * 2);
    }
}

#[test]
fn the_chunk_api_and_the_prefix_cache_work_over_ranks() {
    let none = BTreeMap::new;
    let mut outs = Vec::new();
    for tp in [1, 2] {
        let config = ChunkConfig {
            mode: CompositionMode::Exact,
            engine: engine_config(tp),
            ..ChunkConfig::default()
        };
        let mut c = ChunkedLLM::from_llm(tp_llm(tp), config).unwrap();
        let sys = c
            .register_chunk(
                "You are the Chorus of Verona.\n",
                ChunkType::SystemPrompt,
                none(),
            )
            .unwrap();
        let ctx = c
            .register_chunk(
                "Two households, both alike in dignity,\n",
                ChunkType::Context,
                none(),
            )
            .unwrap();
        let q = c
            .register_chunk("ROMEO:\n", ChunkType::Query, none())
            .unwrap();
        let first = c
            .generate_from_chunks(&sys, &[&ctx], &q, greedy(12))
            .unwrap();
        // Again: every part comes from the cache, the tokens stay.
        let again = c
            .generate_from_chunks(&sys, &[&ctx], &q, greedy(12))
            .unwrap();
        assert_eq!(again.token_ids, first.token_ids);
        assert!(again.cached_tokens > 0);
        outs.push(first.token_ids);
    }
    assert_eq!(outs[0], outs[1]);
}

#[test]
fn a_split_that_does_not_divide_the_model_is_refused_before_loading() {
    let dir = phase6::default_model_dir();
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = Weights::open(&dir).unwrap();
    let err = tp_cpu_runner(config, &weights, &engine_config(3))
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "invalid config: tensor_parallel_size = 3 does not divide the model's attention heads (4)"
    );
    let err = LLM::new(&dir, engine_config(2)).err().unwrap();
    assert!(err.to_string().contains("LLM::from_runner"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any shape that `tp` divides: the ranks together compute what one rank computes.
    #[test]
    fn sharded_equals_unsharded(
        kv in prop::sample::select(vec![1usize, 2, 4]),
        group in 1usize..=3,
        head_dim in prop::sample::select(vec![8usize, 16]),
        hidden in prop::sample::select(vec![16usize, 32]),
        inter_per_rank in 1usize..=3,
        vocab in 20usize..120,
        tp in prop::sample::select(vec![2usize, 4, 8]),
        qkv_bias in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let heads = kv * group;
        let arch = if qkv_bias { "Qwen2ForCausalLM" } else { "Qwen3ForCausalLM" };
        let text = format!(
            r#"{{"architectures":["{arch}"],"vocab_size":{vocab},"hidden_size":{hidden},
            "intermediate_size":{},"num_hidden_layers":2,"num_attention_heads":{heads},
            "num_key_value_heads":{kv},"head_dim":{head_dim},"rms_norm_eps":1e-6,
            "rope_theta":10000,"max_position_embeddings":64,"tie_word_embeddings":{}}}"#,
            8 * tp * inter_per_rank,
            seed % 2 == 0,
        );
        let config = ModelConfig::from_json(&text, std::path::Path::new("config.json")).unwrap();
        prop_assume!(check_split(&config, tp).is_ok());
        let weights = Weights::random(&config, seed);
        let prompt: Vec<u32> = (0..9).map(|i| ((seed as usize + 7 * i) % vocab) as u32).collect();
        let model = Model::from_weights(config.clone(), &weights).unwrap();
        let one = prefill_logits(&mut CpuRunner::new(model, 2, 16), &prompt);
        let mut runner = TpCpuRunner::new(&config, &weights, tp, 2, 16).unwrap();
        let sharded = prefill_logits(&mut runner, &prompt);
        let err = rel_error(&sharded, &one);
        prop_assert!(err < 1e-5, "relative error {err:.1e}");
    }
}
