//! `LogprobDriver`: the same tokens as the plain loop, and for a request that asked, one
//! record per token whose log-probabilities are a distribution with the greedy pick on top.

use phase6::{
    Config, Device, LLM, LogprobDriver, Logprobs, Prompt, SamplingParams, StreamPiece, TokenId,
};

fn llm() -> LLM {
    let config = Config {
        device: Device::Cpu,
        kvcache_block_size: 16,
        cpu_kv_cache_bytes: 64 << 20,
        max_model_len: 256,
        seed: Some(0),
        ..Config::default()
    };
    LLM::new(phase2::default_model_dir(), config).unwrap()
}

fn tokens(llm: &mut LLM, params: SamplingParams) -> Vec<TokenId> {
    let pieces: Vec<StreamPiece> = llm
        .generate_stream(Prompt::Tokens(vec![5, 9, 30]), params)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    pieces.iter().map(|p| p.token_id).collect()
}

#[test]
fn logprobs_ride_along_without_changing_the_tokens() {
    let greedy = SamplingParams::greedy()
        .with_max_tokens(12)
        .with_ignore_eos(true);
    let sampled = SamplingParams {
        temperature: 0.9,
        seed: Some(3),
        ..greedy.clone()
    };
    let mut plain = llm();
    let want_greedy = tokens(&mut plain, greedy.clone());
    let want_sampled = tokens(&mut plain, sampled.clone());

    let mut llm = llm();
    let logprobs = Logprobs::default();
    llm.set_driver(Box::new(LogprobDriver::new(logprobs.clone())));
    for (params, want) in [(greedy, want_greedy), (sampled, want_sampled)] {
        let (id, _events) = llm
            .add_request_streaming(Prompt::Tokens(vec![5, 9, 30]), params.clone())
            .unwrap();
        logprobs.want(id, 4);
        let mut got = Vec::new();
        while !llm.is_finished() {
            llm.step().unwrap();
        }
        while let Some(lp) = logprobs.take(id) {
            assert!(lp.logprob <= 0.0 && lp.top.len() == 4);
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
            if params.temperature == 0.0 {
                assert_eq!(lp.top[0], (lp.token, lp.logprob), "greedy takes the best");
            }
            got.push(lp.token);
        }
        logprobs.forget(id);
        assert_eq!(got, want);
    }
}
