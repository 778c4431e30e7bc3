// KV tiles over a page table, shared by the prefill kernels (prefill_attention.cu and, on
// Hopper, prefill_hopper.cu and prefill_hopper_ws.cu).
//
// How the KV of a sequence is described (FlashInfer's page table with a length per entry):
//   entries kv_indptr[s] .. kv_indptr[s+1] of kv_page_ids / kv_page_lens; entry e holds
//   kv_page_lens[e] tokens at the start of page kv_page_ids[e]. Token k of the sequence
//   ("logical index" k) is the k-th valid token walking the entries in order. Segments that end
//   in a partly filled page are just entries with a short length.
// A kernel walks "slot space": every entry contributes page_size slots, empty slots are skipped
// by the mask. A tile of TILE slots therefore covers several small pages or part of a big one,
// and page_size must be a power of two >= 16.

// One tile's slots: where each slot's K/V row lives in the cache and which token it holds.
template <int TILE>
struct SlotTable {
    int logical[TILE];  // logical index of each slot, -1 if the slot is empty
    int row[TILE];      // cache row of each slot ((page * Hkv + kv_head) * page_size + offset)
    int start;          // logical index at which the tile begins
};

struct SlotWalker {
    // Written only by threads 0..TILE-1, which walk the tiles in order and agree on `base`.
    int base;  // logical index of the first token of the next tile's first entry
};

// This thread's slot of a tile, as its table will hold it.
struct Slot {
    int logical, row;
    int start;  // the tile's first logical index
};

// Reads this thread's slot of tile `j` from the page table (threads 0..TILE-1, one slot each;
// tiles in order: it advances `w`).
template <int TILE>
__device__ __forceinline__ Slot find_slot(int j, SlotWalker& w, const int* page_ids,
                                          const int* page_lens, int num_entries, int page_size,
                                          int page_shift, int num_pages, int num_kv_heads,
                                          int kv_head) {
    // Page sizes and TILE are powers of two: shifts instead of divisions.
    constexpr int TILE_SHIFT = TILE == 128 ? 7 : TILE == 64 ? 6 : TILE == 32 ? 5 : 4;
    static_assert((1 << TILE_SHIFT) == TILE, "TILE is a power of two from 16 to 128");
    const int c = threadIdx.x;
    const bool big = page_shift >= TILE_SHIFT;
    const int tiles_per_entry = big ? 1 << (page_shift - TILE_SHIFT) : 1;
    const int entries_per_tile = big ? 1 : 1 << (TILE_SHIFT - page_shift);
    const int first = big ? j >> (page_shift - TILE_SHIFT) : j * entries_per_tile;
    const int sub = big ? j & (tiles_per_entry - 1) : 0;
    const int i = big ? 0 : c >> page_shift;
    const int offset = big ? sub * TILE + c : c & (page_size - 1);

    // Logical start of this slot's entry: the running base plus the entries before it here.
    int start = w.base, advance = 0;
    for (int k = 0; k < entries_per_tile; ++k) {
        const int e = first + k;
        const int len = e < num_entries ? min(max(page_lens[e], 0), page_size) : 0;
        if (k < i) start += len;
        advance += len;
    }
    const int e = first + i;
    int logical = -1, row = -1;
    if (e < num_entries) {
        const int len = min(max(page_lens[e], 0), page_size);
        const int page = page_ids[e];
        if (offset < len && page >= 0 && page < num_pages) {
            logical = start + offset;
            row = (page * num_kv_heads + kv_head) * page_size + offset;
        }
    }
    // The tile's first logical index: a big page's later tiles start `sub` tiles into it, or
    // where its tokens end when the page is filled only partly (no later slot holds less).
    const int tile_start = w.base + (big ? min(sub * TILE, advance) : 0);
    const Slot slot{logical, row, tile_start};
    if (!big || sub == tiles_per_entry - 1) w.base += advance;
    return slot;
}

// Writes this thread's slot into the table (thread 0 also the tile's start).
template <int TILE>
__device__ __forceinline__ void write_slot(SlotTable<TILE>& t, const Slot& slot) {
    const int c = threadIdx.x;
    t.logical[c] = slot.logical;
    t.row[c] = slot.row;
    if (c == 0) t.start = slot.start;
}

// Fills the slot table of tile `j` (threads 0..TILE-1, one slot each; tiles in order).
template <int TILE>
__device__ __forceinline__ void describe_tile(SlotTable<TILE>& t, int j, SlotWalker& w,
                                              const int* page_ids, const int* page_lens,
                                              int num_entries, int page_size, int page_shift,
                                              int num_pages, int num_kv_heads, int kv_head) {
    write_slot(t, find_slot<TILE>(j, w, page_ids, page_lens, num_entries, page_size, page_shift,
                                  num_pages, num_kv_heads, kv_head));
}

// How many TILE-slot tiles cover a sequence's `num_entries` page-table entries.
template <int TILE>
__device__ __forceinline__ int count_tiles(int num_entries, int page_size) {
    return page_size >= TILE ? num_entries * (page_size / TILE)
                             : (num_entries + TILE / page_size - 1) / (TILE / page_size);
}

// The sequence's total KV tokens (the sum of its entries' lengths), which places its queries at
// the end: summed by threads 0..threads-1, which meet at `sync` and all get it. `scratch` holds
// one int per warp.
template <class Sync>
__device__ __forceinline__ int sequence_kv_len(const int* page_lens, int num_entries,
                                               int page_size, int* scratch, int threads,
                                               Sync sync) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int mine = 0;
    for (int e = threadIdx.x; e < num_entries; e += threads)
        mine += min(max(page_lens[e], 0), page_size);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(FULL_MASK, mine, o);
    if (lane == 0) scratch[warp] = mine;
    sync();
    int kv_len = 0;
    for (int w = 0; w < threads / 32; ++w) kv_len += scratch[w];
    return kv_len;
}

// One sequence's entries of the page table and its total KV tokens (which place its queries at
// the end).
struct SequencePages {
    const int* page_ids;
    const int* page_lens;
    int num_entries;
    int kv_len;
};

// The pages of sequence `seq`, read by threads 0..threads-1 (by default the whole block), which
// meet at `sync` once; `scratch` holds one int per warp.
template <class Sync>
__device__ __forceinline__ SequencePages sequence_pages(const int* kv_indptr,
                                                        const int* kv_page_ids,
                                                        const int* kv_page_lens, int seq,
                                                        int page_size, int* scratch, int threads,
                                                        Sync sync) {
    const int e0 = kv_indptr[seq];
    SequencePages p{kv_page_ids + e0, kv_page_lens + e0, kv_indptr[seq + 1] - e0, 0};
    p.kv_len = sequence_kv_len(p.page_lens, p.num_entries, page_size, scratch, threads, sync);
    return p;
}

__device__ __forceinline__ SequencePages sequence_pages(const int* kv_indptr,
                                                        const int* kv_page_ids,
                                                        const int* kv_page_lens, int seq,
                                                        int page_size, int* scratch) {
    return sequence_pages(kv_indptr, kv_page_ids, kv_page_lens, seq, page_size, scratch,
                          (int)blockDim.x, [] { __syncthreads(); });
}

// A GQA group of q heads (those of one KV head) as a divisor: row r of a block's folded rows is
// head r % group of token r / group. The Hopper kernels split rows by a multiply, as compilers
// divide by a constant: with l = ceil(log2 size) and m = floor(2^32 (2^l - size) / size) + 1,
// t = the high word of x m, x / size = (t + (x - t) / 2) / 2^(l - 1) for every 32-bit x
// (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994; the
// halving is skipped for a size of 1). A few instructions, where a division by a value known
// only at run time takes about twenty: the persistent kernel's consumers split two dozen rows
// an item, and those divisions were 3-7% of a short prompt's time.
struct Group {
    int size;
    u32 magic;       // m
    u32 halve, shift;  // min(l, 1), max(l - 1, 0)
};

__device__ __forceinline__ Group make_group(int size) {
    const u32 l = 32 - __clz(size - 1);
    const u64 m = ((1ull << 32) * ((1ull << l) - (u64)size)) / (u64)size + 1;
    return {size, (u32)m, min(l, 1u), l > 0 ? l - 1 : 0u};
}

__device__ __forceinline__ int operator/(int x, Group g) {
    const u32 t = __umulhi((u32)x, g.magic);
    return (int)((t + (((u32)x - t) >> g.halve)) >> g.shift);
}

__device__ __forceinline__ int operator%(int x, Group g) { return x - (x / g) * g.size; }

// The last KV index that block row `r` (query token r / group of the sequence's q_len) sees:
// causally its own position after the sequence's kv_len - q_len earlier tokens, else every
// token; -1 for a row past the last (`rows`), which then sees nothing. `group`: an int, or a
// Group.
template <class G>
__device__ __forceinline__ int last_visible(int r, int rows, G group, int causal, int kv_len,
                                            int q_len) {
    if (r >= rows) return -1;
    return causal ? kv_len - q_len + r / group : 0x7fffffff;
}
