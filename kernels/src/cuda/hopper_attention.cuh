// The pieces of Hopper prefill attention that do not depend on how a block feeds its warpgroups,
// shared by prefill_hopper.cu (every thread copies, one barrier a tile) and prefill_hopper_ws.cu
// (a producer warpgroup copies, mbarriers hand the tiles over): the tile shape, the copies into
// the swizzled layout, the two products of a tile, its mask and online softmax, and the output.
//
// A warpgroup owns 64 rows of a block's 128 (query token, q head of the block's KV head, folded
// as in the FA2 kernel); each thread holds two of them, r and r + 8, in wgmma's accumulator
// layout (wgmma.cuh).

#define HOP_D 128
// A block: two warpgroups of 64 rows computing, KV tiles of 128 slots, one block an SM. A block
// of one warpgroup with 64-slot tiles, two blocks an SM, was measured too and was slower or
// equal on every shape of the bench (docs/benchmarks/LOG.md).
#define HOP_M 128
#define HOP_N 128

// The block's shared memory, of type T, from the dynamic allocation `raw`: the swizzle repeats
// every 1024 bytes, so the tiles start on a 1024-byte boundary (the launch asks for 1 KiB more).
template <class T>
__device__ __forceinline__ T& aligned_shared(unsigned char* raw) {
    const u32 at = (u32)__cvta_generic_to_shared(raw);
    return *reinterpret_cast<T*>(raw + (((at + 1023) & ~1023u) - at));
}

// Where a block works: (sequence, KV head, rank), the grid's (x, y, z) in prefill_hopper.cu, a
// work item's in prefill_hopper_ws.cu (which takes them in this order where a call has a prompt
// of more than 8 query tiles, see ws_item there). The hardware starts
// blocks x first, then y, then z (what it does, not a documented promise), and the rank counts
// query tiles from each sequence's last, which has the most causal work: every sequence's and
// head's last tile starts first, then the tiles before them. With one block an SM, a heavy tile
// started in the last wave would leave the other SMs idle while it runs (FlashInfer's planner
// sorts its work longest first for the same reason). The block's rows are row0.. of the
// sequence's `rows` (q_len x group); a sequence with fewer tiles than the largest rank gets
// row0 past its rows: no work.
struct HopperBlock {
    int seq, kv_head;
    Group group;
    int q0, q_len, rows, row0;
};

__device__ __forceinline__ HopperBlock hopper_block(const int* q_indptr, int num_q_heads,
                                                    int num_kv_heads, int seq, int kv_head,
                                                    int rank) {
    HopperBlock b;
    b.seq = seq;
    b.kv_head = kv_head;
    b.group = make_group(num_q_heads / num_kv_heads);
    b.q0 = q_indptr[b.seq];
    b.q_len = q_indptr[b.seq + 1] - b.q0;
    b.rows = b.q_len * b.group.size;
    const int tiles = (b.rows + HOP_M - 1) / HOP_M;
    b.row0 = rank < tiles ? (tiles - 1 - rank) * HOP_M : b.rows;
    return b;
}

// The last KV index any row of the block of rows row0.. sees: its last row's (last_visible).
__device__ __forceinline__ int block_last_visible(int row0, int rows, Group group, int causal,
                                                  int kv_len, int q_len) {
    return last_visible(min(rows, row0 + HOP_M) - 1, rows, group, causal, kv_len, q_len);
}

// Starts the copy of one 128-slot tile of K into `k_dst` and of V into `v_dst`, whose cache rows
// `rows` lists, done by threads 0..THREADS-1 (empty slots become zeros). A null destination is
// not copied. Thread t copies chunk t % 16 of rows t / 16 + (THREADS / 16) i: its swizzled
// column is the same in every row it copies, so the loop is address increments.
template <int THREADS>
__device__ __forceinline__ void hopper_load_kv(bf16* k_dst, bf16* v_dst, const int* rows,
                                               const bf16* k_cache, const bf16* v_cache) {
    constexpr int STEP = THREADS / 16;
    const int ch = threadIdx.x & 15, r0 = threadIdx.x >> 4;
    const u32 first = swizzled_offset(r0, ch * 8, HOP_N);
#pragma unroll
    for (int i = 0; i < HOP_N / STEP; ++i) {
        const int row = rows[r0 + STEP * i];
        const size_t at = row >= 0 ? (size_t)row * HOP_D + ch * 8 : 0;
        const u32 to = first + i * STEP * 128;
        if (k_dst != nullptr)
            cp_async_16(reinterpret_cast<char*>(k_dst) + to, k_cache + at, row >= 0 ? 16 : 0);
        if (v_dst != nullptr)
            cp_async_16(reinterpret_cast<char*>(v_dst) + to, v_cache + at, row >= 0 ? 16 : 0);
    }
}

// The row of q and of the output (and the index in lse) that the sequence's folded row r stands
// for: query token r / group, q head kv_head * group + r % group.
__device__ __forceinline__ size_t folded_row(int r, Group group, int kv_head, int q0,
                                             int num_q_heads) {
    return (size_t)(q0 + r / group) * num_q_heads + kv_head * group.size + r % group;
}

// Starts the copy of the block's Q tile (rows row0.. of the sequence's folded rows, zeros past
// the last), done by threads 0..THREADS-1.
template <int THREADS>
__device__ __forceinline__ void hopper_load_q(bf16* dst, const bf16* q, int row0, int rows,
                                              Group group, int kv_head, int q0, int num_q_heads) {
    for (int id = threadIdx.x; id < HOP_M * (HOP_D / 8); id += THREADS) {
        const int r = id >> 4, ch = id & 15;
        const int gr = row0 + r;
        const bf16* src = q;
        if (gr < rows)
            src = q + folded_row(gr, group, kv_head, q0, num_q_heads) * HOP_D + ch * 8;
        cp_async_16(reinterpret_cast<char*>(dst) + swizzled_offset(r, ch * 8, HOP_M), src,
                    gr < rows ? 16 : 0);
    }
}

// This thread's two rows (block rows `my_row` and `my_row` + 8): the query token of each (-1: no
// row) and the last KV index each sees.
__device__ __forceinline__ void hopper_thread_rows(int my_row, int row0, int rows, Group group,
                                                   int causal, int kv_len, int q_len,
                                                   int (&q_token)[2], int (&q_index)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + my_row + 8 * h;
        q_token[h] = r < rows ? r / group : -1;
        q_index[h] = last_visible(r, rows, group, causal, kv_len, q_len);
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

// Issues O += P V: P's 16-slot steps as A fragments, V read transposed ("MN-major"), all 128
// output columns an instruction (V's two 64-column blocks are HOP_N rows of 128 bytes apart).
__device__ __forceinline__ void issue_pv(float (&o_lo)[32], float (&o_hi)[32],
                                         const u32 (&pa)[HOP_N / 16][4], u32 v_addr) {
#pragma unroll
    for (int kk = 0; kk < HOP_N / 16; ++kk)
        wgmma_m64n128k16_rs(o_lo, o_hi, pa[kk],
                            smem_descriptor(v_addr + kk * 16 * 128, HOP_N * 128));
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

// Masks a tile's scores where needed. Most tiles need no mask: every slot holds the next token
// ("dense": slot c holds token start + c) and every row of the block sees all of them (the
// block's first row, whose last visible index is `q_lo`, already sees the tile's last slot).
__device__ __forceinline__ void mask_tile(float (&sc)[HOP_N / 2], const SlotTable<HOP_N>& tab,
                                          bool dense, int q_lo, const int (&q_index)[2]) {
    const int start = tab.start;
    const bool seen_by_all = dense && start + HOP_N - 1 <= q_lo;
    if (!seen_by_all && dense)
        mask_scores<false>(sc, tab.logical, start, q_index);
    else if (!seen_by_all)
        mask_scores<true>(sc, tab.logical, start, q_index);
}

// Once the previous P V is done: rescales the output by the softmax's correction (skipped when
// no row's maximum grew, which is most tiles) and packs this tile's probabilities to bf16 as
// the A fragments of the next P V.
__device__ __forceinline__ void keep_probabilities(float (&o_lo)[32], float (&o_hi)[32],
                                                   u32 (&pa)[HOP_N / 16][4],
                                                   const float (&sc)[HOP_N / 2],
                                                   const float (&alpha)[2]) {
    if (__any_sync(FULL_MASK, alpha[0] != 1.f || alpha[1] != 1.f)) {
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
}

// Normalises and writes this thread's two rows (block rows `my_row` and `my_row` + 8 of the
// block starting at `row0`) and, if `lse` is given, their log-sum-exp.
__device__ __forceinline__ void hopper_store_rows(bf16* out, float* lse, const float (&o_lo)[32],
                                                  const float (&o_hi)[32], const float (&m)[2],
                                                  const float (&l)[2], const int (&q_token)[2],
                                                  int row0, int my_row, Group group, int kv_head,
                                                  int q0, int num_q_heads) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float total = quad_total(l[h]);
        if (q_token[h] < 0) continue;
        const size_t base = folded_row(row0 + my_row + 8 * h, group, kv_head, q0, num_q_heads);
        const float inv = total > 0.f ? 1.f / total : 0.f;
        bf16* dst = out + base * HOP_D;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int col = jj * 8 + (lane & 3) * 2;
            *reinterpret_cast<__nv_bfloat162*>(dst + col) = __floats2bfloat162_rn(
                o_lo[4 * jj + 2 * h] * inv, o_lo[4 * jj + 2 * h + 1] * inv);
            *reinterpret_cast<__nv_bfloat162*>(dst + 64 + col) = __floats2bfloat162_rn(
                o_hi[4 * jj + 2 * h] * inv, o_hi[4 * jj + 2 * h + 1] * inv);
        }
        if (lse != nullptr && (lane & 3) == 0)
            lse[base] = row_lse(m[h], total);
    }
}

// Issues a step's products: S = Q K^T into `sc` and, after the first tile, the previous tile's
// O += P V. `q_addr` points at the warpgroup's first Q row, `k_addr` and `v_addr` at the
// stages of this tile's K and the previous tile's V.
template <bool FIRST>
__device__ __forceinline__ void issue_step(float (&sc)[HOP_N / 2], float (&o_lo)[32],
                                           float (&o_hi)[32], const u32 (&pa)[HOP_N / 16][4],
                                           u32 q_addr, u32 k_addr, u32 v_addr) {
    fence_registers(sc);
    fence_registers(o_lo);
    fence_registers(o_hi);
    wgmma_fence();
    issue_scores(sc, q_addr, k_addr);
    if constexpr (!FIRST) issue_pv(o_lo, o_hi, pa, v_addr);
}

// Once the previous P V is done: rescales O and keeps this tile's P (keep_probabilities).
__device__ __forceinline__ void settle_step(float (&o_lo)[32], float (&o_hi)[32],
                                            u32 (&pa)[HOP_N / 16][4],
                                            const float (&sc)[HOP_N / 2],
                                            const float (&alpha)[2]) {
    wgmma_wait<0>();
    fence_registers(o_lo);
    fence_registers(o_hi);
    fence_registers(pa);
    keep_probabilities(o_lo, o_hi, pa, sc, alpha);
}

// Issues the last tile's O += P V; settle_last_pv waits for it.
__device__ __forceinline__ void issue_last_pv(float (&o_lo)[32], float (&o_hi)[32],
                                              const u32 (&pa)[HOP_N / 16][4], u32 v_addr) {
    fence_registers(o_lo);
    fence_registers(o_hi);
    wgmma_fence();
    issue_pv(o_lo, o_hi, pa, v_addr);
}

__device__ __forceinline__ void settle_last_pv(float (&o_lo)[32], float (&o_hi)[32],
                                               u32 (&pa)[HOP_N / 16][4]) {
    wgmma_wait<0>();
    fence_registers(o_lo);
    fence_registers(o_hi);
    fence_registers(pa);
}

// The last tile's O += P V, issued and waited for.
__device__ __forceinline__ void last_pv(float (&o_lo)[32], float (&o_hi)[32],
                                        u32 (&pa)[HOP_N / 16][4], u32 v_addr) {
    issue_last_pv(o_lo, o_hi, pa, v_addr);
    settle_last_pv(o_lo, o_hi, pa);
}

// Runs a warpgroup's walk over up to `num_tiles` KV tiles: clears its output and softmax state,
// steps (the first tile its own instantiation, with no P V before it) until the tiles or
// causality end, then issues the last P V. `Walk` has the state (o_lo, o_hi, m, l) and
// step<FIRST>(j), false when causality ends the walk before tile j, and finish(done).
template <class Walk>
__device__ __forceinline__ void hopper_walk(Walk& w, int num_tiles) {
#pragma unroll
    for (int i = 0; i < 32; ++i) w.o_lo[i] = w.o_hi[i] = 0.f;
    w.m[0] = w.m[1] = neg_inf();
    w.l[0] = w.l[1] = 0.f;
    int done = 0;  // tiles whose scores are computed
    if (num_tiles > 0 && w.template step<true>(0)) {
        done = 1;
        while (done < num_tiles && w.template step<false>(done)) ++done;
    }
    w.finish(done);
}
