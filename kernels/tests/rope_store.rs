//! q/k RMSNorm + RoPE + paged K/V store against a CPU reference, and a check that nothing but
//! the given slots of the cache is written. The rotation follows the frequency table it is
//! given (here a rescaled one with an attention factor, as YaRN's), not `theta` alone.

mod common;

use common::*;
use kernels::paged::{CacheShape, Fp8CacheMut};
use kernels::rope::{RopeStore, qk_norm_rope_store};
use phase6_fp8::e4m3;

/// A head's rotation: the frequency table, the position and the factor on cos and sin.
struct Turn<'a> {
    inv_freq: &'a [f32],
    pos: f64,
    scale: f64,
}

/// Reference of one head: optional RMSNorm, then rotate_half RoPE (neither, for v).
fn reference_head(x: &[f64], w: Option<&[f64]>, turn: Option<&Turn<'_>>) -> Vec<f64> {
    let d = x.len();
    let mut y = x.to_vec();
    if let Some(w) = w {
        let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / d as f64 + 1e-6).sqrt();
        y = x.iter().zip(w).map(|(v, g)| v * inv * g).collect();
    }
    let Some(turn) = turn else {
        return y;
    };
    let half = d / 2;
    let mut out = vec![0.0; d];
    for p in 0..half {
        let angle = turn.pos * turn.inv_freq[p] as f64;
        let (s, c) = angle.sin_cos();
        let (s, c) = (s * turn.scale, c * turn.scale);
        out[p] = y[p] * c - y[p + half] * s;
        out[p + half] = y[p + half] * c + y[p] * s;
    }
    out
}

#[test]
fn rope_store_matches_reference_for_each_head_dim() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(10);
    // (head_dim, q heads, kv heads, page size, with q/k norm)
    for (d, hq, hkv, ps, with_norm) in [
        (128, 16, 8, 16, true),
        (64, 4, 2, 256, true),
        (32, 4, 1, 16, false),
    ] {
        let shape = CacheShape {
            num_pages: 6,
            num_kv_heads: hkv,
            page_size: ps,
            head_dim: d,
        };
        let t = 21;
        let heads = hq + 2 * hkv;
        // theta 1e6 with the slower half of the pairs interpolated 4x, and a factor on cos/sin.
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|p| {
                let f = 1e6f64.powf(-2.0 * p as f64 / d as f64);
                (if 2 * p < d / 2 { f } else { f / 4.0 }) as f32
            })
            .collect();
        let attention_factor = 1.1386f32;
        let qkv = to_bf16(&rng.normals(t * heads * d, 1.0));
        let positions: Vec<i32> = (0..t).map(|_| rng.below(5000) as i32).collect();
        let mut all_slots: Vec<(i32, i32)> = (0..shape.num_pages * ps)
            .map(|s| ((s / ps) as i32, (s % ps) as i32))
            .collect();
        rng.shuffle(&mut all_slots);
        let mut slots: Vec<(i32, i32)> = all_slots[..t].to_vec();
        slots[3] = (-1, 0); // a padding token: its K/V go nowhere
        let flat_slots: Vec<i32> = slots.iter().flat_map(|&(p, o)| [p, o]).collect();
        let qn = to_bf16(&rng.normals(d, 0.5));
        let kn = to_bf16(&rng.normals(d, 0.5));

        let d_qkv = gpu.upload(&qkv).unwrap();
        let d_pos = gpu.upload(&positions).unwrap();
        let d_slots = gpu.upload(&flat_slots).unwrap();
        let (d_qn, d_kn) = (gpu.upload(&qn).unwrap(), gpu.upload(&kn).unwrap());
        let d_freq = gpu.upload(&inv_freq).unwrap();
        let mut d_q = gpu.upload(&poison_bf16(t * hq * d)).unwrap();
        let mut d_k = gpu.upload(&poison_bf16(shape.elements())).unwrap();
        let mut d_v = gpu.upload(&poison_bf16(shape.elements())).unwrap();
        let args = RopeStore {
            positions: d_pos.as_view(),
            slots: d_slots.as_view(),
            q_norm: with_norm.then(|| d_qn.as_view()),
            k_norm: with_norm.then(|| d_kn.as_view()),
            num_q_heads: hq,
            inv_freq: d_freq.as_view(),
            attention_factor,
            norm_eps: 1e-6,
        };
        qk_norm_rope_store(&gpu, &d_qkv, &args, shape, &mut d_q, &mut d_k, &mut d_v).unwrap();
        let q = wide(&gpu.download(&d_q).unwrap());
        let k = gpu.download(&d_k).unwrap();
        let v = gpu.download(&d_v).unwrap();

        let x = wide(&qkv);
        let (qnw, knw) = (wide(&qn), wide(&kn));
        let head = |tok: usize, h: usize| &x[(tok * heads + h) * d..(tok * heads + h + 1) * d];
        let mut q_ref = Vec::new();
        let (mut kv_got, mut kv_ref) = (Vec::new(), Vec::new());
        let mut written = vec![false; shape.elements()];
        for tok in 0..t {
            let turn = Turn {
                inv_freq: &inv_freq,
                pos: positions[tok] as f64,
                scale: attention_factor as f64,
            };
            for h in 0..hq {
                let w = with_norm.then_some(qnw.as_slice());
                q_ref.extend(reference_head(head(tok, h), w, Some(&turn)));
            }
            let (page, off) = slots[tok];
            if page < 0 {
                continue;
            }
            for kh in 0..hkv {
                let at = shape.row_offset(page as usize, kh, off as usize);
                let w = with_norm.then_some(knw.as_slice());
                kv_ref.extend(reference_head(head(tok, hq + kh), w, Some(&turn)));
                kv_got.extend(wide(&k[at..at + d]));
                kv_ref.extend(reference_head(head(tok, hq + hkv + kh), None, None));
                kv_got.extend(wide(&v[at..at + d]));
                written[at..at + d].iter_mut().for_each(|w| *w = true);
            }
        }
        assert_close(&format!("rope q d{d}"), &q, &q_ref, BF16_TOL);
        assert_close(&format!("rope stored k/v d{d}"), &kv_got, &kv_ref, BF16_TOL);

        // The same into an FP8 cache, with scales that are not powers of two: every stored code
        // is within half a step of value / scale, 99% of them the reference's nearest code
        // exactly, and nothing else is written.
        let (k_scale, v_scale) = (0.3f32, 0.7f32);
        let mut c_k = gpu.upload(&vec![e4m3::NAN; shape.elements()]).unwrap();
        let mut c_v = gpu.upload(&vec![e4m3::NAN; shape.elements()]).unwrap();
        let mut d_q8 = gpu.upload(&poison_bf16(t * hq * d)).unwrap();
        qk_norm_rope_store(
            &gpu,
            &d_qkv,
            &args,
            shape,
            &mut d_q8,
            &mut Fp8CacheMut {
                codes: c_k.as_view_mut(),
                scale: k_scale,
            },
            &mut Fp8CacheMut {
                codes: c_v.as_view_mut(),
                scale: v_scale,
            },
        )
        .unwrap();
        let (ck, cv) = (gpu.download(&c_k).unwrap(), gpu.download(&c_v).unwrap());
        let mut refs = kv_ref.iter();
        let (mut exact, mut total) = (0usize, 0usize);
        for (tok, &(page, off)) in slots.iter().enumerate().take(t) {
            if page < 0 {
                continue;
            }
            for kh in 0..hkv {
                let at = shape.row_offset(page as usize, kh, off as usize);
                for (codes, scale) in [(&ck, k_scale), (&cv, v_scale)] {
                    for i in 0..d {
                        let want = *refs.next().unwrap();
                        let got = f64::from(e4m3::decode(codes[at + i]) * scale);
                        total += 1;
                        exact += usize::from(codes[at + i] == e4m3::encode(want as f32 / scale));
                        // Half a step of 3 mantissa bits, the subnormals' step, and slack for
                        // the kernel's f32 value against the f64 reference.
                        let tol =
                            want.abs() * (1.0 / 16.0 + 1e-3) + f64::from(scale) * 2f64.powi(-10);
                        assert!(
                            (got - want).abs() <= tol,
                            "fp8 d{d} token {tok} element {i}: {got} vs {want}"
                        );
                    }
                }
            }
        }
        // The kernel rounds its own f32 value, the reference an f64 one: they may fall on two
        // sides of a midpoint between codes, rarely.
        assert!(
            exact * 100 >= total * 99,
            "fp8 d{d}: {exact} of {total} codes are the reference's nearest"
        );
        for (i, &w) in written.iter().enumerate() {
            if !w {
                assert_eq!(
                    (ck[i], cv[i]),
                    (e4m3::NAN, e4m3::NAN),
                    "FP8 element {i} written"
                );
            }
        }
        for (i, &w) in written.iter().enumerate() {
            if !w {
                assert_eq!(
                    k[i].to_bits(),
                    0x7fc1,
                    "K element {i} written outside the slots"
                );
                assert_eq!(
                    v[i].to_bits(),
                    0x7fc1,
                    "V element {i} written outside the slots"
                );
            }
        }
    }
}
