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
//   grid = (query tiles, sequences, KV heads), heaviest causal tiles first; block = two
//   warpgroups (256 threads). A block owns 128 rows (query token, q head of this KV head,
//   folded as in the FA2 kernel); warpgroup g owns rows 64g..64g+63.
//   Per 128-slot KV tile j:  S = Q K^T   one m64n128 wgmma chain per warpgroup, Q and K from
//                                        shared memory (K as stored: "K-major");
//                            softmax     in registers, as in the FA2 kernel;
//                            O += P V    P from registers (the score accumulators, repacked to
//                                        bf16: the accumulator layout is mma.sync's), V from
//                                        shared memory read transposed, two m64n64 halves.
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

#define HOP_D 128

// A block: two warpgroups of 64 rows, KV tiles of 128 slots, one block an SM. A block of one
// warpgroup with 64-slot tiles, two blocks an SM, was measured too and was slower or equal on
// every shape of the bench (docs/benchmarks/LOG.md).
#define HOP_M 128
#define HOP_N 128
#define HOP_THREADS 256

struct HopperShared {
    bf16 q[HOP_M * HOP_D];  // [2 column blocks][128 rows][64], swizzled
    bf16 k[2][HOP_N * HOP_D];
    bf16 v[3][HOP_N * HOP_D];  // three stages: tile j's V is read during tile j + 1
    SlotTable<HOP_N> tab[3];
    int reduce[HOP_THREADS / 32];
};

// Starts the copy of one 128-slot tile of K and of V into `k_dst` and `v_dst` (empty slots
// become zeros). Thread t copies chunk t % 16 of rows t / 16 + 16 i: its swizzled column is the
// same in every row it copies, so the loop is 8 address increments.
__device__ __forceinline__ void hopper_load_kv(bf16* k_dst, bf16* v_dst, const int* rows,
                                               const bf16* k_cache, const bf16* v_cache) {
    constexpr int STEP = HOP_THREADS / 16;
    const int ch = threadIdx.x & 15, r0 = threadIdx.x >> 4;
    const u32 first = swizzled_offset(r0, ch * 8, HOP_N);
#pragma unroll
    for (int i = 0; i < HOP_N / STEP; ++i) {
        const int row = rows[r0 + STEP * i];
        const size_t at = row >= 0 ? (size_t)row * HOP_D + ch * 8 : 0;
        const u32 to = first + i * STEP * 128;
        cp_async_16(reinterpret_cast<char*>(k_dst) + to, k_cache + at, row >= 0 ? 16 : 0);
        cp_async_16(reinterpret_cast<char*>(v_dst) + to, v_cache + at, row >= 0 ? 16 : 0);
    }
}

// 2^x in one instruction (denormal results flush to zero, which probabilities can afford).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Issues S = Q K^T for this warpgroup's 64 rows: 8 steps of 16 along head_dim, 4 in each
// 64-column block of the swizzled tiles. `q_addr` points at the warpgroup's first row.
__device__ __forceinline__ void issue_scores(float (&sc)[HOP_N / 2], u32 q_addr, u32 k_addr) {
#pragma unroll
    for (int kk = 0; kk < HOP_D / 16; ++kk) {
        const u64 a = smem_descriptor(q_addr + (kk >> 2) * (HOP_M * 128) + (kk & 3) * 32);
        const u64 b = smem_descriptor(k_addr + (kk >> 2) * (HOP_N * 128) + (kk & 3) * 32);
        wgmma_m64n128k16_ss(sc, a, b, kk > 0);
    }
    wgmma_commit();
}

// Issues O += P V: P's 16-slot steps as A fragments, V read transposed ("MN-major"), the two
// 64-column halves of the output separately.
__device__ __forceinline__ void issue_pv(float (&o_lo)[32], float (&o_hi)[32],
                                         const u32 (&pa)[HOP_N / 16][4], u32 v_addr) {
#pragma unroll
    for (int kk = 0; kk < HOP_N / 16; ++kk) {
        wgmma_m64n64k16_rs(o_lo, pa[kk], smem_descriptor(v_addr + kk * 16 * 128));
        wgmma_m64n64k16_rs(o_hi, pa[kk], smem_descriptor(v_addr + HOP_N * 128 + kk * 16 * 128));
    }
    wgmma_commit();
}

// Sets to -inf the scores of slots a row must not see: empty slots and, causally, tokens after
// the row's own. The accumulator holds (row r, slot 8 nt + 2 (lane % 4) + i) at 4 nt + 2 h + i,
// h = 0 for this thread's first row and 1 for the row 8 below. A dense tile's slot c holds token
// start + c; otherwise the slot table says.
template <bool TABLE>
__device__ __forceinline__ void mask_scores(float (&sc)[HOP_N / 2], const int* logical, int start,
                                            const int (&q_index)[2]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < HOP_N / 8; ++nt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = nt * 8 + (lane & 3) * 2 + i;
            const int kv = TABLE ? logical[c] : start + c;
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (kv < 0 || kv > q_index[h]) sc[4 * nt + 2 * h + i] = neg_inf();
        }
    }
}

// The online softmax of one tile for this thread's two rows: raises the running maxima `m`
// (log2 units), turns the scores into probabilities 2^(s * scale - m), adds their sums into `l`
// and returns each row's correction factor for what was accumulated before. The maximum is
// taken over raw scores (sm_scale > 0 keeps their order), so each probability is one fused
// multiply-add and one exp2; maxima and sums run in four independent chains a row.
__device__ __forceinline__ void online_softmax(float (&sc)[HOP_N / 2], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], float scale) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()};
#pragma unroll
        for (int nt = 0; nt < HOP_N / 8; ++nt)
#pragma unroll
            for (int i = 0; i < 2; ++i)
                mx[(nt & 1) * 2 + i] = fmaxf(mx[(nt & 1) * 2 + i], sc[4 * nt + 2 * h + i]);
        float row_max = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
        row_max = fmaxf(row_max, __shfl_xor_sync(FULL_MASK, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(FULL_MASK, row_max, 2));
        const float m_new = fmaxf(m[h], row_max * scale);
        const float m_use = m_new == neg_inf() ? 0.f : m_new;  // row fully masked so far
        alpha[h] = fast_exp2(m[h] - m_use);
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < HOP_N / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float p = fast_exp2(fmaf(sc[4 * nt + 2 * h + i], scale, -m_use));
                sc[4 * nt + 2 * h + i] = p;
                sum[(nt & 1) * 2 + i] += p;
            }
        }
        l[h] = l[h] * alpha[h] + ((sum[0] + sum[1]) + (sum[2] + sum[3]));
        m[h] = m_new;
    }
}

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
        fence_registers(sc);
        fence_registers(o_lo);
        fence_registers(o_hi);
        wgmma_fence();
        issue_scores(sc, q_addr, (u32)__cvta_generic_to_shared(s.k[j & 1]));
        if constexpr (!FIRST)
            issue_pv(o_lo, o_hi, pa, (u32)__cvta_generic_to_shared(s.v[(j + 2) % 3]));

        // While the tensor cores multiply: the copies of tile j+1, the slot table of tile j+2
        // (whose reads of the page table would otherwise hold up the products' issue).
        if (j + 1 < num_tiles)
            hopper_load_kv(s.k[(j + 1) & 1], s.v[(j + 1) % 3], s.tab[(j + 1) % 3].row,
                                       k_cache, v_cache);
        cp_async_commit();
        if (j + 2 < num_tiles && tid < HOP_N)
            describe_tile<HOP_N>(s.tab[(j + 2) % 3], j + 2, walker, page_ids, page_lens,
                                 num_entries, page_size, page_shift, num_pages, num_kv_heads,
                                 kv_head);
        wgmma_wait<FIRST ? 0 : 1>();  // the scores; P V may still run
        fence_registers(sc);

        // Mask, then the online softmax. Most tiles need no mask: every slot holds the next
        // token ("dense") and every row of the block sees all of them.
        const int start = s.tab[t].start;
        const bool seen_by_all = dense && start + HOP_N - 1 <= q_lo;
        if (!seen_by_all && dense)
            mask_scores<false>(sc, s.tab[t].logical, start, q_index);
        else if (!seen_by_all)
            mask_scores<true>(sc, s.tab[t].logical, start, q_index);
        float alpha[2];
        online_softmax(sc, m, l, alpha, scale);

        // Once the previous P V is done: rescale O and make this tile's P the pending one.
        wgmma_wait<0>();
        fence_registers(o_lo);
        fence_registers(o_hi);
        fence_registers(pa);
        if (__any_sync(FULL_MASK, alpha[0] != 1.f || alpha[1] != 1.f)) {  // a row's max grew
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        o_lo[4 * jj + 2 * h + i] *= alpha[h];
                        o_hi[4 * jj + 2 * h + i] *= alpha[h];
                    }
                }
            }
        }
#pragma unroll
        for (int kk = 0; kk < HOP_N / 16; ++kk) {
            pa[kk][0] = pack_bf16x2(sc[8 * kk + 0], sc[8 * kk + 1]);
            pa[kk][1] = pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);
            pa[kk][2] = pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);
            pa[kk][3] = pack_bf16x2(sc[8 * kk + 6], sc[8 * kk + 7]);
        }
        return true;
    }

    // The last tile's P V, once the walk has computed `done` tiles' scores.
    __device__ __forceinline__ void finish(const int done) {
        if (done == 0) return;
        fence_registers(o_lo);
        fence_registers(o_hi);
        wgmma_fence();
        issue_pv(o_lo, o_hi, pa, (u32)__cvta_generic_to_shared(s.v[(done - 1) % 3]));
        wgmma_wait<0>();
        fence_registers(o_lo);
        fence_registers(o_hi);
        fence_registers(pa);
    }
};

// One block an SM: 128 rows, 128-slot tiles.
extern "C" __global__ void __launch_bounds__(HOP_THREADS, 1) prefill_attention_hopper_d128(
    const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ q_indptr,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_page_ids,
    const int* __restrict__ kv_page_lens, bf16* __restrict__ out, float* __restrict__ lse,
    int num_q_heads, int num_kv_heads, int page_size, int page_shift, int num_pages,
    float sm_scale, int causal) {
    // The swizzle repeats every 1024 bytes, so the tiles start on a 1024-byte boundary.
    extern __shared__ unsigned char raw_smem[];
    const u32 raw = (u32)__cvta_generic_to_shared(raw_smem);
    auto& s = *reinterpret_cast<HopperShared*>(raw_smem + (((raw + 1023) & ~1023u) - raw));

    const int seq = blockIdx.y, kv_head = blockIdx.z;
    const int group = num_q_heads / num_kv_heads;
    const int q0 = q_indptr[seq], q_len = q_indptr[seq + 1] - q0;
    const int rows = q_len * group;
    const int row0 = (gridDim.x - 1 - blockIdx.x) * HOP_M;  // long causal tiles start first
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
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + my_row + 8 * h;
        q_token[h] = r < rows ? r / group : -1;
        q_index[h] = last_visible(r, rows, group, causal, kv_len, q_len);
    }
    const int last_row = min(rows, row0 + HOP_M) - 1;
    const int q_hi = last_visible(last_row, rows, group, causal, kv_len, q_len);
    const int q_lo = last_visible(row0, rows, group, causal, kv_len, q_len);

    // Q tile (zeros past the last row), then the first two slot tables and KV tile 0.
    for (int id = tid; id < HOP_M * (HOP_D / 8); id += HOP_THREADS) {
        const int r = id >> 4, ch = id & 15;
        const int gr = row0 + r;
        const bf16* src = q;
        if (gr < rows) {
            const int t = gr / group, h = kv_head * group + gr % group;
            src = q + ((size_t)(q0 + t) * num_q_heads + h) * HOP_D + ch * 8;
        }
        cp_async_16(reinterpret_cast<char*>(s.q) + swizzled_offset(r, ch * 8, HOP_M), src,
                    gr < rows ? 16 : 0);
    }
    SlotWalker walker{0};
    const int num_tiles = count_tiles<HOP_N>(num_entries, page_size);
    for (int j = 0; j < 2 && j < num_tiles; ++j)
        if (tid < HOP_N)
            describe_tile<HOP_N>(s.tab[j], j, walker, page_ids, page_lens, num_entries,
                                 page_size, page_shift, num_pages, num_kv_heads, kv_head);
    __syncthreads();
    if (num_tiles > 0) hopper_load_kv(s.k[0], s.v[0], s.tab[0].row, k_cache, v_cache);
    cp_async_commit();

    const u32 q_addr = (u32)__cvta_generic_to_shared(s.q) + wg * 64 * 128;
    HopperWalk w{s, k_cache, v_cache, page_ids, page_lens, num_entries, page_size,
                 page_shift, num_pages, num_kv_heads, kv_head, num_tiles,
                 {q_index[0], q_index[1]}, q_lo, q_hi, q_addr, sm_scale * LOG2E,
                 walker};
#pragma unroll
    for (int i = 0; i < 32; ++i) w.o_lo[i] = w.o_hi[i] = 0.f;
    w.m[0] = w.m[1] = neg_inf();
    w.l[0] = w.l[1] = 0.f;
    int done = 0;  // tiles whose scores are computed
    if (num_tiles > 0 && w.step<true>(0)) {
        done = 1;
        while (done < num_tiles && w.step<false>(done)) ++done;
    }
    w.finish(done);
    cp_async_wait_all();

    // Normalise and write this thread's two rows.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float total = w.l[h];
        total += __shfl_xor_sync(FULL_MASK, total, 1);
        total += __shfl_xor_sync(FULL_MASK, total, 2);
        if (q_token[h] < 0) continue;
        const int head = kv_head * group + (row0 + my_row + 8 * h) % group;
        const size_t base = (size_t)(q0 + q_token[h]) * num_q_heads + head;
        const float inv = total > 0.f ? 1.f / total : 0.f;
        bf16* dst = out + base * HOP_D;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int col = jj * 8 + (lane & 3) * 2;
            *reinterpret_cast<__nv_bfloat162*>(dst + col) = __floats2bfloat162_rn(
                w.o_lo[4 * jj + 2 * h] * inv, w.o_lo[4 * jj + 2 * h + 1] * inv);
            *reinterpret_cast<__nv_bfloat162*>(dst + 64 + col) = __floats2bfloat162_rn(
                w.o_hi[4 * jj + 2 * h] * inv, w.o_hi[4 * jj + 2 * h + 1] * inv);
        }
        if (lse != nullptr && (lane & 3) == 0)
            lse[base] = total > 0.f ? (w.m[h] + log2f(total)) * LN2 : neg_inf();
    }
}
