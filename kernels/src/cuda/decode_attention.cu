// Paged attention for decode: one new query token per sequence against all of its cached KV.
//
// Decode attention does ~2 flops per byte of K/V it reads, so it is bound by memory bandwidth,
// not by arithmetic: the whole design is about reading K/V once, in wide coalesced loads, with
// many loads in flight (the approach of vLLM's paged attention and FlashInfer's decode kernel).
//
// Who does what
//   grid  = (sequences, q-head groups, KV splits); block = 4 warps.
//   A block serves GH q heads that share one KV head (GQA): each K/V row is loaded once and
//   used for all GH heads.
//   A token's K row of D bf16 is D/8 chunks of 16 bytes, so D/8 lanes ("a token group") read
//   one token and a warp reads 32/(D/8) tokens side by side: 512 contiguous bytes of a page.
//   Each lane keeps its own online-softmax state (max m, sum l, output acc over its 8 dims);
//   partial dot products are summed across the token group with shuffles.
//   A warp issues the loads for UNROLL steps before using any of them, so 2 * UNROLL 16-byte
//   loads per lane are in flight to hide memory latency.
//   At the end the states of the token groups, then of the warps, are merged (same rule as
//   FlashInfer's merge_state).
//
// KV description: the same page table as prefill (see prefill_attention.cu): entries with a
// page id and a valid length, walked in "slot space" of page_size slots per entry.
//
// Split-K (FlashDecoding, Dao et al., 2023): with few sequences there are too few blocks to keep
// every SM busy, so the slots of a sequence are cut into num_splits ranges handled by separate
// blocks. Each writes a partial output and its log-sum-exp in f32; merge_splits (merge.cu)
// combines them. With num_splits == 1 the block writes the final bf16 output directly.

#define DECODE_WARPS 4
#define DECODE_UNROLL 4
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// A 16-byte load of K/V through the read-only path, not kept in L1: each K/V byte is read once
// a step, so L1 has nothing to keep (measured: 3-4% more bandwidth on an H100).
__device__ __forceinline__ uint4 load_kv(const bf16* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// Merges online-softmax state (mb, lb, accb) into (ma, la, acca); m in log2 units.
__device__ __forceinline__ void merge_into(float& ma, float& la, float* acca, float mb, float lb,
                                           const float* accb) {
    const float m = fmaxf(ma, mb);
    if (m == neg_inf()) return;  // both empty
    const float wa = exp2f(ma - m), wb = exp2f(mb - m);
    la = la * wa + lb * wb;
#pragma unroll
    for (int i = 0; i < 8; ++i) acca[i] = acca[i] * wa + accb[i] * wb;
    ma = m;
}

template <int D, int GH>
__device__ __forceinline__ void decode_attention(
    const bf16* __restrict__ q, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_page_ids,
    const int* __restrict__ kv_page_lens, bf16* __restrict__ out, float* __restrict__ lse,
    float* __restrict__ part_o, float* __restrict__ part_lse, int num_q_heads, int num_kv_heads,
    int page_size, int page_shift, int num_pages, float sm_scale, int num_splits) {
    constexpr int LPT = D / 8;          // lanes per token
    constexpr int TPW = 32 / LPT;       // tokens a warp reads side by side
    constexpr int CH = TPW * DECODE_UNROLL;  // slots a warp handles per iteration
    __shared__ float s_m[DECODE_WARPS][GH], s_l[DECODE_WARPS][GH];
    __shared__ __align__(16) float s_acc[DECODE_WARPS][GH][D];

    const int seq = blockIdx.x, head0 = blockIdx.y * GH, split = blockIdx.z;
    const int kv_head = head0 / (num_q_heads / num_kv_heads);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ts = lane / LPT, dc = lane % LPT;  // token slot in the warp, chunk of the row

    // Units run up to the last valid slot of the last entry: the empty end of a sequence's last
    // page is not walked, so the splits share out only slots that hold tokens.
    const int e0 = kv_indptr[seq];
    const int num_entries = kv_indptr[seq + 1] - e0;
    const int last_end =
        num_entries > 0
            ? ((num_entries - 1) << page_shift) + min(kv_page_lens[e0 + num_entries - 1], page_size)
            : 0;
    const int units = (last_end + CH - 1) / CH;
    const int per_split = (units + num_splits - 1) / num_splits;
    const int u_begin = split * per_split;
    const int u_end = min(units, u_begin + per_split);

    // The query chunk of each head, pre-scaled so that scores come out in log2 units.
    float qf[GH][8];
    const float scale = sm_scale * LOG2E;
#pragma unroll
    for (int g = 0; g < GH; ++g) {
        const uint4 c = *reinterpret_cast<const uint4*>(
            q + ((size_t)seq * num_q_heads + head0 + g) * D + dc * 8);
        chunk_to_float(c, qf[g]);
#pragma unroll
        for (int i = 0; i < 8; ++i) qf[g][i] *= scale;
    }

    float m[GH], l[GH], acc[GH][8];
#pragma unroll
    for (int g = 0; g < GH; ++g) {
        m[g] = neg_inf();
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }

    for (int u = u_begin + warp; u < u_end; u += DECODE_WARPS) {
        uint4 kc[DECODE_UNROLL], vc[DECODE_UNROLL];
        bool valid[DECODE_UNROLL];
        // Issue every load of this iteration first...
#pragma unroll
        for (int uu = 0; uu < DECODE_UNROLL; ++uu) {
            const int slot = u * CH + uu * TPW + ts;
            const int e = slot >> page_shift, offset = slot & (page_size - 1);
            valid[uu] = false;
            if (e < num_entries) {
                const int page = kv_page_ids[e0 + e];
                valid[uu] = offset < kv_page_lens[e0 + e] && page >= 0 && page < num_pages;
                if (valid[uu]) {
                    const size_t row = ((size_t)page * num_kv_heads + kv_head) * page_size + offset;
                    kc[uu] = load_kv(k_cache + row * D + dc * 8);
                    vc[uu] = load_kv(v_cache + row * D + dc * 8);
                }
            }
            if (!valid[uu]) kc[uu] = vc[uu] = make_uint4(0, 0, 0, 0);
        }
        // ...then use them: scores of every (token, head), summed over the token group.
        float sc[DECODE_UNROLL][GH];
#pragma unroll
        for (int uu = 0; uu < DECODE_UNROLL; ++uu) {
            float kf[8];
            chunk_to_float(kc[uu], kf);
#pragma unroll
            for (int g = 0; g < GH; ++g) {
                float part = 0.f;
#pragma unroll
                for (int i = 0; i < 8; ++i) part += qf[g][i] * kf[i];
#pragma unroll
                for (int o = LPT / 2; o > 0; o >>= 1) part += __shfl_xor_sync(FULL_MASK, part, o);
                sc[uu][g] = valid[uu] ? part : neg_inf();
            }
        }
        // Online softmax: rescale once per iteration, then add the UNROLL tokens.
#pragma unroll
        for (int g = 0; g < GH; ++g) {
            float m_new = m[g];
#pragma unroll
            for (int uu = 0; uu < DECODE_UNROLL; ++uu) m_new = fmaxf(m_new, sc[uu][g]);
            if (m_new == neg_inf()) continue;
            const float alpha = exp2f(m[g] - m_new);
            l[g] *= alpha;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
            m[g] = m_new;
        }
#pragma unroll
        for (int uu = 0; uu < DECODE_UNROLL; ++uu) {
            float vf[8];
            chunk_to_float(vc[uu], vf);
#pragma unroll
            for (int g = 0; g < GH; ++g) {
                const float p = m[g] == neg_inf() ? 0.f : exp2f(sc[uu][g] - m[g]);
                l[g] += p;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] += p * vf[i];
            }
        }
    }

    // Merge the token groups of the warp: lanes with the same dc hold the same 8 dims.
#pragma unroll
    for (int o = LPT; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < GH; ++g) {
            float other[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) other[i] = __shfl_xor_sync(FULL_MASK, acc[g][i], o);
            const float mo = __shfl_xor_sync(FULL_MASK, m[g], o);
            const float lo = __shfl_xor_sync(FULL_MASK, l[g], o);
            merge_into(m[g], l[g], acc[g], mo, lo, other);
        }
    }
    // Then the warps, through shared memory.
    if (ts == 0) {
#pragma unroll
        for (int g = 0; g < GH; ++g) {
            if (dc == 0) {
                s_m[warp][g] = m[g];
                s_l[warp][g] = l[g];
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) s_acc[warp][g][dc * 8 + i] = acc[g][i];
        }
    }
    __syncthreads();
    if (warp != 0 || ts != 0) return;
#pragma unroll
    for (int g = 0; g < GH; ++g) {
        for (int w = 1; w < DECODE_WARPS; ++w)
            merge_into(m[g], l[g], acc[g], s_m[w][g], s_l[w][g], &s_acc[w][g][dc * 8]);
        const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
        float y[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) y[i] = acc[g][i] * inv;
        const float row_lse = l[g] > 0.f ? (m[g] + log2f(l[g])) * LN2 : neg_inf();
        const size_t row = (size_t)seq * num_q_heads + head0 + g;
        if (num_splits == 1) {
            *reinterpret_cast<uint4*>(out + row * D + dc * 8) = float_to_chunk(y);
            if (lse != nullptr && dc == 0) lse[row] = row_lse;
        } else {
            float* dst = part_o + (row * num_splits + split) * D + dc * 8;
            *reinterpret_cast<float4*>(dst) = make_float4(y[0], y[1], y[2], y[3]);
            *reinterpret_cast<float4*>(dst + 4) = make_float4(y[4], y[5], y[6], y[7]);
            if (dc == 0) part_lse[row * num_splits + split] = row_lse;
        }
    }
}

#define DECODE(D, GH)                                                                          \
    extern "C" __global__ void __launch_bounds__(DECODE_WARPS * 32) decode_attention_d##D##_g##GH( \
        const bf16* q, const bf16* k_cache, const bf16* v_cache, const int* kv_indptr,         \
        const int* kv_page_ids, const int* kv_page_lens, bf16* out, float* lse, float* part_o, \
        float* part_lse, int num_q_heads, int num_kv_heads, int page_size, int page_shift,     \
        int num_pages, float sm_scale, int num_splits) {                                       \
        decode_attention<D, GH>(q, k_cache, v_cache, kv_indptr, kv_page_ids, kv_page_lens, out, \
                                lse, part_o, part_lse, num_q_heads, num_kv_heads, page_size,   \
                                page_shift, num_pages, sm_scale, num_splits);                  \
    }

DECODE(32, 1)
DECODE(32, 2)
DECODE(32, 4)
DECODE(32, 8)
DECODE(64, 1)
DECODE(64, 2)
DECODE(64, 4)
DECODE(64, 8)
DECODE(128, 1)
DECODE(128, 2)
DECODE(128, 4)
DECODE(128, 8)
