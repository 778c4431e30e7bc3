//! Prefill and decode throughput of the CPU forward pass on the embedded model's shape
//! (random weights, so the bench needs no checkpoint): batch 1, 8 and 32.
//!
//! Prefill runs 128 prompt tokens per sequence; decode runs one token per sequence after a
//! 128-token context. The contrast is the lesson of chapter 2: a decode step reads all the
//! weights for one token per sequence, so only batching makes it efficient.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use phase1::{BlockTable, KvPool};
use phase2::{
    CpuRunner, ForwardBatch, ForwardSeq, Model, ModelConfig, ModelRunner, SampleSpec, Weights,
};
use std::hint::black_box;

const CONTEXT: usize = 128;
const PAGE: usize = 16;

fn tiny_shape() -> Model {
    let json = r#"{"architectures":["Qwen3ForCausalLM"],"vocab_size":2048,"hidden_size":256,
        "intermediate_size":768,"num_hidden_layers":8,"num_attention_heads":4,
        "num_key_value_heads":2,"head_dim":64,"rms_norm_eps":1e-6,"rope_theta":10000,
        "max_position_embeddings":2048,"tie_word_embeddings":true}"#;
    let config = ModelConfig::from_json(json, std::path::Path::new("bench")).unwrap();
    let weights = Weights::random(&config, 0);
    Model::from_weights(config, &weights).unwrap()
}

/// `batch` sequences of `CONTEXT` prompt tokens, as one prefill step.
fn prefill_batch(pool: &mut KvPool, batch: usize) -> ForwardBatch {
    let seqs = (0..batch)
        .map(|i| {
            let mut table = BlockTable::new();
            table.append_tokens(pool, CONTEXT).unwrap();
            ForwardSeq {
                seq_id: i as u64,
                tokens: (0..CONTEXT as u32)
                    .map(|t| (t * 7 + i as u32) % 2048)
                    .collect(),
                start_pos: 0,
                kv: vec![table],
                sample: Some(SampleSpec::greedy()),
            }
        })
        .collect();
    ForwardBatch { seqs }
}

fn forward(c: &mut Criterion) {
    let model = tiny_shape();
    let mut group = c.benchmark_group("cpu forward (tiny model shape)");
    group.sample_size(10);
    for batch in [1usize, 8, 32] {
        let pages = batch * (CONTEXT / PAGE + 1);
        let mut runner = CpuRunner::new(model.clone(), pages, PAGE);
        group.throughput(Throughput::Elements((batch * CONTEXT) as u64));
        group.bench_function(format!("prefill batch {batch} x {CONTEXT} tokens"), |b| {
            b.iter_batched(
                || {
                    let mut pool = KvPool::new(pages, PAGE).unwrap();
                    prefill_batch(&mut pool, batch)
                },
                |step| black_box(runner.forward(&step).unwrap()),
                BatchSize::LargeInput,
            )
        });

        // Decode: one token per sequence on top of the prefilled context.
        let mut pool = KvPool::new(pages, PAGE).unwrap();
        let mut step = prefill_batch(&mut pool, batch);
        runner.forward(&step).unwrap();
        for s in &mut step.seqs {
            let table = s.kv.last_mut().unwrap();
            table.append_slot(&mut pool).unwrap();
            s.tokens = vec![1];
            s.start_pos = CONTEXT;
        }
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(format!("decode batch {batch} (context {CONTEXT})"), |b| {
            b.iter(|| black_box(runner.forward(&step).unwrap()))
        });
    }
    group.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
