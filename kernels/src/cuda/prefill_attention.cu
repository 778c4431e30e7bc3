// Paged attention for prefill: FlashAttention-2's tiled online softmax (Dao, 2023) reading K/V
// through a page table (vLLM's PagedAttention, Kwon et al., 2023), on tensor cores.
//
// Who does what
//   grid  = (query tiles, sequences, KV heads); block = 4 warps.
//   A block owns up to 64 "rows" of one sequence and one KV head. GQA is folded into the rows:
//   row r is (query token r / G, q head kv_head * G + r % G), so the q heads that share a KV
//   head share every K/V tile the block loads (FlashInfer does the same).
//   Each warp owns 16 rows. Scores S = Q K^T for a 64-wide KV tile live in registers, the
//   online softmax rescales the running output O (also in registers), and P = exp(S - m) is fed
//   straight back into the P V product without touching shared memory.
//
// The KV is read tile by tile through the page table (page_tiles.cuh): 64 slots a tile.
//
// Causal mask: the queries of sequence s are its last q_len tokens, so query t has logical
// index kv_len - q_len + t and sees logical indices <= its own. Without the mask (cascade
// attention over a shared prefix) every query sees every token.
//
// Q has q_rows rows and sequence s's queries start at row q_indptr[s] mod q_rows: the pieces of
// one KV cut apart (split-KV, cascade) are sequences of their own that read the same rows of Q,
// written once; anywhere else q_indptr[s] is below q_rows and names the row itself. Outputs go
// to rows q_indptr[s].. as always.
//
// Pipeline per KV tile j (one K buffer, one V buffer, copies overlap math):
//   wait K(j) | start copy V(j) | S = Q K(j)^T, softmax | wait V(j) | start copy K(j+1) | O += P V(j)

#define BM 64
#define BN 64
#define PREFILL_WARPS 4

template <int D>
struct PrefillShared {
    bf16 k[BN][D + 8];  // +8: rows 16 bytes apart in bank terms, so ldmatrix is conflict-free
    bf16 v[BN][D + 8];
    SlotTable<BN> tab[2];
    int reduce[PREFILL_WARPS];
};

// Starts the asynchronous copy of one K or V tile into `dst`; empty slots become zeros. An FP8
// tile is read into registers, turned into bf16 (code * scale) and stored: the tensor cores
// take bf16 here, and a copy engine cannot convert on the way.
template <int D, typename KV>
__device__ __forceinline__ void load_tile(bf16 (*dst)[D + 8], const int* rows,
                                          const typename KV::T* cache, float scale) {
    constexpr int CHUNKS = D / 8;
    for (int id = threadIdx.x; id < BN * CHUNKS; id += PREFILL_WARPS * 32) {
        const int r = id / CHUNKS, ch = id % CHUNKS;
        const int row = rows[r];
        if constexpr (KV::FP8) {
            uint4 codes = make_uint4(0, 0, 0, 0);
            if (row >= 0) {
                const uint2 c = *reinterpret_cast<const uint2*>(cache + (size_t)row * D + ch * 8);
                codes.x = c.x;
                codes.y = c.y;
            }
            float f[8];
            fp8_chunk_to_float(codes, f, scale);
            *reinterpret_cast<uint4*>(&dst[r][ch * 8]) = float_to_chunk(f);
        } else {
            const bf16* src = row >= 0 ? cache + (size_t)row * D + ch * 8 : cache;
            cp_async_16(&dst[r][ch * 8], src, row >= 0 ? 16 : 0);
        }
    }
    cp_async_commit();
}

template <int D, typename KV>
__device__ __forceinline__ void prefill_attention(
    const bf16* __restrict__ q, const typename KV::T* __restrict__ k_cache,
    const typename KV::T* __restrict__ v_cache,
    const int* __restrict__ q_indptr, const int* __restrict__ kv_indptr,
    const int* __restrict__ kv_page_ids, const int* __restrict__ kv_page_lens,
    bf16* __restrict__ out, float* __restrict__ lse, int num_q_heads, int num_kv_heads,
    int page_size, int page_shift, int num_pages, int q_rows, float sm_scale, int causal,
    float k_scale, float v_scale) {
    __shared__ __align__(16) PrefillShared<D> s;
    const int seq = blockIdx.y, kv_head = blockIdx.z;
    const int group = num_q_heads / num_kv_heads;
    const int q0 = q_indptr[seq], q_len = q_indptr[seq + 1] - q0;
    const int rows = q_len * group;
    const int row0 = blockIdx.x * BM;
    if (row0 >= rows) return;  // this sequence has fewer query tiles than the longest one

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const SequencePages sp =
        sequence_pages(kv_indptr, kv_page_ids, kv_page_lens, seq, page_size, s.reduce);
    const int* page_ids = sp.page_ids;
    const int* page_lens = sp.page_lens;
    const int num_entries = sp.num_entries, kv_len = sp.kv_len;

    // The two rows this thread accumulates: r_a = 16 warp + lane/4 and r_a + 8.
    int q_index[2];
    int q_token[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + warp * 16 + (lane >> 2) + 8 * h;
        q_token[h] = r < rows ? r / group : -1;
        q_index[h] = last_visible(r, rows, group, causal, kv_len, q_len);
    }
    const int last_row = min(rows, row0 + BM) - 1;
    const int q_hi = last_visible(last_row, rows, group, causal, kv_len, q_len);

    SlotWalker walker{0};
    const int num_tiles = count_tiles<BN>(num_entries, page_size);
    if (tid < BN && num_tiles > 0)
        describe_tile<BN>(s.tab[0], 0, walker, page_ids, page_lens, num_entries, page_size,
                          page_shift, num_pages, num_kv_heads, kv_head);

    // Stage the Q tile through the K buffer and keep it in registers as mma A fragments.
    constexpr int CHUNKS = D / 8;
    for (int id = tid; id < BM * CHUNKS; id += PREFILL_WARPS * 32) {
        const int r = id / CHUNKS, ch = id % CHUNKS;
        const int gr = row0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (gr < rows) {
            const int t = gr / group, h = kv_head * group + gr % group;
            const size_t token = q0 % q_rows + t;  // pieces read the same rows of Q
            v = *reinterpret_cast<const uint4*>(q + (token * num_q_heads + h) * D + ch * 8);
        }
        *reinterpret_cast<uint4*>(&s.k[r][ch * 8]) = v;
    }
    __syncthreads();
    const int m8 = lane >> 3;  // which 8x8 matrix this lane addresses in ldmatrix
    u32 qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qa[kk], &s.k[warp * 16 + (m8 & 1) * 8 + (lane & 7)][kk * 16 + (m8 >> 1) * 8]);
    __syncthreads();

    float o[D / 8][4];
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
    float m[2] = {neg_inf(), neg_inf()};
    float l[2] = {0.f, 0.f};
    const float scale = sm_scale * LOG2E;  // scores in log2 units: exp2f is a single instruction

    if (num_tiles > 0) load_tile<D, KV>(s.k, s.tab[0].row, k_cache, k_scale);
    for (int j = 0; j < num_tiles; ++j) {
        const int b = j & 1;
        if (j + 1 < num_tiles && tid < BN)
            describe_tile<BN>(s.tab[b ^ 1], j + 1, walker, page_ids, page_lens, num_entries,
                              page_size, page_shift, num_pages, num_kv_heads, kv_head);
        cp_async_wait_all();
        __syncthreads();
        if (s.tab[b].start > q_hi) break;  // causal: this tile and all later ones are future
        load_tile<D, KV>(s.v, s.tab[b].row, v_cache, v_scale);

        // S = Q K^T for this warp's 16 rows and the tile's 64 slots.
        float sc[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < BN / 16; ++np) {
                u32 kb[4];
                ldmatrix_x4(kb, &s.k[np * 16 + (m8 >> 1) * 8 + (lane & 7)][kk * 16 + (m8 & 1) * 8]);
                mma_bf16_16816(sc[2 * np], qa[kk], kb[0], kb[1]);
                mma_bf16_16816(sc[2 * np + 1], qa[kk], kb[2], kb[3]);
            }
        }

        // Mask, then the online softmax update of each of this thread's two rows.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float row_max = neg_inf();
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int kv = s.tab[b].logical[nt * 8 + (lane & 3) * 2 + i];
                    float x = sc[nt][2 * h + i] * scale;
                    if (kv < 0 || kv > q_index[h]) x = neg_inf();
                    sc[nt][2 * h + i] = x;
                    row_max = fmaxf(row_max, x);
                }
            }
            // The 4 lanes of a quad hold the same row.
            row_max = fmaxf(row_max, __shfl_xor_sync(FULL_MASK, row_max, 1));
            row_max = fmaxf(row_max, __shfl_xor_sync(FULL_MASK, row_max, 2));
            const float m_new = fmaxf(m[h], row_max);
            const float m_use = m_new == neg_inf() ? 0.f : m_new;  // row fully masked so far
            const float alpha = exp2f(m[h] - m_use);
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const float p = exp2f(sc[nt][2 * h + i] - m_use);
                    sc[nt][2 * h + i] = p;
                    sum += p;
                }
            }
            l[h] = l[h] * alpha + sum;  // this lane's share; the quad is summed at the end
            m[h] = m_new;
#pragma unroll
            for (int dn = 0; dn < D / 8; ++dn) {
                o[dn][2 * h] *= alpha;
                o[dn][2 * h + 1] *= alpha;
            }
        }

        cp_async_wait_all();
        __syncthreads();
        if (j + 1 < num_tiles) load_tile<D, KV>(s.k, s.tab[b ^ 1].row, k_cache, k_scale);

        // O += P V: the score accumulators become the A operand directly.
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            u32 pa[4];
            pa[0] = pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]);
            pa[1] = pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]);
            pa[2] = pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pa[3] = pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                u32 vb[4];
                ldmatrix_x4_trans(vb, &s.v[kk * 16 + (m8 & 1) * 8 + (lane & 7)][dp * 16 + (m8 >> 1) * 8]);
                mma_bf16_16816(o[2 * dp], pa, vb[0], vb[1]);
                mma_bf16_16816(o[2 * dp + 1], pa, vb[2], vb[3]);
            }
        }
    }
    cp_async_wait_all();  // a causal break can leave nothing in flight, but be explicit

    // Normalise and write this thread's two rows.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float total = quad_total(l[h]);
        if (q_token[h] < 0) continue;
        const int head = kv_head * group + (row0 + warp * 16 + (lane >> 2) + 8 * h) % group;
        const size_t base = ((size_t)(q0 + q_token[h]) * num_q_heads + head);
        const float inv = total > 0.f ? 1.f / total : 0.f;
        bf16* dst = out + base * D;
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
            const int col = dn * 8 + (lane & 3) * 2;
            *reinterpret_cast<__nv_bfloat162*>(dst + col) =
                __floats2bfloat162_rn(o[dn][2 * h] * inv, o[dn][2 * h + 1] * inv);
        }
        if (lse != nullptr && (lane & 3) == 0)
            lse[base] = row_lse(m[h], total);
    }
}

// Three blocks per multiprocessor (12 warps) cap the registers at 168 for head_dim 128: enough
// for Q fragments, the score tile and the output tile, with a few bytes spilled outside the loop.
// `k_scale` and `v_scale` are the FP8 cache's scales (unused for bf16).
#define PREFILL(NAME, D, KV)                                                                    \
    extern "C" __global__ void __launch_bounds__(PREFILL_WARPS * 32, 3) NAME(                   \
        const bf16* q, const KV::T* k_cache, const KV::T* v_cache, const int* q_indptr,         \
        const int* kv_indptr, const int* kv_page_ids, const int* kv_page_lens, bf16* out,       \
        float* lse, int num_q_heads, int num_kv_heads, int page_size, int page_shift,           \
        int num_pages, int q_rows, float sm_scale, int causal, float k_scale, float v_scale) {  \
        prefill_attention<D, KV>(q, k_cache, v_cache, q_indptr, kv_indptr, kv_page_ids,         \
                                 kv_page_lens, out, lse, num_q_heads, num_kv_heads, page_size,  \
                                 page_shift, num_pages, q_rows, sm_scale, causal, k_scale,      \
                                 v_scale);                                                      \
    }

PREFILL(prefill_attention_d32, 32, KvBf16)
PREFILL(prefill_attention_d64, 64, KvBf16)
PREFILL(prefill_attention_d128, 128, KvBf16)
PREFILL(prefill_attention_fp8_d32, 32, KvFp8)
PREFILL(prefill_attention_fp8_d64, 64, KvFp8)
PREFILL(prefill_attention_fp8_d128, 128, KvFp8)
