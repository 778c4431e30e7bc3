//! Chapter 6.5: which part of the model each rank holds (Megatron-LM's split).
//!
//! With `tp` ranks, rank `r` keeps:
//! - q/k/v (column-parallel): its `heads / tp` query heads and the KV heads they read; when
//!   `tp` exceeds the KV heads, a KV head is copied to the `tp / kv_heads` ranks whose query
//!   heads use it (as vLLM does), so each rank still holds one;
//! - the output projection (row-parallel): the columns that read its heads, so its product is a
//!   partial sum of the layer's output, completed by an all-reduce;
//! - gate/up (column-parallel) and down (row-parallel) over its `intermediate / tp` slice, the
//!   same way;
//! - the embedding and the lm_head (vocab-parallel): a contiguous slice of the vocabulary;
//! - the norms, whole.
//!
//! A rank's part is itself a [`Model`] of the same family, only narrower, so the forward pass of
//! chapter 2 runs it as it is.

use std::ops::Range;

use phase2::{Layer, Model, ModelConfig};

/// Rank `rank` of `world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub world_size: usize,
}

/// Refuses a split that does not divide the model, before anything is loaded (the engine's
/// `Config::validate` has already kept `tp` within 1 to 8).
pub fn check_split(c: &ModelConfig, tp: usize) -> Result<(), String> {
    let fits = |what: &str, n: usize| {
        if n.is_multiple_of(tp) {
            Ok(())
        } else {
            Err(format!(
                "tensor_parallel_size = {tp} does not divide the model's {what} ({n})"
            ))
        }
    };
    fits("attention heads", c.num_heads)?;
    fits("intermediate size", c.intermediate_size)?;
    if c.num_kv_heads >= tp {
        fits("KV heads", c.num_kv_heads)
    } else if tp.is_multiple_of(c.num_kv_heads) {
        Ok(())
    } else {
        Err(format!(
            "tensor_parallel_size = {tp} is neither a divisor nor a multiple of the model's KV heads ({})",
            c.num_kv_heads
        ))
    }
}

impl Shard {
    fn part(&self, n: usize) -> Range<usize> {
        let each = n / self.world_size;
        self.rank * each..(self.rank + 1) * each
    }

    /// This rank's query heads.
    pub fn q_heads(&self, c: &ModelConfig) -> Range<usize> {
        self.part(c.num_heads)
    }

    /// This rank's KV heads: a slice of them, or the one head its query heads share.
    pub fn kv_heads(&self, c: &ModelConfig) -> Range<usize> {
        if c.num_kv_heads >= self.world_size {
            self.part(c.num_kv_heads)
        } else {
            let head = self.rank * c.num_kv_heads / self.world_size;
            head..head + 1
        }
    }

    /// This rank's slice of the MLP's intermediate size.
    pub fn intermediate(&self, c: &ModelConfig) -> Range<usize> {
        self.part(c.intermediate_size)
    }

    /// This rank's slice of the vocabulary: `ceil(vocab / tp)` ids, the last rank fewer.
    pub fn vocab(&self, c: &ModelConfig) -> Range<usize> {
        let each = c.vocab_size.div_ceil(self.world_size);
        let start = (self.rank * each).min(c.vocab_size);
        start..((self.rank + 1) * each).min(c.vocab_size)
    }

    /// This rank's config: the same model, narrower.
    pub fn config(&self, c: &ModelConfig) -> ModelConfig {
        ModelConfig {
            num_heads: self.q_heads(c).len(),
            num_kv_heads: self.kv_heads(c).len(),
            intermediate_size: self.intermediate(c).len(),
            vocab_size: self.vocab(c).len(),
            ..c.clone()
        }
    }

    /// This rank's part of `model`.
    pub fn slice(&self, model: &Model) -> Model {
        let c = &model.config;
        let (h, d) = (c.hidden_size, c.head_dim);
        let (q, kv, inter) = (self.q_heads(c), self.kv_heads(c), self.intermediate(c));
        let qd = c.num_heads * d;
        let kvd = c.num_kv_heads * d;
        // Row ranges (in units of rows) of the fused q|k|v matrix and bias.
        let qkv_rows = [
            q.start * d..q.end * d,
            qd + kv.start * d..qd + kv.end * d,
            qd + kvd + kv.start * d..qd + kvd + kv.end * d,
        ];
        let gate_up_rows = [
            inter.clone(),
            c.intermediate_size + inter.start..c.intermediate_size + inter.end,
        ];
        let layers = model
            .layers
            .iter()
            .map(|layer| Layer {
                input_norm: layer.input_norm.clone(),
                qkv: rows(&layer.qkv, h, &qkv_rows),
                qkv_bias: layer.qkv_bias.as_ref().map(|b| rows(b, 1, &qkv_rows)),
                q_norm: layer.q_norm.clone(),
                k_norm: layer.k_norm.clone(),
                o_proj: columns(&layer.o_proj, qd, q.start * d..q.end * d),
                post_norm: layer.post_norm.clone(),
                gate_up: rows(&layer.gate_up, h, &gate_up_rows),
                down: columns(&layer.down, c.intermediate_size, inter.clone()),
            })
            .collect();
        let vocab = self.vocab(c);
        Model {
            config: self.config(c),
            embed: rows(&model.embed, h, std::slice::from_ref(&vocab)),
            layers,
            final_norm: model.final_norm.clone(),
            lm_head: model
                .lm_head
                .as_ref()
                .map(|m| rows(m, h, std::slice::from_ref(&vocab))),
        }
    }
}

/// The rows `ranges` (in order) of a row-major matrix `width` wide.
fn rows(m: &[f32], width: usize, ranges: &[Range<usize>]) -> Vec<f32> {
    ranges
        .iter()
        .flat_map(|r| &m[r.start * width..r.end * width])
        .copied()
        .collect()
}

/// The columns `cols` of every row of a row-major matrix `width` wide.
fn columns(m: &[f32], width: usize, cols: Range<usize>) -> Vec<f32> {
    m.chunks_exact(width)
        .flat_map(|row| &row[cols.clone()])
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(heads: usize, kv: usize, inter: usize, vocab: usize) -> ModelConfig {
        let text = format!(
            r#"{{"architectures":["Qwen3ForCausalLM"],"vocab_size":{vocab},"hidden_size":16,
            "intermediate_size":{inter},"num_hidden_layers":1,"num_attention_heads":{heads},
            "num_key_value_heads":{kv},"head_dim":4,"rms_norm_eps":1e-6,"rope_theta":10000,
            "max_position_embeddings":64}}"#
        );
        ModelConfig::from_json(&text, std::path::Path::new("config.json")).unwrap()
    }

    #[test]
    fn splits_that_do_not_divide_are_refused_by_name() {
        let c = config(8, 2, 32, 100);
        assert!(check_split(&c, 2).is_ok() && check_split(&c, 4).is_ok());
        assert_eq!(
            check_split(&c, 3).unwrap_err(),
            "tensor_parallel_size = 3 does not divide the model's attention heads (8)"
        );
        assert!(
            check_split(&config(12, 4, 48, 10), 6)
                .unwrap_err()
                .contains("KV heads (4)")
        );
    }

    #[test]
    fn kv_heads_are_shared_out_or_copied() {
        let c = config(8, 2, 32, 10);
        let heads = |tp: usize| -> Vec<_> {
            (0..tp)
                .map(|rank| {
                    Shard {
                        rank,
                        world_size: tp,
                    }
                    .kv_heads(&c)
                })
                .collect()
        };
        assert_eq!(heads(2), vec![0..1, 1..2]);
        assert_eq!(heads(4), vec![0..1, 0..1, 1..2, 1..2]);
        // The vocabulary: ceil(10 / 4) = 3 ids a rank, the last one fewer.
        let vocab: Vec<_> = (0..4)
            .map(|rank| {
                Shard {
                    rank,
                    world_size: 4,
                }
                .vocab(&c)
            })
            .collect();
        assert_eq!(vocab, vec![0..3, 3..6, 6..9, 9..10]);
    }
}
