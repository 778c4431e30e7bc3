//! One forward step on the device: embedding, the decoder layers, the final norm and the
//! lm_head, as a fixed sequence of launches on one stream with no host synchronisation. The
//! same code runs a step eagerly or records it into a CUDA graph.
//!
//! Hidden states are bf16 between kernels, arithmetic inside them f32 (as in vLLM). The
//! residual stream is added inside the norms (`add_rms_norm`), and only the last token of each
//! sampling sequence goes through the lm_head.
//!
//! The runner launches whatever [`DeviceModel`] it was given: the whole model on this GPU
//! ([`DeviceWeights`], whose step is [`run`]), or one rank's part of a model split over several
//! GPUs, which composes the same pieces ([`attention_block`], [`mlp_block`], [`final_rows`])
//! with collectives in between (chapter 6.5).

use kernels::decode::{self, DecodeWorkspace};
use kernels::merge::{self, PartialState};
use kernels::paged::{AttentionInputs, CacheRead, CacheShape, Fp8Cache, Fp8CacheMut, PageTable};
use kernels::prefill::{self, PrefillQueries};
use kernels::rope::{self, RopeStore};
use kernels::{
    CudaSlice, CudaView, CudaViewMut, DevicePtrMut, Gpu, Result, activation, bf16, gather, linear,
    norm, split_k,
};
use phase1::KvDtype;
use phase2::ModelConfig;
use phase6_cuda_weights::DeviceWeights;

/// What the runner launches for one step: every layer of the model, leaving the logits of
/// `inputs.sample_rows` in [`Activations::logits`]. Launches only (no host synchronisation), so
/// a step can be recorded into a CUDA graph.
pub trait DeviceModel: Send {
    fn forward(
        &mut self,
        gpu: &Gpu,
        m: &Dims,
        a: &mut Activations,
        kv: &mut KvCache,
        inputs: &StepInputs<'_>,
    ) -> Result<()>;

    /// The weights this device holds (the RoPE table, what K/V copies turn keys with).
    fn weights(&self) -> &DeviceWeights;

    /// Whether a step may be run again on this device alone (to retry a failed graph capture):
    /// not when its steps exchange data with other devices, which would wait for a partner.
    fn may_repeat_alone(&self) -> bool {
        true
    }
}

impl DeviceModel for DeviceWeights {
    fn forward(
        &mut self,
        gpu: &Gpu,
        m: &Dims,
        a: &mut Activations,
        kv: &mut KvCache,
        inputs: &StepInputs<'_>,
    ) -> Result<()> {
        run(gpu, m, self, a, kv, inputs)
    }

    fn weights(&self) -> &DeviceWeights {
        self
    }
}

/// The model's sizes as the kernels take them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    pub vocab: usize,
    pub eps: f32,
    /// What RoPE's cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    pub rope_attention_factor: f32,
}

impl Dims {
    pub fn new(c: &ModelConfig) -> Self {
        Self {
            layers: c.num_layers,
            hidden: c.hidden_size,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            inter: c.intermediate_size,
            vocab: c.vocab_size,
            eps: c.rms_norm_eps,
            rope_attention_factor: c.rope.attention_factor,
        }
    }

    /// Width of a row of queries (or of attention outputs).
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    pub fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// The page table of one attention call, as device views.
pub(crate) struct TableViews<'a> {
    pub indptr: CudaView<'a, i32>,
    /// The decode table's `slot_indptr` (`kernels::paged::PageTable`).
    pub slot_indptr: Option<CudaView<'a, i32>>,
    pub page_ids: CudaView<'a, i32>,
    pub page_lens: CudaView<'a, i32>,
}

impl<'a> TableViews<'a> {
    fn page_table(&self) -> PageTable<'a> {
        PageTable {
            indptr: self.indptr.slice(..),
            page_ids: self.page_ids.slice(..),
            page_lens: self.page_lens.slice(..),
            slot_indptr: self.slot_indptr.as_ref().map(|o| o.slice(..)),
        }
    }

    fn num_seqs(&self) -> usize {
        self.indptr.len().saturating_sub(1)
    }
}

/// One-token sequences, rows `0..num_seqs`, through the decode kernel.
pub(crate) struct DecodePart<'a> {
    pub table: TableViews<'a>,
    /// The host's copy of the table's `slot_indptr`: beside a cascade level (a step that runs
    /// eagerly, never from a graph) the decode launches its merge only if it has work.
    pub slot_indptr: Vec<i32>,
}

/// Query rows against paged KV through the prefill kernel.
pub(crate) struct PrefillPart<'a> {
    pub table: TableViews<'a>,
    pub q_indptr: CudaView<'a, i32>,
    pub max_q: usize,
}

/// Unmasked KV attended in one call (`phase6_cuda_plan::Level`): the queries of `rows`, read
/// in place where they are one run of the step's rows (`in_place`: the first) and gathered
/// once otherwise, attend their pieces of cascade groups' shared segments and of long visible
/// prefixes; the pieces are merged into the rows' main state in one launch.
pub(crate) struct LevelPart<'a> {
    pub rows: CudaView<'a, u32>,
    pub pieces: usize,
    pub in_place: Option<usize>,
    /// The decode folds its pieces into the decode rows (`phase6_cuda_plan::Level::folded`).
    pub folded: bool,
    pub groups: PrefillPart<'a>,
}

/// What one step reads, all in the staging buffer (see `staging`).
pub struct StepInputs<'a> {
    pub(crate) ids: CudaView<'a, u32>,
    pub(crate) positions: CudaView<'a, i32>,
    pub(crate) slots: CudaView<'a, i32>,
    pub(crate) sample_rows: CudaView<'a, u32>,
    pub(crate) decode: Option<DecodePart<'a>>,
    /// The rows after the decode ones.
    pub(crate) prefill: Option<PrefillPart<'a>>,
    pub(crate) levels: Vec<LevelPart<'a>>,
}

impl StepInputs<'_> {
    /// Rows (tokens) in the step.
    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }

    /// Token ids of the rows.
    pub fn ids(&self) -> &CudaView<'_, u32> {
        &self.ids
    }

    /// Rows whose logits the step returns.
    pub fn num_sampled(&self) -> usize {
        self.sample_rows.len()
    }
}

/// Device buffers that every step reuses, sized once for the largest step.
pub struct Activations {
    /// The residual stream `[tokens, hidden]`.
    resid: CudaSlice<bf16>,
    /// A sub-layer's input (normalised) or output `[tokens, hidden]`.
    hidden: CudaSlice<bf16>,
    /// The fused q|k|v, later gate|up, projection output.
    wide: CudaSlice<bf16>,
    q: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    /// silu(gate) * up `[tokens, intermediate]`.
    act: CudaSlice<bf16>,
    /// Split-K partials of o_proj or down, when a thin step splits them (`kernels::split_k`).
    partials: CudaSlice<f32>,
    /// Log-sum-exp of each (token, head) of `attn`, kept when a cascade merges into it.
    lse: CudaSlice<f32>,
    part_q: CudaSlice<bf16>,
    part_o: CudaSlice<bf16>,
    part_lse: CudaSlice<f32>,
    decode_ws: DecodeWorkspace,
    /// The lm_head's input rows `[seqs, hidden]` and output `[seqs, vocab]`.
    last: CudaSlice<bf16>,
    pub logits: CudaSlice<f32>,
    pub sampled: CudaSlice<u32>,
    bytes: usize,
}

impl Activations {
    /// Buffers for steps of up to `tokens` rows and `seqs` sequences.
    pub fn new(gpu: &Gpu, m: &Dims, tokens: usize, seqs: usize) -> Result<Self> {
        let mut bytes = 0;
        let mut bf = |n: usize| {
            bytes += 2 * n;
            gpu.zeros::<bf16>(n)
        };
        let (qw, hq) = (m.q_width(), m.heads);
        let resid = bf(tokens * m.hidden)?;
        let hidden = bf(tokens * m.hidden)?;
        let wide = bf(tokens * m.qkv_width().max(2 * m.inter))?;
        let q = bf(tokens * qw)?;
        let attn = bf(tokens * qw)?;
        let act = bf(tokens * m.inter)?;
        let part_q = bf(tokens * qw)?;
        let part_o = bf(tokens * qw)?;
        let last = bf(seqs * m.hidden)?;
        bytes += 4 * (2 * tokens * hq + seqs * m.vocab + seqs);
        let decode_ws = DecodeWorkspace::new(gpu, m.head_dim)?;
        bytes += decode_ws.bytes();
        bytes += 4 * split_k::MAX_PARTIALS;
        Ok(Self {
            resid,
            hidden,
            wide,
            q,
            attn,
            act,
            partials: gpu.zeros(split_k::MAX_PARTIALS)?,
            lse: gpu.zeros(tokens * hq)?,
            part_q,
            part_o,
            part_lse: gpu.zeros(tokens * hq)?,
            decode_ws,
            last,
            logits: gpu.zeros(seqs * m.vocab)?,
            sampled: gpu.zeros(seqs)?,
            bytes,
        })
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The residual stream `[tokens, hidden]` (the embedding's output before layer 0).
    pub fn resid_mut(&mut self) -> &mut CudaSlice<bf16> {
        &mut self.resid
    }

    /// Where a product of width `hidden` is: `bf16[tokens, hidden]`, or split-K partials
    /// `f32[splits, tokens, hidden]` (both are sums, term by term, of what each part gives).
    pub fn product_mut(&mut self, out: HiddenOut, t: usize, hidden: usize) -> ProductMut<'_> {
        match out.splits {
            1 => ProductMut::Whole(self.hidden.slice_mut(..t * hidden)),
            n => ProductMut::Partials(self.partials.slice_mut(..n * t * hidden)),
        }
    }

    /// The lm_head's input rows `[seqs, hidden]` (after [`final_rows`]).
    pub fn last(&self) -> &CudaSlice<bf16> {
        &self.last
    }
}

/// A product's buffer, as [`Activations::product_mut`] finds it.
pub enum ProductMut<'a> {
    Whole(CudaViewMut<'a, bf16>),
    Partials(CudaViewMut<'a, f32>),
}

/// The scale of every FP8 K and V buffer: values are stored as they are, within e4m3's ±448
/// (vLLM's default without a quantized checkpoint). The kernels take any scale per buffer;
/// chapter 6.6 measures what calibrated ones would change.
const FP8_SCALE: f32 = 1.0;

enum Buffers {
    Bf16 {
        k: CudaSlice<bf16>,
        v: CudaSlice<bf16>,
    },
    /// FP8 codes, every layer's K and V with scale [`FP8_SCALE`].
    Fp8 { k: CudaSlice<u8>, v: CudaSlice<u8> },
}

/// One K and one V buffer for every layer, each `[layers][pages][kv_heads][page_size][head_dim]`.
pub struct KvCache {
    buffers: Buffers,
    pub shape: CacheShape,
}

impl KvCache {
    /// Zeroed buffers of bf16, or of FP8 codes (`KvDtype::Fp8E4m3`, scale [`FP8_SCALE`]).
    pub fn new(gpu: &Gpu, layers: usize, shape: CacheShape, dtype: KvDtype) -> Result<Self> {
        let n = layers * shape.elements();
        let buffers = match dtype {
            KvDtype::Fp8E4m3 => Buffers::Fp8 {
                k: gpu.zeros(n)?,
                v: gpu.zeros(n)?,
            },
            _ => Buffers::Bf16 {
                k: gpu.zeros(n)?,
                v: gpu.zeros(n)?,
            },
        };
        Ok(Self { buffers, shape })
    }

    pub fn bytes(&self) -> usize {
        match &self.buffers {
            Buffers::Bf16 { k, .. } => 2 * 2 * k.len(),
            Buffers::Fp8 { k, .. } => 2 * k.len(),
        }
    }

    pub fn dtype(&self) -> KvDtype {
        match self.buffers {
            Buffers::Bf16 { .. } => KvDtype::BF16,
            Buffers::Fp8 { .. } => KvDtype::Fp8E4m3,
        }
    }
}

/// Layer `l`'s part of a buffer of `n` elements a layer.
fn layer_of<T>(b: &CudaSlice<T>, l: usize, n: usize) -> CudaView<'_, T> {
    b.slice(l * n..(l + 1) * n)
}

fn layer_of_mut<T>(b: &mut CudaSlice<T>, l: usize, n: usize) -> CudaViewMut<'_, T> {
    b.slice_mut(l * n..(l + 1) * n)
}

/// Runs `$body` with `$k` and `$v` bound to layer `$l`'s writable K and V, whichever the cache
/// holds (the kernels take either).
macro_rules! with_layer_mut {
    ($kv:expr, $l:expr, |$k:ident, $v:ident| $body:expr) => {{
        let n = $kv.shape.elements();
        match &mut $kv.buffers {
            Buffers::Bf16 { k, v } => {
                let (mut $k, mut $v) = (layer_of_mut(k, $l, n), layer_of_mut(v, $l, n));
                $body
            }
            Buffers::Fp8 { k, v } => {
                let mut $k = Fp8CacheMut {
                    codes: layer_of_mut(k, $l, n),
                    scale: FP8_SCALE,
                };
                let mut $v = Fp8CacheMut {
                    codes: layer_of_mut(v, $l, n),
                    scale: FP8_SCALE,
                };
                $body
            }
        }
    }};
}

/// Queues a whole step; the logits of `inputs.sample_rows` land in `a.logits`.
pub(crate) fn run(
    gpu: &Gpu,
    m: &Dims,
    w: &DeviceWeights,
    a: &mut Activations,
    kv: &mut KvCache,
    s: &StepInputs<'_>,
) -> Result<()> {
    let t = s.ids.len();
    gather::embedding(gpu, &s.ids, &w.embed, m.vocab, &mut a.resid, m.hidden)?;
    let mut mlp_out = None;
    for l in 0..m.layers {
        let attn_out = attention_block(gpu, m, l, w, a, kv, s, mlp_out, true)?;
        mlp_out = Some(mlp_block(gpu, m, l, w, a, attn_out, t, true)?);
    }
    final_rows(gpu, m, w, a, s, mlp_out)?;
    let rows = s.sample_rows.len();
    linear::linear(
        gpu,
        &a.last,
        w.output(),
        &mut a.logits,
        rows,
        m.vocab,
        m.hidden,
    )
}

/// The last layer's output added in and normalised, and the rows that sample gathered into
/// [`Activations::last`], the lm_head's input.
pub fn final_rows(
    gpu: &Gpu,
    m: &Dims,
    w: &DeviceWeights,
    a: &mut Activations,
    s: &StepInputs<'_>,
    mlp_out: Option<HiddenOut>,
) -> Result<()> {
    let t = s.ids.len();
    match mlp_out {
        Some(out) => add_norm(gpu, m, a, out, &w.final_norm, t)?,
        None => norm::rms_norm(
            gpu,
            &a.resid,
            &w.final_norm,
            &mut a.hidden,
            t,
            m.hidden,
            m.eps,
        )?,
    }
    gather::gather_rows(gpu, &a.hidden, t, &s.sample_rows, &mut a.last, m.hidden)
}

/// Where a product of width `hidden` (o_proj, down) left its output for the add + RMSNorm
/// after it: whole in `a.hidden`, or as split-K partials in `a.partials`.
#[derive(Debug, Clone, Copy)]
pub struct HiddenOut {
    splits: usize,
}

/// `x · w^T` of width `hidden` for the next [`add_norm`]: split-K when the step is thin (few
/// rows make too few output tiles to fill the GPU, see `kernels::split_k`) and `may_split`.
#[allow(clippy::too_many_arguments)]
fn hidden_product(
    gpu: &Gpu,
    m: &Dims,
    x: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    in_features: usize,
    out: (&mut CudaSlice<bf16>, &mut CudaSlice<f32>),
    t: usize,
    may_split: bool,
) -> Result<HiddenOut> {
    let h = m.hidden;
    let splits = match may_split {
        true => split_k::num_splits(t, h, in_features),
        false => 1,
    };
    if splits > 1 {
        split_k::linear_partials(gpu, x, w, out.1, t, h, in_features, splits)?;
    } else {
        linear::linear(gpu, x, w, out.0, t, h, in_features)?;
    }
    Ok(HiddenOut { splits })
}

/// `a.resid += product; a.hidden = rms_norm(a.resid) * weight`, the product read from where
/// [`hidden_product`] left it.
fn add_norm(
    gpu: &Gpu,
    m: &Dims,
    a: &mut Activations,
    product: HiddenOut,
    weight: &CudaSlice<bf16>,
    t: usize,
) -> Result<()> {
    let (h, eps) = (m.hidden, m.eps);
    match product.splits {
        1 => norm::add_rms_norm(gpu, &mut a.hidden, &mut a.resid, weight, t, h, eps),
        n => norm::add_split_rms_norm(
            gpu,
            &a.partials,
            n,
            &mut a.hidden,
            &mut a.resid,
            weight,
            t,
            h,
            eps,
        ),
    }
}

/// The attention half of decoder layer `l` over all rows, up to its output projection: `prev`
/// is the previous layer's MLP output (`None` for layer 0: the embedding is in `a.resid`).
/// Returns where the projection is, to be added to the residual stream by [`mlp_block`].
/// `may_split` lets a thin step split the projection (split-K).
#[allow(clippy::too_many_arguments)]
pub fn attention_block(
    gpu: &Gpu,
    m: &Dims,
    l: usize,
    w: &DeviceWeights,
    a: &mut Activations,
    kv: &mut KvCache,
    s: &StepInputs<'_>,
    prev: Option<HiddenOut>,
    may_split: bool,
) -> Result<HiddenOut> {
    let (t, h) = (s.ids.len(), m.hidden);
    let layer = &w.layers[l];
    // BEGIN SOLUTION
    match prev {
        None => norm::rms_norm(gpu, &a.resid, &layer.input_norm, &mut a.hidden, t, h, m.eps)?,
        Some(out) => add_norm(gpu, m, a, out, &layer.input_norm, t)?,
    }
    linear::linear(gpu, &a.hidden, &layer.qkv, &mut a.wide, t, m.qkv_width(), h)?;
    if let Some(bias) = &layer.qkv_bias {
        linear::add_bias(gpu, &mut a.wide, bias, t, m.qkv_width())?;
    }
    let rope = RopeStore {
        positions: s.positions.slice(..),
        slots: s.slots.slice(..),
        q_norm: layer.q_norm.as_ref().map(CudaSlice::as_view),
        k_norm: layer.k_norm.as_ref().map(CudaSlice::as_view),
        num_q_heads: m.heads,
        inv_freq: w.rope_inv_freq.as_view(),
        attention_factor: m.rope_attention_factor,
        norm_eps: m.eps,
    };
    let shape = kv.shape;
    with_layer_mut!(kv, l, |k, v| rope::qk_norm_rope_store(
        gpu, &a.wide, &rope, shape, &mut a.q, &mut k, &mut v
    ))?;
    attention(gpu, m, l, a, kv, s)?;
    let out = (&mut a.hidden, &mut a.partials);
    hidden_product(
        gpu,
        m,
        &a.attn,
        &layer.o_proj,
        m.q_width(),
        out,
        t,
        may_split,
    )
    // END SOLUTION
}

/// The MLP half of decoder layer `l`: adds the attention output `attn_out` to the residual
/// stream, normalises, and runs gate/up, SiLU and down; returns where down's product is.
#[allow(clippy::too_many_arguments)]
pub fn mlp_block(
    gpu: &Gpu,
    m: &Dims,
    l: usize,
    w: &DeviceWeights,
    a: &mut Activations,
    attn_out: HiddenOut,
    t: usize,
    may_split: bool,
) -> Result<HiddenOut> {
    let (layer, h) = (&w.layers[l], m.hidden);
    // BEGIN SOLUTION
    add_norm(gpu, m, a, attn_out, &layer.post_norm, t)?;
    linear::linear(
        gpu,
        &a.hidden,
        &layer.gate_up,
        &mut a.wide,
        t,
        2 * m.inter,
        h,
    )?;
    activation::silu_mul(gpu, &a.wide, &mut a.act, t, m.inter)?;
    let out = (&mut a.hidden, &mut a.partials);
    hidden_product(gpu, m, &a.act, &layer.down, m.inter, out, t, may_split)
    // END SOLUTION
}

/// Copies the K/V of `tokens` tokens from `src_slots` to `dst_slots` (`i32[tokens, 2]`) in
/// every layer, keys turned by `shift` positions (see `kernels::rope::copy_kv_rotated`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_kv_rotated(
    gpu: &Gpu,
    m: &Dims,
    rope_inv_freq: &CudaSlice<f32>,
    kv: &mut KvCache,
    src_slots: &CudaSlice<i32>,
    dst_slots: &CudaSlice<i32>,
    tokens: usize,
    shift: i64,
) -> Result<()> {
    let shape = kv.shape;
    for l in 0..m.layers {
        with_layer_mut!(kv, l, |k, v| rope::copy_kv_rotated(
            gpu,
            src_slots,
            dst_slots,
            tokens,
            shift,
            rope_inv_freq,
            shape,
            &mut k,
            &mut v,
        ))?;
    }
    Ok(())
}

/// Attention of every row (its K/V already stored) into `a.attn`: decode rows through the
/// decode kernel, prefill rows through the prefill kernel (causal), each over its own segments;
/// then each level attends its unmasked KV (cascade groups' shared segments, once for all their
/// queries; the visible head of a prefill's own KV) in pieces at once, merged in by log-sum-exp.
fn attention(
    gpu: &Gpu,
    m: &Dims,
    l: usize,
    a: &mut Activations,
    kv: &KvCache,
    s: &StepInputs<'_>,
) -> Result<()> {
    let (n, shape) = (kv.shape.elements(), kv.shape);
    match &kv.buffers {
        Buffers::Bf16 { k, v } => attend(gpu, m, a, s, shape, &|| {
            (layer_of(k, l, n), layer_of(v, l, n))
        }),
        Buffers::Fp8 { k, v } => attend(gpu, m, a, s, shape, &|| {
            (
                Fp8Cache {
                    codes: layer_of(k, l, n),
                    scale: FP8_SCALE,
                },
                Fp8Cache {
                    codes: layer_of(v, l, n),
                    scale: FP8_SCALE,
                },
            )
        }),
    }
}

/// [`attention`] over one layer's K and V, as `layer` gives them.
fn attend<C: CacheRead>(
    gpu: &Gpu,
    m: &Dims,
    a: &mut Activations,
    s: &StepInputs<'_>,
    shape: CacheShape,
    layer: &dyn Fn() -> (C, C),
) -> Result<()> {
    let (t, qw, hq) = (s.ids.len(), m.q_width(), m.heads);
    let cascade = !s.levels.is_empty();
    let first = s.decode.as_ref().map_or(0, |d| d.table.num_seqs());
    // The decode rows' own pages: with cascade levels, beside the first level's shared pass
    // (which at 64 requests fills half the GPU), since neither reads what the other writes;
    // where the plan folds that level (`Level::folded`), folding in its `pieces` parts (then
    // true: the level needs no merge; a refusal, which the plan foresees, is an error).
    let decode_rows = |a: &mut Activations, beside: bool, fold: Option<usize>| -> Result<bool> {
        let Some(d) = &s.decode else {
            return Ok(false);
        };
        let q = a.q.slice(..first * qw);
        let inputs = attention_inputs(m, shape, layer(), q, d.table.page_table());
        let mut out = a.attn.slice_mut(..first * qw);
        let mut lse_rows = a.lse.slice_mut(..first * hq);
        let (ws, slots) = (&mut a.decode_ws, &d.slot_indptr);
        if let Some(pieces) = fold {
            let parts = PartialState {
                o: a.part_o.slice(..pieces * first * qw),
                lse: a.part_lse.slice(..pieces * first * hq),
            };
            let lse: Option<&mut dyn DevicePtrMut<f32>> = cascade.then_some(&mut lse_rows);
            let folded = decode::decode_attention_folding(
                gpu, &inputs, ws, &mut out, lse, slots, &parts, pieces,
            )?;
            if !folded {
                // The plan folds a level only where `decode::folds` says the call will: a
                // refusal is a plan that disagrees with the kernel, not a slower path to take.
                return Err(kernels::Error::InvalidArgument {
                    kernel: "decode_attention_folding",
                    message: "the step's plan folds its first level, but the decode refused".into(),
                });
            }
            return Ok(true);
        }
        let lse: Option<&mut dyn DevicePtrMut<f32>> = cascade.then_some(&mut lse_rows);
        if beside {
            decode::decode_attention_beside(gpu, &inputs, ws, &mut out, lse, slots)?;
        } else {
            decode::decode_attention(gpu, &inputs, ws, &mut out, lse)?;
        }
        Ok(false)
    };
    if !cascade {
        decode_rows(a, false, None)?;
    }
    if let Some(p) = &s.prefill {
        let inputs = attention_inputs(
            m,
            shape,
            layer(),
            a.q.slice(first * qw..t * qw),
            p.table.page_table(),
        );
        let queries = PrefillQueries {
            indptr: p.q_indptr.slice(..),
            max_len: p.max_q,
        };
        let mut out = a.attn.slice_mut(first * qw..t * qw);
        let mut lse = a.lse.slice_mut(first * hq..t * hq);
        let lse: Option<&mut dyn DevicePtrMut<f32>> = cascade.then_some(&mut lse);
        prefill::prefill_attention(gpu, &inputs, &queries, true, &mut out, lse)?;
    }
    for (i, level) in s.levels.iter().enumerate() {
        let (n, pieces) = (level.rows.len(), level.pieces);
        let q = match level.in_place {
            Some(first) => a.q.slice(first * qw..(first + n) * qw),
            None => {
                gather::gather_rows(gpu, &a.q, t, &level.rows, &mut a.part_q, qw)?;
                a.part_q.slice(..n * qw)
            }
        };
        let g = &level.groups;
        let inputs = attention_inputs(m, shape, layer(), q, g.table.page_table());
        let queries = PrefillQueries {
            indptr: g.q_indptr.slice(..),
            max_len: g.max_q,
        };
        // Started as the kernel before it ends (RoPE's K/V store, the causal prefill, the
        // gather, the last level's merge, or the decode that folded the first level): before
        // waiting for it the call reads only its page table, indptr and K/V entries, which no
        // kernel of the step writes (the store writes only new tokens' slots, which no level
        // reads: the plan's property test).
        let lse: &mut dyn DevicePtrMut<f32> = &mut a.part_lse;
        let out = &mut a.part_o;
        prefill::prefill_attention_pieces(gpu, &inputs, &queries, pieces, true, out, lse)?;
        // A folded level's rows are the decode rows, in order: piece p's state of decode row r
        // is the pass's row p x n + r, as the decode folds it.
        let fold = level.folded.then_some(pieces);
        if i == 0 && decode_rows(a, true, fold)? {
            continue;
        }
        let parts = PartialState {
            o: a.part_o.slice(..pieces * n * qw),
            lse: a.part_lse.slice(..pieces * n * hq),
        };
        let (mut out, mut lse) = (a.attn.slice_mut(..t * qw), a.lse.slice_mut(..t * hq));
        let d = m.head_dim;
        merge::merge_pieces_into(gpu, &mut out, &mut lse, &parts, pieces, &level.rows, hq, d)?;
    }
    Ok(())
}

fn attention_inputs<'a, C: CacheRead>(
    m: &Dims,
    cache: CacheShape,
    (k_cache, v_cache): (C, C),
    q: CudaView<'a, bf16>,
    table: PageTable<'a>,
) -> AttentionInputs<'a, C> {
    AttentionInputs {
        q,
        k_cache,
        v_cache,
        cache,
        table,
        num_q_heads: m.heads,
        sm_scale: 1.0 / (m.head_dim as f32).sqrt(),
    }
}
