//! The chapter 6.5 exercise (`src/exercises/`):
//! `cargo test -p phase6-tp --features exercises --test exercises`.

mod shard_tensor {
    use phase2::{Model, ModelConfig, Weights, tensor_shapes};
    use phase6_tp::Shard;
    use phase6_tp::exercises::shard_tensor::shard_tensor;

    fn config(arch: &str, heads: usize, kv: usize, tied: bool) -> ModelConfig {
        let text = format!(
            r#"{{"architectures":["{arch}"],"vocab_size":50,"hidden_size":16,
            "intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":{heads},
            "num_key_value_heads":{kv},"head_dim":8,"rms_norm_eps":1e-6,"rope_theta":10000,
            "max_position_embeddings":64,"tie_word_embeddings":{tied}}}"#
        );
        ModelConfig::from_json(&text, std::path::Path::new("config.json")).unwrap()
    }

    /// Every tensor sharded by name, put together again as the rank's model, equals the
    /// chapter's `Shard::slice` of the whole model.
    fn check(c: &ModelConfig, tp: usize) {
        let weights = Weights::random(c, 5);
        let whole = Model::from_weights(c.clone(), &weights).unwrap();
        for rank in 0..tp {
            let shard = Shard {
                rank,
                world_size: tp,
            };
            let expected = shard.slice(&whole);
            let mut pieces = Vec::new();
            for (name, shape) in tensor_shapes(c) {
                let data = weights.get_f32(&name, &shape).unwrap();
                let (s, v) = shard_tensor(c, shard, &name, &shape, &data);
                assert_eq!(
                    s.iter().product::<usize>(),
                    v.len(),
                    "{name}: rank {rank} of {tp}: shape {s:?} does not hold its {} values",
                    v.len()
                );
                pieces.push((name, s, v));
            }
            let got = |name: &str| {
                let (_, s, v) = pieces.iter().find(|(n, _, _)| n == name).unwrap();
                (s.clone(), v.clone())
            };
            let layer = &expected.layers[1];
            let mut qkv = Vec::new();
            for p in ["q_proj", "k_proj", "v_proj"] {
                qkv.extend(got(&format!("model.layers.1.self_attn.{p}.weight")).1);
            }
            let at = format!("rank {rank} of {tp}");
            assert_eq!(
                qkv, layer.qkv,
                "{at}: q/k/v rows (its query heads, their KV heads)"
            );
            let (o_shape, o) = got("model.layers.1.self_attn.o_proj.weight");
            assert_eq!(o, layer.o_proj, "{at}: o_proj columns of its heads");
            assert_eq!(
                o_shape[0], c.hidden_size,
                "{at}: o_proj keeps every output row"
            );
            let mut gate_up = got("model.layers.1.mlp.gate_proj.weight").1;
            gate_up.extend(got("model.layers.1.mlp.up_proj.weight").1);
            assert_eq!(gate_up, layer.gate_up, "{at}: gate/up rows of its slice");
            assert_eq!(
                got("model.layers.1.mlp.down_proj.weight").1,
                layer.down,
                "{at}: down"
            );
            assert_eq!(
                got("model.embed_tokens.weight").1,
                expected.embed,
                "{at}: vocabulary rows"
            );
            if let Some(head) = &expected.lm_head {
                assert_eq!(&got("lm_head.weight").1, head, "{at}: lm_head rows");
            }
            if let Some(bias) = &layer.qkv_bias {
                let mut b = Vec::new();
                for p in ["q_proj", "k_proj", "v_proj"] {
                    b.extend(got(&format!("model.layers.1.self_attn.{p}.bias")).1);
                }
                assert_eq!(&b, bias, "{at}: q/k/v biases");
            }
            let norm = "model.layers.1.input_layernorm.weight";
            assert_eq!(
                got(norm).1,
                weights.get_f32(norm, &[16]).unwrap(),
                "{at}: norms whole"
            );
        }
    }

    #[test]
    fn heads_and_mlp_split_over_two_ranks() {
        check(&config("Qwen3ForCausalLM", 4, 2, true), 2);
    }

    #[test]
    fn biases_and_an_untied_head_over_four_ranks() {
        check(&config("Qwen2ForCausalLM", 8, 4, false), 4);
    }

    #[test]
    fn kv_heads_copied_when_ranks_outnumber_them() {
        check(&config("LlamaForCausalLM", 8, 2, false), 8);
    }
}
