//! Helpers shared by the chapter 2 model tests: where the models are, a random checkpoint
//! folder, and a plain greedy loop over one sequence.

#![allow(dead_code)]

use std::path::PathBuf;

use phase1::{BlockTable, KvPool};
use phase2::{
    CpuRunner, ForwardBatch, ForwardSeq, Model, ModelConfig, ModelRunner, SampleSpec, Weights,
};

pub use phase2::models_dir;

/// A small Qwen3 config for fast tests.
pub fn small_config() -> ModelConfig {
    let json = r#"{"architectures":["Qwen3ForCausalLM"],"vocab_size":300,"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"head_dim":32,"rms_norm_eps":1e-6,"rope_theta":10000,
        "max_position_embeddings":512,"tie_word_embeddings":true}"#;
    ModelConfig::from_json(json, std::path::Path::new("test config")).unwrap()
}

pub fn small_model(seed: u64) -> Model {
    let config = small_config();
    let weights = Weights::random(&config, seed);
    Model::from_weights(config, &weights).unwrap()
}

/// Prefills `prompt` in one step and decodes greedily; returns the prefill's last logits and
/// `steps` tokens.
pub fn greedy(
    model: Model,
    prompt: &[u32],
    steps: usize,
    page_size: usize,
) -> (Vec<f32>, Vec<u32>) {
    let total = prompt.len() + steps;
    let pages = total.div_ceil(page_size) + 1;
    let mut pool = KvPool::new(pages, page_size).unwrap();
    let mut runner = CpuRunner::new(model, pages, page_size);
    let mut table = BlockTable::new();
    table.append_tokens(&mut pool, prompt.len()).unwrap();
    let mut batch = ForwardBatch {
        seqs: vec![ForwardSeq {
            seq_id: 0,
            tokens: prompt.to_vec(),
            start_pos: 0,
            kv: vec![table.clone()],
            sample: Some(SampleSpec::greedy()),
        }],
    };
    let first = runner.forward(&batch).unwrap();
    let mut out = vec![phase2::sampler::argmax(first.row(0))];
    while out.len() < steps {
        table.append_slot(&mut pool).unwrap();
        let seq = &mut batch.seqs[0];
        seq.start_pos = table.num_tokens() - 1;
        seq.tokens = vec![*out.last().unwrap()];
        seq.kv = vec![table.clone()];
        out.push(runner.forward_sample(&batch).unwrap()[0]);
    }
    (first.data, out)
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_error(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "nano-serving-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a complete random checkpoint folder (config, weights, the tiny model's tokenizer).
pub fn write_random_checkpoint(tag: &str, config_json: &str, seed: u64) -> PathBuf {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("config.json"), config_json).unwrap();
    let config = ModelConfig::from_json(config_json, &dir.join("config.json")).unwrap();
    Weights::random(&config, seed)
        .save(&dir.join("model.safetensors"))
        .unwrap();
    let tiny = models_dir().join("tiny-shakespeare");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny.join(f), dir.join(f)).unwrap();
    }
    dir
}

pub const SMALL_CONFIG_JSON: &str = r#"{"architectures":["Qwen3ForCausalLM"],"vocab_size":2048,
    "hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
    "num_key_value_heads":2,"head_dim":16,"rms_norm_eps":1e-6,"rope_theta":10000,
    "max_position_embeddings":256,"tie_word_embeddings":true,"eos_token_id":0}"#;
