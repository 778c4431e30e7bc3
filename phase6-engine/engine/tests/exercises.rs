//! The chapter 6.1 exercise (`src/exercises/`), one module each:
//! `cargo test -p phase6 --features exercises --test exercises [module]`.

use phase6::exercises::step_limit::StepLimit;
use phase6::{Config, Device, FinishReason, LLM, SamplingParams};

fn llm() -> LLM {
    let config = Config {
        device: Device::Cpu,
        kvcache_block_size: 16,
        cpu_kv_cache_bytes: 16 << 20,
        max_model_len: 512,
        ..Config::default()
    };
    LLM::new(phase2::default_model_dir(), config).unwrap()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams::greedy()
        .with_max_tokens(n)
        .with_ignore_eos(true)
}

mod step_limit {
    use super::*;

    #[test]
    fn a_request_stops_after_its_steps_with_the_tokens_it_made() {
        let prompts = ["ROMEO:", "JULIET:"];
        let params = vec![greedy(32), greedy(3)];
        let unlimited = llm().generate(&prompts, params.clone(), false).unwrap();
        let mut limited = llm();
        limited.set_driver(Box::new(StepLimit::new(6)));
        let outputs = limited.generate(&prompts, params, false).unwrap();

        let romeo = &outputs[0];
        assert_eq!(
            romeo.finish_reason,
            FinishReason::Aborted,
            "32 tokens take 32 steps: the limit of 6 must abort it"
        );
        assert_eq!(
            romeo.token_ids,
            unlimited[0].token_ids[..6],
            "in 6 steps (a prefill, then 5 decodes) a request makes its first 6 tokens"
        );
        let juliet = &outputs[1];
        assert_eq!(
            (juliet.finish_reason, &juliet.token_ids),
            (FinishReason::Length, &unlimited[1].token_ids),
            "a request that finishes within the limit is left alone"
        );
        assert_eq!(
            limited.kv_pool().num_used(),
            0,
            "an aborted request gives its pages back"
        );
    }

    #[test]
    fn each_request_counts_its_own_steps() {
        let mut llm = llm();
        llm.set_driver(Box::new(StepLimit::new(5)));
        let first = llm.add_request("ROMEO:", greedy(20)).unwrap();
        let mut finished = Vec::new();
        for _ in 0..3 {
            finished.extend(llm.step().unwrap().0);
        }
        let second = llm.add_request("JULIET:", greedy(20)).unwrap();
        let mut steps = 3;
        while !llm.is_finished() {
            finished.extend(llm.step().unwrap().0);
            steps += 1;
            assert!(steps < 50, "the limit never stopped them");
        }
        let len = |id| {
            finished
                .iter()
                .find(|(f, _)| *f == id)
                .map(|(_, t)| t.len())
        };
        assert_eq!(len(first), Some(5), "the first request is in steps 1 to 5");
        assert_eq!(
            len(second),
            Some(5),
            "the second request, added after step 3, has its own 5 steps"
        );
        assert_eq!(steps, 8, "the second request's fifth step is step 8");
    }

    #[test]
    fn a_limit_of_one_step_keeps_only_the_prefill_token() {
        let mut llm = llm();
        llm.set_driver(Box::new(StepLimit::new(1)));
        let out = llm.generate(&["ROMEO:"], greedy(10), false).unwrap();
        assert_eq!(
            (out[0].completion_tokens, out[0].finish_reason),
            (1, FinishReason::Aborted),
            "the prefill step makes one token; then the limit is reached"
        );
        assert_eq!(StepLimit::new(3).max_steps(), 3);
    }
}
