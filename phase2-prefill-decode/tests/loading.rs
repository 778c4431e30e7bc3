//! Loading model folders: a random checkpoint written to disk loads and runs like the same
//! weights in memory, and every broken folder gets an error that names the file and the fault.

mod common;

use common::{SMALL_CONFIG_JSON, greedy, models_dir, temp_dir, write_random_checkpoint};
use phase2::{ChatMessage, Model, ModelConfig, Tokenizer, Weights};

fn load_err(dir: &std::path::Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("{} should not load", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_written_checkpoint_loads_and_runs_like_the_weights_in_memory() {
    let dir = write_random_checkpoint("roundtrip", SMALL_CONFIG_JSON, 11);
    let from_disk = Model::load(&dir).unwrap();
    let config = ModelConfig::from_json(SMALL_CONFIG_JSON, &dir).unwrap();
    let in_memory = Model::from_weights(config, &Weights::random(&from_disk.config, 11)).unwrap();
    let prompt = [5, 6, 7, 8];
    assert_eq!(
        greedy(from_disk, &prompt, 6, 4),
        greedy(in_memory, &prompt, 6, 4)
    );
    // No generation_config.json here: <|endoftext|> comes from config.json, <|im_end|> from the
    // chat template, whose turns it closes.
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.eos_token_ids(), &[0, 2]);
}

#[test]
fn sharded_checkpoints_load_through_their_index() {
    let dir = write_random_checkpoint("sharded", SMALL_CONFIG_JSON, 3);
    let whole = Model::load(&dir).unwrap();
    // Split the tensors over two shards and describe them in an index.
    let w = Weights::open(&dir).unwrap();
    let names: Vec<String> = w.names().map(String::from).collect();
    let mut map = serde_json::Map::new();
    let mut shards: [Vec<(String, safetensors::tensor::TensorView)>; 2] = [Vec::new(), Vec::new()];
    for (i, name) in names.iter().enumerate() {
        let t = w.tensor(name).unwrap();
        let view = safetensors::tensor::TensorView::new(
            safetensors::Dtype::BF16,
            t.shape.to_vec(),
            t.data,
        )
        .unwrap();
        let shard = format!("model-0000{}-of-00002.safetensors", i % 2 + 1);
        map.insert(name.clone(), serde_json::Value::String(shard));
        shards[i % 2].push((name.clone(), view));
    }
    for (i, shard) in shards.into_iter().enumerate() {
        let path = dir.join(format!("model-0000{}-of-00002.safetensors", i + 1));
        safetensors::serialize_to_file(shard, None, &path).unwrap();
    }
    drop(w);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let sharded = Model::load(&dir).unwrap();
    assert_eq!(sharded.embed, whole.embed);
    assert_eq!(sharded.layers[1].down, whole.layers[1].down);

    // Positioned reads of any piece of any shard give the memory map's bytes.
    let w = Weights::open(&dir).unwrap();
    for name in [
        "model.embed_tokens.weight",
        "model.layers.1.mlp.down_proj.weight",
    ] {
        let data = w.tensor(name).unwrap().data;
        let mut piece = vec![0u8; 100];
        w.read_bytes(name, 34, &mut piece).unwrap();
        assert_eq!(piece, data[34..134]);
        let err = w.read_bytes(name, data.len() - 10, &mut piece).unwrap_err();
        assert!(err.to_string().contains("read past the end"), "{err}");
        let mut values = vec![half::bf16::ZERO; 40];
        w.read_bf16(name, 17, &mut values).unwrap();
        let expected: Vec<_> = data[34..114]
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(values, expected);
    }
}

#[test]
fn every_broken_folder_names_its_file_and_fault() {
    let empty = temp_dir("empty");
    let err = load_err(&empty);
    assert!(
        err.contains("config.json") && err.contains("No such file"),
        "{err}"
    );

    let bad_json = write_random_checkpoint("badjson", SMALL_CONFIG_JSON, 1);
    std::fs::write(bad_json.join("config.json"), "{ not json").unwrap();
    let err = load_err(&bad_json);
    assert!(
        err.contains("config.json") && err.contains("bad JSON"),
        "{err}"
    );

    let gpt = write_random_checkpoint("arch", SMALL_CONFIG_JSON, 1);
    std::fs::write(
        gpt.join("config.json"),
        SMALL_CONFIG_JSON.replace("Qwen3ForCausalLM", "GPT2LMHeadModel"),
    )
    .unwrap();
    let err = load_err(&gpt);
    assert!(
        err.contains("config.json") && err.contains("unknown architecture \"GPT2LMHeadModel\""),
        "{err}"
    );

    let no_weights = write_random_checkpoint("noweights", SMALL_CONFIG_JSON, 1);
    std::fs::remove_file(no_weights.join("model.safetensors")).unwrap();
    let err = load_err(&no_weights);
    assert!(
        err.contains("model.safetensors") && err.contains("missing"),
        "{err}"
    );

    // Weights of a smaller model: the first tensor it checks has the wrong shape.
    let misshapen = write_random_checkpoint("shape", SMALL_CONFIG_JSON, 1);
    let wider = SMALL_CONFIG_JSON.replace("\"hidden_size\":64", "\"hidden_size\":96");
    std::fs::write(misshapen.join("config.json"), wider).unwrap();
    let err = load_err(&misshapen);
    assert!(
        err.contains("model.safetensors") && err.contains("has shape") && err.contains("expected"),
        "{err}"
    );

    // Qwen2 expects q/k/v biases that a Qwen3 checkpoint does not have.
    let missing = write_random_checkpoint("missing", SMALL_CONFIG_JSON, 1);
    std::fs::write(
        missing.join("config.json"),
        SMALL_CONFIG_JSON.replace("Qwen3ForCausalLM", "Qwen2ForCausalLM"),
    )
    .unwrap();
    let err = load_err(&missing);
    assert!(
        err.contains("missing tensor model.layers.0.self_attn.q_proj.bias"),
        "{err}"
    );

    let int_dtype = write_random_checkpoint("dtype", SMALL_CONFIG_JSON, 1);
    let data = vec![0u8; 16];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![4], &data).unwrap();
    safetensors::serialize_to_file(
        vec![("model.norm.weight", view)],
        None,
        &int_dtype.join("model.safetensors"),
    )
    .unwrap();
    let err = load_err(&int_dtype);
    assert!(
        err.contains("model.safetensors")
            && err.contains("model.norm.weight")
            && err.contains("I32"),
        "{err}"
    );

    let no_tok = temp_dir("notok");
    let err = Tokenizer::from_dir(&no_tok).err().unwrap().to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn tokenizer_round_trip_chat_template_and_streaming() {
    let tok = Tokenizer::from_dir(&models_dir().join("tiny-shakespeare")).unwrap();
    assert_eq!(tok.vocab_size(), 2048);
    let text = "ROMEO:\nBut soft, what light through yonder window breaks?";
    let ids = tok.encode(text).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(tok.eos_token_ids(), &[0, 2], "<|endoftext|> and <|im_end|>");

    let speak = [ChatMessage::new("user", "Speak.")];
    let chat = tok.apply_chat_template(&speak, true).unwrap();
    assert_eq!(
        chat,
        "<|im_start|>user\nSpeak.<|im_end|>\n<|im_start|>assistant\n"
    );
    let chat_ids = tok.encode_chat(&speak, true).unwrap();
    assert_eq!(chat_ids, tok.encode(&chat).unwrap());
    assert_eq!(chat_ids[0], tok.token_to_id("<|im_start|>").unwrap());

    // Streaming gives back the same text piece by piece, multi-byte characters included.
    let text = "Wherefore art thou — Romeo? ’tis naïve";
    let ids = tok.encode(text).unwrap();
    let mut stream = phase2::StreamDecoder::new(false);
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&stream.push(&tok, id).unwrap());
    }
    assert_eq!(streamed, text);
}
