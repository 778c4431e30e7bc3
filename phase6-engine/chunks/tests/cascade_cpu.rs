//! The chunk runner on the CPU: cascade attention gives the numbers of flat attention, and a
//! K/V copy with a RoPE shift and back restores what the next token sees.

use phase1::{BlockTable, KvPool};
use phase2::{
    CpuRunner, ForwardBatch, ForwardSeq, Model, ModelConfig, ModelRunner, SampleSpec, Weights,
};
use phase6_chunks::{CascadeCpuRunner, ChunkRunner, SharedSegment};
use proptest::prelude::*;

const TOL: f32 = 1e-4;

fn runner(seed: u64, pages: usize, page_size: usize) -> CascadeCpuRunner {
    let json = r#"{"architectures":["Qwen3ForCausalLM"],"vocab_size":300,"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"head_dim":32,"rms_norm_eps":1e-6,"rope_theta":10000,
        "max_position_embeddings":512,"tie_word_embeddings":true}"#;
    let config = ModelConfig::from_json(json, std::path::Path::new("test config")).unwrap();
    let weights = Weights::random(&config, seed);
    let model = Model::from_weights(config, &weights).unwrap();
    CascadeCpuRunner::new(CpuRunner::new(model, pages, page_size))
}

/// ‖a − b‖ / ‖b‖.
fn rel_error(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn cascade_equals_flat_attention(
        shared_len in 1usize..30,
        suffixes in prop::collection::vec(prop::collection::vec(0u32..300, 1..8), 2..5),
        page_size in 1usize..9,
    ) {
        // A shared segment (a prefix prefilled once, ending in a partly filled page), then
        // each sequence's own tokens on fresh pages.
        let mut pool = KvPool::new(256, page_size).unwrap();
        let mut runner = runner(4, 256, page_size);
        let prefix: Vec<u32> = (0..shared_len as u32).map(|i| (i * 11) % 300).collect();
        let mut shared = BlockTable::new();
        shared.append_tokens(&mut pool, prefix.len()).unwrap();
        runner.forward(&ForwardBatch {
            seqs: vec![ForwardSeq { seq_id: 99, tokens: prefix.clone(), start_pos: 0, kv: vec![shared.clone()], sample: None }],
        }).unwrap();
        let mut seqs = Vec::new();
        for (i, suffix) in suffixes.iter().enumerate() {
            let mut own = BlockTable::new();
            own.append_tokens(&mut pool, suffix.len()).unwrap();
            seqs.push(ForwardSeq {
                seq_id: i as u64,
                tokens: suffix.clone(),
                start_pos: prefix.len(),
                kv: vec![shared.clone(), own],
                sample: Some(SampleSpec::greedy()),
            });
        }
        let batch = ForwardBatch { seqs };
        let flat = runner.forward_planned(&batch, &[]).unwrap();
        let group = SharedSegment { seqs: (0..suffixes.len()).collect(), segment: 0 };
        let cascade = runner.forward_planned(&batch, &[group]).unwrap();
        let err = rel_error(&cascade.data, &flat.data);
        prop_assert!(err < TOL, "cascade differs from flat: {}", err);
        // `forward` finds the same plan by itself and counts it.
        let planned = runner.forward(&batch).unwrap();
        prop_assert_eq!(&planned.data, &cascade.data);
        let stats = runner.cascade_stats();
        prop_assert_eq!(stats.steps, 1);
        prop_assert_eq!(stats.tokens_saved, ((suffixes.len() - 1) * shared_len) as u64);
    }

    /// Copying K/V with a RoPE shift and back restores it, and a shift of 0 is a plain copy:
    /// the next token after either copy sees exactly what it sees after the original.
    #[test]
    fn copied_kv_with_a_rope_shift_round_trips(
        prompt in prop::collection::vec(0u32..300, 1..20),
        next in 0u32..300,
        shift in 1i64..40,
        page_size in 1usize..9,
    ) {
        let mut pool = KvPool::new(128, page_size).unwrap();
        let mut runner = runner(6, 128, page_size);
        let n = prompt.len();
        let mut table = || {
            let mut t = BlockTable::new();
            t.append_tokens(&mut pool, n).unwrap();
            t
        };
        let (original, moved, back, plain) = (table(), table(), table(), table());
        runner.forward(&ForwardBatch {
            seqs: vec![ForwardSeq { seq_id: 1, tokens: prompt.clone(), start_pos: 0, kv: vec![original.clone()], sample: None }],
        }).unwrap();
        runner.copy_kv(&original, &moved, shift).unwrap();
        runner.copy_kv(&moved, &back, -shift).unwrap();
        runner.copy_kv(&original, &plain, 0).unwrap();

        let mut next_logits = |kv: &BlockTable| {
            let mut own = BlockTable::new();
            own.append_tokens(&mut pool, 1).unwrap();
            let seq = ForwardSeq { seq_id: 2, tokens: vec![next], start_pos: n, kv: vec![kv.clone(), own], sample: Some(SampleSpec::greedy()) };
            runner.forward(&ForwardBatch { seqs: vec![seq] }).unwrap().data
        };
        let expected = next_logits(&original);
        prop_assert!(rel_error(&next_logits(&back), &expected) < TOL, "shift and back");
        prop_assert!(rel_error(&next_logits(&plain), &expected) < 1e-6, "shift 0");
        prop_assert!(rel_error(&next_logits(&moved), &expected) > TOL, "a real shift changes what the next token sees");
    }
}

#[test]
fn a_copy_that_does_not_fit_is_an_error() {
    let mut runner = runner(1, 8, 4);
    let src = BlockTable::from_pages(vec![0], 3);
    let err = runner
        .copy_kv(&src, &BlockTable::from_pages(vec![1], 2), 0)
        .unwrap_err();
    assert!(err.to_string().contains("copy of 3 tokens"), "{err}");
    let err = runner
        .copy_kv(&src, &BlockTable::from_pages(vec![9], 3), 0)
        .unwrap_err();
    assert!(err.to_string().contains("outside the store"), "{err}");
}
