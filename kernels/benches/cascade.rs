//! Cascade attention against flat paged decode for a batch sharing one long prefix
//! (FlashInfer's cascade inference, Ye et al. 2024): 64-256 requests, a 4k-32k-token shared
//! prefix, 64 unique tokens each, Qwen3-0.6B's attention shape.
//!
//! Flat decode reads the prefix's pages once per request. Cascade reads them once for the
//! whole batch: all the batch's queries attend the prefix with the non-causal prefill kernel
//! (tensor cores, the queries of a GQA group folded into its tile rows), each request attends
//! its own pages with the decode kernel, and the two partial results are merged by
//! log-sum-exp. A small batch has too few query tiles to fill the GPU, so the "split" variant
//! also cuts the prefix into parts attended in parallel (each reading the batch's queries in
//! place), as the CUDA runner does, the decode of the requests' own pages started beside the
//! prefix's pass and folding the parts into its rows (or, where it cannot, the parts merged
//! after it in one launch); the table
//! shows the fastest count of parts (2 to 32), and a third table every count. Times are device
//! times between CUDA events, the median of 15 batches of 10 calls. Without a GPU it says so
//! and exits.
//!
//! A second table is one layer's attention in the chunk API's cached composition: 16 new tokens
//! after a 40-token system prompt and a 1k-16k-token context, one sequence, pages of 256 (the
//! engine's). One causal pass gives it 8 blocks, each walking the whole KV; split-KV (what the
//! CUDA runner plans) attends the system prompt and context in pieces in one unmasked call, the
//! new tokens' page causally, and merges the pieces into that (`merge_pieces_into`).

mod common;

use common::{fill, time};
use kernels::decode::{
    DecodeWorkspace, decode_attention, decode_attention_beside, decode_attention_folding,
};
use kernels::merge::{PartialState, merge_pieces_into};
use kernels::paged::{AttentionInputs, CacheShape, DevicePageTable, HostPageTable};
use kernels::prefill::{PrefillQueries, prefill_attention, prefill_attention_pieces};
use kernels::{CudaSlice, Gpu, bf16};

const HQ: usize = 16;
const HKV: usize = 8;
const D: usize = 128;
const PAGE: usize = 16;
const SUFFIX: usize = 64;

/// One shape's K/V cache: the prefix's pages first, then each request's own pages.
struct Cache {
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    shape: CacheShape,
    prefix_pages: usize,
}

impl Cache {
    fn new(gpu: &Gpu, batch: usize, prefix: usize) -> Self {
        let prefix_pages = prefix / PAGE;
        let shape = CacheShape {
            num_pages: prefix_pages + batch * SUFFIX / PAGE,
            num_kv_heads: HKV,
            page_size: PAGE,
            head_dim: D,
        };
        Self {
            k: gpu.upload(&fill(shape.elements(), 1)).unwrap(),
            v: gpu.upload(&fill(shape.elements(), 2)).unwrap(),
            shape,
            prefix_pages,
        }
    }

    /// Request `r`'s own pages.
    fn suffix(&self, r: usize) -> impl Iterator<Item = (u32, usize)> {
        let first = self.prefix_pages + r * SUFFIX / PAGE;
        (first..first + SUFFIX / PAGE).map(|p| (p as u32, PAGE))
    }

    /// Prefix pages `from..to`.
    fn prefix(&self, from: usize, to: usize) -> impl Iterator<Item = (u32, usize)> {
        (from..to).map(|p| (p as u32, PAGE))
    }

    fn inputs<'a>(
        &'a self,
        q: &'a CudaSlice<bf16>,
        table: &'a DevicePageTable,
    ) -> AttentionInputs<'a> {
        AttentionInputs {
            q: q.as_view(),
            k_cache: self.k.as_view(),
            v_cache: self.v.as_view(),
            cache: self.shape,
            table: table.view(),
            num_q_heads: HQ,
            sm_scale: 1.0 / (D as f32).sqrt(),
        }
    }
}

/// Split-KV attention launched as the CUDA runner launches it: every piece of `table` (a
/// sequence a piece) is attended in one unmasked prefill call that reads the `queries` query
/// tokens in place for each, starting as the kernel before it ends, and the pieces merge into
/// a main state in one launch.
struct Pieces {
    table: DevicePageTable,
    pieces: usize,
    queries: usize,
    index: CudaSlice<u32>,
    indptr: CudaSlice<i32>,
    o: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
}

impl Pieces {
    fn new(gpu: &Gpu, table: DevicePageTable, pieces: usize, queries: usize) -> Self {
        let rows = queries * HQ;
        let index: Vec<u32> = (0..queries as u32).collect();
        let indptr: Vec<i32> = (0..=pieces).map(|p| (p * queries) as i32).collect();
        Self {
            table,
            pieces,
            queries,
            index: gpu.upload(&index).unwrap(),
            indptr: gpu.upload(&indptr).unwrap(),
            o: gpu.zeros::<bf16>(pieces * rows * D).unwrap(),
            lse: gpu.zeros::<f32>(pieces * rows).unwrap(),
        }
    }

    /// Attends `q` over every piece and folds the pieces into `(o, lse)`.
    fn attend_into(
        &mut self,
        gpu: &Gpu,
        cache: &Cache,
        q: &CudaSlice<bf16>,
        o: &mut CudaSlice<bf16>,
        lse: &mut CudaSlice<f32>,
    ) {
        self.attend(gpu, cache, q);
        self.merge_into(gpu, o, lse);
    }

    /// Attends `q` over every piece. The kernels that may still run as it starts (the call
    /// before this one, or the merge of the last, and what those started beside) write neither
    /// the page table nor the K/V, so it may start early.
    fn attend(&mut self, gpu: &Gpu, cache: &Cache, q: &CudaSlice<bf16>) {
        let queries = PrefillQueries {
            indptr: self.indptr.as_view(),
            max_len: self.queries,
        };
        let inputs = cache.inputs(q, &self.table);
        let (o, lse) = (&mut self.o, &mut self.lse);
        prefill_attention_pieces(gpu, &inputs, &queries, self.pieces, true, o, lse).unwrap();
    }

    /// Folds the pieces into `(o, lse)`.
    fn merge_into(&self, gpu: &Gpu, o: &mut CudaSlice<bf16>, lse: &mut CudaSlice<f32>) {
        let pieces = PartialState {
            o: self.o.as_view(),
            lse: self.lse.as_view(),
        };
        merge_pieces_into(gpu, o, lse, &pieces, self.pieces, &self.index, HQ, D).unwrap();
    }
}

/// Flat paged decode: every request's table lists the prefix pages and then its own.
fn flat(gpu: &Gpu, cache: &Cache, batch: usize, q: &CudaSlice<bf16>) -> (f64, Vec<bf16>) {
    let mut table = HostPageTable::new(PAGE);
    for r in 0..batch {
        table.push_seq(cache.prefix(0, cache.prefix_pages).chain(cache.suffix(r)));
    }
    let table = table.upload(gpu).unwrap();
    let mut ws = DecodeWorkspace::new(gpu, D).unwrap();
    let mut out = gpu.zeros::<bf16>(batch * HQ * D).unwrap();
    let inputs = cache.inputs(q, &table);
    let secs = time(gpu, &mut || {
        decode_attention(gpu, &inputs, &mut ws, &mut out, None).unwrap()
    });
    (secs, gpu.download(&out).unwrap())
}

/// Cascade: the prefix in `parts` parallel pieces for all queries, the suffixes by decode, and
/// log-sum-exp merges, launched as the CUDA runner launches them: one unmasked prefill call
/// attends every part, each reading the queries in place, and the decode of the suffixes starts
/// beside it, folding the parts into its rows; where it cannot (a request's own pages shared by
/// two of its blocks), the parts merge into its result after it.
fn cascade(
    gpu: &Gpu,
    cache: &Cache,
    batch: usize,
    q: &CudaSlice<bf16>,
    parts: usize,
) -> (f64, Vec<bf16>) {
    let rows = batch * HQ;
    let per_part = cache.prefix_pages / parts;
    let mut prefix_table = HostPageTable::new(PAGE);
    for p in 0..parts {
        prefix_table.push_seq(cache.prefix(p * per_part, (p + 1) * per_part));
    }
    let mut shared = Pieces::new(gpu, prefix_table.upload(gpu).unwrap(), parts, batch);
    let mut own = HostPageTable::new(PAGE);
    for r in 0..batch {
        own.push_seq(cache.suffix(r));
    }
    let own_slots = own.slot_indptr();
    let own = own.upload(gpu).unwrap();
    let mut o = gpu.zeros::<bf16>(rows * D).unwrap();
    let mut lse = gpu.zeros::<f32>(rows).unwrap();
    let own_inputs = cache.inputs(q, &own);
    let mut ws = DecodeWorkspace::new(gpu, D).unwrap();

    let mut run = || {
        shared.attend(gpu, cache, q);
        let parts = PartialState {
            o: shared.o.as_view(),
            lse: shared.lse.as_view(),
        };
        let folded = decode_attention_folding(
            gpu,
            &own_inputs,
            &mut ws,
            &mut o,
            Some(&mut lse),
            &own_slots,
            &parts,
            shared.pieces,
        )
        .unwrap();
        if !folded {
            decode_attention_beside(
                gpu,
                &own_inputs,
                &mut ws,
                &mut o,
                Some(&mut lse),
                &own_slots,
            )
            .unwrap();
            shared.merge_into(gpu, &mut o, &mut lse);
        }
    };
    let secs = time(gpu, &mut run);
    (secs, gpu.download(&o).unwrap())
}

/// New tokens of the cached composition, and its page size.
const QUERY: usize = 16;
const ENGINE_PAGE: usize = 256;

/// One layer's attention of 16 new tokens after a 40-token system prompt and `context` tokens:
/// page 0 holds the system prompt, the context's pages follow, the new tokens' page is last.
/// Returns the device time of one causal pass, then of split-KV for each count of `pieces`,
/// with the largest difference of a split output from the one pass.
fn cached_composition(gpu: &Gpu, context: usize, pieces: &[usize]) -> (f64, Vec<(f64, f32)>) {
    let context_pages = context.div_ceil(ENGINE_PAGE);
    let shape = CacheShape {
        num_pages: context_pages + 2,
        num_kv_heads: HKV,
        page_size: ENGINE_PAGE,
        head_dim: D,
    };
    let own_page = (context_pages + 1) as u32;
    let cache = Cache {
        k: gpu.upload(&fill(shape.elements(), 4)).unwrap(),
        v: gpu.upload(&fill(shape.elements(), 5)).unwrap(),
        shape,
        prefix_pages: context_pages + 1,
    };
    let q = gpu.upload(&fill(QUERY * HQ * D, 6)).unwrap();
    // The entries before the new tokens: the system prompt's page, then the context's.
    let visible: Vec<(u32, usize)> = std::iter::once((0, 40))
        .chain((0..context_pages).map(|p| {
            let n = (context - p * ENGINE_PAGE).min(ENGINE_PAGE);
            (p as u32 + 1, n)
        }))
        .collect();
    let rows = QUERY * HQ;
    let one_indptr = gpu.upload(&[0, QUERY as i32]).unwrap();
    let one_queries = PrefillQueries {
        indptr: one_indptr.as_view(),
        max_len: QUERY,
    };

    let mut whole = HostPageTable::new(ENGINE_PAGE);
    whole.push_seq(visible.iter().copied().chain([(own_page, QUERY)]));
    let whole = whole.upload(gpu).unwrap();
    let mut o_one = gpu.zeros::<bf16>(rows * D).unwrap();
    let one_s = time(gpu, &mut || {
        prefill_attention(
            gpu,
            &cache.inputs(&q, &whole),
            &one_queries,
            true,
            &mut o_one,
            None,
        )
        .unwrap()
    });
    let want = gpu.download(&o_one).unwrap();

    let mut own = HostPageTable::new(ENGINE_PAGE);
    own.push_seq([(own_page, QUERY)]);
    let own = own.upload(gpu).unwrap();
    let mut o = gpu.zeros::<bf16>(rows * D).unwrap();
    let mut lse = gpu.zeros::<f32>(rows).unwrap();
    let split = pieces
        .iter()
        .map(|&p| {
            let mut table = HostPageTable::new(ENGINE_PAGE);
            let e = visible.len();
            for i in 0..p {
                table.push_seq(visible[i * e / p..(i + 1) * e / p].iter().copied());
            }
            let mut split = Pieces::new(gpu, table.upload(gpu).unwrap(), p, QUERY);
            let secs = time(gpu, &mut || {
                let own_inputs = cache.inputs(&q, &own);
                prefill_attention(gpu, &own_inputs, &one_queries, true, &mut o, Some(&mut lse))
                    .unwrap();
                split.attend_into(gpu, &cache, &q, &mut o, &mut lse);
            });
            (secs, max_abs_diff(&want, &gpu.download(&o).unwrap()))
        })
        .collect();
    (one_s, split)
}

fn max_abs_diff(a: &[bf16], b: &[bf16]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x.to_f32() - y.to_f32()).abs())
        .fold(0.0, f32::max)
}

fn main() {
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("cascade bench skipped: {e}");
            return;
        }
    };
    gpu.preload().unwrap();
    println!(
        "cascade vs flat decode attention on {} ({} SMs): {HQ} q heads, {HKV} KV heads, \
         head_dim {D}, page {PAGE}, {SUFFIX} own tokens per request\n",
        gpu.name().unwrap(),
        gpu.num_sms()
    );
    println!(
        "| batch | shared prefix | flat (us) | cascade 1 pass (us) | cascade split (us) | parts \
         | speed-up 1 pass | speed-up split | max abs diff |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // Every count of parts tried, for the table after this one.
    let mut by_parts = Vec::new();
    for batch in [64, 128, 256] {
        for prefix in [4096, 8192, 16384, 32768] {
            let cache = Cache::new(&gpu, batch, prefix);
            let q = gpu.upload(&fill(batch * HQ * D, 3)).unwrap();
            let (flat_s, flat_out) = flat(&gpu, &cache, batch, &q);
            let (one_s, one_out) = cascade(&gpu, &cache, batch, &q, 1);
            // The split: the fastest power of two of parts up to 32, none under 256 tokens.
            let tried: Vec<_> = (1..=5)
                .map(|e| 1usize << e)
                .filter(|p| prefix / p >= 256)
                .map(|p| (p, cascade(&gpu, &cache, batch, &q, p)))
                .collect();
            by_parts.push((
                batch,
                prefix,
                tried.iter().map(|(p, (s, _))| (*p, *s)).collect::<Vec<_>>(),
            ));
            let (parts, (split_s, split_out)) = tried
                .into_iter()
                .min_by(|a, b| a.1.0.total_cmp(&b.1.0))
                .unwrap();
            println!(
                "| {batch} | {prefix} | {:.1} | {:.1} | {:.1} | {parts} | {:.1}x | {:.1}x | {:.1e} |",
                flat_s * 1e6,
                one_s * 1e6,
                split_s * 1e6,
                flat_s / one_s,
                flat_s / split_s,
                max_abs_diff(&flat_out, &split_out).max(max_abs_diff(&flat_out, &one_out))
            );
        }
    }

    // What the engine's rule for cutting (phase6-cuda-plan's KvSplit) is fitted to.
    println!("\ncascade split by count of parts (us)\n");
    println!("| batch | shared prefix | 2 | 4 | 8 | 16 | 32 |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (batch, prefix, tried) in &by_parts {
        let cells: Vec<String> = [2, 4, 8, 16, 32]
            .iter()
            .map(|p| match tried.iter().find(|(q, _)| q == p) {
                Some((_, s)) => format!("{:.1}", s * 1e6),
                None => "-".to_string(),
            })
            .collect();
        println!("| {batch} | {prefix} | {} |", cells.join(" | "));
    }

    let pieces = [4, 8, 16, 32];
    println!(
        "\none layer's attention of {QUERY} new tokens after a 40-token system prompt and a \
         context, one sequence, pages of {ENGINE_PAGE}: one causal pass vs split-KV in pieces\n"
    );
    println!(
        "| context | one pass (us) | {} | best speed-up | max abs diff |",
        pieces.map(|p| format!("{p} pieces (us)")).join(" | ")
    );
    println!("|---:|---:|{}---:|---:|", "---:|".repeat(pieces.len()));
    for context in [1000, 4000, 16000] {
        let (one, split) = cached_composition(&gpu, context, &pieces);
        let best = split.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
        let diff = split.iter().map(|s| s.1).fold(0.0, f32::max);
        let cells: Vec<String> = split.iter().map(|s| format!("{:.1}", s.0 * 1e6)).collect();
        println!(
            "| {context} | {:.1} | {} | {:.1}x | {diff:.1e} |",
            one * 1e6,
            cells.join(" | "),
            one / best
        );
    }
}
