//! The chapter 2 exercises (`src/exercises/`), one module each:
//! `cargo test -p phase2 --features exercises --test exercises [module]`.

use phase0::TokenId;
use phase2::exercises::logprobs::{log_softmax, top_logprobs};
use phase2::exercises::min_p::{apply_min_p, sample_min_p, validate_min_p};
use phase2::exercises::repetition_penalty::{apply_repetition_penalty, generate};
use phase2::sampler::{argmax, sample};
use phase2::{CpuRunner, Fixture, Model, SampleSpec, models_dir};
use proptest::prelude::*;

fn spec(temperature: f32, top_k: i32, seed: u64, step: u64) -> SampleSpec {
    SampleSpec {
        temperature,
        top_k,
        top_p: 1.0,
        seed,
        step,
    }
}

/// The embedded model on a CPU runner with room for 64 pages of 16 tokens.
fn tiny_runner() -> CpuRunner {
    let model = Model::load(&models_dir().join("tiny-shakespeare")).unwrap();
    CpuRunner::new(model, 64, 16)
}

/// A prompt and its 32 greedy tokens from Hugging Face `transformers`
/// (`models/fixtures/tiny-shakespeare.json`).
fn fixture(name: &str) -> (Vec<TokenId>, Vec<TokenId>) {
    let fixture = Fixture::read(&models_dir().join("fixtures/tiny-shakespeare.json")).unwrap();
    let case = fixture
        .case(name)
        .unwrap_or_else(|| panic!("no fixture case {name}"));
    (case.prompt.clone(), case.greedy.clone())
}

mod min_p {
    use super::*;

    #[test]
    fn only_tokens_near_the_top_stay() {
        // Probabilities at temperature 1 relative to the top: 1, e^-1 = 0.37, e^-2 = 0.14, e^-4.
        let logits = [2.0f32, 1.0, 0.0, -2.0];
        let mut x = logits;
        apply_min_p(&mut x, 1.0, 0.2);
        assert_eq!(x, [2.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        // At temperature 2 the distribution is flatter: e^-1 = 0.37 > 0.2 now survives.
        let mut x = logits;
        apply_min_p(&mut x, 2.0, 0.2);
        assert_eq!(x, [2.0, 1.0, 0.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn zero_min_p_and_greedy_change_nothing_and_one_keeps_only_the_top() {
        let logits = [0.5f32, 3.0, 3.0, -1.0];
        let mut x = logits;
        apply_min_p(&mut x, 1.0, 0.0);
        assert_eq!(x, logits);
        apply_min_p(&mut x, 0.0, 0.9);
        assert_eq!(x, logits, "greedy sampling has no distribution to cut");
        apply_min_p(&mut x, 0.7, 1.0);
        assert_eq!(x, [f32::NEG_INFINITY, 3.0, 3.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for bad in [-0.1, 1.5, f32::NAN] {
            match validate_min_p(bad) {
                Err(phase0::Error::InvalidSamplingParams { field, .. }) => {
                    assert_eq!(field, "min_p")
                }
                other => panic!("min_p {bad}: expected an error, got {other:?}"),
            }
        }
        assert!(validate_min_p(0.0).is_ok() && validate_min_p(1.0).is_ok());
    }

    #[test]
    fn kept_tokens_are_drawn_in_proportion_and_the_rest_never() {
        let logits = [1.0f32, 0.0, 2.0, -3.0, 1.5];
        let kept = [0usize, 2, 4]; // within e^-1.2 = 0.3 of the top
        let n = 20_000;
        let mut counts = [0usize; 5];
        for step in 0..n {
            counts[sample_min_p(&logits, &spec(1.0, -1, 3, step), 0.3) as usize] += 1;
        }
        assert_eq!(
            counts[1] + counts[3],
            0,
            "drew a token below min_p: {counts:?}"
        );
        let z: f32 = kept.iter().map(|&i| logits[i].exp()).sum();
        for i in kept {
            let (seen, expected) = (counts[i] as f32 / n as f32, logits[i].exp() / z);
            assert!(
                (seen - expected).abs() < 0.02,
                "token {i}: drawn {seen:.3} of the time, expected {expected:.3}"
            );
        }
    }

    proptest! {
        #[test]
        fn min_p_zero_is_the_plain_sampler(
            logits in prop::collection::vec(-5.0f32..5.0, 2..40),
            temperature in 0.0f32..2.0,
            seed in any::<u64>(),
        ) {
            let s = spec(temperature, -1, seed, 0);
            prop_assert_eq!(sample_min_p(&logits, &s, 0.0), sample(&logits, &s));
        }
    }
}

mod repetition_penalty {
    use super::*;

    #[test]
    fn positive_logits_shrink_negative_ones_grow_more_negative_once_each() {
        let mut x = [2.0f32, -1.0, 0.5, 3.0];
        apply_repetition_penalty(&mut x, &[0, 1, 1, 1, 9], 2.0);
        assert_eq!(x, [1.0, -2.0, 0.5, 3.0]);
        let mut y = [2.0f32, -1.0];
        apply_repetition_penalty(&mut y, &[0, 1], 1.0);
        assert_eq!(y, [2.0, -1.0], "a penalty of 1 is no penalty");
    }

    #[test]
    fn the_loop_gives_the_reference_greedy_tokens() {
        let mut runner = tiny_runner();
        for case in ["short", "sentence", "passage-200"] {
            let (prompt, expected) = fixture(case);
            let got = generate(&mut runner, &prompt, expected.len(), |logits, _| {
                argmax(logits)
            })
            .unwrap();
            assert_eq!(
                got, expected,
                "{case}: greedy tokens differ from transformers'"
            );
        }
    }

    #[test]
    fn choose_sees_the_output_so_far_and_its_choice_is_fed_back() {
        let mut runner = tiny_runner();
        let (prompt, _) = fixture("short");
        let mut seen = Vec::new();
        // Force a token that greedy would not pick; the model must continue from it.
        let forced = generate(&mut runner, &prompt, 6, |logits, out| {
            seen.push(out.to_vec());
            if out.is_empty() { 7 } else { argmax(logits) }
        })
        .unwrap();
        assert_eq!(forced.len(), 6);
        assert_eq!(forced[0], 7);
        let expected: Vec<Vec<TokenId>> = (0..6).map(|i| forced[..i].to_vec()).collect();
        assert_eq!(seen, expected, "choose gets the tokens generated before it");
        let mut with_seven = prompt.clone();
        with_seven.push(7);
        let continued = generate(&mut runner, &with_seven, 5, |l, _| argmax(l)).unwrap();
        assert_eq!(continued, forced[1..], "the forced token's K/V was used");
    }

    #[test]
    fn a_penalty_makes_the_model_repeat_itself_less() {
        let mut runner = tiny_runner();
        let (prompt, _) = fixture("sentence");
        let distinct = |tokens: &[TokenId]| {
            let mut t = tokens.to_vec();
            t.sort();
            t.dedup();
            t.len()
        };
        let plain = generate(&mut runner, &prompt, 64, |l, _| argmax(l)).unwrap();
        let penalised = generate(&mut runner, &prompt, 64, |logits, out| {
            apply_repetition_penalty(logits, out, 1.5);
            argmax(logits)
        })
        .unwrap();
        assert!(
            distinct(&penalised) > distinct(&plain),
            "{} distinct tokens with a penalty of 1.5, {} without",
            distinct(&penalised),
            distinct(&plain)
        );
    }

    #[test]
    fn a_too_long_request_is_an_error_not_a_panic() {
        let mut runner = CpuRunner::new(
            Model::load(&models_dir().join("tiny-shakespeare")).unwrap(),
            2,
            4,
        );
        assert!(generate(&mut runner, &[1, 2, 3], 8, |l, _| argmax(l)).is_err());
    }
}

mod logprobs {
    use super::*;

    #[test]
    fn log_softmax_is_stable_and_normalised() {
        let lp = log_softmax(&[1000.0, 1000.0, f32::NEG_INFINITY]);
        assert!((lp[0] - 0.5f32.ln()).abs() < 1e-6 && (lp[1] - lp[0]).abs() < 1e-9);
        assert_eq!(lp[2], f32::NEG_INFINITY);
        let lp = log_softmax(&[-3.0, 0.0, 2.5, 1.0]);
        let total: f32 = lp.iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "probabilities sum to {total}");
        assert!(
            (lp[2] - lp[1] - 2.5).abs() < 1e-6,
            "differences of logits are kept"
        );
    }

    #[test]
    fn top_logprobs_are_sorted_with_ties_in_id_order() {
        let top = top_logprobs(&[0.0, 2.0, 1.0, 2.0], 3);
        let ids: Vec<TokenId> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!(top[0].1 == top[1].1 && top[1].1 > top[2].1);
        assert_eq!(top_logprobs(&[0.0, 1.0], 5).len(), 2);
    }

    #[test]
    fn greedy_tokens_are_the_top_entry_and_top_k_samples_are_in_the_top_k() {
        let mut runner = tiny_runner();
        let (prompt, _) = fixture("sentence");
        generate(&mut runner, &prompt, 24, |logits, _| {
            let token = argmax(logits);
            let top = top_logprobs(logits, 1);
            assert_eq!(
                top[0].0, token,
                "greedy picked a token that is not the most likely"
            );
            token
        })
        .unwrap();
        for seed in 0..3 {
            let mut step = 0;
            generate(&mut runner, &prompt, 24, |logits, _| {
                let token = sample(logits, &spec(1.0, 5, seed, step));
                step += 1;
                let top: Vec<TokenId> = top_logprobs(logits, 5).iter().map(|t| t.0).collect();
                assert!(
                    top.contains(&token),
                    "seed {seed}: top-5 sampling drew {token}, not in {top:?}"
                );
                token
            })
            .unwrap();
        }
    }
}
