//! The `LLM` API on the embedded model: greedy generation equals the `transformers` fixtures,
//! the step API and streaming agree with `generate`, per-prompt params are honoured, and bad
//! input is a clear error while the other requests go on.

use phase6::{Config, Device, Error, FinishReason, LLM, Prompt, SamplingParams};

fn config() -> Config {
    Config {
        device: Device::Cpu,
        kvcache_block_size: 16,
        cpu_kv_cache_bytes: 64 << 20,
        max_model_len: 2048,
        seed: Some(0),
        ..Config::default()
    }
}

fn llm() -> LLM {
    LLM::new(phase2::default_model_dir(), config()).unwrap()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams::greedy()
        .with_max_tokens(n)
        .with_ignore_eos(true)
}

#[test]
fn greedy_generate_equals_the_transformers_fixtures() {
    let path = phase2::models_dir().join("fixtures/tiny-shakespeare.json");
    let cases: Vec<(Vec<u32>, Vec<u32>)> = phase2::Fixture::read(&path)
        .unwrap()
        .cases
        .into_iter()
        .map(|c| (c.prompt, c.greedy))
        .collect();
    let mut llm = llm();
    let prompts: Vec<Prompt> = cases
        .iter()
        .map(|(p, _)| Prompt::Tokens(p.clone()))
        .collect();
    // All cases in one batched call: batching must not change a token.
    let outputs = llm.generate(&prompts, greedy(32), false).unwrap();
    for ((_, expected), out) in cases.iter().zip(&outputs) {
        assert_eq!(&out.token_ids, expected);
        assert_eq!(out.finish_reason, FinishReason::Length);
        assert_eq!(out.completion_tokens, 32);
    }
}

#[test]
fn step_api_streaming_and_generate_agree() {
    let prompts = [
        "ROMEO:",
        "JULIET:\nAy me!",
        "KING RICHARD III:\nNow is the winter",
    ];
    let mut a = llm();
    let expected: Vec<Vec<u32>> = a
        .generate(&prompts, greedy(12), false)
        .unwrap()
        .into_iter()
        .map(|o| o.token_ids)
        .collect();

    let mut b = llm();
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| b.add_request(*p, greedy(12)).unwrap())
        .collect();
    let mut got = std::collections::HashMap::new();
    let mut saw_prefill = false;
    let mut saw_decode = false;
    while !b.is_finished() {
        let (finished, n) = b.step().unwrap();
        saw_prefill |= n > 0;
        saw_decode |= n < 0;
        got.extend(finished);
    }
    assert!(
        saw_prefill && saw_decode,
        "prefill steps count positive, decode steps negative"
    );
    for (id, exp) in ids.iter().zip(&expected) {
        assert_eq!(&got[id], exp);
    }

    let mut c = llm();
    let mut stream = c.generate_stream(prompts[1], greedy(12)).unwrap();
    let pieces: Vec<_> = stream.by_ref().map(|p| p.unwrap()).collect();
    assert_eq!(stream.finish_reason(), Some(FinishReason::Length));
    let tokens: Vec<u32> = pieces.iter().map(|p| p.token_id).collect();
    assert_eq!(tokens, expected[1]);
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(text, c.decode(&expected[1]).unwrap());
}

#[test]
fn per_prompt_params_are_honoured_and_seeds_reproduce() {
    let mut llm = llm();
    let sampled = SamplingParams::default()
        .with_temperature(0.9)
        .with_top_k(40)
        .with_seed(7)
        .with_max_tokens(9);
    let params = vec![greedy(3), sampled.clone(), greedy(5)];
    let out = llm
        .generate(&["ROMEO:", "ROMEO:", "ROMEO:"], params, false)
        .unwrap();
    assert_eq!(
        out.iter().map(|o| o.token_ids.len()).collect::<Vec<_>>(),
        vec![3, out[1].token_ids.len(), 5]
    );
    assert!(out[1].token_ids.len() <= 9);
    assert_eq!(out[0].token_ids, out[2].token_ids[..3], "greedy is greedy");
    let again = llm.generate(&["ROMEO:"], sampled, false).unwrap();
    assert_eq!(
        again[0].token_ids, out[1].token_ids,
        "same seed, same sample, alone or batched"
    );
}

#[test]
fn bad_input_is_a_clear_error_and_the_others_go_on() {
    let mut llm = llm();
    let kept = llm.add_request("ROMEO:", greedy(4)).unwrap();

    let err = llm.generate(&["ROMEO:", ""], greedy(4), false).unwrap_err();
    assert!(matches!(err, Error::EmptyPrompt { index: 1 }), "{err}");
    let long = Prompt::Tokens(vec![5; 2048]);
    let err = llm.generate(&[long], greedy(4), false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "prompt of 2048 tokens is longer than the limit of 2047"
    );
    let err = llm
        .generate(
            &["ROMEO:"],
            SamplingParams::default().with_top_p(0.0),
            false,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid sampling params: top_p = 0 (must be in (0, 1])"
    );
    let err = llm
        .generate(&["a", "b"], vec![greedy(1)], false)
        .unwrap_err();
    assert!(matches!(err, Error::ParamsCount(1, 2)), "{err}");

    // The request queued before the bad calls still finishes.
    let mut done = Vec::new();
    while !llm.is_finished() {
        done.extend(llm.step().unwrap().0);
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, kept);
    assert_eq!(done[0].1.len(), 4);
    llm.engine_mut().scheduler_mut().clear_cache();
    let pool = llm.engine().scheduler().pool();
    assert_eq!(pool.num_free(), pool.num_pages(), "no page leaked");

    let err = LLM::new("/nonexistent/model", config()).err().unwrap();
    assert!(
        err.to_string().contains("/nonexistent/model/config.json"),
        "{err}"
    );
    let err = LLM::new(
        phase2::default_model_dir(),
        Config {
            kvcache_block_size: 10,
            ..config()
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("kvcache_block_size = 10"), "{err}");
}

#[test]
fn requests_that_set_nothing_get_the_models_generation_config() {
    // models/tiny-shakespeare/generation_config.json: temperature 0.8, top_k 50,
    // max_new_tokens 256 (which caps a default, never raises it).
    let p = llm().default_sampling_params();
    assert_eq!((p.temperature, p.top_p, p.top_k), (0.8, 1.0, 50));
    assert_eq!(p.max_tokens, SamplingParams::default().max_tokens);
    let bare = LLM::with_weights(
        phase2::ModelConfig::from_file(&phase2::default_model_dir().join("config.json")).unwrap(),
        &phase2::Weights::open(&phase2::default_model_dir()).unwrap(),
        None,
        config(),
    )
    .unwrap();
    assert_eq!(bare.default_sampling_params(), SamplingParams::default());
}

#[test]
fn abort_returns_pages_and_chat_template_uses_the_markers() {
    let mut llm = llm();
    let id = llm.add_request("ROMEO:", greedy(100)).unwrap();
    llm.step().unwrap();
    assert!(llm.abort(id));
    assert!(!llm.abort(id));
    assert!(llm.is_finished());
    let question = [phase6::ChatMessage::new("user", "Who art thou?")];
    let chat = llm.apply_chat_template(&question).unwrap();
    assert_eq!(
        chat,
        "<|im_start|>user\nWho art thou?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        llm.encode_chat(&question).unwrap(),
        llm.encode(&phase6::Prompt::Text(chat)).unwrap()
    );
    assert!(llm.startup_report().starts_with("device cpu: KV cache of"));
}
