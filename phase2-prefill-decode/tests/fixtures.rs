//! The Rust forward pass against reference outputs computed with Hugging Face `transformers`
//! (see `tools/reference_outputs.py`): for the embedded model and random checkpoints that
//! differ where implementations go wrong (head_dim, kv heads, untied head, rope theta, Llama,
//! Qwen2 biases, Llama 3 and YaRN RoPE scaling, Mistral), the last prefill logits within 2e-4
//! relative error (the largest measured is 9e-5) and 32 greedy tokens equal.

mod common;

use common::{greedy, models_dir, rel_error};
use phase2::{Fixture, FixtureCase, Model};

/// Reads one fixture file: the model folder (relative to `models/`) and its cases.
fn read_fixture(path: &std::path::Path) -> (String, Vec<FixtureCase>) {
    let f = Fixture::read(path).unwrap();
    (f.model_dir, f.cases)
}

#[test]
fn forward_pass_matches_transformers_on_every_fixture() {
    let fixtures = models_dir().join("fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&fixtures)
        .unwrap_or_else(|e| panic!("no fixtures at {}: {e}", fixtures.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "expected the fixture files in {}",
        fixtures.display()
    );

    for file in files {
        let (model_dir, cases) = read_fixture(&file);
        let model = Model::load(&models_dir().join(&model_dir)).unwrap();
        for case in cases {
            let label = format!(
                "{} / {}",
                file.file_name().unwrap().to_string_lossy(),
                case.name
            );
            let (logits, tokens) = greedy(model.clone(), &case.prompt, case.greedy.len(), 16);
            let err = rel_error(&logits, &case.logits);
            assert!(
                err < 2e-4,
                "{label}: last logits differ, relative error {err:.2e}"
            );
            // Tokens must agree; only a reference near-tie (gap < 1e-3) could excuse a change.
            if let Some(i) = tokens.iter().zip(&case.greedy).position(|(a, b)| a != b) {
                assert!(
                    case.gaps[i] < 1e-3,
                    "{label}: greedy token {i} is {} instead of {} (reference gap {})",
                    tokens[i],
                    case.greedy[i],
                    case.gaps[i]
                );
                eprintln!("{label}: stops agreeing at token {i}, a reference near-tie");
            }
            eprintln!(
                "{label}: ok (logits error {err:.1e}, {} tokens)",
                tokens.len()
            );
        }
    }
}

#[test]
fn fixture_prompts_tokenize_as_in_transformers() {
    let (_, cases) = read_fixture(&models_dir().join("fixtures/tiny-shakespeare.json"));
    let tok = phase2::Tokenizer::from_dir(&models_dir().join("tiny-shakespeare")).unwrap();
    for case in cases {
        let text = case
            .text
            .as_deref()
            .expect("the embedded model's fixture has its texts");
        assert_eq!(
            tok.encode(text).unwrap(),
            case.prompt,
            "case {} tokenizes differently from the Python tokenizers library",
            case.name
        );
    }
}
