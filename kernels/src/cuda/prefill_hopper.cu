// Paged prefill attention on Hopper (sm_90a): the FA2 kernel of prefill_attention.cu with its
// matrix products moved to warpgroup MMAs (wgmma), after FlashAttention-3 (Shah et al., 2024).
//
// Why another kernel: mma.sync multiplies 16 x 8 tiles from registers, so every product first
// copies its operands out of shared memory with ldmatrix; on an H100 the FA2 kernel reaches
// about a sixth of the ~800 TFLOP/s cuBLAS gets from the tensor cores. wgmma multiplies a 64 x N
// tile whose B operand (and here A too) the tensor cores read from shared memory themselves,
// asynchronously, for a whole warpgroup at once.
//
// Who does what
//   grid = (sequences, KV heads, query tiles), heaviest causal tiles first; block = two
//   warpgroups (256 threads). A block owns 128 rows (query token, q head of this KV head,
//   folded as in the FA2 kernel); warpgroup g owns rows 64g..64g+63.
//   Per 128-slot KV tile j:  S = Q K^T   one m64n128 wgmma chain per warpgroup, Q and K from
//                                        shared memory (K as stored: "K-major");
//                            softmax     in registers, as in the FA2 kernel;
//                            O += P V    P from registers (the score accumulators, repacked to
//                                        bf16: the accumulator layout is mma.sync's), V from
//                                        shared memory read transposed, one m64n128 chain.
//   Tile j's P V is issued together with tile j+1's Q K^T, so the tensor cores work on it
//   while the warps compute tile j+1's softmax (FlashAttention-3's intra-warpgroup overlap).
//   Loads: every thread issues cp.async copies of tile j+1's K and V while tile j is computed,
//   each 16-byte chunk written at its swizzled place (wgmma.cuh), into a ring of two K stages
//   and three V stages (tile j's V is still read during tile j+1). The slot tables
//   (page_tiles.cuh) run two tiles ahead in a ring of three.
//
// One barrier per tile: it publishes tile j's copies (each thread waited for its own and
// fenced them for the tensor cores) and proves every warp is done with the stages and slot
// table that are then refilled (tile j-1's K, tile j-2's V). The same barrier tells whether
// tile j is "dense" (every slot holds the next token), which with a tile wholly in every row's
// past skips the mask.

// The shared pieces (tile shape, copies, products, softmax, output) are hopper_attention.cuh's.
#define HOP_THREADS 256

struct HopperShared {
    bf16 q[HOP_M * HOP_D];  // [2 column blocks][128 rows][64], swizzled
    bf16 k[2][HOP_N * HOP_D];
    bf16 v[3][HOP_N * HOP_D];  // three stages: tile j's V is read during tile j + 1
    SlotTable<HOP_N> tab[3];
    int reduce[HOP_THREADS / 32];
};

// The walk of one block over its sequence's KV tiles, with what every tile needs: where the
// KV is, this thread's rows, and the running softmax state and output.
//
// Tile j's P V is issued in step j + 1, next to tile j + 1's Q K^T: the tensor cores multiply
// while the warps compute tile j + 1's softmax (FlashAttention-3's overlap within a warpgroup).
// P of the tile before waits in registers. The first step has no P V to issue; it is a
// separate instantiation so that neither has a branch around its wgmmas (ptxas serializes
// wgmmas it cannot prove alone with their accumulators).
struct HopperWalk {
    HopperShared& s;
    const bf16* k_cache;
    const bf16* v_cache;
    const int* page_ids;
    const int* page_lens;
    int num_entries, page_size, page_shift, num_pages, num_kv_heads, kv_head, num_tiles;
    int q_index[2];  // the last KV index each of this thread's rows sees (-1: no row)
    int q_lo, q_hi;  // the same for the block's first and last rows
    u32 q_addr;      // this warpgroup's first Q row in shared memory
    float scale;     // sm_scale in log2 units
    SlotWalker walker;
    float o_lo[32], o_hi[32];  // output columns 0..63 and 64..127
    u32 pa[HOP_N / 16][4];         // the previous tile's P
    float m[2], l[2];

    // One tile: false when causality ends the walk before it.
    template <bool FIRST>
    __device__ __forceinline__ bool step(const int j) {
        const int tid = threadIdx.x;
        const int t = j % 3;
        cp_async_wait_all();
        fence_async_shared();
        const int dense = __syncthreads_and(tid >= HOP_N ||
                                            s.tab[t].logical[tid] == s.tab[t].start + tid);
        if (s.tab[t].start > q_hi) return false;  // causal: this tile and all later are future
        float sc[HOP_N / 2];
        issue_step<FIRST>(sc, o_lo, o_hi, pa, q_addr, (u32)__cvta_generic_to_shared(s.k[j & 1]),
                          (u32)__cvta_generic_to_shared(s.v[(j + 2) % 3]));

        // While the tensor cores multiply: the copies of tile j+1, the slot table of tile j+2
        // (whose reads of the page table would otherwise hold up the products' issue).
        if (j + 1 < num_tiles)
            hopper_load_kv<HOP_THREADS>(s.k[(j + 1) & 1], s.v[(j + 1) % 3],
                                        s.tab[(j + 1) % 3].row, k_cache, v_cache);
        cp_async_commit();
        if (j + 2 < num_tiles && tid < HOP_N)
            describe_tile<HOP_N>(s.tab[(j + 2) % 3], j + 2, walker, page_ids, page_lens,
                                 num_entries, page_size, page_shift, num_pages, num_kv_heads,
                                 kv_head);
        wgmma_wait<FIRST ? 0 : 1>();  // the scores; P V may still run
        fence_registers(sc);

        mask_tile(sc, s.tab[t], dense, q_lo, q_index);
        float alpha[2];
        online_softmax(sc, m, l, alpha, scale);

        settle_step(o_lo, o_hi, pa, sc, alpha);
        return true;
    }

    // The last tile's P V, once the walk has computed `done` tiles' scores.
    __device__ __forceinline__ void finish(const int done) {
        if (done > 0) last_pv(o_lo, o_hi, pa, (u32)__cvta_generic_to_shared(s.v[(done - 1) % 3]));
    }
};

// One block an SM: 128 rows, 128-slot tiles.
extern "C" __global__ void __launch_bounds__(HOP_THREADS, 1) prefill_attention_hopper_d128(
    const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ q_indptr,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_page_ids,
    const int* __restrict__ kv_page_lens, bf16* __restrict__ out, float* __restrict__ lse,
    int num_q_heads, int num_kv_heads, int page_size, int page_shift, int num_pages, int q_rows,
    float sm_scale, int causal) {
    extern __shared__ unsigned char raw_smem[];
    auto& s = aligned_shared<HopperShared>(raw_smem);
    const auto [seq, kv_head, group, q0, q_len, rows, row0] =
        hopper_block(q_indptr, num_q_heads, num_kv_heads, blockIdx.x, blockIdx.y, blockIdx.z);
    if (row0 >= rows) return;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;  // warpgroup: rows 64 wg ..
    const SequencePages sp =
        sequence_pages(kv_indptr, kv_page_ids, kv_page_lens, seq, page_size, s.reduce);
    const int* page_ids = sp.page_ids;
    const int* page_lens = sp.page_lens;
    const int num_entries = sp.num_entries, kv_len = sp.kv_len;

    // This thread's two rows (block-relative r and r + 8) and the last KV index each sees.
    const int my_row = wg * 64 + (warp & 3) * 16 + (lane >> 2);
    int q_index[2], q_token[2];
    hopper_thread_rows(my_row, row0, rows, group, causal, kv_len, q_len, q_token, q_index);
    const int q_hi = block_last_visible(row0, rows, group, causal, kv_len, q_len);
    const int q_lo = last_visible(row0, rows, group, causal, kv_len, q_len);

    // Q tile (zeros past the last row), then the first two slot tables and KV tile 0.
    hopper_load_q<HOP_THREADS>(s.q, q, row0, rows, group, kv_head, q0 % q_rows, num_q_heads);
    SlotWalker walker{0};
    const int num_tiles = count_tiles<HOP_N>(num_entries, page_size);
    for (int j = 0; j < 2 && j < num_tiles; ++j)
        if (tid < HOP_N)
            describe_tile<HOP_N>(s.tab[j], j, walker, page_ids, page_lens, num_entries,
                                 page_size, page_shift, num_pages, num_kv_heads, kv_head);
    __syncthreads();
    if (num_tiles > 0)
        hopper_load_kv<HOP_THREADS>(s.k[0], s.v[0], s.tab[0].row, k_cache, v_cache);
    cp_async_commit();

    const u32 q_addr = (u32)__cvta_generic_to_shared(s.q) + wg * 64 * 128;
    HopperWalk w{s, k_cache, v_cache, page_ids, page_lens, num_entries, page_size,
                 page_shift, num_pages, num_kv_heads, kv_head, num_tiles,
                 {q_index[0], q_index[1]}, q_lo, q_hi, q_addr, sm_scale * LOG2E,
                 walker};
    hopper_walk(w, num_tiles);
    cp_async_wait_all();

    hopper_store_rows(out, lse, w.o_lo, w.o_hi, w.m, w.l, q_token, row0, my_row, group, kv_head,
                      q0, num_q_heads);
}
