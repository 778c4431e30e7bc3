//! The paged KV cache as the attention kernels see it: the cache's shape, and the page table
//! that says where each sequence's tokens are.
//!
//! A layer's cache is two buffers, K and V, each `[num_pages][num_kv_heads][page_size]
//! [head_dim]` ("HND", as in the CPU store): inside a page, one head's tokens are contiguous rows,
//! so a kernel streams a page of one head as one block of memory. Elements are bf16, or FP8
//! E4M3 codes with a scale per buffer ([`Fp8Cache`]; vLLM's `kv_cache_dtype="fp8"`): half the
//! bytes, turned back into numbers in registers as the kernels read them.
//!
//! A sequence's KV is a list of *page entries* (FlashInfer's layout, plus a length per entry):
//! `page_ids[indptr[s]..indptr[s+1]]` with `page_lens` of valid tokens for each entry. The
//! sequence's token k is the k-th valid token walking its entries in order. Shared segments
//! that end in a partly filled page (a 50-token system prompt in 16-token pages) are entries
//! with a short length, so a sequence can be several segments without copying anything.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::check;
use crate::device::Gpu;
use crate::error::Result;

/// One layer's K (or V) buffer as a kernel reads it: bf16 elements (any bf16 buffer), or an
/// [`Fp8Cache`].
pub trait CacheRead {
    /// Elements (one per byte for FP8).
    fn elements(&self) -> usize;
    /// The device address, for a launch.
    fn address(&self, gpu: &Gpu) -> u64;
    /// The scale of FP8 codes; `None` for bf16.
    fn fp8_scale(&self) -> Option<f32>;
}

impl<T: DevicePtr<bf16>> CacheRead for T {
    fn elements(&self) -> usize {
        self.len()
    }

    fn address(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(self)
    }

    fn fp8_scale(&self) -> Option<f32> {
        None
    }
}

/// FP8 E4M3 codes (the "fn" variant: saturating at ±448, no infinities), each element read as
/// `code * scale`; stored as `round(value / scale)`.
#[derive(Debug)]
pub struct Fp8Cache<'a> {
    pub codes: CudaView<'a, u8>,
    pub scale: f32,
}

impl CacheRead for Fp8Cache<'_> {
    fn elements(&self) -> usize {
        self.codes.len()
    }

    fn address(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.codes)
    }

    fn fp8_scale(&self) -> Option<f32> {
        Some(self.scale)
    }
}

/// One layer's K (or V) buffer as a kernel writes it (see [`CacheRead`]).
pub trait CacheWrite {
    fn elements(&self) -> usize;
    fn address_mut(&mut self, gpu: &Gpu) -> u64;
    fn fp8_scale(&self) -> Option<f32>;
}

impl<T: DevicePtrMut<bf16>> CacheWrite for T {
    fn elements(&self) -> usize {
        self.len()
    }

    fn address_mut(&mut self, gpu: &Gpu) -> u64 {
        gpu.ptr_mut(self)
    }

    fn fp8_scale(&self) -> Option<f32> {
        None
    }
}

/// [`Fp8Cache`], writable.
#[derive(Debug)]
pub struct Fp8CacheMut<'a> {
    pub codes: CudaViewMut<'a, u8>,
    pub scale: f32,
}

impl CacheWrite for Fp8CacheMut<'_> {
    fn elements(&self) -> usize {
        self.codes.len()
    }

    fn address_mut(&mut self, gpu: &Gpu) -> u64 {
        gpu.ptr_mut(&mut self.codes)
    }

    fn fp8_scale(&self) -> Option<f32> {
        Some(self.scale)
    }
}

/// The FP8 kernels' scales of a K and a V buffer: `(k_scale, v_scale, fp8)`; 1 for bf16. The
/// two buffers must hold the same kind.
pub(crate) fn cache_scales(
    kernel: &'static str,
    k: Option<f32>,
    v: Option<f32>,
) -> Result<(f32, f32, bool)> {
    match (k, v) {
        (None, None) => Ok((1.0, 1.0, false)),
        (Some(k), Some(v)) if k > 0.0 && v > 0.0 && k.is_finite() && v.is_finite() => {
            Ok((k, v, true))
        }
        (Some(_), Some(_)) => Err(check::invalid(kernel, "FP8 scales must be positive")),
        _ => Err(check::invalid(kernel, "K and V caches of different kinds")),
    }
}

/// The shape of one layer's K (or V) buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    pub num_pages: usize,
    pub num_kv_heads: usize,
    pub page_size: usize,
    pub head_dim: usize,
}

impl CacheShape {
    /// Elements in one of the two buffers.
    pub fn elements(&self) -> usize {
        self.num_pages * self.num_kv_heads * self.page_size * self.head_dim
    }

    /// Element offset of the row of `(page, kv_head, offset)`.
    pub fn row_offset(&self, page: usize, kv_head: usize, offset: usize) -> usize {
        ((page * self.num_kv_heads + kv_head) * self.page_size + offset) * self.head_dim
    }

    /// Checks the buffers' sizes and that row indices fit the kernels' 32-bit arithmetic.
    pub(crate) fn check(&self, kernel: &'static str, k_len: usize, v_len: usize) -> Result<()> {
        check::head_dim(kernel, self.head_dim)?;
        if self.num_kv_heads == 0 || self.page_size == 0 {
            return Err(check::invalid(kernel, "empty cache shape"));
        }
        check::at_least(kernel, "K cache", k_len, self.elements())?;
        check::at_least(kernel, "V cache", v_len, self.elements())?;
        check::int(
            kernel,
            "cache rows",
            self.num_pages * self.num_kv_heads * self.page_size,
        )?;
        Ok(())
    }

    /// The attention kernels walk pages in power-of-two slot tiles: page_size must be a power
    /// of two, at least 16. Returns log2(page_size).
    pub(crate) fn page_shift(&self, kernel: &'static str) -> Result<i32> {
        if !self.page_size.is_power_of_two() || self.page_size < 16 {
            return Err(check::invalid(
                kernel,
                format!("page_size {} must be a power of two >= 16", self.page_size),
            ));
        }
        Ok(self.page_size.trailing_zeros() as i32)
    }
}

/// Device arrays of a page table (see the module docs): `indptr: i32[num_seqs + 1]`,
/// `page_ids` and `page_lens: i32[indptr[num_seqs]]`.
#[derive(Debug)]
pub struct PageTable<'a> {
    pub indptr: CudaView<'a, i32>,
    pub page_ids: CudaView<'a, i32>,
    pub page_lens: CudaView<'a, i32>,
    /// For the decode kernel, `i32[num_seqs + 1]`: prefix sums of each sequence's slot count
    /// (up to its last valid slot) rounded up to 32 ([`slot_indptr`]). The kernel shares the
    /// batch's KV out evenly among its blocks along these; the prefill kernel does not read it.
    pub slot_indptr: Option<CudaView<'a, i32>>,
}

impl PageTable<'_> {
    pub fn num_seqs(&self) -> usize {
        self.indptr.len().saturating_sub(1)
    }

    pub(crate) fn check(&self, kernel: &'static str) -> Result<()> {
        if self.indptr.is_empty() {
            return Err(check::invalid(kernel, "indptr needs num_seqs + 1 entries"));
        }
        if self.page_ids.len() != self.page_lens.len() {
            return Err(check::invalid(
                kernel,
                "page_ids and page_lens must have the same length",
            ));
        }
        Ok(())
    }
}

/// A page table built on the host, ready to upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPageTable {
    pub page_size: usize,
    pub indptr: Vec<i32>,
    pub page_ids: Vec<i32>,
    pub page_lens: Vec<i32>,
}

impl HostPageTable {
    pub fn new(page_size: usize) -> Self {
        Self {
            page_size,
            indptr: vec![0],
            page_ids: Vec::new(),
            page_lens: Vec::new(),
        }
    }

    /// Appends a sequence given as `(page id, valid tokens)` entries, in KV order.
    pub fn push_seq(&mut self, entries: impl IntoIterator<Item = (u32, usize)>) {
        for (page, len) in entries {
            self.page_ids.push(page as i32);
            self.page_lens.push(len as i32);
        }
        self.indptr.push(self.page_ids.len() as i32);
    }

    pub fn num_seqs(&self) -> usize {
        self.indptr.len() - 1
    }

    /// Tokens of sequence `s`.
    pub fn kv_len(&self, s: usize) -> usize {
        let (a, b) = (self.indptr[s] as usize, self.indptr[s + 1] as usize);
        self.page_lens[a..b].iter().map(|&l| l as usize).sum()
    }

    /// The decode kernel's `slot_indptr` for this table.
    pub fn slot_indptr(&self) -> Vec<i32> {
        slot_indptr(&self.indptr, &self.page_lens, self.page_size)
    }

    pub fn max_kv_len(&self) -> usize {
        (0..self.num_seqs())
            .map(|s| self.kv_len(s))
            .max()
            .unwrap_or(0)
    }

    pub fn upload(&self, gpu: &Gpu) -> Result<DevicePageTable> {
        // A zero-length allocation is avoided: an empty table still gets one (unread) entry.
        let pad = |v: &Vec<i32>| if v.is_empty() { vec![0] } else { v.clone() };
        Ok(DevicePageTable {
            indptr: gpu.upload(&self.indptr)?,
            page_ids: gpu.upload(&pad(&self.page_ids))?,
            page_lens: gpu.upload(&pad(&self.page_lens))?,
            slot_indptr: gpu.upload(&self.slot_indptr())?,
            entries: self.page_ids.len(),
        })
    }
}

/// An uploaded page table; [`DevicePageTable::view`] gives what the kernels take.
#[derive(Debug)]
pub struct DevicePageTable {
    pub indptr: CudaSlice<i32>,
    pub page_ids: CudaSlice<i32>,
    pub page_lens: CudaSlice<i32>,
    pub slot_indptr: CudaSlice<i32>,
    entries: usize,
}

impl DevicePageTable {
    pub fn view(&self) -> PageTable<'_> {
        PageTable {
            indptr: self.indptr.as_view(),
            page_ids: self.page_ids.slice(..self.entries),
            page_lens: self.page_lens.slice(..self.entries),
            slot_indptr: Some(self.slot_indptr.as_view()),
        }
    }
}

/// What each sequence's slot count is rounded up to in [`slot_indptr`], and the decode kernel's
/// ranges of slots with it (its `SLOT_ALIGN`).
pub const SLOT_ALIGN: usize = 32;

/// Prefix sums of each sequence's slot count rounded up to 32: its entries walked in slot
/// space (`page_size` slots an entry) up to the last valid slot of its last entry. The decode
/// kernel lays the sequences' slots end to end (once per q-head group) and gives each of its
/// blocks an equal range of that line.
pub fn slot_indptr(indptr: &[i32], page_lens: &[i32], page_size: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(indptr.len());
    out.push(0);
    for w in indptr.windows(2) {
        let slots = seq_slots(&page_lens[w[0] as usize..w[1] as usize], page_size);
        out.push(out.last().expect("starts with 0") + slots as i32);
    }
    out
}

/// One sequence's term of [`slot_indptr`]: its entries' `page_lens` walked in slot space up
/// to the last valid slot, rounded up to 32.
pub fn seq_slots(page_lens: &[i32], page_size: usize) -> usize {
    let slots = match page_lens {
        [] => 0,
        [.., last] => (page_lens.len() - 1) * page_size + (*last as usize).min(page_size),
    };
    slots.next_multiple_of(SLOT_ALIGN)
}

/// What both attention kernels read: queries, one layer's cache (bf16, or [`Fp8Cache`]), and
/// the page table.
#[derive(Debug)]
pub struct AttentionInputs<'a, C: CacheRead = CudaView<'a, bf16>> {
    /// `bf16[rows, num_q_heads, head_dim]`: one row per query token.
    pub q: CudaView<'a, bf16>,
    pub k_cache: C,
    pub v_cache: C,
    pub cache: CacheShape,
    pub table: PageTable<'a>,
    pub num_q_heads: usize,
    /// Usually 1 / sqrt(head_dim).
    pub sm_scale: f32,
}

impl<C: CacheRead> AttentionInputs<'_, C> {
    /// Query heads per KV head (GQA group size).
    pub fn group(&self) -> usize {
        self.num_q_heads / self.cache.num_kv_heads
    }

    /// `(k_scale, v_scale, fp8)` for the kernels.
    pub(crate) fn scales(&self, kernel: &'static str) -> Result<(f32, f32, bool)> {
        cache_scales(kernel, self.k_cache.fp8_scale(), self.v_cache.fp8_scale())
    }

    /// Checks everything but the number of query rows; returns log2(page_size).
    pub(crate) fn check(&self, kernel: &'static str, gpu: &Gpu) -> Result<i32> {
        self.cache
            .check(kernel, self.k_cache.elements(), self.v_cache.elements())?;
        let shift = self.cache.page_shift(kernel)?;
        self.table.check(kernel)?;
        if self.num_q_heads == 0 || !self.num_q_heads.is_multiple_of(self.cache.num_kv_heads) {
            return Err(check::invalid(
                kernel,
                format!(
                    "{} q heads cannot share {} KV heads evenly",
                    self.num_q_heads, self.cache.num_kv_heads
                ),
            ));
        }
        check::aligned(kernel, "q", gpu.ptr(&self.q))?;
        check::aligned(kernel, "K cache", self.k_cache.address(gpu))?;
        check::aligned(kernel, "V cache", self.v_cache.address(gpu))?;
        Ok(shift)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_page_table_counts_partial_pages() {
        let mut t = HostPageTable::new(16);
        t.push_seq([(4, 16), (9, 2), (1, 16), (7, 5)]);
        t.push_seq([]);
        t.push_seq([(3, 1)]);
        assert_eq!(t.indptr, vec![0, 4, 4, 5]);
        assert_eq!(t.num_seqs(), 3);
        assert_eq!((t.kv_len(0), t.kv_len(1), t.kv_len(2)), (39, 0, 1));
        assert_eq!(t.max_kv_len(), 39);
    }

    #[test]
    fn slot_indptr_walks_slot_space_to_the_last_valid_slot_rounded_to_32() {
        let mut t = HostPageTable::new(16);
        // Slot space: 3 entries of 16 slots, then 5 valid slots of the 4th: 53 -> 64.
        t.push_seq([(4, 16), (9, 2), (1, 16), (7, 5)]);
        t.push_seq([]);
        t.push_seq([(3, 1)]); // 1 -> 32
        t.push_seq([(5, 16), (6, 16)]); // 32 -> 32
        assert_eq!(t.slot_indptr(), vec![0, 64, 64, 96, 128]);
    }

    #[test]
    fn cache_rows_are_head_major_within_a_page() {
        let shape = CacheShape {
            num_pages: 10,
            num_kv_heads: 2,
            page_size: 16,
            head_dim: 64,
        };
        assert_eq!(shape.row_offset(0, 0, 1), 64);
        assert_eq!(shape.row_offset(0, 1, 0), 16 * 64);
        assert_eq!(shape.row_offset(1, 0, 0), 2 * 16 * 64);
        assert_eq!(shape.elements(), 10 * 2 * 16 * 64);
        assert!(shape.page_shift("t").is_ok());
        let odd = CacheShape {
            page_size: 24,
            ..shape
        };
        assert!(odd.page_shift("t").is_err());
    }
}
