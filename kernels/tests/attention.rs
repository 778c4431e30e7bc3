//! Paged prefill and decode attention, split-K, cascade and split-KV merges against a CPU reference
//! in f64, over page tables with partly filled pages in the middle of a sequence.

mod common;

use common::*;
use kernels::decode::{
    DecodeKernel, DecodeWorkspace, MIN_RANGE, decode_attention, decode_attention_beside,
    decode_attention_folding, decode_attention_on, folding_blocks, folds,
};
use kernels::gather::gather_rows;
use kernels::merge::{PartialState, merge_pieces_into, merge_state};
use kernels::paged::{
    AttentionInputs, CacheRead, CacheShape, DevicePageTable, Fp8Cache, HostPageTable,
};
use kernels::prefill::{
    PrefillKernel, PrefillQueries, prefill_attention, prefill_attention_on,
    prefill_attention_pieces, prefill_attention_pieces_on,
};
use kernels::{CudaSlice, Gpu, bf16};
use phase6_fp8::e4m3;

/// A cache filled with random K/V where sequences have tokens and NaN everywhere else, so a
/// kernel that reads a slot it should skip poisons its own output.
struct Cache {
    shape: CacheShape,
    k: Vec<bf16>,
    v: Vec<bf16>,
    free: Vec<usize>,
}

/// One sequence's KV: its (page, offset) per logical token, and its page-table entries.
#[derive(Clone)]
struct SeqKv {
    slots: Vec<(usize, usize)>,
    entries: Vec<(u32, usize)>,
}

impl SeqKv {
    fn concat(parts: &[&SeqKv]) -> SeqKv {
        SeqKv {
            slots: parts.iter().flat_map(|p| p.slots.clone()).collect(),
            entries: parts.iter().flat_map(|p| p.entries.clone()).collect(),
        }
    }
}

impl Cache {
    fn new(shape: CacheShape, rng: &mut Rng) -> Self {
        let mut free: Vec<usize> = (0..shape.num_pages).collect();
        rng.shuffle(&mut free);
        Self {
            shape,
            k: poison_bf16(shape.elements()),
            v: poison_bf16(shape.elements()),
            free,
        }
    }

    /// A segment of `len` tokens on fresh pages (its last page possibly partial).
    fn segment(&mut self, len: usize, rng: &mut Rng) -> SeqKv {
        let (ps, d) = (self.shape.page_size, self.shape.head_dim);
        let mut seg = SeqKv {
            slots: Vec::new(),
            entries: Vec::new(),
        };
        for start in (0..len).step_by(ps) {
            let page = self.free.pop().expect("enough pages");
            let n = ps.min(len - start);
            seg.entries.push((page as u32, n));
            for off in 0..n {
                seg.slots.push((page, off));
                for h in 0..self.shape.num_kv_heads {
                    let at = self.shape.row_offset(page, h, off);
                    for i in 0..d {
                        self.k[at + i] = bf16::from_f64(rng.normal());
                        self.v[at + i] = bf16::from_f64(rng.normal());
                    }
                }
            }
        }
        seg
    }
}

struct Problem {
    hq: usize,
    cache: Cache,
    seqs: Vec<SeqKv>,
    q_lens: Vec<usize>,
    q: Vec<bf16>,
}

impl Problem {
    fn total_q(&self) -> usize {
        self.q_lens.iter().sum()
    }

    fn table(&self, seqs: &[SeqKv]) -> HostPageTable {
        let mut t = HostPageTable::new(self.cache.shape.page_size);
        for s in seqs {
            t.push_seq(s.entries.iter().copied());
        }
        t
    }

    /// What the kernels read: `q`, the cache buffers, and an uploaded page table.
    fn inputs<'a, C: CacheRead>(
        &self,
        (k_cache, v_cache): (C, C),
        q: &'a CudaSlice<bf16>,
        table: &'a DevicePageTable,
    ) -> AttentionInputs<'a, C> {
        AttentionInputs {
            q: q.as_view(),
            k_cache,
            v_cache,
            cache: self.cache.shape,
            table: table.view(),
            num_q_heads: self.hq,
            sm_scale: 1.0 / (self.cache.shape.head_dim as f32).sqrt(),
        }
    }

    fn q_indptr(&self) -> Vec<i32> {
        let mut v = vec![0];
        for &n in &self.q_lens {
            v.push(v.last().unwrap() + n as i32);
        }
        v
    }

    /// Reference output [total_q, hq, d] and lse [total_q, hq] (natural log).
    fn reference(&self, seqs: &[SeqKv], causal: bool) -> (Vec<f64>, Vec<f64>) {
        let shape = self.cache.shape;
        let (d, hq) = (shape.head_dim, self.hq);
        let group = hq / shape.num_kv_heads;
        let scale = 1.0 / (d as f64).sqrt();
        let (q, k, v) = (wide(&self.q), wide(&self.cache.k), wide(&self.cache.v));
        let (mut out, mut lse) = (Vec::new(), Vec::new());
        let mut row = 0;
        for (s, seq) in seqs.iter().enumerate() {
            let kv_len = seq.slots.len();
            for t in 0..self.q_lens[s] {
                for h in 0..hq {
                    let qv = &q[(row * hq + h) * d..(row * hq + h + 1) * d];
                    // Causally the queries are the sequence's last tokens; a query that sees
                    // no KV attends nothing: zeros and a log-sum-exp of -inf.
                    let visible = if causal {
                        (kv_len + t + 1).saturating_sub(self.q_lens[s])
                    } else {
                        kv_len
                    };
                    if visible == 0 {
                        out.extend(std::iter::repeat_n(0.0, d));
                        lse.push(f64::NEG_INFINITY);
                        continue;
                    }
                    let at: Vec<usize> = seq.slots[..visible]
                        .iter()
                        .map(|&(p, o)| shape.row_offset(p, h / group, o))
                        .collect();
                    let scores: Vec<f64> = at
                        .iter()
                        .map(|&a| (0..d).map(|i| qv[i] * k[a + i]).sum::<f64>() * scale)
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for i in 0..d {
                        out.push(at.iter().zip(&w).map(|(&a, wi)| wi * v[a + i]).sum::<f64>() / z);
                    }
                    lse.push(m + z.ln());
                }
                row += 1;
            }
        }
        (out, lse)
    }
}

struct Device {
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    q: CudaSlice<bf16>,
}

fn upload(gpu: &Gpu, p: &Problem) -> Device {
    Device {
        k: gpu.upload(&p.cache.k).unwrap(),
        v: gpu.upload(&p.cache.v).unwrap(),
        q: gpu.upload(&p.q).unwrap(),
    }
}

/// (out, lse) from the device.
type Attended = (Vec<f64>, Vec<f64>);

/// Runs prefill attention of `p`'s queries over `seqs` on every prefill kernel the device has
/// (the mma.sync kernel everywhere, the two wgmma ones on Hopper); (out, lse) from each.
fn run_prefill(
    gpu: &Gpu,
    p: &Problem,
    dev: &Device,
    seqs: &[SeqKv],
    causal: bool,
) -> Vec<(PrefillKernel, Attended)> {
    prefill_over(
        gpu,
        p,
        (dev.k.as_view(), dev.v.as_view()),
        &dev.q,
        seqs,
        causal,
    )
}

/// [`run_prefill`] over any cache (bf16 or FP8 codes).
fn prefill_over<C: CacheRead>(
    gpu: &Gpu,
    p: &Problem,
    (k_cache, v_cache): (C, C),
    q: &CudaSlice<bf16>,
    seqs: &[SeqKv],
    causal: bool,
) -> Vec<(PrefillKernel, Attended)> {
    let (d, hq, n) = (p.cache.shape.head_dim, p.hq, p.total_q());
    let table = p.table(seqs).upload(gpu).unwrap();
    let q_indptr = gpu.upload(&p.q_indptr()).unwrap();
    let inputs = p.inputs((k_cache, v_cache), q, &table);
    let queries = PrefillQueries {
        indptr: q_indptr.as_view(),
        max_len: *p.q_lens.iter().max().unwrap(),
    };
    [
        PrefillKernel::Mma,
        PrefillKernel::Wgmma,
        PrefillKernel::WgmmaWarpSpecialized,
    ]
    .into_iter()
    .filter(|k| runs_here(gpu, *k, k.runs(gpu, &inputs)))
    .map(|kernel| {
        let mut out = gpu.upload(&poison_bf16(n * hq * d)).unwrap();
        let mut lse = gpu.upload(&poison_f32(n * hq)).unwrap();
        prefill_attention_on(
            gpu,
            kernel,
            &inputs,
            &queries,
            causal,
            &mut out,
            Some(&mut lse),
        )
        .unwrap();
        (kernel, download(gpu, &out, &lse))
    })
    .collect()
}

/// Decode on the kernel the GPU runs by default.
fn run_decode(gpu: &Gpu, p: &Problem, dev: &Device, seqs: &[SeqKv]) -> (Vec<f64>, Vec<f64>) {
    let group = p.hq / p.cache.shape.num_kv_heads;
    let kernel = DecodeKernel::best(gpu, p.cache.shape.head_dim, group, false);
    decode_over(
        kernel,
        gpu,
        p,
        (dev.k.as_view(), dev.v.as_view()),
        &dev.q,
        seqs,
    )
}

/// Every decode kernel that runs on `gpu` at `head_dim`.
fn decode_kernels(gpu: &Gpu, head_dim: usize) -> Vec<DecodeKernel> {
    [DecodeKernel::Loads, DecodeKernel::BulkCopies]
        .into_iter()
        .filter(|k| runs_here(gpu, *k, k.runs_on(gpu, head_dim)))
        .collect()
}

/// `runs`, saying so where a kernel is left out on a GPU that is not a Hopper one (on Hopper a
/// kernel is left out only for a problem it does not serve: a head size, or an FP8 cache for
/// the wgmma prefill kernels).
fn runs_here(gpu: &Gpu, kernel: impl std::fmt::Debug, runs: bool) -> bool {
    if !runs && !gpu.arch().is_hopper() {
        common::skipped(&format_args!(
            "{kernel:?} (Hopper only) on {:?}",
            gpu.arch()
        ));
    }
    runs
}

/// Decode on `kernel` over any cache (bf16 or FP8 codes): the first `seqs.len()` rows of `q`.
fn decode_over<C: CacheRead>(
    kernel: DecodeKernel,
    gpu: &Gpu,
    p: &Problem,
    (k_cache, v_cache): (C, C),
    q: &CudaSlice<bf16>,
    seqs: &[SeqKv],
) -> (Vec<f64>, Vec<f64>) {
    let (d, hq, n) = (p.cache.shape.head_dim, p.hq, seqs.len());
    let table = p.table(seqs).upload(gpu).unwrap();
    let inputs = p.inputs((k_cache, v_cache), q, &table);
    let mut ws = DecodeWorkspace::new(gpu, d).unwrap();
    let mut out = gpu.upload(&poison_bf16(n * hq * d)).unwrap();
    let mut lse = gpu.upload(&poison_f32(n * hq)).unwrap();
    decode_attention_on(kernel, gpu, &inputs, &mut ws, &mut out, Some(&mut lse)).unwrap();
    download(gpu, &out, &lse)
}

/// An attention call's output and log-sum-exp, widened.
/// Attention output within bf16's error of the reference, and its log-sum-exp within 1e-3.
fn assert_attention(name: &str, (out, lse): (&[f64], &[f64]), (want, want_lse): (&[f64], &[f64])) {
    assert_close(name, out, want, BF16_TOL);
    assert_close(&format!("{name} lse"), lse, want_lse, 1e-3);
}

fn download(gpu: &Gpu, out: &CudaSlice<bf16>, lse: &CudaSlice<f32>) -> (Vec<f64>, Vec<f64>) {
    let out = wide(&gpu.download(out).unwrap());
    let lse = gpu
        .download(lse)
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    (out, lse)
}

/// Builds sequences from segment lengths; queries are each sequence's last `q_len` tokens.
fn problem(rng: &mut Rng, shape: CacheShape, hq: usize, seqs: &[(&[usize], usize)]) -> Problem {
    let mut cache = Cache::new(shape, rng);
    let kv: Vec<SeqKv> = seqs
        .iter()
        .map(|(segs, _)| {
            let parts: Vec<SeqKv> = segs.iter().map(|&n| cache.segment(n, rng)).collect();
            SeqKv::concat(&parts.iter().collect::<Vec<_>>())
        })
        .collect();
    let q_lens: Vec<usize> = seqs.iter().map(|s| s.1).collect();
    let total: usize = q_lens.iter().sum();
    let q = to_bf16(&rng.normals(total * hq * shape.head_dim, 1.0));
    Problem {
        hq,
        cache,
        seqs: kv,
        q_lens,
        q,
    }
}

fn shape(d: usize, hkv: usize, ps: usize, pages: usize) -> CacheShape {
    CacheShape {
        num_pages: pages,
        num_kv_heads: hkv,
        page_size: ps,
        head_dim: d,
    }
}

#[test]
fn prefill_matches_reference_with_cached_prefixes_and_odd_segments() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(20);
    // (head_dim, q heads, kv heads, page size, [(segments, q_len)], causal)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        Vec<(&'static [usize], usize)>,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            128,
            4,
            2,
            16,
            vec![(&[70], 70), (&[40, 57], 33), (&[5], 5)],
            true,
        ),
        (64, 4, 4, 256, vec![(&[50, 300], 120), (&[600], 1)], true),
        (32, 8, 2, 16, vec![(&[33, 17, 100], 60), (&[16], 16)], true),
        (128, 16, 8, 256, vec![(&[300], 300)], true),
        (64, 4, 2, 16, vec![(&[45, 20], 30), (&[3], 2)], false),
        (128, 4, 1, 32, vec![(&[77, 9], 50)], true),
        // head_dim 128 at Qwen3's GQA: the wgmma kernel's shapes on Hopper. Chunks that start
        // mid-sequence after odd segments, several 128-row blocks, whole dense tiles.
        (
            128,
            16,
            8,
            16,
            vec![(&[1000, 37, 500], 300), (&[129], 129), (&[1], 1)],
            true,
        ),
        (128, 32, 8, 256, vec![(&[700], 700), (&[260, 3], 90)], true),
        (128, 16, 8, 16, vec![(&[300, 50], 200), (&[64], 17)], false),
        // A group of 3 q heads: a work item's 128 rows are not whole tokens, so the
        // warp-specialized kernel's producer copies Q row by row instead of with the TMA.
        (128, 12, 4, 16, vec![(&[200, 40], 150), (&[90], 90)], true),
        // Groups of 1, 8 and 128: one q head a token's row (its TMA boxes one head deep), eight
        // tokens' heads a box, and a box of one token whose rows are copied out row by row.
        (128, 8, 8, 16, vec![(&[300], 260), (&[70, 5], 75)], true),
        (128, 32, 4, 256, vec![(&[150, 100], 200), (&[33], 33)], true),
        (128, 128, 1, 16, vec![(&[40], 3), (&[7], 7)], true),
    ];
    for (d, hq, hkv, ps, seqs, causal) in cases {
        let pages = seqs
            .iter()
            .flat_map(|s| s.0)
            .map(|n| n.div_ceil(ps))
            .sum::<usize>()
            + 3;
        let p = problem(&mut rng, shape(d, hkv, ps, pages), hq, &seqs);
        let dev = upload(&gpu, &p);
        let (want, want_lse) = p.reference(&p.seqs, causal);
        for (kernel, (out, lse)) in run_prefill(&gpu, &p, &dev, &p.seqs, causal) {
            let name = format!("prefill {kernel:?} d{d} hq{hq} hkv{hkv} page{ps} causal={causal}");
            assert_attention(&name, (&out, &lse), (&want, &want_lse));
        }
    }
}

/// The persistent Hopper kernel's blocks take many work items each (here 768 over the GPU's
/// multiprocessors), some of them sequences without KV, which load no Q and write their zero
/// rows straight out; every kernel runs twice, so the work counter must have been reset.
#[test]
fn prefill_many_items_a_block_with_empty_sequences() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(41);
    let (d, hq, hkv, ps, q_len, seqs) = (128, 16, 8, 16, 16, 96);
    let lens: Vec<usize> = (0..seqs)
        .map(|i| match i % 3 {
            1 => 0,
            0 => 20 + (i % 7) * 9,
            _ => 200 + (i % 5) * 61,
        })
        .collect();
    let pages = lens.iter().map(|n| n.div_ceil(ps)).sum::<usize>() + 3;
    let mut cache = Cache::new(shape(d, hkv, ps, pages), &mut rng);
    let kv: Vec<SeqKv> = lens.iter().map(|&n| cache.segment(n, &mut rng)).collect();
    let p = Problem {
        hq,
        q: to_bf16(&rng.normals(seqs * q_len * hq * d, 1.0)),
        cache,
        seqs: kv,
        q_lens: vec![q_len; seqs],
    };
    let dev = upload(&gpu, &p);
    let (want, want_lse) = p.reference(&p.seqs, false);
    // Rows (query, head) of sequences with KV, and of those without.
    let row_of = |i: usize| i / (q_len * hq);
    let with_kv = |i: &usize| lens[row_of(*i)] > 0;
    let pick = |v: &[f64], per: usize, keep: bool| -> Vec<f64> {
        v.chunks(per)
            .enumerate()
            .filter(|(i, _)| with_kv(i) == keep)
            .flat_map(|(_, c)| c.iter().copied())
            .collect()
    };
    for round in 0..2 {
        for (kernel, (out, lse)) in run_prefill(&gpu, &p, &dev, &p.seqs, false) {
            let name = format!("prefill {kernel:?} over many items, round {round}");
            assert_attention(
                &name,
                (&pick(&out, d, true), &pick(&lse, 1, true)),
                (&pick(&want, d, true), &pick(&want_lse, 1, true)),
            );
            assert!(
                pick(&out, d, false).iter().all(|&x| x == 0.0),
                "{name}: a sequence without KV wrote non-zero output"
            );
            assert!(
                pick(&lse, 1, false).iter().all(|&x| x == f64::NEG_INFINITY),
                "{name}: a sequence without KV's lse"
            );
        }
    }
}

/// The FP8 codes of cache values `xs` at `scale`, each value replaced by the one its code stands
/// for (what the reference then reads). Poisoned slots stay NaN codes: a kernel reading one
/// poisons its output.
fn quantize(xs: &mut [bf16], scale: f32) -> Vec<u8> {
    xs.iter_mut()
        .map(|x| {
            let code = e4m3::encode(x.to_f32() / scale);
            *x = bf16::from_f32(e4m3::decode(code) * scale);
            code
        })
        .collect()
}

/// An FP8 cache: the codes of the K/V values (scales 1/4 and 1/2), read by the kernels as
/// `code * scale`, give the reference computed on the decoded values, by prefill (causal and
/// not) and decode, over partly filled pages and GQA groups.
#[test]
fn fp8_cache_attention_matches_reference_on_the_decoded_values() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(23);
    let (k_scale, v_scale) = (0.25f32, 0.5f32);
    let segs: Vec<(&[usize], usize)> = vec![(&[37, 100], 20), (&[5], 5), (&[300], 1)];
    for d in [32, 64, 128] {
        for (hq, hkv, ps) in [(4, 4, 16), (8, 2, 256), (16, 2, 16), (8, 4, 64)] {
            let pages = segs
                .iter()
                .flat_map(|s| s.0)
                .map(|n| n.div_ceil(ps))
                .sum::<usize>()
                + 2;
            let mut p = problem(&mut rng, shape(d, hkv, ps, pages), hq, &segs);
            let k_codes = gpu.upload(&quantize(&mut p.cache.k, k_scale)).unwrap();
            let v_codes = gpu.upload(&quantize(&mut p.cache.v, v_scale)).unwrap();
            let q = gpu.upload(&p.q).unwrap();
            let codes = || {
                (
                    Fp8Cache {
                        codes: k_codes.as_view(),
                        scale: k_scale,
                    },
                    Fp8Cache {
                        codes: v_codes.as_view(),
                        scale: v_scale,
                    },
                )
            };
            let name = format!("fp8 d{d} group{} page{ps}", hq / hkv);
            for causal in [true, false] {
                let [(_, (out, lse))] = &prefill_over(&gpu, &p, codes(), &q, &p.seqs, causal)[..]
                else {
                    panic!("an FP8 cache runs on the mma.sync kernel alone");
                };
                let (want, want_lse) = p.reference(&p.seqs, causal);
                let case = format!("{name} prefill causal={causal}");
                assert_attention(&case, (out, lse), (&want, &want_lse));
            }
            // Decode: one query a sequence, the first rows of q.
            let one_query = Problem {
                q_lens: vec![1; p.seqs.len()],
                q: p.q[..p.seqs.len() * hq * d].to_vec(),
                hq,
                cache: Cache {
                    shape: p.cache.shape,
                    k: p.cache.k.clone(),
                    v: p.cache.v.clone(),
                    free: Vec::new(),
                },
                seqs: p.seqs.clone(),
            };
            let (want, want_lse) = one_query.reference(&p.seqs, true);
            for kernel in decode_kernels(&gpu, d) {
                let (out, lse) = decode_over(kernel, &gpu, &p, codes(), &q, &p.seqs);
                let name = format!("{name} decode {kernel:?}");
                assert_attention(&name, (&out, &lse), (&want, &want_lse));
            }
        }
    }
}

/// Sequences of 5 to 300 tokens, some in two segments: with ranges of `MIN_RANGE` slots the
/// longer ones and those that straddle a range's end are put together from pieces, the rest
/// are written whole by one block.
#[test]
fn decode_matches_reference_whole_and_in_pieces() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(21);
    let segs: Vec<(&[usize], usize)> =
        vec![(&[37, 100], 1), (&[5], 1), (&[300], 1), (&[16, 16], 1)];
    for d in [32, 64, 128] {
        for (hq, hkv) in [(4, 4), (4, 2), (8, 2), (16, 2)] {
            for ps in [16, 64, 256] {
                let pages = segs
                    .iter()
                    .flat_map(|s| s.0)
                    .map(|n| n.div_ceil(ps))
                    .sum::<usize>()
                    + 2;
                let p = problem(&mut rng, shape(d, hkv, ps, pages), hq, &segs);
                let dev = upload(&gpu, &p);
                let (want, want_lse) = p.reference(&p.seqs, true);
                for kernel in decode_kernels(&gpu, d) {
                    let cache = (dev.k.as_view(), dev.v.as_view());
                    let (out, lse) = decode_over(kernel, &gpu, &p, cache, &dev.q, &p.seqs);
                    let name = format!("decode d{d} group{} page{ps} {kernel:?}", hq / hkv);
                    assert_attention(&name, (&out, &lse), (&want, &want_lse));
                }
            }
        }
    }
}

/// Cascade's own pages: 64 sequences of 1 to 80 tokens, so few slots that every range is
/// `MIN_RANGE` long: a range holds one or two segments (rounded up to 32 slots), often a piece
/// of each.
#[test]
fn decode_many_short_sequences_spread_over_the_wave() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(24);
    let (d, hq, hkv, ps) = (128, 16, 8, 16);
    let lens: Vec<usize> = (0..64).map(|i| 1 + (i * 37) % 80).collect();
    let segs: Vec<(&[usize], usize)> = lens.iter().map(|l| (std::slice::from_ref(l), 1)).collect();
    let pages: usize = lens.iter().map(|n| n.div_ceil(ps)).sum();
    let p = problem(&mut rng, shape(d, hkv, ps, pages), hq, &segs);
    // One segment a sequence and group of two q heads (a block's).
    let slots: usize = lens.iter().map(|n| n.div_ceil(32) * 32).sum::<usize>() * hq / 2;
    let blocks = kernels::decode::blocks(&gpu, d, hq / hkv).unwrap();
    assert!(
        slots.div_ceil(blocks) <= MIN_RANGE,
        "{slots} slots on {blocks} blocks should make ranges of MIN_RANGE"
    );
    let dev = upload(&gpu, &p);
    let (want, want_lse) = p.reference(&p.seqs, true);
    for kernel in decode_kernels(&gpu, d) {
        let cache = (dev.k.as_view(), dev.v.as_view());
        let (out, lse) = decode_over(kernel, &gpu, &p, cache, &dev.q, &p.seqs);
        let name = format!("decode many short sequences {kernel:?}");
        assert_attention(&name, (&out, &lse), (&want, &want_lse));
    }
}

/// `decode_attention_beside`, told the host's copy of `slot_indptr`, writes what
/// `decode_attention` writes, bit for bit, whether it launches the merge after the kernel (some
/// sequence's slots cut between blocks, or a sequence with none) or leaves it out (every
/// sequence's slots in one block's range). Both outputs start poisoned.
#[test]
fn decode_beside_equals_decode_with_or_without_its_merge() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(31);
    let (d, hq, hkv, ps) = (128, 16, 8, 16);
    let layouts: [(&str, Vec<usize>); 3] = [
        ("cut", (0..64).map(|i| 1 + (i * 37) % 80).collect()),
        ("whole", (0..64).map(|i| 1 + (i * 37) % 64).collect()),
        (
            "one empty",
            (0..64).map(|i| if i == 5 { 0 } else { 40 }).collect(),
        ),
    ];
    for (name, lens) in layouts {
        let segs: Vec<(&[usize], usize)> =
            lens.iter().map(|l| (std::slice::from_ref(l), 1)).collect();
        let pages = lens.iter().map(|n| n.div_ceil(ps)).sum::<usize>() + 1;
        let p = problem(&mut rng, shape(d, hkv, ps, pages), hq, &segs);
        let dev = upload(&gpu, &p);
        let host = p.table(&p.seqs);
        let slots = host.slot_indptr();
        let table = host.upload(&gpu).unwrap();
        let inputs = p.inputs((dev.k.as_view(), dev.v.as_view()), &dev.q, &table);
        let mut ws = DecodeWorkspace::new(&gpu, d).unwrap();
        let n = lens.len();
        let mut run = |beside: bool| {
            let mut out = gpu.upload(&poison_bf16(n * hq * d)).unwrap();
            let mut lse = gpu.upload(&poison_f32(n * hq)).unwrap();
            if beside {
                decode_attention_beside(&gpu, &inputs, &mut ws, &mut out, Some(&mut lse), &slots)
            } else {
                decode_attention(&gpu, &inputs, &mut ws, &mut out, Some(&mut lse))
            }
            .unwrap();
            let out: Vec<u16> = gpu
                .download(&out)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            let lse: Vec<u32> = gpu
                .download(&lse)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (out, lse)
        };
        if name == "whole" {
            // Ranges of MIN_RANGE (64) slots: each sequence's 8 segments of 32 or 64 slots start
            // at a multiple of 64 and none crosses a range's end, so no merge is launched.
            let line = *slots.last().unwrap() as usize * hq / 2;
            let blocks = kernels::decode::blocks(&gpu, d, hq / hkv).unwrap();
            assert!(
                line.div_ceil(blocks) <= MIN_RANGE,
                "{line} slots on {blocks} blocks"
            );
        }
        let (plain, beside) = (run(false), run(true));
        assert!(
            plain == beside,
            "{name}: the decode beside differs from the plain decode"
        );
    }
}

/// Long sequences, enough of them that the KV is shared out in ranges longer than the
/// shortest (a sequence then spans many blocks, and a block holds pieces of several), and long
/// enough that a block walks more than the 32 units of 32 slots for which the bulk-copy
/// kernel's producer reads the page table at once.
#[test]
fn decode_long_contexts_shared_out_among_all_blocks() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(22);
    let (d, hq, hkv, ps) = (128, 16, 8, 16);
    let lens: Vec<Vec<usize>> = vec![
        vec![9000],
        vec![3702, 2331],
        vec![8700],
        vec![9300],
        vec![120],
        vec![7500, 1800],
        vec![9000],
        vec![8997],
        vec![9003],
        vec![9000, 300],
        vec![6144],
        vec![12000],
        vec![9999],
    ];
    let segs: Vec<(&[usize], usize)> = lens.iter().map(|l| (l.as_slice(), 1)).collect();
    let pages: usize = lens.iter().flatten().map(|n| n.div_ceil(ps)).sum();
    let p = problem(&mut rng, shape(d, hkv, ps, pages), hq, &segs);
    let table = p.table(&p.seqs);
    let slots = *table.slot_indptr().last().unwrap() as usize * hq / 2;
    let blocks = kernels::decode::blocks(&gpu, d, hq / hkv).unwrap();
    assert!(
        slots > blocks * 32 * 32,
        "{slots} slots should need ranges longer than 32 units of 32 slots on {blocks} blocks"
    );
    let dev = upload(&gpu, &p);
    let (want, want_lse) = p.reference(&p.seqs, true);
    // Every kernel: the bulk-copy one walks more than a producer's 32 units a block here.
    for kernel in decode_kernels(&gpu, d) {
        let cache = (dev.k.as_view(), dev.v.as_view());
        let (out, lse) = decode_over(kernel, &gpu, &p, cache, &dev.q, &p.seqs);
        let name = format!("decode long contexts {kernel:?}");
        assert_attention(&name, (&out, &lse), (&want, &want_lse));
    }
}

/// One long sequence and a short one: the long one's segment is cut into over a hundred pieces,
/// which the merge reads 32 at a time, four at once.
#[test]
fn decode_one_long_sequence_in_many_pieces() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(23);
    let (d, hq, hkv, ps) = (64, 2, 1, 256);
    let lens = [40_000, 300];
    let segs: Vec<(&[usize], usize)> = lens.iter().map(|l| (std::slice::from_ref(l), 1)).collect();
    let pages: usize = lens.iter().map(|n| n.div_ceil(ps)).sum();
    let p = problem(&mut rng, shape(d, hkv, ps, pages), hq, &segs);
    let blocks = kernels::decode::blocks(&gpu, d, hq / hkv).unwrap();
    let total: usize = lens.iter().map(|n| n.div_ceil(32) * 32).sum();
    let range = total.div_ceil(blocks).max(MIN_RANGE);
    assert!(
        lens[0] / range > 32,
        "{} pieces of {range} slots should be more than 32",
        lens[0] / range
    );
    let dev = upload(&gpu, &p);
    let (out, lse) = run_decode(&gpu, &p, &dev, &p.seqs);
    let (want, want_lse) = p.reference(&p.seqs, true);
    assert_attention(
        "decode, one sequence in many pieces",
        (&out, &lse),
        (&want, &want_lse),
    );
}

/// Cascade: the shared prefix is attended once for all queries (no mask), each sequence's own
/// pages separately (causal), and merge_state gives flat attention back. The decode runs beside
/// level 1's call; the last case's pass is long enough to outlast it (on Hopper, at head_dim
/// 128), and its rows go out with no merge after the decode kernel.
#[test]
fn cascade_partials_merged_equal_flat_attention() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(23);
    // The requests' own tokens (decoded in the second and third cases): 100 gives a request 128
    // slots, which the decode's blocks share (ranges of 64), so the merge after the decode
    // kernel runs; in the third no request's slots are shared, and the call beside the pass
    // leaves that merge out.
    let cases = [
        (128, 4, 2, 16, 50usize, [5, 33, 1], [20, 40, 7]),
        (64, 8, 2, 256, 50, [1, 1, 1], [20, 100, 7]),
        (128, 16, 8, 16, 6000, [1, 1, 1], [20, 40, 7]),
    ];
    for (d, hq, hkv, ps, prefix_len, q_lens, own_lens) in cases {
        let pages = prefix_len.div_ceil(ps) + 10;
        let mut cache = Cache::new(shape(d, hkv, ps, pages), &mut rng);
        let prefix = cache.segment(prefix_len, &mut rng); // ends in a partial page
        let own: Vec<SeqKv> = own_lens
            .iter()
            .map(|&n| cache.segment(n, &mut rng))
            .collect();
        let flat: Vec<SeqKv> = own.iter().map(|o| SeqKv::concat(&[&prefix, o])).collect();
        let total: usize = q_lens.iter().sum();
        let p = Problem {
            hq,
            q: to_bf16(&rng.normals(total * hq * d, 1.0)),
            cache,
            seqs: flat.clone(),
            q_lens: q_lens.to_vec(),
        };
        let dev = upload(&gpu, &p);
        let (want, want_lse) = p.reference(&flat, true);

        // Level 1: one "sequence" holding every query, over the shared pages, unmasked.
        let shared = Problem {
            q_lens: vec![total],
            hq,
            cache: Cache {
                shape: p.cache.shape,
                k: Vec::new(),
                v: Vec::new(),
                free: Vec::new(),
            },
            seqs: Vec::new(),
            q: Vec::new(),
        };
        let table_a = shared
            .table(std::slice::from_ref(&prefix))
            .upload(&gpu)
            .unwrap();
        let qa_indptr = gpu.upload(&shared.q_indptr()).unwrap();
        let inputs = AttentionInputs {
            q: dev.q.as_view(),
            k_cache: dev.k.as_view(),
            v_cache: dev.v.as_view(),
            cache: p.cache.shape,
            table: table_a.view(),
            num_q_heads: hq,
            sm_scale: 1.0 / (d as f32).sqrt(),
        };
        let queries = PrefillQueries {
            indptr: qa_indptr.as_view(),
            max_len: total,
        };
        let mut o_a = gpu.upload(&poison_bf16(total * hq * d)).unwrap();
        let mut lse_a = gpu.upload(&poison_f32(total * hq)).unwrap();
        // Level 2's buffers, uploaded before level 1's call so that its decode follows that call.
        let host_b = p.table(&own);
        let table_b = host_b.upload(&gpu).unwrap();
        let mut o_b = gpu.upload(&poison_bf16(total * hq * d)).unwrap();
        let mut lse_b = gpu.upload(&poison_f32(total * hq)).unwrap();
        let mut ws = DecodeWorkspace::new(&gpu, d).unwrap();
        prefill_attention(&gpu, &inputs, &queries, false, &mut o_a, Some(&mut lse_a)).unwrap();

        // Level 2: each sequence over its own pages, causal (decode when every q_len is 1).
        let inputs_b = AttentionInputs {
            table: table_b.view(),
            ..inputs
        };
        if q_lens.iter().all(|&n| n == 1) {
            // Beside level 1's call, as the CUDA runner launches it (on Hopper at head_dim 128
            // the warp-specialized kernel lets it start at once): merge_state below reads
            // level 1's still poisoned output if the decode ends before that call.
            let slots = host_b.slot_indptr();
            decode_attention_beside(&gpu, &inputs_b, &mut ws, &mut o_b, Some(&mut lse_b), &slots)
                .unwrap();
        } else {
            let qb_indptr = gpu.upload(&p.q_indptr()).unwrap();
            let queries_b = PrefillQueries {
                indptr: qb_indptr.as_view(),
                max_len: *q_lens.iter().max().unwrap(),
            };
            prefill_attention(
                &gpu,
                &inputs_b,
                &queries_b,
                true,
                &mut o_b,
                Some(&mut lse_b),
            )
            .unwrap();
        }

        let mut o = gpu.upload(&poison_bf16(total * hq * d)).unwrap();
        let mut lse = gpu.upload(&poison_f32(total * hq)).unwrap();
        let a = PartialState {
            o: o_a.as_view(),
            lse: lse_a.as_view(),
        };
        let b = PartialState {
            o: o_b.as_view(),
            lse: lse_b.as_view(),
        };
        merge_state(&gpu, &a, &b, &mut o, Some(&mut lse), total * hq, d).unwrap();
        let (out, out_lse) = download(&gpu, &o, &lse);
        let name = format!("cascade d{d} page{ps} q_lens {q_lens:?}");
        assert_attention(&name, (&out, &out_lse), (&want, &want_lse));

        for (kernel, (flat_out, _)) in run_prefill(&gpu, &p, &dev, &flat, true) {
            assert_close(
                &format!("{name} vs flat kernel {kernel:?}"),
                &out,
                &flat_out,
                BF16_TOL,
            );
        }
    }
}

/// Cascade's decode rows with the level's parts folded in by the decode (as the CUDA runner
/// launches it, beside the level's unmasked pass over the shared prefix in pieces): flat
/// attention back, over bf16 and FP8 caches, GQA groups of 1 to 8 heads a block, parts folded
/// in one batch of loads a thread or more, empty pieces (more pieces than the prefix has
/// entries) and parts poisoned until the pass writes them. Where the call cannot fold (a
/// request whose own pages the decode's blocks share, or Hopper's FP8 decode through bulk
/// copies) it launches nothing and says so, and the decode beside the pass and the merge give
/// the same result.
#[test]
fn decode_folding_a_levels_parts_equals_flat_attention() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(37);
    type Case = (
        usize,
        usize,
        usize,
        usize,
        usize,
        Vec<usize>,
        Vec<usize>,
        bool,
    );
    let cases: [Case; 8] = [
        // (d, hq, hkv, page, prefix, own tokens, pieces, fp8)
        (
            128,
            16,
            8,
            16,
            700,
            vec![50, 64, 33, 7],
            vec![1, 5, 16, 32],
            false,
        ),
        (64, 8, 8, 16, 300, vec![1, 20, 64], vec![3, 40], false),
        (64, 16, 4, 16, 300, vec![20, 64, 5], vec![20], false),
        (128, 32, 4, 256, 1000, vec![64, 9], vec![2, 7], false),
        (32, 4, 2, 16, 200, vec![30, 60, 2, 12, 64], vec![4], false),
        (128, 16, 8, 16, 500, vec![40, 64, 17], vec![6], true),
        (128, 16, 4, 16, 400, vec![40, 64, 9], vec![6, 24], true),
        (128, 16, 8, 16, 300, vec![100, 5], vec![3], false),
    ];
    for (d, hq, hkv, ps, prefix_len, own_lens, piece_counts, fp8) in cases {
        let pages =
            prefix_len.div_ceil(ps) + own_lens.iter().map(|n| n.div_ceil(ps)).sum::<usize>();
        let mut cache = Cache::new(shape(d, hkv, ps, pages), &mut rng);
        let prefix = cache.segment(prefix_len, &mut rng);
        let own: Vec<SeqKv> = own_lens
            .iter()
            .map(|&n| cache.segment(n, &mut rng))
            .collect();
        let flat: Vec<SeqKv> = own.iter().map(|o| SeqKv::concat(&[&prefix, o])).collect();
        let n = own.len();
        let mut p = Problem {
            hq,
            q: to_bf16(&rng.normals(n * hq * d, 1.0)),
            cache,
            seqs: flat.clone(),
            q_lens: vec![1; n],
        };
        let (k_scale, v_scale) = (0.25f32, 0.5f32);
        let codes = fp8.then(|| {
            (
                gpu.upload(&quantize(&mut p.cache.k, k_scale)).unwrap(),
                gpu.upload(&quantize(&mut p.cache.v, v_scale)).unwrap(),
            )
        });
        let dev = upload(&gpu, &p);
        let (want, want_lse) = p.reference(&flat, true);
        let host_own = p.table(&own);
        let own_table = host_own.upload(&gpu).unwrap();
        let slots = host_own.slot_indptr();
        let entries = prefix.entries.len();
        for pieces in piece_counts {
            let mut table = HostPageTable::new(ps);
            for i in 0..pieces {
                let range = i * entries / pieces..(i + 1) * entries / pieces;
                table.push_seq(prefix.entries[range].iter().copied());
            }
            let table = table.upload(&gpu).unwrap();
            let indptr: Vec<i32> = (0..=pieces).map(|i| (i * n) as i32).collect();
            let indptr = gpu.upload(&indptr).unwrap();
            let queries = PrefillQueries {
                indptr: indptr.as_view(),
                max_len: n,
            };
            let mut parts_o = gpu.upload(&poison_bf16(pieces * n * hq * d)).unwrap();
            let mut parts_lse = gpu.upload(&poison_f32(pieces * n * hq)).unwrap();
            let mut o = gpu.upload(&poison_bf16(n * hq * d)).unwrap();
            let mut lse = gpu.upload(&poison_f32(n * hq)).unwrap();
            let mut ws = DecodeWorkspace::new(&gpu, d).unwrap();
            let name = format!(
                "folding d{d} group{} page{ps} fp8={fp8} in {pieces} pieces",
                hq / hkv
            );
            let folded = match &codes {
                None => {
                    let cache = (dev.k.as_view(), dev.v.as_view());
                    let level = p.inputs(cache, &dev.q, &table);
                    let (po, pl) = (&mut parts_o, &mut parts_lse);
                    prefill_attention_pieces(&gpu, &level, &queries, pieces, true, po, pl).unwrap();
                    let own_inputs =
                        p.inputs((dev.k.as_view(), dev.v.as_view()), &dev.q, &own_table);
                    fold_or_merge(
                        &gpu,
                        &own_inputs,
                        &mut ws,
                        (&mut o, &mut lse),
                        &slots,
                        (&parts_o, &parts_lse),
                        pieces,
                    )
                }
                Some((k_codes, v_codes)) => {
                    let cache = || {
                        (
                            Fp8Cache {
                                codes: k_codes.as_view(),
                                scale: k_scale,
                            },
                            Fp8Cache {
                                codes: v_codes.as_view(),
                                scale: v_scale,
                            },
                        )
                    };
                    let level = p.inputs(cache(), &dev.q, &table);
                    let (po, pl) = (&mut parts_o, &mut parts_lse);
                    prefill_attention_pieces(&gpu, &level, &queries, pieces, true, po, pl).unwrap();
                    let own_inputs = p.inputs(cache(), &dev.q, &own_table);
                    fold_or_merge(
                        &gpu,
                        &own_inputs,
                        &mut ws,
                        (&mut o, &mut lse),
                        &slots,
                        (&parts_o, &parts_lse),
                        pieces,
                    )
                }
            };
            // Own pages of at most 64 tokens each fit one block's range; 100 do not. Only the
            // per-lane kernel folds (not Hopper's FP8 decode of one or two heads a block).
            let per_lane = DecodeKernel::best(&gpu, d, hq / hkv, fp8) == DecodeKernel::Loads;
            let fits = own_lens.iter().all(|&l| l <= 64);
            assert_eq!(folded, per_lane && fits, "{name}: folded");
            // What a planner is told before the call (`folding_blocks`, `folds`) is what it did.
            let grid = folding_blocks(&gpu, d, hq / hkv, fp8).unwrap();
            let foreseen = grid.is_some_and(|blocks| folds(&slots, hq, hq / hkv, blocks));
            assert_eq!(foreseen, folded, "{name}: foreseen");
            let (out, out_lse) = download(&gpu, &o, &lse);
            assert_attention(&name, (&out, &out_lse), (&want, &want_lse));
        }
    }
}

/// The decode of `inputs` folding the level's `pieces` parts (`parts`) into `(o, lse)`, or where
/// it cannot, the decode beside the level's pass and the merge; whether it folded.
fn fold_or_merge<C: CacheRead>(
    gpu: &Gpu,
    inputs: &AttentionInputs<'_, C>,
    ws: &mut DecodeWorkspace,
    (o, lse): (&mut CudaSlice<bf16>, &mut CudaSlice<f32>),
    slots: &[i32],
    (parts_o, parts_lse): (&CudaSlice<bf16>, &CudaSlice<f32>),
    pieces: usize,
) -> bool {
    let parts = PartialState {
        o: parts_o.as_view(),
        lse: parts_lse.as_view(),
    };
    let folded =
        decode_attention_folding(gpu, inputs, ws, o, Some(&mut *lse), slots, &parts, pieces)
            .unwrap();
    if !folded {
        decode_attention_beside(gpu, inputs, ws, o, Some(&mut *lse), slots).unwrap();
        let rows = inputs.table.num_seqs();
        let index = gpu.upload(&(0..rows as u32).collect::<Vec<_>>()).unwrap();
        let hq = inputs.num_q_heads;
        merge_pieces_into(
            gpu,
            o,
            lse,
            &parts,
            pieces,
            &index,
            hq,
            inputs.cache.head_dim,
        )
        .unwrap();
    }
    folded
}

/// Folding one partial state into gathered rows in place equals merge_state on those rows, and
/// leaves every other row as it was.
#[test]
fn one_piece_merged_into_gathered_rows_equals_merge_state() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(29);
    let (tokens, heads, d) = (9, 4, 64);
    let index: Vec<u32> = vec![7, 2, 3, 8];
    let n = index.len();
    let o = to_bf16(&rng.normals(tokens * heads * d, 1.0));
    let mut lse: Vec<f32> = rng.normals(tokens * heads, 2.0);
    lse[2 * heads + 1] = f32::NEG_INFINITY; // an empty main part: the result is the partial
    let part_o = to_bf16(&rng.normals(n * heads * d, 1.0));
    let part_lse: Vec<f32> = rng.normals(n * heads, 2.0);

    // Reference: merge_state over the gathered main rows.
    let gathered_o: Vec<kernels::bf16> = index
        .iter()
        .flat_map(|&t| o[t as usize * heads * d..(t as usize + 1) * heads * d].to_vec())
        .collect();
    let gathered_lse: Vec<f32> = index
        .iter()
        .flat_map(|&t| lse[t as usize * heads..(t as usize + 1) * heads].to_vec())
        .collect();
    let (ga, gl) = (
        gpu.upload(&gathered_o).unwrap(),
        gpu.upload(&gathered_lse).unwrap(),
    );
    let (pa, pl) = (gpu.upload(&part_o).unwrap(), gpu.upload(&part_lse).unwrap());
    let a = PartialState {
        o: ga.as_view(),
        lse: gl.as_view(),
    };
    let b = PartialState {
        o: pa.as_view(),
        lse: pl.as_view(),
    };
    let mut want_o = gpu.upload(&poison_bf16(n * heads * d)).unwrap();
    let mut want_lse = gpu.upload(&poison_f32(n * heads)).unwrap();
    merge_state(&gpu, &a, &b, &mut want_o, Some(&mut want_lse), n * heads, d).unwrap();
    let (want_o, want_lse) = (
        gpu.download(&want_o).unwrap(),
        gpu.download(&want_lse).unwrap(),
    );

    let (mut d_o, mut d_lse) = (gpu.upload(&o).unwrap(), gpu.upload(&lse).unwrap());
    let d_index = gpu.upload(&index).unwrap();
    merge_pieces_into(&gpu, &mut d_o, &mut d_lse, &b, 1, &d_index, heads, d).unwrap();
    let (got_o, got_lse) = (gpu.download(&d_o).unwrap(), gpu.download(&d_lse).unwrap());
    let row = heads * d;
    for t in 0..tokens {
        let (got, got_l) = (
            &got_o[t * row..(t + 1) * row],
            &got_lse[t * heads..(t + 1) * heads],
        );
        match index.iter().position(|&x| x as usize == t) {
            Some(i) => {
                assert_close(
                    &format!("merged row {t}"),
                    &wide(got),
                    &wide(&want_o[i * row..(i + 1) * row]),
                    BF16_TOL,
                );
                let want_l = &want_lse[i * heads..(i + 1) * heads];
                for (x, y) in got_l.iter().zip(want_l) {
                    assert!((x - y).abs() < 1e-4, "row {t}: lse {x} vs {y}");
                }
            }
            None => {
                assert_eq!(got, &o[t * row..(t + 1) * row], "row {t} untouched");
                assert_eq!(got_l, &lse[t * heads..(t + 1) * heads]);
            }
        }
    }
}

/// Split-KV prefill: a few queries over a long prefix, the prefix cut into pieces attended in
/// one unmasked call (the queries repeated once a piece), the own pages attended causally, and
/// the pieces folded into that by merge_pieces_into: flat attention back, empty pieces included,
/// on every prefill kernel the device has.
#[test]
fn split_kv_pieces_merged_equal_one_pass() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(31);
    let (d, hq, hkv, ps, q_len) = (128, 4, 2, 16, 16);
    let mut cache = Cache::new(shape(d, hkv, ps, 64), &mut rng);
    // Three segments ending in partial pages: 24 entries.
    let segments = [40, 300, 27].map(|n| cache.segment(n, &mut rng));
    let prefix = SeqKv::concat(&segments.iter().collect::<Vec<_>>());
    let own = cache.segment(24, &mut rng);
    let p = Problem {
        hq,
        q: to_bf16(&rng.normals(q_len * hq * d, 1.0)),
        cache,
        seqs: vec![SeqKv::concat(&[&prefix, &own])],
        q_lens: vec![q_len],
    };
    let dev = upload(&gpu, &p);
    let (want, want_lse) = p.reference(&p.seqs, true);
    let one_pass = run_prefill(&gpu, &p, &dev, &p.seqs, true);
    let rows = q_len * hq;
    let entries = prefix.entries.len();
    let q_indptr = gpu.upload(&p.q_indptr()).unwrap();
    let own_queries = PrefillQueries {
        indptr: q_indptr.as_view(),
        max_len: q_len,
    };
    let own_table = p.table(std::slice::from_ref(&own)).upload(&gpu).unwrap();
    let own_inputs = p.inputs((dev.k.as_view(), dev.v.as_view()), &dev.q, &own_table);
    let index = gpu.upload(&(0..q_len as u32).collect::<Vec<_>>()).unwrap();
    let poisoned = |n: usize| {
        (
            gpu.upload(&poison_bf16(n * rows * d)).unwrap(),
            gpu.upload(&poison_f32(n * rows)).unwrap(),
        )
    };
    // Piece i reads entries i * E / P .. (i + 1) * E / P: with 32 pieces, 8 are empty; 12 are
    // merged in one partial batch of the merge's loads, 20 in a full one and a partial one. The
    // pieces' page table and their queries' indptr.
    let cut = |pieces: usize| {
        let mut table = HostPageTable::new(ps);
        for i in 0..pieces {
            let range = i * entries / pieces..(i + 1) * entries / pieces;
            table.push_seq(prefix.entries[range].iter().copied());
        }
        let indptr: Vec<i32> = (0..=pieces).map(|i| (i * q_len) as i32).collect();
        (table.upload(&gpu).unwrap(), gpu.upload(&indptr).unwrap())
    };
    // The own pages, causal, with the pieces folded in: the split's result.
    let own_merged = |kernel: PrefillKernel,
                      parts_o: &CudaSlice<bf16>,
                      parts_lse: &CudaSlice<f32>,
                      pieces: usize| {
        let (mut o, mut lse) = poisoned(1);
        let lse_out: &mut dyn kernels::DevicePtrMut<f32> = &mut lse;
        prefill_attention_on(
            &gpu,
            kernel,
            &own_inputs,
            &own_queries,
            true,
            &mut o,
            Some(lse_out),
        )
        .unwrap();
        let parts = PartialState {
            o: parts_o.as_view(),
            lse: parts_lse.as_view(),
        };
        merge_pieces_into(&gpu, &mut o, &mut lse, &parts, pieces, &index, hq, d).unwrap();
        download(&gpu, &o, &lse)
    };
    for (kernel, (one_out, _)) in &one_pass {
        for pieces in [1, 3, 4, 12, 20, 32] {
            // Every piece reads the one copy of the queries.
            let (table, indptr) = cut(pieces);
            let queries = PrefillQueries {
                indptr: indptr.as_view(),
                max_len: q_len,
            };
            let inputs = p.inputs((dev.k.as_view(), dev.v.as_view()), &dev.q, &table);
            let (mut parts_o, mut parts_lse) = poisoned(pieces);
            let (o, lse) = (&mut parts_o, &mut parts_lse);
            prefill_attention_pieces_on(&gpu, *kernel, &inputs, &queries, pieces, o, lse).unwrap();
            // An empty piece attends nothing: zeros and a log-sum-exp of -inf (which the merge
            // skips), whatever its block's shared memory held.
            let (part_o, part_lse) = download(&gpu, &parts_o, &parts_lse);
            for i in (0..pieces).filter(|i| i * entries / pieces == (i + 1) * entries / pieces) {
                let (o, l) = (
                    &part_o[i * rows * d..(i + 1) * rows * d],
                    &part_lse[i * rows..(i + 1) * rows],
                );
                assert!(
                    o.iter().all(|&x| x == 0.0),
                    "{kernel:?}: empty piece {i} wrote non-zero output"
                );
                assert!(
                    l.iter().all(|&x| x == f64::NEG_INFINITY),
                    "{kernel:?}: empty piece {i}'s lse"
                );
            }
            let (out, out_lse) = own_merged(*kernel, &parts_o, &parts_lse, pieces);
            let name = format!("split-KV prefill {kernel:?} in {pieces} pieces");
            assert_attention(&name, (&out, &out_lse), (&want, &want_lse));
            assert_close(&format!("{name} vs one pass"), &out, one_out, BF16_TOL);
        }
    }
    // As the CUDA runner launches it: the queries written by the kernel just before (here a
    // gather into rows 5.. of a poisoned buffer, as RoPE writes a step's queries) and read in
    // place from there, the pieces' call started as that kernel ends (on Hopper its blocks read
    // the page table and start their first K/V copies first, then wait for it before Q).
    let skip = 5;
    for pieces in [3, 32] {
        let (table, indptr) = cut(pieces);
        let queries = PrefillQueries {
            indptr: indptr.as_view(),
            max_len: q_len,
        };
        let rows_index = gpu.upload(&(0..q_len as u32).collect::<Vec<_>>()).unwrap();
        let mut q_buf = gpu.upload(&poison_bf16((skip + q_len) * hq * d)).unwrap();
        let (mut parts_o, mut parts_lse) = poisoned(pieces);
        let mut written = q_buf.slice_mut(skip * hq * d..);
        gather_rows(&gpu, &dev.q, q_len, &rows_index, &mut written, hq * d).unwrap();
        let mut inputs = p.inputs((dev.k.as_view(), dev.v.as_view()), &q_buf, &table);
        inputs.q = q_buf.slice(skip * hq * d..);
        let (o, lse) = (&mut parts_o, &mut parts_lse);
        prefill_attention_pieces(&gpu, &inputs, &queries, pieces, true, o, lse).unwrap();
        let best = PrefillKernel::best(&gpu, &own_inputs);
        let (out, out_lse) = own_merged(best, &parts_o, &parts_lse, pieces);
        let name = format!("split-KV prefill started early, {pieces} pieces");
        assert_attention(&name, (&out, &out_lse), (&want, &want_lse));
    }
}

#[test]
fn attention_refuses_unsupported_shapes() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(24);
    let p = problem(&mut rng, shape(64, 2, 24, 4), 4, &[(&[10], 1)]);
    let dev = upload(&gpu, &p);
    let table = p.table(&p.seqs).upload(&gpu).unwrap();
    let inputs = AttentionInputs {
        q: dev.q.as_view(),
        k_cache: dev.k.as_view(),
        v_cache: dev.v.as_view(),
        cache: p.cache.shape,
        table: table.view(),
        num_q_heads: 4,
        sm_scale: 0.125,
    };
    let mut out = gpu.upload(&poison_bf16(4 * 64)).unwrap();
    let mut ws = DecodeWorkspace::new(&gpu, 64).unwrap();
    let err = decode_attention(&gpu, &inputs, &mut ws, &mut out, None).unwrap_err();
    assert!(err.to_string().contains("power of two"), "{err}");
    // The bulk-copy kernel is Hopper's and head_dim 128's only.
    let err = decode_attention_on(
        DecodeKernel::BulkCopies,
        &gpu,
        &AttentionInputs {
            q: dev.q.as_view(),
            k_cache: dev.k.as_view(),
            v_cache: dev.v.as_view(),
            cache: shape(64, 2, 16, 4),
            table: table.view(),
            num_q_heads: 4,
            sm_scale: 0.125,
        },
        &mut ws,
        &mut out,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("head_dim 128"), "{err}");
    let err = decode_attention(
        &gpu,
        &AttentionInputs {
            num_q_heads: 3,
            cache: shape(64, 2, 16, 4),
            ..inputs
        },
        &mut ws,
        &mut out,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("evenly"), "{err}");
}
