//! Device sampling: greedy is the exact argmax (first index on ties); seeded sampling draws the
//! same token as a CPU implementation of phase2's sampler procedure on the same logits.

mod common;

use common::*;
use kernels::sampling::{SampleParams, sample};
use kernels::{Gpu, bf16};

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn uniform(seed: u64, step: u64) -> f32 {
    let bits = splitmix64(seed ^ splitmix64(step));
    (bits >> 40) as f32 / (1u64 << 24) as f32
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The procedure of phase2-prefill-decode/src/sampler.rs, written again here, with its sums
/// accumulated in `A` (f32 as in phase2, or f64).
///
/// Over a 150k-token vocabulary a sequential f32 sum drifts by ~1e-4 relative, enough to move
/// a draw that lands near a boundary by a few tokens; the GPU's fixed-point sums are exact to
/// ~1e-12, so at that size the f64 version is the reference.
fn cpu_sample<A: Accumulator>(logits: &[f32], p: &SampleParams) -> u32 {
    if p.temperature == 0.0 {
        return argmax(logits);
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weight = |x: f32| A::from(((x - max) / p.temperature).exp());
    let top_k_on = p.top_k > 0 && (p.top_k as usize) < logits.len();
    let threshold = if !top_k_on && p.top_p >= 1.0 {
        f32::NEG_INFINITY
    } else {
        let mut sorted = logits.to_vec();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        if top_k_on {
            sorted.truncate(p.top_k as usize);
        }
        if p.top_p < 1.0 {
            let weights: Vec<A> = sorted.iter().map(|&x| weight(x)).collect();
            let total = weights.iter().fold(A::default(), |s, &w| s + w);
            let mut mass = A::default();
            for (i, &w) in weights.iter().enumerate() {
                mass = mass + w / total;
                if mass >= A::from(p.top_p) {
                    sorted.truncate(i + 1);
                    break;
                }
            }
        }
        *sorted.last().unwrap()
    };
    let candidates = || logits.iter().enumerate().filter(|(_, x)| **x >= threshold);
    let kept = candidates().fold(A::default(), |s, (_, &x)| s + weight(x));
    let target = A::from(uniform(p.seed, p.step)) * kept;
    let (mut cumulative, mut last) = (A::default(), 0);
    for (i, &x) in candidates() {
        cumulative = cumulative + weight(x);
        last = i;
        if target < cumulative {
            return i as u32;
        }
    }
    last as u32
}

trait Accumulator:
    Copy
    + Default
    + PartialOrd
    + From<f32>
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
}

impl Accumulator for f32 {}
impl Accumulator for f64 {}

fn params_grid(rng: &mut Rng, rows: usize) -> Vec<SampleParams> {
    let temps = [0.0, 0.7, 1.0, 1.5];
    let top_ks = [-1, 1, 5, 50, 1000];
    let top_ps = [1.0, 0.9, 0.5, 0.05];
    (0..rows)
        .map(|i| {
            SampleParams::new(
                temps[i % temps.len()],
                top_ks[(i / 4) % top_ks.len()],
                top_ps[(i / 20) % top_ps.len()],
                rng.next_u64(),
                rng.below(1000) as u64,
            )
        })
        .collect()
}

fn run<T: kernels::sampling::Logit>(
    gpu: &Gpu,
    logits: &[T],
    params: &[SampleParams],
    vocab: usize,
) -> Vec<u32> {
    let d_logits = gpu.upload(logits).unwrap();
    let d_params = gpu.upload(params).unwrap();
    let mut d_out = gpu.upload(&vec![u32::MAX; params.len()]).unwrap();
    sample(gpu, &d_logits, &d_params, &mut d_out, params.len(), vocab).unwrap();
    gpu.download(&d_out).unwrap()
}

#[test]
fn greedy_is_the_first_argmax() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(30);
    let (rows, vocab) = (9, 151_936);
    let mut logits = rng.normals(rows * vocab, 3.0);
    // Row r: a tie for the maximum at two places, the earlier one must win.
    for r in 0..rows {
        let (a, b) = (rng.below(vocab), rng.below(vocab));
        logits[r * vocab + a] = 100.0;
        logits[r * vocab + b] = 100.0;
    }
    let params = vec![SampleParams::greedy(); rows];
    let got = run(&gpu, &logits, &params, vocab);
    let want: Vec<u32> = (0..rows)
        .map(|r| argmax(&logits[r * vocab..(r + 1) * vocab]))
        .collect();
    assert_eq!(got, want);
    // All -inf: index 0, like the CPU.
    let got = run(&gpu, &vec![f32::NEG_INFINITY; 64], &params[..1], 64);
    assert_eq!(got, vec![0]);
}

/// Rows where the device's draw differs from `reference` on the same logits.
fn differing(
    got: &[u32],
    logits: &[f32],
    params: &[SampleParams],
    vocab: usize,
    f64_sums: bool,
) -> Vec<usize> {
    (0..params.len())
        .filter(|&r| {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let want = if f64_sums {
                cpu_sample::<f64>(row, &params[r])
            } else {
                cpu_sample::<f32>(row, &params[r])
            };
            got[r] != want
        })
        .collect()
}

fn check_seeded_sampling(gpu: &Gpu, vocab: usize, scale: f64, seed: u64) {
    let mut rng = Rng::new(seed);
    let rows = 80;
    let logits = rng.normals(rows * vocab, scale);
    let params = params_grid(&mut rng, rows);
    // bf16 logits have many exact ties, which top-k must count as the CPU does.
    let low: Vec<bf16> = to_bf16(&logits);
    let low_f32: Vec<f32> = low.iter().map(|x| x.to_f32()).collect();
    let got = run(gpu, &logits, &params, vocab);
    let got_low = run(gpu, &low, &params, vocab);
    for (what, got, logits) in [("f32", &got, &logits), ("bf16", &got_low, &low_f32)] {
        let diff = differing(got, logits, &params, vocab, true);
        assert!(
            diff.is_empty(),
            "{what} logits, vocab {vocab}: rows {diff:?} differ"
        );
        let drift = differing(got, logits, &params, vocab, false);
        eprintln!(
            "{what} logits, vocab {vocab}: {rows} rows equal the procedure with f64 sums, \
             {} differ from it with f32 sums {drift:?}",
            drift.len()
        );
        if vocab <= 2048 {
            assert!(
                drift.is_empty(),
                "small vocabularies agree with f32 sums too"
            );
        }
    }
}

#[test]
fn seeded_sampling_equals_the_cpu_procedure_small_vocab() {
    let Some(gpu) = gpu() else { return };
    check_seeded_sampling(&gpu, 2048, 2.0, 31);
}

#[test]
fn seeded_sampling_equals_the_cpu_procedure_qwen_vocab() {
    let Some(gpu) = gpu() else { return };
    check_seeded_sampling(&gpu, 151_936, 3.0, 32);
}

#[test]
fn sampled_frequencies_follow_the_softmax() {
    let Some(gpu) = gpu() else { return };
    let logits = [1.0f32, 0.0, 2.0, -1.0];
    let rows = 4000;
    let all: Vec<f32> = logits.iter().copied().cycle().take(rows * 4).collect();
    let params: Vec<SampleParams> = (0..rows as u64)
        .map(|step| SampleParams::new(1.0, -1, 1.0, 7, step))
        .collect();
    let got = run(&gpu, &all, &params, 4);
    let z: f32 = logits.iter().map(|x| x.exp()).sum();
    for (t, logit) in logits.iter().enumerate() {
        let seen = got.iter().filter(|&&x| x == t as u32).count() as f32 / rows as f32;
        let expected = logit.exp() / z;
        assert!(
            (seen - expected).abs() < 0.03,
            "token {t}: {seen} vs {expected}"
        );
    }
}

#[test]
fn params_are_32_bytes_as_the_kernel_reads_them() {
    assert_eq!(std::mem::size_of::<SampleParams>(), 32);
}
