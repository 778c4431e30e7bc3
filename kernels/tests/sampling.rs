//! Device sampling: greedy is the exact argmax (first index on ties); seeded sampling draws the
//! same token as a CPU implementation of phase2's sampler procedure on the same logits.
//!
//! The cases reach every path of the kernel: a top-k whose candidates rank 0 gathers, bins too
//! full to gather (equal logits, ties at the k-th logit, logits packed into one bin), top-p
//! alone, plain temperature, vocabularies that are not a multiple of 16 (unaligned rows), small
//! ones that leave blocks of a cluster without logits, and masked (-inf) logits.

mod common;

use common::*;
use kernels::sampling::{
    SampleParams, SampleShape, launch_shape, rows_at_once, sample, sample_with,
};
use kernels::{Arch, Gpu};

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

/// Every pair of (top-k, top-p) the kernel tells apart, row after row, at temperatures 0.7, 1
/// and 1.5: top-k off, 1, small, the largest the one-pass top-k takes on 2 x 512 (80, whose cut
/// list can pass 128 entries), large enough that its candidates no longer fit rank 0's list
/// (6,000), the whole vocabulary and more (off); top-p off, 0.999, 0.9, 0.5, 0.01.
fn every_path(rng: &mut Rng, rows: usize, vocab: usize) -> Vec<SampleParams> {
    let top_ks = [-1, 1, 5, 50, 80, 1000, 6000, vocab as i32, vocab as i32 + 5];
    let top_ps = [1.0, 0.999, 0.9, 0.5, 0.01];
    let temps = [0.7, 1.0, 1.5];
    (0..rows)
        .map(|i| {
            let (k, p) = (i % top_ks.len(), (i / top_ks.len()) % top_ps.len());
            let t = (i / (top_ks.len() * top_ps.len())) % temps.len();
            SampleParams::new(
                temps[t],
                top_ks[k],
                top_ps[p],
                rng.next_u64(),
                rng.below(1000) as u64,
            )
        })
        .collect()
}

/// The tokens the kernel samples, checked to be the same in every shape the device has.
fn run<T: kernels::sampling::Logit>(
    gpu: &Gpu,
    logits: &[T],
    params: &[SampleParams],
    vocab: usize,
) -> Vec<u32> {
    let d_logits = gpu.upload(logits).unwrap();
    let d_params = gpu.upload(params).unwrap();
    let rows = params.len();
    let mut d_out = gpu.upload(&vec![u32::MAX; rows]).unwrap();
    sample(gpu, &d_logits, &d_params, &mut d_out, rows, vocab).unwrap();
    let got = gpu.download(&d_out).unwrap();
    for &shape in SampleShape::available(gpu.arch()) {
        let mut d_out = gpu.upload(&vec![u32::MAX; rows]).unwrap();
        sample_with(gpu, shape, &d_logits, &d_params, &mut d_out, rows, vocab).unwrap();
        assert_eq!(gpu.download(&d_out).unwrap(), got, "{shape:?}");
    }
    got
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
    // Unaligned rows, masked logits, and a maximum of 0 held by a +0 and a -0 (equal: the first
    // one wins), in f32 and bf16.
    for vocab in [37, 1003] {
        let rows = 33;
        let mut logits = rng.normals(rows * vocab, 1.0);
        for (r, row) in logits.chunks_mut(vocab).enumerate() {
            for (i, x) in row.iter_mut().enumerate() {
                *x = if i % 4 == r % 4 {
                    f32::NEG_INFINITY
                } else {
                    -x.abs()
                };
            }
            row[(5 * r + 3) % vocab] = 0.0;
            row[(7 * r + 1) % vocab] = -0.0;
        }
        let params = vec![SampleParams::greedy(); rows];
        let low = to_bf16(&logits);
        let low_f32: Vec<f32> = low.iter().map(|x| x.to_f32()).collect();
        for (got, logits) in [
            (run(&gpu, &logits, &params, vocab), &logits),
            (run(&gpu, &low, &params, vocab), &low_f32),
        ] {
            let want: Vec<u32> = logits.chunks(vocab).map(argmax).collect();
            assert_eq!(got, want, "vocab {vocab}");
        }
    }
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

/// Asserts that the device draws, for f32 logits and for the same logits rounded to bf16, the
/// token of the CPU procedure with f64 sums on every row. Returns each run: its logits' type,
/// the tokens, and the logits as f32.
fn assert_draws_match(
    gpu: &Gpu,
    what: &str,
    logits: &[f32],
    params: &[SampleParams],
    vocab: usize,
) -> [(&'static str, Vec<u32>, Vec<f32>); 2] {
    assert_eq!(logits.len(), params.len() * vocab);
    let low = to_bf16(logits);
    let runs = [
        ("f32", run(gpu, logits, params, vocab), logits.to_vec()),
        (
            "bf16",
            run(gpu, &low, params, vocab),
            low.iter().map(|x| x.to_f32()).collect(),
        ),
    ];
    for (kind, got, logits) in &runs {
        let diff = differing(got, logits, params, vocab, true);
        let detail: Vec<_> = diff.iter().map(|&r| (r, got[r], params[r])).collect();
        assert!(
            diff.is_empty(),
            "{what}, {kind} logits, vocab {vocab}: rows differ (row, token, params): {detail:?}"
        );
    }
    runs
}

fn check_seeded_sampling(gpu: &Gpu, vocab: usize, scale: f64, seed: u64) {
    let mut rng = Rng::new(seed);
    let rows = 80;
    let logits = rng.normals(rows * vocab, scale);
    let params = params_grid(&mut rng, rows);
    // bf16 logits have many exact ties, which top-k must count as the CPU does.
    for (what, got, logits) in assert_draws_match(gpu, "randn", &logits, &params, vocab) {
        let drift = differing(&got, &logits, &params, vocab, false);
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
fn flat_and_peaked_logits_on_every_path() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(33);
    let (rows, vocab) = (80, 151_936);
    for (what, scale) in [
        ("flat logits (randn)", 1.0),
        ("peaked logits (randn * 8)", 8.0),
    ] {
        let logits = rng.normals(rows * vocab, scale);
        let params = every_path(&mut rng, rows, vocab);
        assert_draws_match(&gpu, what, &logits, &params, vocab);
    }
}

/// Top-p alone on every row: row i takes the temperatures in turn, and the next top-p after each
/// round of them; a seed and a step of its own.
fn top_p_rows(rng: &mut Rng, rows: usize, temps: &[f32], top_ps: &[f32]) -> Vec<SampleParams> {
    (0..rows)
        .map(|i| {
            SampleParams::new(
                temps[i % temps.len()],
                -1,
                top_ps[(i / temps.len()) % top_ps.len()],
                rng.next_u64(),
                rng.below(1000) as u64,
            )
        })
        .collect()
}

#[test]
fn top_p_at_low_temperatures_in_wide_bins() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(40);
    // Logits around 20, where a bin of the first pass's guess is 1 or 2 wide (13 bits on 2 x
    // 512, 12 on 8 x 256), at temperatures of 0.1-0.3: a logit's term against its bin's edge can
    // round to nothing, and top-p's first-pass guess gives way to the exact selection; 0.9999
    // puts the need within the guess's margin of the total.
    let (rows, vocab) = (24, 151_936);
    let logits: Vec<f32> = rng
        .normals(rows * vocab, 3.0)
        .into_iter()
        .map(|x| x + 20.0)
        .collect();
    let params = top_p_rows(&mut rng, rows, &[0.1, 0.15, 0.3], &[0.9, 0.5, 0.9999, 0.05]);
    assert_draws_match(&gpu, "randn * 3 + 20", &logits, &params, vocab);
}

#[test]
fn top_p_where_the_guessed_bins_end_below_zero() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(41);
    // A twentieth of each row is -0.0, a twentieth tiny negative denormals (the guess's bin just
    // below +0's), the rest below -1. The first pass's guess counts -0.0 in that bin too, so the
    // guessed bins end there for top-p 0.15 and 0.3 (the two twentieths hold about 20% of the
    // mass each, few enough to gather): the second pass must then compare with the negative
    // float nearest zero, not with -0.0, which as a float equals the zeros it must leave out
    // (as keys they lie above the bin).
    let (rows, vocab) = (12, 30_000);
    let logits: Vec<f32> = rng
        .normals(rows * vocab, 1.0)
        .into_iter()
        .enumerate()
        .map(|(i, x)| match i % 20 {
            0 => -0.0,
            1 => -1e-42 * (1 + i % 1000) as f32,
            _ => -x.abs() - 1.0,
        })
        .collect();
    let top_ps = [0.15, 0.3, 0.97];
    let params: Vec<SampleParams> = (0..rows)
        .map(|i| SampleParams::new(1.0, -1, top_ps[i % 3], rng.next_u64(), i as u64))
        .collect();
    assert_draws_match(&gpu, "-0.0, denormals, below -1", &logits, &params, vocab);
}

#[test]
fn top_p_over_a_long_gathered_list() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(42);
    // About 4,500 logits of each row spread over [1, 1.0625), one bin of the guess on every
    // shape, the rest at -20 and below, where their weights round to nothing: the crossing of
    // top-p lies inside that bin, whose logits are all gathered. A list that long leaves no room
    // after it for the wide histogram, so rank 0 selects in rounds of a byte.
    let (rows, vocab) = (8, 151_936);
    let logits: Vec<f32> = (0..rows * vocab)
        .map(|_| {
            if rng.below(vocab) < 4_500 {
                1.0 + rng.uniform() as f32 * 0.0624
            } else {
                -20.0 - rng.uniform() as f32
            }
        })
        .collect();
    let params = top_p_rows(&mut rng, rows, &[0.7, 1.0], &[0.3, 0.5, 0.9, 0.99]);
    assert_draws_match(&gpu, "4,500 logits in one bin", &logits, &params, vocab);
}

#[test]
fn small_and_unaligned_vocabularies() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(34);
    // 37 and 1,003 logits: rows start at addresses that are not 16-byte aligned, and with 37 most
    // blocks of a cluster have no logit at all. 7,001 is past what rank 0 can gather at once.
    for (vocab, rows) in [(37, 80), (1000, 1), (1003, 41), (2048, 7), (7001, 80)] {
        let logits = rng.normals(rows * vocab, 2.0);
        let params = every_path(&mut rng, rows, vocab);
        assert_draws_match(&gpu, "randn * 2", &logits, &params, vocab);
    }
}

#[test]
fn equal_logits_take_the_refinement_path() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(35);
    // Every logit of a row in one bin: too many to gather, so the selection refines to the last
    // bit. -0 and +0 are equal logits too.
    for vocab in [151_936, 7000, 37] {
        let rows = 40;
        let mut logits = Vec::with_capacity(rows * vocab);
        for r in 0..rows {
            let value = [1.5, 0.0, -3.0, 0.0][r % 4];
            logits.extend((0..vocab).map(|i| {
                if r % 4 == 3 && i % 3 == 0 {
                    -0.0
                } else {
                    value
                }
            }));
        }
        let params = every_path(&mut rng, rows, vocab);
        assert_draws_match(&gpu, "equal logits", &logits, &params, vocab);
    }
}

#[test]
fn ties_at_the_kth_logit() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(36);
    let (rows, vocab) = (80, 151_936);
    // Half of each row ties at 1.0, a few hundred logits lie above it and the rest below: the
    // k-th logit is one of the ties for any k up to half the row.
    let mut logits = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        logits.extend((0..vocab).map(|_| match rng.below(1000) {
            0..=1 => 1.5 + rng.uniform() as f32 * 2.0,
            2..=499 => 1.0,
            _ => rng.normal() as f32 - 2.0,
        }));
    }
    let params = every_path(&mut rng, rows, vocab);
    assert_draws_match(&gpu, "ties at the k-th logit", &logits, &params, vocab);
    // Logits from a handful of values: ties everywhere.
    let logits: Vec<f32> = (0..rows * vocab)
        .map(|_| (rng.normal() * 2.0).round() as f32)
        .collect();
    assert_draws_match(&gpu, "integer logits", &logits, &params, vocab);
}

#[test]
fn masked_logits() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(37);
    let (rows, vocab) = (80, 151_936);
    // Row r masks a share of its vocabulary with -inf: 30%, or all but 20 logits.
    let mut logits = rng.normals(rows * vocab, 3.0);
    for (r, row) in logits.chunks_mut(vocab).enumerate() {
        let keep_one_in = if r % 2 == 0 { 0 } else { vocab / 20 };
        for (i, x) in row.iter_mut().enumerate() {
            let masked = if keep_one_in == 0 {
                rng.below(10) < 3
            } else {
                i % keep_one_in != 0
            };
            if masked {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    let params = every_path(&mut rng, rows, vocab);
    assert_draws_match(&gpu, "masked logits", &logits, &params, vocab);
}

#[test]
fn bins_too_full_to_gather() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(38);
    let (rows, vocab) = (40, 151_936);
    let mut logits = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        match r % 3 {
            // Distinct logits, all in one 12-bit bin (1.0 to 1.1): the crossing is found in the
            // next 12 bits, then gathered.
            0 => logits.extend((0..vocab).map(|_| 1.0 + rng.uniform() as f32 * 0.1)),
            // Logits that differ only in their last 8 bits: the last level decides.
            1 => logits
                .extend((0..vocab).map(|_| f32::from_bits(0x3f80_0000 + rng.below(256) as u32))),
            // One logit far above a cloud whose fixed-point weights round to 0..3: the cloud's
            // count is not bounded by its mass, so gathering is tried and overflows.
            _ => logits.extend((0..vocab).map(|i| {
                if i == vocab / 2 {
                    0.0
                } else {
                    -27.2 + rng.uniform() as f32 * 0.4
                }
            })),
        }
    }
    let mut params = every_path(&mut rng, rows, vocab);
    for (r, p) in params.iter_mut().enumerate() {
        if r % 3 == 2 {
            p.temperature = 1.0;
            p.top_k = -1;
            p.top_p = 0.999_999_94;
        }
    }
    assert_draws_match(&gpu, "bins too full to gather", &logits, &params, vocab);
}

#[test]
fn real_model_logits() {
    let Some(gpu) = gpu() else { return };
    // The tiny Shakespeare model's logits after the 9 prompts of its reference fixture.
    let fixture = phase2::models_dir().join("fixtures/tiny-shakespeare.json");
    let cases = phase2::Fixture::read(&fixture).unwrap().cases;
    let (rows, vocab) = (80, cases[0].logits.len());
    let logits: Vec<f32> = (0..rows)
        .flat_map(|r| cases[r % cases.len()].logits.iter().copied())
        .collect();
    let params = every_path(&mut Rng::new(39), rows, vocab);
    assert_draws_match(&gpu, "tiny model logits", &logits, &params, vocab);
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

#[test]
fn a_cluster_of_blocks_per_row_from_hopper_on() {
    let one_block = [SampleShape {
        blocks: 1,
        threads: 1024,
    }];
    assert_eq!(
        SampleShape::available(Arch { major: 8, minor: 0 }),
        one_block
    );
    assert_eq!(
        SampleShape::available(Arch { major: 8, minor: 9 }),
        one_block
    );
    for major in [9, 10] {
        let shapes = SampleShape::available(Arch { major, minor: 0 });
        assert_eq!(shapes.iter().map(|s| s.blocks).collect::<Vec<_>>(), [8, 2]);
        assert!(shapes.iter().all(|s| s.threads * s.blocks <= 2048));
    }
}

#[test]
fn the_shape_fits_the_batch_in_one_wave() {
    let Some(gpu) = gpu() else { return };
    for rows in [1, 8, 64, 128, 1000] {
        let shape = launch_shape::<f32>(&gpu, rows).unwrap();
        let at_once = rows_at_once::<f32>(&gpu, shape).unwrap() as usize;
        let most = SampleShape::available(gpu.arch())
            .iter()
            .map(|&s| rows_at_once::<f32>(&gpu, s).unwrap() as usize)
            .max()
            .unwrap();
        assert!(rows <= at_once || at_once == most, "{rows} rows: {shape:?}");
        println!("{rows} rows: {shape:?}, {at_once} at once");
    }
}
