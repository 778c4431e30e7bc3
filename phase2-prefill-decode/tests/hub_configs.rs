//! The `config.json` files of real checkpoints, as the Hugging Face hub has them (`configs/`):
//! each family loads, with its RoPE scaling, tied or untied head and published size; what this
//! engine cannot run is refused with a message that names it.

use std::path::{Path, PathBuf};

use phase2::{Architecture, ModelConfig, RopeScaling};

fn config(name: &str) -> ModelConfig {
    let path = configs_dir().join(name);
    ModelConfig::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn configs_dir() -> PathBuf {
    phase2::models_dir().join("../configs")
}

/// Parameters in billions, one decimal.
fn billions(c: &ModelConfig) -> f64 {
    (c.num_parameters() as f64 / 1e8).round() / 10.0
}

#[test]
fn llama_3_1_and_3_2_load_with_llama3_rope_scaling() {
    let c = config("llama-3.1-8b.json");
    assert_eq!(c.architecture, Architecture::Llama);
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Llama3 { factor: 8.0, .. }
    ));
    assert!(!c.tie_word_embeddings && !c.qk_norm && !c.qkv_bias);
    assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
    assert_eq!(billions(&c), 8.0);
    // The fast pairs keep their trained frequency, the slowest turn 8 times slower.
    let plain = phase2::RopeFrequencies::new(128, 500_000.0, &RopeScaling::None);
    assert_eq!(c.rope.inv_freq[0], plain.inv_freq[0]);
    let last = plain.inv_freq[63] / 8.0;
    assert!((c.rope.inv_freq[63] - last).abs() <= last * 1e-6);

    let c = config("llama-3.2-1b.json");
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Llama3 { factor: 32.0, .. }
    ));
    assert!(c.tie_word_embeddings);
    assert_eq!((c.head_dim, billions(&c)), (64, 1.2));
}

#[test]
fn qwen_yarn_in_both_spellings_scales_the_context() {
    let c = config("qwen3-8b-yarn.json");
    let RopeScaling::Yarn {
        factor,
        attention_factor,
        ..
    } = c.rope_scaling
    else {
        panic!("{:?}", c.rope_scaling)
    };
    assert_eq!(factor, 4.0);
    assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
    assert_eq!(c.rope.attention_factor, attention_factor as f32);
    assert_eq!(c.max_position_embeddings, 4 * 32768);
    assert_eq!(billions(&c), 8.2);

    // Qwen2.5 writes the older `"type": "yarn"`, and a window that is switched off.
    let c = config("qwen2.5-7b-yarn.json");
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Yarn { factor: 4.0, .. }
    ));
    assert!(c.qkv_bias && c.sliding_window.is_none());
    assert_eq!(billions(&c), 7.6);

    let c = config("qwen3-8b.json");
    assert_eq!(
        (c.rope_scaling.clone(), c.max_position_embeddings),
        (RopeScaling::None, 40960)
    );
    assert_eq!(billions(&config("qwen3-32b.json")), 32.8);
}

#[test]
fn mistral_loads_and_keeps_its_sliding_window() {
    let c = config("mistral-7b-v0.3.json");
    assert_eq!(c.architecture, Architecture::Mistral);
    assert_eq!((c.sliding_window, billions(&c)), (None, 7.2));
    let c = config("mistral-7b-v0.1.json");
    assert_eq!(c.sliding_window, Some(4096));
}

#[test]
fn every_config_here_loads() {
    let mut names: Vec<_> = std::fs::read_dir(configs_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    assert!(names.len() >= 9, "{names:?}");
    for path in names {
        ModelConfig::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn other_rope_types_are_refused_by_name() {
    let text = std::fs::read_to_string(configs_dir().join("llama-3.1-8b.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["rope_scaling"] = serde_json::json!({"rope_type": "longrope", "factor": 4.0});
    let err = ModelConfig::from_json(&v.to_string(), Path::new("config.json")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot load model from config.json: rope type \"longrope\" is not supported \
         (supported: default, linear, llama3, yarn)"
    );
}
