//! Getting a step's inputs to the device in one copy.
//!
//! Every array of a [`StepPlan`] is written into one host buffer of 32-bit words at
//! 32-byte-aligned offsets (a [`Layout`]); the used words go to a pinned buffer and from there to
//! a device buffer of the same layout in one asynchronous copy, and the kernels read views into
//! it. A layout can reserve room for the page arrays ([`pack`]'s `entry_capacity`): then every
//! offset depends only on the number of rows, which is what a captured graph needs, at the cost
//! of copying the unused room along with the page ids that sit after it (or of a second copy,
//! when the room is large).

use kernels::sampling::SampleParams;
use kernels::{CudaEvent, CudaSlice, CudaView, CudaViewMut, Gpu, PinnedHostSlice};

use crate::forward::{DecodePart, LevelPart, PrefillPart, StepInputs, TableViews};
use phase6_cuda_plan::{Prefill, StepPlan, Table};

/// Words between two used ranges that are still copied rather than starting a second copy: a
/// copy call costs the host ~10 us (measured on the H100's host, where every microsecond
/// before the graph launch leaves the GPU idle), 64 KiB more over PCIe ~3 us of the copy
/// engine. A decode graph's reserved page room (20 entries a sequence) stays under it.
const MAX_GAP_WORDS: usize = 16 * 1024;

/// `len` words at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    offset: usize,
    len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct TableRegions {
    indptr: Region,
    /// The decode table's `slot_indptr`; prefill tables have none.
    slot_indptr: Option<Region>,
    page_ids: Region,
    page_lens: Region,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PrefillRegions {
    table: TableRegions,
    q_indptr: Region,
    max_q: usize,
}

/// Where a level's arrays are, with what its call needs to know on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LevelRegions {
    /// Its distinct query rows.
    rows: Region,
    pieces: usize,
    /// The first of its rows where they are one run of the step's
    /// (`phase6_cuda_plan::Level::in_place`).
    in_place: Option<usize>,
    /// `phase6_cuda_plan::Level::folded`.
    folded: bool,
    groups: PrefillRegions,
}

/// Where each array of a packed step is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    ids: Region,
    positions: Region,
    slots: Region,
    sample_rows: Region,
    params: Region,
    decode: TableRegions,
    prefill: PrefillRegions,
    levels: Vec<LevelRegions>,
    /// Word ranges that hold data, merged where the gap between them is small.
    copies: Vec<(usize, usize)>,
    /// Words the layout spans, reserved room included.
    span: usize,
}

impl Layout {
    /// Words up to the end of the last data written.
    pub fn end(&self) -> usize {
        self.copies.last().map_or(0, |&(_, end)| end)
    }

    /// Words the layout spans, reserved room included: a staging buffer this large holds any
    /// step packed with the same layout.
    pub fn span(&self) -> usize {
        self.span
    }

    /// The offsets of every array, whatever their content: two layouts with the same
    /// fingerprint can be read through the same captured graph.
    pub fn fingerprint(&self) -> Vec<usize> {
        let mut regions = vec![
            self.ids,
            self.positions,
            self.slots,
            self.sample_rows,
            self.params,
            self.decode.indptr,
        ];
        regions.extend(self.decode.slot_indptr);
        regions.extend([self.decode.page_ids, self.decode.page_lens]);
        regions.iter().map(|r| r.offset).collect()
    }

    pub fn params_region(&self) -> Region {
        self.params
    }
}

/// Appends arrays to a word buffer.
struct Packer<'a> {
    words: &'a mut Vec<u32>,
    used: Vec<(usize, usize)>,
}

impl Packer<'_> {
    /// Writes `values` at the next 8-word boundary, keeping room for `capacity` words if that
    /// is more.
    fn push(&mut self, values: impl IntoIterator<Item = u32>, capacity: usize) -> Region {
        let offset = self.words.len().next_multiple_of(8);
        self.words.resize(offset, 0);
        self.words.extend(values);
        let len = self.words.len() - offset;
        self.words.resize(offset + len.max(capacity), 0);
        if len > 0 {
            self.used.push((offset, offset + len));
        }
        Region { offset, len }
    }

    fn push_i32(&mut self, values: &[i32], capacity: usize) -> Region {
        self.push(values.iter().map(|&v| v as u32), capacity)
    }

    fn prefill(&mut self, p: &Prefill) -> PrefillRegions {
        PrefillRegions {
            q_indptr: self.push_i32(&p.q_indptr, 0),
            table: self.table(&p.table, 0, false),
            max_q: p.max_q,
        }
    }

    fn table(&mut self, t: &Table, entry_capacity: usize, decode: bool) -> TableRegions {
        TableRegions {
            indptr: self.push_i32(&t.indptr, 0),
            slot_indptr: decode.then(|| self.push_i32(&t.slot_indptr, 0)),
            page_lens: self.push_i32(&t.page_lens, entry_capacity),
            page_ids: self.push_i32(&t.page_ids, entry_capacity),
        }
    }
}

/// Packs `plan` into `words` (cleared first). With `entry_capacity`, the decode page arrays
/// come last with that much room each, so the layout of a padded decode step depends only on
/// its number of rows.
pub(crate) fn pack(plan: &StepPlan, entry_capacity: usize, words: &mut Vec<u32>) -> Layout {
    words.clear();
    let mut p = Packer {
        words,
        used: Vec::new(),
    };
    let ids = p.push(plan.ids.iter().copied(), 0);
    let positions = p.push_i32(&plan.positions, 0);
    let slots = p.push_i32(&plan.slots, 0);
    let sample_rows = p.push(plan.sample_rows.iter().copied(), 0);
    let params = p.push(plan.params.iter().flat_map(param_words), 0);
    let prefill = p.prefill(&plan.prefill);
    let levels = plan
        .levels
        .iter()
        .map(|level| LevelRegions {
            rows: p.push(level.rows.iter().copied(), 0),
            pieces: level.pieces,
            in_place: level.in_place(),
            folded: level.folded,
            groups: p.prefill(&level.groups),
        })
        .collect();
    let decode = p.table(&plan.decode, entry_capacity, true);
    let used = p.used;
    let mut copies: Vec<(usize, usize)> = Vec::new();
    for (start, end) in used {
        match copies.last_mut() {
            Some(last) if start - last.1 <= MAX_GAP_WORDS => last.1 = end,
            _ => copies.push((start, end)),
        }
    }
    Layout {
        ids,
        positions,
        slots,
        sample_rows,
        params,
        decode,
        prefill,
        levels,
        copies,
        span: words.len(),
    }
}

/// The 8 words of one [`SampleParams`], as the sampling kernel reads them.
fn param_words(p: &SampleParams) -> [u32; 8] {
    const _: () = assert!(std::mem::size_of::<SampleParams>() == 32);
    // Safety: SampleParams is `repr(C)`, 32 bytes of plain numbers with no implicit padding
    // (its padding word is a field), 8-byte aligned, so it reads as 8 initialised words.
    unsafe { std::mem::transmute_copy(p) }
}

/// A pinned host buffer and a device buffer of the same size, holding packed steps.
pub(crate) struct Staging {
    words: Vec<u32>,
    host: PinnedHostSlice<u32>,
    device: CudaSlice<u32>,
    /// Recorded after the last upload's copies: the host buffer may be rewritten once it ran
    /// (with steps launched ahead, the copy may still wait behind the step before).
    copied: CudaEvent,
}

impl Staging {
    pub fn new(gpu: &Gpu, capacity: usize) -> kernels::Result<Self> {
        Ok(Self {
            words: Vec::with_capacity(capacity),
            host: gpu.pinned(capacity)?,
            device: gpu.zeros(capacity.max(1))?,
            copied: gpu.event()?,
        })
    }

    pub fn capacity(&self) -> usize {
        self.device.len()
    }

    pub fn bytes(&self) -> usize {
        self.capacity() * 4
    }

    /// Packs `plan` into the host words (see [`pack`]).
    pub fn pack(&mut self, plan: &StepPlan, entry_capacity: usize) -> Layout {
        pack(plan, entry_capacity, &mut self.words)
    }

    /// Queues the copy of the packed words to the device, growing both buffers first if they
    /// are too small (which moves them: only for steps that are not replayed from a graph).
    /// Waits first for the previous upload's copies to have run.
    pub fn upload(&mut self, gpu: &Gpu, layout: &Layout) -> kernels::Result<()> {
        self.copied
            .synchronize()
            .map_err(|e| kernels::Error::Driver {
                context: "waiting for the previous upload".into(),
                source: e,
            })?;
        if layout.end() > self.capacity() {
            let capacity = layout.end().next_power_of_two();
            self.host = gpu.pinned(capacity)?;
            self.device = gpu.zeros(capacity)?;
        }
        let host = self
            .host
            .as_mut_slice()
            .map_err(|e| kernels::Error::Driver {
                context: "writing pinned memory".into(),
                source: e,
            })?;
        for &(start, end) in &layout.copies {
            host[start..end].copy_from_slice(&self.words[start..end]);
            gpu.copy_to_device(&host[start..end], &mut self.device.slice_mut(start..end))?;
        }
        gpu.record(&self.copied)
    }

    /// The kernels' views of a step packed with `layout`.
    pub fn inputs(&self, layout: &Layout) -> StepInputs<'_> {
        let table = |t: &TableRegions| TableViews {
            indptr: self.i32s(t.indptr),
            slot_indptr: t.slot_indptr.map(|r| self.i32s(r)),
            page_ids: self.i32s(t.page_ids),
            page_lens: self.i32s(t.page_lens),
        };
        let prefill = |p: &PrefillRegions| PrefillPart {
            table: table(&p.table),
            q_indptr: self.i32s(p.q_indptr),
            max_q: p.max_q,
        };
        let num_decode = layout.decode.indptr.len - 1;
        let num_prefill = layout.prefill.q_indptr.len - 1;
        StepInputs {
            ids: self.words(layout.ids),
            positions: self.i32s(layout.positions),
            slots: self.i32s(layout.slots),
            sample_rows: self.words(layout.sample_rows),
            decode: (num_decode > 0).then(|| DecodePart {
                table: table(&layout.decode),
                slot_indptr: {
                    let r = layout
                        .decode
                        .slot_indptr
                        .expect("a decode table has slot_indptr");
                    let words = &self.words[r.offset..r.offset + r.len];
                    words.iter().map(|&w| w as i32).collect()
                },
            }),
            prefill: (num_prefill > 0).then(|| prefill(&layout.prefill)),
            levels: layout
                .levels
                .iter()
                .map(|level| LevelPart {
                    rows: self.words(level.rows),
                    pieces: level.pieces,
                    in_place: level.in_place,
                    folded: level.folded,
                    groups: prefill(&level.groups),
                })
                .collect(),
        }
    }

    /// The token ids of a step packed with `layout`, to be rewritten on the device.
    pub fn ids_mut(&mut self, layout: &Layout) -> CudaViewMut<'_, u32> {
        let r = layout.ids;
        self.device.slice_mut(r.offset..r.offset + r.len)
    }

    /// The sampling parameters of a step packed with `layout`.
    pub fn params(&self, region: Region) -> CudaView<'_, SampleParams> {
        // Safety: the region holds SampleParams written word by word by `param_words`.
        unsafe { self.words(region).transmute::<SampleParams>(region.len / 8) }
            .expect("8 words per SampleParams")
    }

    fn words(&self, r: Region) -> CudaView<'_, u32> {
        self.device.slice(r.offset..r.offset + r.len)
    }

    fn i32s(&self, r: Region) -> CudaView<'_, i32> {
        // Safety: i32 and u32 have the same size and every bit pattern is valid for both.
        unsafe { self.words(r).transmute::<i32>(r.len) }.expect("same size")
    }
}

#[cfg(test)]
mod tests {
    use phase1::BlockTable;
    use phase2::{ForwardBatch, ForwardSeq, SampleSpec};

    use super::*;
    use phase6_cuda_plan::{KvSplit, Limits};

    fn decode_plan(lens: &[usize]) -> StepPlan {
        let seqs = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| ForwardSeq {
                seq_id: i as u64,
                tokens: vec![7],
                start_pos: n - 1,
                kv: vec![BlockTable::from_pages(
                    (0..n.div_ceil(16) as u32)
                        .map(|p| p + 10 * i as u32)
                        .collect(),
                    n,
                )],
                sample: Some(SampleSpec::greedy()),
            })
            .collect();
        let limits = Limits {
            page_size: 16,
            num_pages: 100,
            vocab_size: 10,
            max_position: 1000,
            max_tokens: 64,
            max_seqs: 16,
            split: KvSplit {
                block_rows: 64,
                blocks_at_once: 264,
                q_per_kv: 2,
                kv_heads: 8,
                min_tokens: 1024,
                decode_beside: false,
                fold_blocks: None,
            },
        };
        StepPlan::new(&ForwardBatch { seqs }, &[], &limits).unwrap()
    }

    #[test]
    fn arrays_are_aligned_and_copied_once_when_compact() {
        let mut words = Vec::new();
        let layout = pack(&decode_plan(&[5, 40, 17]), 0, &mut words);
        assert_eq!(layout.copies.len(), 1);
        assert_eq!(layout.end(), words.len());
        for offset in layout.fingerprint() {
            assert_eq!(offset % 8, 0);
        }
        assert_eq!(&words[layout.ids.offset..][..3], &[7, 7, 7]);
        let lens = layout.decode.page_lens;
        assert_eq!(&words[lens.offset..][..lens.len], &[5, 16, 16, 8, 16, 1]);
        let p = layout.params;
        assert_eq!(p.len, 24);
        // Greedy: temperature 0.0, top_k -1, top_p 1.0.
        assert_eq!(&words[p.offset..][..3], &[0, u32::MAX, 1.0f32.to_bits()]);
    }

    #[test]
    fn padded_decode_layouts_depend_only_on_the_bucket() {
        let mut words = Vec::new();
        let mut a = decode_plan(&[5, 40, 17]);
        let mut b = decode_plan(&[300]);
        a.pad_decode(4);
        b.pad_decode(4);
        let (la, lb) = (pack(&a, 2000, &mut words), pack(&b, 2000, &mut words));
        assert_eq!(la.fingerprint(), lb.fingerprint());
        assert_eq!(la.span(), lb.span());
        assert!(la.end() < la.span(), "room reserved past the data");
        // The page ids sit after the reserved room, which is copied along: one copy.
        assert_eq!(lb.copies.len(), 1);
        let mut wide = decode_plan(&[300]);
        wide.pad_decode(4);
        assert_eq!(pack(&wide, 40_000, &mut words).copies.len(), 2);
        let c = decode_plan(&[5]);
        let lc = pack(&c, 2000, &mut words);
        assert_ne!(
            la.fingerprint(),
            lc.fingerprint(),
            "unpadded: other offsets"
        );
    }
}
