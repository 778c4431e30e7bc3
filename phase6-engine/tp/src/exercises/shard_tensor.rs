//! Exercise 6.5.1: a rank's slice of one checkpoint tensor, by its Hugging Face name.
//!
//! `Shard::slice` cuts a model that is already loaded whole. A GPU rank cannot afford that: a
//! 70B model does not fit one device, so each rank reads only its slice of each tensor from the
//! safetensors files, as vLLM's weight loaders do. Given a tensor's name, its shape and its
//! row-major values, return the shape and values rank `shard` keeps, following the split of
//! `crate::shard` (q/k/v and gate/up by rows, o_proj and down by columns, embedding and
//! lm_head by vocabulary rows, everything else whole; KV heads copied when `tp` exceeds them).

use phase2::ModelConfig;

use crate::shard::Shard;

/// The shape and the values of `name` that `shard` keeps.
pub fn shard_tensor(
    c: &ModelConfig,
    shard: Shard,
    name: &str,
    shape: &[usize],
    data: &[f32],
) -> (Vec<usize>, Vec<f32>) {
    if !cfg!(feature = "solutions") {
        todo!("exercise 6.5.1: the rows or columns of `name` that rank `shard.rank` keeps");
    }
    // BEGIN SOLUTION
    let d = c.head_dim;
    let by_rows = |range: std::ops::Range<usize>| {
        let width: usize = shape[1..].iter().product();
        let mut out_shape = shape.to_vec();
        out_shape[0] = range.len();
        (
            out_shape,
            data[range.start * width..range.end * width].to_vec(),
        )
    };
    let by_columns = |range: std::ops::Range<usize>| {
        let width = shape[1];
        let values = data
            .chunks_exact(width)
            .flat_map(|row| &row[range.clone()])
            .copied()
            .collect();
        (vec![shape[0], range.len()], values)
    };
    let heads = |r: std::ops::Range<usize>| r.start * d..r.end * d;
    let kind = name.rsplit('.').nth(1).unwrap_or("");
    match kind {
        "q_proj" => by_rows(heads(shard.q_heads(c))),
        "k_proj" | "v_proj" => by_rows(heads(shard.kv_heads(c))),
        "o_proj" => by_columns(heads(shard.q_heads(c))),
        "gate_proj" | "up_proj" => by_rows(shard.intermediate(c)),
        "down_proj" => by_columns(shard.intermediate(c)),
        "embed_tokens" | "lm_head" => by_rows(shard.vocab(c)),
        _ => (shape.to_vec(), data.to_vec()),
    }
    // END SOLUTION
}
