//! From the fused QKV projection to attention's inputs: q/k RMSNorm, rotary embedding, and the
//! store of the new K/V into their pages, in one kernel.
//!
//! Writing K/V straight into the paged cache is what vLLM's `reshape_and_cache` does; here it
//! is fused with the rotation so the new keys are read and written once. Attention then finds
//! the new tokens in the cache like any cached token.
//!
//! The same rotation moves cached K/V: [`copy_kv_rotated`] copies a span of tokens to other
//! pages and turns their keys by a position shift (the chunk API's independent mode).

use cudarc::driver::{CudaView, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::paged::{CacheShape, CacheWrite, cache_scales};
use crate::source::Source;

/// Per-token inputs and the model's constants.
#[derive(Debug)]
pub struct RopeStore<'a> {
    /// `i32[T]`: each token's position in its sequence.
    pub positions: CudaView<'a, i32>,
    /// `i32[T, 2]`: each token's slot as (page id, offset in the page). A negative page id (a
    /// padding token) stores nothing.
    pub slots: CudaView<'a, i32>,
    /// Qwen3's per-head RMSNorm weights `bf16[head_dim]`, `None` for Llama/Qwen2.
    pub q_norm: Option<CudaView<'a, bf16>>,
    pub k_norm: Option<CudaView<'a, bf16>>,
    pub num_q_heads: usize,
    /// `f32[head_dim / 2]`: the model's RoPE frequencies (scaling applied).
    pub inv_freq: CudaView<'a, f32>,
    /// What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    pub attention_factor: f32,
    pub norm_eps: f32,
}

const K: &str = "qk_norm_rope_store";

/// `qkv: bf16[T, (Hq + 2 Hkv) * D]` -> `q_out: bf16[T, Hq, D]` (normalised and rotated), and
/// the rotated k and plain v of every token stored at its slot in `k_cache` / `v_cache`.
pub fn qk_norm_rope_store(
    gpu: &Gpu,
    qkv: &impl DevicePtr<bf16>,
    args: &RopeStore<'_>,
    cache: CacheShape,
    q_out: &mut impl DevicePtrMut<bf16>,
    k_cache: &mut impl CacheWrite,
    v_cache: &mut impl CacheWrite,
) -> Result<()> {
    cache.check(K, k_cache.elements(), v_cache.elements())?;
    let (k_scale, v_scale, fp8) = cache_scales(K, k_cache.fp8_scale(), v_cache.fp8_scale())?;
    let (t, d, hq, hkv) = (
        args.positions.len(),
        cache.head_dim,
        args.num_q_heads,
        cache.num_kv_heads,
    );
    if hq == 0 {
        return Err(check::invalid(K, "no q heads"));
    }
    let heads = hq + 2 * hkv;
    check::at_least(K, "qkv", qkv.len(), t * heads * d)?;
    check::at_least(K, "slots", args.slots.len(), 2 * t)?;
    check::at_least(K, "q_out", q_out.len(), t * hq * d)?;
    for norm in [&args.q_norm, &args.k_norm].into_iter().flatten() {
        check::at_least(K, "norm weight", norm.len(), d)?;
    }
    check::at_least(K, "inv_freq", args.inv_freq.len(), d / 2)?;
    if t == 0 {
        return Ok(());
    }
    let f = gpu.function(
        Source::RopeStore,
        match (d, fp8) {
            (32, false) => "qk_norm_rope_store_d32",
            (64, false) => "qk_norm_rope_store_d64",
            (_, false) => "qk_norm_rope_store_d128",
            (32, true) => "qk_norm_rope_store_fp8_d32",
            (64, true) => "qk_norm_rope_store_fp8_d64",
            (_, true) => "qk_norm_rope_store_fp8_d128",
        },
    )?;
    let ptrs = [
        gpu.ptr(qkv),
        gpu.ptr_mut(q_out),
        k_cache.address_mut(gpu),
        v_cache.address_mut(gpu),
        gpu.ptr(&args.positions),
        gpu.ptr(&args.slots),
        args.q_norm.as_ref().map_or(0, |w| gpu.ptr(w)),
        args.k_norm.as_ref().map_or(0, |w| gpu.ptr(w)),
    ];
    let inv_freq = gpu.ptr(&args.inv_freq);
    let ints = [
        check::int(K, "num_q_heads", hq)?,
        check::int(K, "num_kv_heads", hkv)?,
        check::int(K, "page_size", cache.page_size)?,
        check::int(K, "num_pages", cache.num_pages)?,
    ];
    const WARPS: usize = 4;
    let mut launch = gpu.stream().launch_builder(&f);
    for p in &ptrs {
        launch.arg(p);
    }
    for i in &ints {
        launch.arg(i);
    }
    launch
        .arg(&args.norm_eps)
        .arg(&inv_freq)
        .arg(&args.attention_factor)
        .arg(&k_scale)
        .arg(&v_scale);
    let blocks = (t as u32, heads.div_ceil(WARPS) as u32, 1);
    unsafe { launch.launch(grid(blocks, (WARPS * 32) as u32)) }.during(K)?;
    Ok(())
}

const COPY: &str = "copy_kv_rotated";

/// Copies the K/V of `tokens` tokens of one layer from `src_slots` to `dst_slots` (`i32[tokens,
/// 2]`, (page id, offset) as in [`RopeStore::slots`]), turning every key by `shift` positions:
/// K/V computed at positions `0..n` becomes that of the same tokens at `shift..shift + n`
/// (RoPE rotations compose; `inv_freq` is the model's `f32[head_dim / 2]` table). The two slot
/// sets must not share a page; slots outside the cache copy nothing.
#[allow(clippy::too_many_arguments)]
pub fn copy_kv_rotated(
    gpu: &Gpu,
    src_slots: &impl DevicePtr<i32>,
    dst_slots: &impl DevicePtr<i32>,
    tokens: usize,
    shift: i64,
    inv_freq: &impl DevicePtr<f32>,
    cache: CacheShape,
    k_cache: &mut impl CacheWrite,
    v_cache: &mut impl CacheWrite,
) -> Result<()> {
    cache.check(COPY, k_cache.elements(), v_cache.elements())?;
    let (k_scale, v_scale, fp8) = cache_scales(COPY, k_cache.fp8_scale(), v_cache.fp8_scale())?;
    check::at_least(COPY, "src_slots", src_slots.len(), 2 * tokens)?;
    check::at_least(COPY, "dst_slots", dst_slots.len(), 2 * tokens)?;
    check::at_least(COPY, "inv_freq", inv_freq.len(), cache.head_dim / 2)?;
    // The angle is computed in f32 from the shift, as the forward pass does from positions.
    if shift.unsigned_abs() > 1 << 24 {
        return Err(check::invalid(
            COPY,
            format!("shift {shift} is beyond the positions f32 holds exactly (2^24)"),
        ));
    }
    if tokens == 0 {
        return Ok(());
    }
    let f = gpu.function(
        Source::RopeStore,
        match (cache.head_dim, fp8) {
            (32, false) => "copy_kv_rotated_d32",
            (64, false) => "copy_kv_rotated_d64",
            (_, false) => "copy_kv_rotated_d128",
            (32, true) => "copy_kv_rotated_fp8_d32",
            (64, true) => "copy_kv_rotated_fp8_d64",
            (_, true) => "copy_kv_rotated_fp8_d128",
        },
    )?;
    let ptrs = [
        k_cache.address_mut(gpu),
        v_cache.address_mut(gpu),
        gpu.ptr(src_slots),
        gpu.ptr(dst_slots),
        gpu.ptr(inv_freq),
    ];
    let ints = [
        check::int(COPY, "num_kv_heads", cache.num_kv_heads)?,
        check::int(COPY, "page_size", cache.page_size)?,
        check::int(COPY, "num_pages", cache.num_pages)?,
    ];
    let shift = shift as f32;
    const WARPS: usize = 4;
    let mut launch = gpu.stream().launch_builder(&f);
    for p in &ptrs {
        launch.arg(p);
    }
    for i in &ints {
        launch.arg(i);
    }
    launch.arg(&shift).arg(&k_scale).arg(&v_scale);
    let blocks = (
        tokens as u32,
        (2 * cache.num_kv_heads).div_ceil(WARPS) as u32,
        1,
    );
    unsafe { launch.launch(grid(blocks, (WARPS * 32) as u32)) }.during(COPY)?;
    Ok(())
}
