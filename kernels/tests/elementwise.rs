//! Gathers, norms, SiLU-and-multiply and the cuBLAS linear layer against CPU references.

mod common;

use common::*;
use kernels::{activation, gather, linear, norm, split_k};

#[test]
fn embedding_and_gather_rows_copy_exactly() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(1);
    for (vocab, hidden) in [(2048, 256), (1000, 1024)] {
        let table = to_bf16(&rng.normals(vocab * hidden, 1.0));
        let mut ids: Vec<u32> = (0..37).map(|_| rng.below(vocab) as u32).collect();
        ids[5] = vocab as u32 + 3; // out of range: a zero row
        let d_table = gpu.upload(&table).unwrap();
        let d_ids = gpu.upload(&ids).unwrap();
        let mut d_out = gpu.upload(&poison_bf16(ids.len() * hidden)).unwrap();
        gather::embedding(&gpu, &d_ids, &d_table, vocab, &mut d_out, hidden).unwrap();
        let out = gpu.download(&d_out).unwrap();
        for (t, &id) in ids.iter().enumerate() {
            let row = &out[t * hidden..(t + 1) * hidden];
            if (id as usize) < vocab {
                let want = &table[id as usize * hidden..(id as usize + 1) * hidden];
                assert!(
                    row.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                );
            } else {
                assert!(
                    row.iter().all(|x| x.to_bits() == 0),
                    "out-of-range id gives zeros"
                );
            }
        }

        let pick: Vec<u32> = vec![36, 0, 17, 17];
        let d_pick = gpu.upload(&pick).unwrap();
        let mut d_rows = gpu.upload(&poison_bf16(pick.len() * hidden)).unwrap();
        gather::gather_rows(&gpu, &d_out, ids.len(), &d_pick, &mut d_rows, hidden).unwrap();
        let rows = gpu.download(&d_rows).unwrap();
        for (i, &p) in pick.iter().enumerate() {
            let want = &out[p as usize * hidden..(p as usize + 1) * hidden];
            let got = &rows[i * hidden..(i + 1) * hidden];
            assert!(
                got.iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
        }
    }
}

/// A vocabulary split over ranks: the slices' lookups sum to the whole table's (each id is in
/// exactly one slice), and the ranks' gathered logits join back into rows of the whole vocabulary.
#[test]
fn vocabulary_slices_embed_and_join_like_the_whole() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(2);
    let (vocab, hidden, ranks): (usize, usize, usize) = (1001, 64, 4);
    let each = vocab.div_ceil(ranks);
    let table = to_bf16(&rng.normals(vocab * hidden, 1.0));
    let ids: Vec<u32> = (0..29).map(|_| rng.below(vocab) as u32).collect();
    let d_ids = gpu.upload(&ids).unwrap();
    let mut whole = vec![0.0f32; ids.len() * hidden];
    for r in 0..ranks {
        let rows = each.min(vocab - r * each);
        let part = &table[r * each * hidden..(r * each + rows) * hidden];
        let d_part = gpu.upload(part).unwrap();
        let mut d_out = gpu.upload(&poison_bf16(ids.len() * hidden)).unwrap();
        gather::embedding_slice(&gpu, &d_ids, &d_part, (r * each, rows), &mut d_out, hidden)
            .unwrap();
        for (w, x) in whole.iter_mut().zip(gpu.download(&d_out).unwrap()) {
            *w += x.to_f32();
        }
    }
    for (t, &id) in ids.iter().enumerate() {
        let want = &table[id as usize * hidden..(id as usize + 1) * hidden];
        let got = &whole[t * hidden..(t + 1) * hidden];
        assert!(got.iter().zip(want).all(|(a, b)| *a == b.to_f32()));
    }

    let rows = 3;
    let logits: Vec<f32> = (0..rows * vocab).map(|i| i as f32).collect();
    // What an all-gather of each rank's [rows, each] block (the last one padded) lays out.
    let mut parts = vec![f32::NAN; ranks * rows * each];
    for r in 0..ranks {
        for row in 0..rows {
            for c in 0..each.min(vocab - r * each) {
                parts[(r * rows + row) * each + c] = logits[row * vocab + r * each + c];
            }
        }
    }
    let d_parts = gpu.upload(&parts).unwrap();
    let mut d_out = gpu.zeros::<f32>(rows * vocab).unwrap();
    gather::join_vocab_slices(&gpu, &d_parts, &mut d_out, rows, vocab, each).unwrap();
    assert_eq!(gpu.download(&d_out).unwrap(), logits);
}

fn rms_reference(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * inv * g).collect()
}

#[test]
fn rms_norm_and_fused_residual_add() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(2);
    let eps = 1e-6;
    for (rows, hidden) in [(5, 256), (33, 1024), (3, 4096)] {
        let x = to_bf16(&rng.normals(rows * hidden, 2.0));
        let res = to_bf16(&rng.normals(rows * hidden, 1.0));
        let w = to_bf16(&rng.normals(hidden, 0.5));
        let (d_x, d_w) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
        let mut d_out = gpu.upload(&poison_bf16(rows * hidden)).unwrap();
        norm::rms_norm(&gpu, &d_x, &d_w, &mut d_out, rows, hidden, eps).unwrap();
        let out = wide(&gpu.download(&d_out).unwrap());
        let (xw, ww) = (wide(&x), wide(&w));
        let reference: Vec<f64> = (0..rows)
            .flat_map(|r| rms_reference(&xw[r * hidden..(r + 1) * hidden], &ww, eps as f64))
            .collect();
        assert_close(
            &format!("rms_norm {rows}x{hidden}"),
            &out,
            &reference,
            BF16_TOL,
        );

        let mut d_x = gpu.upload(&x).unwrap();
        let mut d_res = gpu.upload(&res).unwrap();
        norm::add_rms_norm(&gpu, &mut d_x, &mut d_res, &d_w, rows, hidden, eps).unwrap();
        let (new_x, new_res) = (
            wide(&gpu.download(&d_x).unwrap()),
            wide(&gpu.download(&d_res).unwrap()),
        );
        let sum: Vec<f64> = xw.iter().zip(wide(&res)).map(|(a, b)| a + b).collect();
        assert_close("residual sum", &new_res, &sum, 1e-2);
        let reference: Vec<f64> = (0..rows)
            .flat_map(|r| rms_reference(&sum[r * hidden..(r + 1) * hidden], &ww, eps as f64))
            .collect();
        assert_close(
            &format!("add_rms_norm {rows}x{hidden}"),
            &new_x,
            &reference,
            BF16_TOL,
        );
    }
}

#[test]
fn silu_mul_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(3);
    for (rows, inter) in [(7, 3072), (64, 512)] {
        let gu = to_bf16(&rng.normals(rows * 2 * inter, 2.0));
        let d_gu = gpu.upload(&gu).unwrap();
        let mut d_out = gpu.upload(&poison_bf16(rows * inter)).unwrap();
        activation::silu_mul(&gpu, &d_gu, &mut d_out, rows, inter).unwrap();
        let out = wide(&gpu.download(&d_out).unwrap());
        let g = wide(&gu);
        let reference: Vec<f64> = (0..rows * inter)
            .map(|i| {
                let (r, c) = (i / inter, i % inter);
                let (a, b) = (g[r * 2 * inter + c], g[r * 2 * inter + inter + c]);
                a / (1.0 + (-a).exp()) * b
            })
            .collect();
        assert_close(
            &format!("silu_mul {rows}x{inter}"),
            &out,
            &reference,
            BF16_TOL,
        );
    }
}

#[test]
fn linear_through_cublas_with_fused_weights() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(4);
    let (tokens, hidden) = (19, 256);
    let (q, k, v) = (256, 128, 128);
    let parts: Vec<Vec<kernels::bf16>> = [q, k, v]
        .iter()
        .map(|&o| to_bf16(&rng.normals(o * hidden, 0.05)))
        .collect();
    let refs: Vec<&[kernels::bf16]> = parts.iter().map(|p| p.as_slice()).collect();
    let fused = linear::fuse_rows(&refs, hidden).unwrap();
    let out_features = q + k + v;
    let x = to_bf16(&rng.normals(tokens * hidden, 1.0));
    let (d_x, d_w) = (gpu.upload(&x).unwrap(), gpu.upload(&fused).unwrap());
    let (xw, ww) = (wide(&x), wide(&fused));
    let reference: Vec<f64> = (0..tokens * out_features)
        .map(|i| {
            let (t, o) = (i / out_features, i % out_features);
            (0..hidden)
                .map(|j| xw[t * hidden + j] * ww[o * hidden + j])
                .sum()
        })
        .collect();

    let mut d_y = gpu.upload(&poison_bf16(tokens * out_features)).unwrap();
    linear::linear(&gpu, &d_x, &d_w, &mut d_y, tokens, out_features, hidden).unwrap();
    let y = wide(&gpu.download(&d_y).unwrap());
    assert_close("linear bf16 out", &y, &reference, BF16_TOL);

    let mut d_y32 = gpu.upload(&poison_f32(tokens * out_features)).unwrap();
    linear::linear(&gpu, &d_x, &d_w, &mut d_y32, tokens, out_features, hidden).unwrap();
    let y32: Vec<f64> = gpu
        .download(&d_y32)
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_close("linear f32 out", &y32, &reference, 1e-3);

    assert!(linear::fuse_rows(&[&fused[..hidden + 1]], hidden).is_err());
}

#[test]
fn bias_is_added_to_every_row() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(5);
    let (rows, width) = (13, 384);
    let y = to_bf16(&rng.normals(rows * width, 1.0));
    let bias = to_bf16(&rng.normals(width, 0.5));
    let mut d_y = gpu.upload(&y).unwrap();
    let d_bias = gpu.upload(&bias).unwrap();
    linear::add_bias(&gpu, &mut d_y, &d_bias, rows, width).unwrap();
    let got = wide(&gpu.download(&d_y).unwrap());
    let want: Vec<f64> = (0..rows * width)
        .map(|i| round_bf16(y[i].to_f64() + bias[i % width].to_f64()))
        .collect();
    assert_close("add_bias", &got, &want, 1e-6);
}

#[test]
fn wrong_sizes_are_refused_before_launch() {
    let Some(gpu) = gpu() else { return };
    let x = gpu.upload(&to_bf16(&[1.0; 64])).unwrap();
    let w = gpu.upload(&to_bf16(&[1.0; 32])).unwrap();
    let mut out = gpu.upload(&to_bf16(&[0.0; 64])).unwrap();
    let err = norm::rms_norm(&gpu, &x, &w, &mut out, 3, 32, 1e-6).unwrap_err();
    assert!(
        matches!(err, kernels::Error::InvalidArgument { .. }),
        "{err}"
    );
    let err = norm::rms_norm(&gpu, &x, &w, &mut out, 2, 30, 1e-6).unwrap_err();
    assert!(err.to_string().contains("multiple of 8"), "{err}");
}

#[test]
fn split_k_partials_and_their_fused_consumers() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(8);
    let eps = 1e-6;
    // (tokens, out_features, in_features, splits): o_proj-, down- and gate_up-like products.
    for (tokens, out, inp, splits) in [(5, 256, 512, 4), (33, 512, 768, 3), (1, 384, 256, 16)] {
        let x = to_bf16(&rng.normals(tokens * inp, 1.0));
        let w = to_bf16(&rng.normals(out * inp, 0.05));
        let (d_x, d_w) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
        let (xw, ww) = (wide(&x), wide(&w));
        let product: Vec<f64> = (0..tokens * out)
            .map(|i| {
                let (t, o) = (i / out, i % out);
                (0..inp).map(|j| xw[t * inp + j] * ww[o * inp + j]).sum()
            })
            .collect();
        let what = format!("{tokens}x{out}x{inp} in {splits} splits");

        let mut d_parts = gpu.upload(&poison_f32(splits * tokens * out)).unwrap();
        split_k::linear_partials(&gpu, &d_x, &d_w, &mut d_parts, tokens, out, inp, splits).unwrap();
        let parts = gpu.download(&d_parts).unwrap();
        let range = inp / splits;
        let first: Vec<f64> = (0..tokens * out)
            .map(|i| {
                let (t, o) = (i / out, i % out);
                (0..range).map(|j| xw[t * inp + j] * ww[o * inp + j]).sum()
            })
            .collect();
        let got: Vec<f64> = parts[..tokens * out].iter().map(|&v| v as f64).collect();
        assert_close(&format!("first partial, {what}"), &got, &first, 1e-4);

        let mut d_y = gpu.upload(&poison_bf16(tokens * out)).unwrap();
        split_k::sum_splits(&gpu, &d_parts, &mut d_y, tokens, out, splits).unwrap();
        let y = wide(&gpu.download(&d_y).unwrap());
        assert_close(&format!("sum_splits, {what}"), &y, &product, BF16_TOL);

        // The fused add + RMSNorm: as add_rms_norm on the bf16 product.
        let res = to_bf16(&rng.normals(tokens * out, 1.0));
        let g = to_bf16(&rng.normals(out, 0.5));
        let d_g = gpu.upload(&g).unwrap();
        let mut d_res = gpu.upload(&res).unwrap();
        let mut d_x2 = gpu.upload(&poison_bf16(tokens * out)).unwrap();
        norm::add_split_rms_norm(
            &gpu, &d_parts, splits, &mut d_x2, &mut d_res, &d_g, tokens, out, eps,
        )
        .unwrap();
        let sum: Vec<f64> = product.iter().zip(wide(&res)).map(|(a, b)| a + b).collect();
        let new_res = wide(&gpu.download(&d_res).unwrap());
        assert_close(&format!("split residual sum, {what}"), &new_res, &sum, 1e-2);
        let gw = wide(&g);
        let reference: Vec<f64> = (0..tokens)
            .flat_map(|r| rms_reference(&sum[r * out..(r + 1) * out], &gw, eps as f64))
            .collect();
        let new_x = wide(&gpu.download(&d_x2).unwrap());
        assert_close(
            &format!("add_split_rms_norm, {what}"),
            &new_x,
            &reference,
            BF16_TOL,
        );
    }
    // Ranges must be whole multiples of 8.
    let (d_x, d_w) = (
        gpu.zeros::<kernels::bf16>(64).unwrap(),
        gpu.zeros(64).unwrap(),
    );
    let mut d_p = gpu.zeros::<f32>(64).unwrap();
    assert!(split_k::linear_partials(&gpu, &d_x, &d_w, &mut d_p, 1, 1, 64, 16).is_err());
}
