//! The chapter 0 exercises (`src/exercises/`), one module each:
//! `cargo test -p phase0 --features exercises --test exercises [module]`.

use phase0::exercises::min_tokens::MinTokensParams;
use phase0::exercises::parallel_sampling::fan_out;
use phase0::exercises::stop_strings::StopStrings;
use phase0::{Error, FinishReason, Request, SamplingParams, Sequence, TokenId};
use proptest::prelude::*;

fn field(err: Error) -> &'static str {
    match err {
        Error::InvalidSamplingParams { field, .. } => field,
        other => panic!("expected InvalidSamplingParams, got {other:?}"),
    }
}

mod min_tokens {
    use super::*;

    const EOS: TokenId = 0;
    const STOP: TokenId = 7;

    fn params(min_tokens: usize, max_tokens: usize) -> MinTokensParams {
        MinTokensParams {
            params: SamplingParams::default()
                .with_max_tokens(max_tokens)
                .with_stop_token_ids(vec![STOP]),
            min_tokens,
        }
    }

    /// Feeds `tokens` one at a time; returns the output at the stop and why it stopped.
    fn run(p: &MinTokensParams, tokens: &[TokenId]) -> (usize, Option<FinishReason>) {
        for n in 1..=tokens.len() {
            if let Some(reason) = p.stop_reason(&tokens[..n], &[EOS]) {
                return (n, Some(reason));
            }
        }
        (tokens.len(), None)
    }

    #[test]
    fn min_tokens_may_not_exceed_max_tokens() {
        assert!(params(4, 4).validate().is_ok());
        assert!(params(0, 1).validate().is_ok());
        assert_eq!(field(params(5, 4).validate().unwrap_err()), "min_tokens");
        let mut bad = params(1, 4);
        bad.params.top_k = 0;
        assert_eq!(
            field(bad.validate().unwrap_err()),
            "top_k",
            "the old checks still run first"
        );
    }

    #[test]
    fn eos_and_stop_ids_count_only_after_min_tokens() {
        let p = params(2, 10);
        assert_eq!(run(&p, &[EOS, STOP, 3, EOS]), (4, Some(FinishReason::Eos)));
        assert_eq!(run(&p, &[4, 5, STOP]), (3, Some(FinishReason::Stop)));
        assert_eq!(run(&p, &[4, EOS, 5]), (3, None));
        // max_tokens still ends it, whatever min_tokens says.
        assert_eq!(
            run(&params(3, 3), &[EOS, EOS, EOS]),
            (3, Some(FinishReason::Length))
        );
        let mut ignoring = params(0, 3);
        ignoring.params.ignore_eos = true;
        assert_eq!(
            run(&ignoring, &[EOS, EOS, STOP]),
            (3, Some(FinishReason::Stop))
        );
    }

    #[test]
    fn early_stop_tokens_are_masked_until_allowed() {
        let p = params(2, 10);
        let fresh = || vec![1.0f32; 10];
        for num_output in 0..2 {
            let mut logits = fresh();
            p.mask_early_stops(&mut logits, num_output, &[EOS, 42]);
            assert_eq!(logits[EOS as usize], f32::NEG_INFINITY);
            assert_eq!(logits[STOP as usize], f32::NEG_INFINITY);
            let untouched = (0..10).filter(|&i| i != EOS as usize && i != STOP as usize);
            assert!(untouched.into_iter().all(|i| logits[i] == 1.0));
        }
        let mut logits = fresh();
        p.mask_early_stops(&mut logits, 2, &[EOS]);
        assert_eq!(
            logits,
            fresh(),
            "two tokens came before: stopping is allowed"
        );

        let mut ignoring = params(1, 10);
        ignoring.params.ignore_eos = true;
        let mut logits = fresh();
        ignoring.mask_early_stops(&mut logits, 0, &[EOS]);
        assert_eq!(logits[EOS as usize], 1.0, "an ignored EOS needs no mask");
        assert_eq!(logits[STOP as usize], f32::NEG_INFINITY);
    }

    proptest! {
        #[test]
        fn without_a_minimum_the_rule_is_append_token(
            tokens in prop::collection::vec(0u32..10, 1..12),
            max_tokens in 1usize..12,
        ) {
            let p = params(0, max_tokens);
            let mut seq = Sequence::new(Request::new(1, vec![5], p.params.clone())).unwrap();
            seq.start().unwrap();
            for n in 1..=tokens.len() {
                let expected = seq.append_token(tokens[n - 1], &[EOS]).unwrap();
                prop_assert_eq!(p.stop_reason(&tokens[..n], &[EOS]), expected);
                if expected.is_some() {
                    break;
                }
            }
        }

        #[test]
        fn no_early_stop_before_the_minimum(
            tokens in prop::collection::vec(0u32..10, 1..12),
            min_tokens in 0usize..6,
        ) {
            let p = params(min_tokens, 12);
            let (n, reason) = run(&p, &tokens);
            if matches!(reason, Some(FinishReason::Eos | FinishReason::Stop)) {
                prop_assert!(n > min_tokens, "stopped after {} tokens, min {}", n, min_tokens);
            }
            // And it stops at the first stop token that is allowed.
            let first_allowed = (min_tokens..tokens.len())
                .find(|&i| tokens[i] == EOS || tokens[i] == STOP);
            if let Some(i) = first_allowed {
                prop_assert_eq!(n, i + 1);
            }
        }
    }
}

mod stop_strings {
    use super::*;

    /// Where the output ends, computed on the whole text: at the first place where a stop
    /// string is complete, before the longest one ending there.
    fn reference(text: &str, stops: &[String]) -> (String, bool) {
        for end in (1..=text.len()).filter(|&e| text.is_char_boundary(e)) {
            let start = stops
                .iter()
                .filter(|s| text[..end].ends_with(s.as_str()))
                .map(|s| end - s.len())
                .min();
            if let Some(start) = start {
                return (text[..start].to_string(), true);
            }
        }
        (text.to_string(), false)
    }

    #[test]
    fn a_stop_string_split_over_pieces_is_found_and_cut() {
        let mut f = StopStrings::new(vec!["User:".into()]).unwrap();
        let r = f.push("Hello. Us");
        assert_eq!((r.text.as_str(), r.stopped), ("Hello. ", false));
        assert_eq!(f.held(), "Us");
        let r = f.push("er: hi");
        assert_eq!((r.text.as_str(), r.stopped), ("", true));
        assert!(f.push("more").stopped);
        assert_eq!(f.push("more").text, "");
    }

    #[test]
    fn held_text_is_released_when_it_turns_out_harmless() {
        let mut f = StopStrings::new(vec!["\n\n".into()]).unwrap();
        assert_eq!(f.push("one\n").text, "one");
        assert_eq!(f.push("two").text, "\ntwo");
        assert_eq!(f.push("\n").text, "");
        assert_eq!(f.finish(), "\n", "the end of the output releases the rest");
    }

    #[test]
    fn empty_stop_strings_are_refused() {
        let err = StopStrings::new(vec!["x".into(), String::new()]).unwrap_err();
        assert_eq!(field(err), "stop");
    }

    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(vec!['a', 'b', '\n', 'é']), 0..24)
            .prop_map(|c| c.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn streaming_gives_the_whole_text_answer_and_holds_back_as_little_as_possible(
            input in text(),
            stops in prop::collection::vec(text().prop_filter("non-empty", |s| !s.is_empty()), 1..3),
            cuts in prop::collection::vec(0usize..24, 0..6),
        ) {
            let chars: Vec<char> = input.chars().collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(chars.len())).collect();
            cuts.push(chars.len());
            cuts.sort();
            let mut f = StopStrings::new(stops.clone()).unwrap();
            let (mut out, mut fed, mut from, mut stopped) = (String::new(), String::new(), 0, false);
            for cut in cuts {
                let piece: String = chars[from..cut].iter().collect();
                from = cut;
                fed.push_str(&piece);
                let r = f.push(&piece);
                out.push_str(&r.text);
                stopped = r.stopped;
                if stopped {
                    break;
                }
                // Nothing lost, and only a possible start of a stop string is held.
                prop_assert_eq!(format!("{out}{}", f.held()), fed.clone());
                let held = f.held().len();
                for n in held + 1..=fed.len() {
                    if fed.is_char_boundary(fed.len() - n) {
                        let tail = &fed[fed.len() - n..];
                        prop_assert!(
                            !stops.iter().any(|s| s.starts_with(tail)),
                            "held {:?}, but {:?} could start a stop string too", f.held(), tail
                        );
                    }
                }
                prop_assert!(held == 0 || stops.iter().any(|s| s.starts_with(f.held())));
            }
            if !stopped {
                out.push_str(&f.finish());
            }
            prop_assert_eq!((out, stopped), reference(&input, &stops));
        }
    }
}

mod parallel_sampling {
    use super::*;

    fn request(seed: Option<u64>) -> Request {
        let mut params = SamplingParams::default().with_max_tokens(4);
        params.seed = seed;
        Request::new(9, vec![3, 1, 4], params)
    }

    #[test]
    fn each_copy_has_its_own_id_and_seed_and_the_same_prompt() {
        let group = fan_out(&request(Some(10)), 3, 5).unwrap();
        let ids: Vec<u64> = group.seqs.iter().map(Sequence::id).collect();
        let seeds: Vec<Option<u64>> = group.seqs.iter().map(|s| s.params().seed).collect();
        assert_eq!(ids, vec![5, 6, 7]);
        assert_eq!(seeds, vec![Some(10), Some(11), Some(12)]);
        for s in &group.seqs {
            assert_eq!(s.prompt(), &[3, 1, 4]);
            assert_eq!(s.params().max_tokens, 4);
            assert!(!s.is_finished());
        }
        let wrapped = fan_out(&request(Some(u64::MAX)), 2, 0).unwrap();
        assert_eq!(wrapped.seqs[1].params().seed, Some(0));
        let unseeded = fan_out(&request(None), 2, 0).unwrap();
        assert!(unseeded.seqs.iter().all(|s| s.params().seed.is_none()));
    }

    #[test]
    fn bad_fan_outs_are_errors() {
        assert_eq!(field(fan_out(&request(None), 0, 0).unwrap_err()), "n");
        let mut bad = request(None);
        bad.params.top_p = 0.0;
        assert_eq!(field(fan_out(&bad, 2, 0).unwrap_err()), "top_p");
        bad.params.top_p = 1.0;
        bad.prompt.clear();
        assert_eq!(fan_out(&bad, 2, 0).unwrap_err(), Error::EmptyPrompt(0));
    }

    #[test]
    fn a_group_is_done_when_every_sequence_is() {
        let mut group = fan_out(&request(Some(1)), 3, 0).unwrap();
        assert_eq!(group.num_unfinished(), 3);
        for s in &mut group.seqs {
            s.start().unwrap();
        }
        group.seqs[0].finish(FinishReason::Eos).unwrap();
        group.seqs[2].finish(FinishReason::Aborted).unwrap();
        assert!(!group.is_finished());
        assert_eq!(group.num_unfinished(), 1);
        group.seqs[1].append_token(2, &[]).unwrap();
        group.seqs[1].finish(FinishReason::Length).unwrap();
        assert!(group.is_finished());
        assert_eq!(group.num_unfinished(), 0);
    }
}
