// Paged attention for decode: one new query token per sequence against all of its cached KV.
//
// Decode attention does ~2 flops per byte of K/V it reads, so it is bound by memory bandwidth,
// not by arithmetic: the whole design is about reading K/V once, in wide coalesced loads, with
// many loads in flight (the approach of vLLM's paged attention and FlashInfer's decode kernel).
//
// Who does what
//   block = 4 warps, serving GH q heads that share one KV head (GQA): each K/V row is loaded
//   once and used for all GH heads. The grid is as many blocks as the GPU holds at once.
//   A token's K row of D bf16 is D/8 chunks of 16 bytes, so D/8 lanes ("a token group") read
//   one token and a warp reads 32/(D/8) tokens side by side: 512 contiguous bytes of a page.
//   Each lane keeps its own online-softmax state (max m, sum l, output acc over its 8 dims);
//   partial dot products are summed across the token group with shuffles.
//   A warp issues the loads for UNROLL steps before using any of them, so 2 * UNROLL 16-byte
//   loads per lane are in flight to hide memory latency.
//   At the end of a piece of work the states of the token groups, then of the warps, are merged
//   (same rule as FlashInfer's merge_state).
//
// KV description: the same page table as prefill (see prefill_attention.cu): entries with a
// page id and a valid length, walked in "slot space" of page_size slots per entry.
//
// Sharing the work out evenly. In a serving batch sequences differ in length by 10x or more;
// with one block per (sequence, head group), or a fixed number of blocks per sequence, the GPU
// runs waves of blocks of unequal length and the last ones run while most multiprocessors idle
// (on an H100, 128 sequences of 100-2,047 tokens: 2.65-2.69 TB/s at the best fixed split count,
// 2.72-2.78 TB/s shared out evenly; the engine's whole decode step 2% faster). Instead, every (sequence, head group) is a segment of its slots (rounded up
// to 32, `slot_indptr` holds their prefix sums), the segments are laid end to end, and each
// block takes one equal range of that line: all blocks start together, read the same number
// of bytes and finish together. A range holds whole segments, whose results the block writes
// directly, and at its two ends pieces of segments; those pieces are written as partial states
// (f32 output and log-sum-exp) and decode_merge_pieces combines them (FlashDecoding's split-K,
// with splits where the ranges fall instead of a fixed count per sequence; FlashInfer's decode
// plan balances work the same way).
//
// On Hopper the merge is launched as a programmatic dependent launch: its blocks may start while
// the decode kernel's last blocks run, read the segment layout, and wait at griddepcontrol.wait
// for the pieces. That hides part of the second launch (0.7-2.1 us of the 4.3-5.8 the merge
// cost on an H100; merging inside the decode kernel instead, the last block to write a piece
// merging its segment, was slower). The decode kernel itself may be launched the same way,
// beside a kernel whose memory it does not touch (end_after_previous_kernel below); launched
// so, with the host's copy of the segment layout, it is followed by the merge only where some
// segment is cut or empty (cascade's own pages, whose merge would otherwise stand empty between
// the shared prefix's pass and the merge of its parts). Where no segment is cut or empty, the folding
// kernels also fold that pass's parts into the rows they write (LevelParts below), so that no
// merge of the parts waits after the decode's last blocks.

#define DECODE_WARPS 4
#define DECODE_UNROLL 4

// A 16-byte load of K/V through the read-only path, not kept in L1: each K/V byte is read once
// a step, so L1 has nothing to keep (measured: 3-4% more bandwidth on an H100).
__device__ __forceinline__ uint4 load_kv(const bf16* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// The same for an FP8 cache: 8 codes (8 bytes), in the low half of the result.
__device__ __forceinline__ uint4 load_kv(const unsigned char* p) {
    uint4 v = make_uint4(0, 0, 0, 0);
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// 8 cache elements as floats: bf16 as they are, FP8 codes times the scale.
template <typename KV>
__device__ __forceinline__ void kv_chunk_to_float(const uint4 c, float out[8], float scale) {
    if constexpr (KV::FP8) {
        fp8_chunk_to_float(c, out, scale);
    } else {
        chunk_to_float(c, out);
    }
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

// A decode launched beside the kernel queued before it (`decode_attention_beside`: cascade's own
// pages while the shared prefix's pass runs) starts once that kernel lets it, and touches no
// memory that kernel reads or writes (a folding kernel reads the parts that kernel writes only
// after waiting for it, fold_level_parts). The kernels after the decode on the stream wait only for
// the decode (and its merge where launched, which waits for it), so block 0 waits for the
// earlier kernel before it ends: the decode then ends after that kernel. Launched as usual, the
// wait returns at once.
__device__ __forceinline__ void end_after_previous_kernel() {
    if (blockIdx.x == 0) wait_for_previous_kernel();
}

#define SLOT_ALIGN 32

// The range of the segment line that each block takes: an equal share, a multiple of
// SLOT_ALIGN and at least min_range slots (a block's fixed costs need some work to hide in).
// The host's merge_has_work (kernels/src/decode.rs) computes the same ranges: keep them equal.
__device__ __forceinline__ long long block_range(long long total, int blocks, int min_range) {
    long long r = (total + blocks - 1) / blocks;
    r = r > min_range ? r : min_range;
    return (r + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
}

// This block's part [begin, end) of the segment line (`slot_indptr`'s slots once per head
// group); empty for a block past the line's end.
struct LinePart {
    long long begin, end;
};
__device__ __forceinline__ LinePart block_part(const int* slot_indptr, int num_seqs, int groups,
                                               int min_range) {
    const long long total = (long long)slot_indptr[num_seqs] * groups;
    const long long range = block_range(total, gridDim.x, min_range);
    const long long begin = blockIdx.x * range;
    return {begin, min(total, begin + range)};
}

// The segment the walk is in at line position `pos`, and the part of it before `end`.
struct DecodeSegment {
    int seq, g, seg;       // sequence, head group, slots of the segment
    int lo, hi;            // the part walked: slots [lo, hi) of the segment
    long long seq_base;    // line position of the sequence's first segment
    int head0, kv_head;    // the group's first q head and its KV head
    int e0, num_entries;   // the sequence's entries of the page table
    int u_begin, u_end;    // the units of slots walked

    __device__ __forceinline__ bool whole() const { return lo == 0 && hi == seg; }
    // The line position after this part.
    __device__ __forceinline__ long long next() const { return seq_base + (long long)g * seg + hi; }
};

// The segment at `pos`; `seq` (a sequence at or before it) moves forward to its sequence.
// A segment already ends at its sequence's last valid slot rounded up to 32 (`slot_indptr`),
// so units of `unit` slots run to the part's end and the empty end of a sequence's last page
// is not walked; reading the last entry's length again would add one more wait, each on the
// one before, before a block's first K/V load and at each change of segment.
__device__ __forceinline__ DecodeSegment segment_at(long long pos, long long end, int& seq,
                                                    const int* slot_indptr, const int* kv_indptr,
                                                    int groups, int gh, int num_q_heads,
                                                    int num_kv_heads, int unit) {
    while ((long long)slot_indptr[seq + 1] * groups <= pos) ++seq;  // skips empty ones
    DecodeSegment s;
    s.seq = seq;
    s.seq_base = (long long)slot_indptr[seq] * groups;
    s.seg = slot_indptr[seq + 1] - slot_indptr[seq];
    s.g = (int)((pos - s.seq_base) / s.seg);
    s.lo = (int)(pos - s.seq_base - (long long)s.g * s.seg);
    s.hi = (int)min((long long)s.seg, end - s.seq_base - (long long)s.g * s.seg);
    s.head0 = s.g * gh;
    s.kv_head = s.head0 / (num_q_heads / num_kv_heads);
    s.e0 = kv_indptr[seq];
    s.num_entries = kv_indptr[seq + 1] - s.e0;
    s.u_begin = s.lo / unit;
    s.u_end = (s.hi + unit - 1) / unit;
    return s;
}

// This thread's first entry of `slot_indptr` for first_sequence, read before the block's range is
// known (which reads the last entry): the two reads then wait together, not one after the other.
__device__ __forceinline__ int first_entry(const int* slot_indptr, int num_seqs) {
    return (int)threadIdx.x + 1 <= num_seqs ? slot_indptr[threadIdx.x + 1] : 0;
}

// The sequence that holds line position `begin`: the number of sequences that end at or
// before it. Every thread of the block calls it, with its first_entry.
__device__ __forceinline__ int first_sequence(long long begin, const int* slot_indptr,
                                              int num_seqs, int groups, int& s_first,
                                              int first) {
    if (threadIdx.x == 0) s_first = 0;
    __syncthreads();
    int before = (int)threadIdx.x + 1 <= num_seqs && (long long)first * groups <= begin;
    for (int i = threadIdx.x + 1 + blockDim.x; i <= num_seqs; i += blockDim.x)
        before += (long long)slot_indptr[i] * groups <= begin;
    before = (int)warp_sum((float)before);
    if ((threadIdx.x & 31) == 0 && before > 0) atomicAdd(&s_first, before);
    __syncthreads();
    return s_first;
}

// One lane's online-softmax state over a segment for the GH q heads of a group: the query chunk
// of each head, and the running maximum m, sum l and output acc over the lane's 8 dims.
template <int D, int GH, typename KV>
struct DecodeRows {
    static constexpr int LPT = D / 8;     // lanes per token
    static constexpr int TPW = 32 / LPT;  // tokens a warp reads side by side
    float qf[GH][8];
    __half2 qh[GH][4];
    float m[GH], l[GH], acc[GH][8];

    // The query chunk of each head, pre-scaled so that scores come out in log2 units. Over an
    // FP8 cache the key scale is folded in too, and the query is also kept as f16 pairs: codes
    // turn into f16 pairs in one instruction, and the dot product of 8 of them takes four paired
    // multiply-adds (E4M3 values are exact in f16; each multiply-add of the two running sums of
    // 4 rounds to f16's 11 bits, finer than the bf16 the step works in).
    __device__ __forceinline__ void begin(const bf16* q, int seq, int num_q_heads, int head0,
                                          int dc, float scale, float k_scale) {
#pragma unroll
        for (int h = 0; h < GH; ++h) {
            const uint4 c = *reinterpret_cast<const uint4*>(
                q + ((size_t)seq * num_q_heads + head0 + h) * D + dc * 8);
            chunk_to_float(c, qf[h]);
            const float qs = KV::FP8 ? scale * k_scale : scale;
#pragma unroll
            for (int i = 0; i < 8; ++i) qf[h][i] *= qs;
#pragma unroll
            for (int i = 0; i < 4; ++i) qh[h][i] = __floats2half2_rn(qf[h][2 * i], qf[h][2 * i + 1]);
            m[h] = neg_inf();
            l[h] = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[h][i] = 0.f;
        }
    }

    // Adds DECODE_UNROLL tokens, the lane's chunk of each K and V row (zeros where not valid):
    // scores of every (token, head) summed over the token group, then the online softmax,
    // rescaled once for all of them.
    __device__ __forceinline__ void attend(const uint4 (&kc)[DECODE_UNROLL],
                                           const uint4 (&vc)[DECODE_UNROLL],
                                           const bool (&valid)[DECODE_UNROLL]) {
        float sc[DECODE_UNROLL][GH];
#pragma unroll
        for (int uu = 0; uu < DECODE_UNROLL; ++uu) {
            float kf[8];
            __half2 kh[4];
            if constexpr (KV::FP8) {
                const unsigned short* pairs = reinterpret_cast<const unsigned short*>(&kc[uu]);
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    kh[i] = __half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3));
            } else {
                chunk_to_float(kc[uu], kf);
            }
#pragma unroll
            for (int h = 0; h < GH; ++h) {
                float part = 0.f;
                if constexpr (KV::FP8) {
                    __half2 s2 = __hmul2(qh[h][0], kh[0]);
#pragma unroll
                    for (int i = 1; i < 4; ++i) s2 = __hfma2(qh[h][i], kh[i], s2);
                    const float2 f = __half22float2(s2);
                    part = f.x + f.y;
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) part += qf[h][i] * kf[i];
                }
#pragma unroll
                for (int o = LPT / 2; o > 0; o >>= 1) part += __shfl_xor_sync(FULL_MASK, part, o);
                sc[uu][h] = valid[uu] ? part : neg_inf();
            }
        }
#pragma unroll
        for (int h = 0; h < GH; ++h) {
            float m_new = m[h];
#pragma unroll
            for (int uu = 0; uu < DECODE_UNROLL; ++uu) m_new = fmaxf(m_new, sc[uu][h]);
            if (m_new == neg_inf()) continue;
            const float alpha = exp2f(m[h] - m_new);
            l[h] *= alpha;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[h][i] *= alpha;
            m[h] = m_new;
        }
#pragma unroll
        for (int uu = 0; uu < DECODE_UNROLL; ++uu) {
            float vf[8];
            // The value scale is applied once, to the output.
            kv_chunk_to_float<KV>(vc[uu], vf, 1.f);
#pragma unroll
            for (int h = 0; h < GH; ++h) {
                const float p = m[h] == neg_inf() ? 0.f : exp2f(sc[uu][h] - m[h]);
                l[h] += p;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[h][i] += p * vf[i];
            }
        }
    }

    // Merges the token groups of the warp: lanes with the same dc hold the same 8 dims.
    __device__ __forceinline__ void merge_token_groups() {
#pragma unroll
        for (int o = LPT; o < 32; o <<= 1) {
#pragma unroll
            for (int h = 0; h < GH; ++h) {
                float other[8];
#pragma unroll
                for (int i = 0; i < 8; ++i) other[i] = __shfl_xor_sync(FULL_MASK, acc[h][i], o);
                const float mo = __shfl_xor_sync(FULL_MASK, m[h], o);
                const float lo_ = __shfl_xor_sync(FULL_MASK, l[h], o);
                merge_into(m[h], l[h], acc[h], mo, lo_, other);
            }
        }
    }
};

// Where each attending thread of a folding kernel leaves its share of a cascade level's parts
// (fold_level_parts); nothing in the other kernels.
template <bool FOLD>
struct FoldSlots {};
template <>
struct FoldSlots<true> {
    __align__(16) float fold_y[DECODE_WARPS * 32][8];
    float fold_m[DECODE_WARPS * 32], fold_total[DECODE_WARPS * 32];
};

// Where the warps of a block merge their states.
template <int D, int GH, bool FOLD>
struct DecodeMerge : FoldSlots<FOLD> {
    float m[DECODE_WARPS][GH], l[DECODE_WARPS][GH];
    __align__(16) float acc[DECODE_WARPS][GH][D];
};

// A cascade level's parts, computed by the kernel queued before this one (the level's pass over
// its shared pages) for the decode's own rows: piece p's state of row r is at [p * stride + r].
// The decode's folding kernels fold them into every row they write, so that no merge launch waits
// after them (decode_attention_folding, kernels/src/decode.rs; the host asks for it only where
// every block writes its segments whole).
struct LevelParts {
    const bf16* o;
    const float* lse;
    int pieces, stride;
};

// The attending threads split a segment's rows into (head, chunk) pairs and the parts into
// groups: thread t sums pair t % PAIRS over every GROUPS-th part from t / PAIRS, FOLD_BATCH parts
// loaded at once, into its slot of `sm` (the row's running maximum of lse, sum of weights and
// weighted output chunk). It first waits for the kernel before this one, which wrote the parts:
// a block that finishes its own pages before that kernel ends waits there, holding its place.
#define FOLD_BATCH 4
template <int D, int GH>
__device__ __forceinline__ void fold_level_parts(DecodeMerge<D, GH, true>& sm, const LevelParts& parts,
                                                 size_t row0) {
    constexpr int LPT = D / 8, PAIRS = GH * LPT, GROUPS = DECODE_WARPS * 32 / PAIRS;
    static_assert(GROUPS >= 1, "a thread for every (head, chunk) of a segment");
    const int t = threadIdx.x, pair = t % PAIRS, dc = pair % LPT;
    const size_t row = row0 + pair / LPT;
    wait_for_previous_kernel();
    float m = neg_inf(), total = 0.f;
    float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int p0 = t / PAIRS; p0 < parts.pieces; p0 += FOLD_BATCH * GROUPS) {
        float l[FOLD_BATCH];
        uint4 c[FOLD_BATCH];
#pragma unroll
        for (int k = 0; k < FOLD_BATCH; ++k) {
            const int p = p0 + k * GROUPS;
            const size_t at = (size_t)p * parts.stride + row;
            const bool here = p < parts.pieces;
            l[k] = here ? parts.lse[at] : neg_inf();
            c[k] = here ? reinterpret_cast<const uint4*>(parts.o + at * D)[dc]
                        : make_uint4(0, 0, 0, 0);
        }
        add_states<FOLD_BATCH>(m, total, y, l, c, FOLD_BATCH);
    }
    sm.fold_m[t] = m;
    sm.fold_total[t] = total;
    *reinterpret_cast<float4*>(&sm.fold_y[t][0]) = make_float4(y[0], y[1], y[2], y[3]);
    *reinterpret_cast<float4*>(&sm.fold_y[t][4]) = make_float4(y[4], y[5], y[6], y[7]);
}

// Adds the groups' sums of the parts (fold_level_parts) to a row's own result: its output chunk
// `y` (normalised) and natural-log lse, both rewritten as the merge over all of the row's KV.
template <int D, int GH>
__device__ __forceinline__ void add_level_parts(const DecodeMerge<D, GH, true>& sm, int h, int dc,
                                                float (&y)[8], float& lse_h) {
    constexpr int LPT = D / 8, PAIRS = GH * LPT, GROUPS = DECODE_WARPS * 32 / PAIRS;
    float m = lse_h;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) m = fmaxf(m, sm.fold_m[g * PAIRS + h * LPT + dc]);
    if (m == neg_inf()) return;  // no key anywhere: y is zeros and lse -inf already
    const float w = lse_h == neg_inf() ? 0.f : expf(lse_h - m);
    float total = w;
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] *= w;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
        const int at = g * PAIRS + h * LPT + dc;
        if (sm.fold_m[at] == neg_inf()) continue;
        const float s = expf(sm.fold_m[at] - m);
        total += s * sm.fold_total[at];
#pragma unroll
        for (int i = 0; i < 8; ++i) y[i] += s * sm.fold_y[at][i];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] /= total;
    lse_h = m + logf(total);
}

// The warps' states (each merged over its token groups) merged through shared memory and
// written: a whole segment as the final result, a piece of one as a partial state in the
// block's slot 0 (the piece its range starts with) or 1 (the one it ends with); a whole
// segment's rows with a cascade level's `parts` folded in where FOLD. `sync` is a barrier of the
// DECODE_WARPS warps that attend.
template <int D, int GH, typename KV, bool FOLD, typename Sync>
__device__ __forceinline__ void write_segment(DecodeRows<D, GH, KV>& r, DecodeMerge<D, GH, FOLD>& sm,
                                              const DecodeSegment& sg, bool first_piece,
                                              int num_q_heads, float v_scale, bf16* out,
                                              float* lse, float* part_o, float* part_lse,
                                              const LevelParts& parts, Sync sync) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ts = lane / DecodeRows<D, GH, KV>::LPT, dc = lane % DecodeRows<D, GH, KV>::LPT;
    if (ts == 0) {
#pragma unroll
        for (int h = 0; h < GH; ++h) {
            if (dc == 0) {
                sm.m[warp][h] = r.m[h];
                sm.l[warp][h] = r.l[h];
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) sm.acc[warp][h][dc * 8 + i] = r.acc[h][i];
        }
    }
    if constexpr (FOLD) {
        if (sg.whole()) fold_level_parts(sm, parts, (size_t)sg.seq * num_q_heads + sg.head0);
    }
    sync();
    if (warp == 0 && ts == 0) {
        const int piece = blockIdx.x * 2 + (first_piece ? 0 : 1);
#pragma unroll
        for (int h = 0; h < GH; ++h) {
            for (int w = 1; w < DECODE_WARPS; ++w)
                merge_into(r.m[h], r.l[h], r.acc[h], sm.m[w][h], sm.l[w][h], &sm.acc[w][h][dc * 8]);
            const float inv = (r.l[h] > 0.f ? 1.f / r.l[h] : 0.f) * (KV::FP8 ? v_scale : 1.f);
            float y[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) y[i] = r.acc[h][i] * inv;
            float lse_h = row_lse(r.m[h], r.l[h]);
            if constexpr (FOLD) {
                if (sg.whole()) add_level_parts(sm, h, dc, y, lse_h);
            }
            if (sg.whole()) {
                const size_t row = (size_t)sg.seq * num_q_heads + sg.head0 + h;
                *reinterpret_cast<uint4*>(out + row * D + dc * 8) = float_to_chunk(y);
                if (lse != nullptr && dc == 0) lse[row] = lse_h;
            } else {
                float* dst = part_o + ((size_t)piece * GH + h) * D + dc * 8;
                *reinterpret_cast<float4*>(dst) = make_float4(y[0], y[1], y[2], y[3]);
                *reinterpret_cast<float4*>(dst + 4) = make_float4(y[4], y[5], y[6], y[7]);
                if (dc == 0) part_lse[(size_t)piece * GH + h] = lse_h;
            }
        }
    }
    sync();  // shared memory is reused by the next segment
}

// Every lane loads its own chunks: a warp takes units of CH slots in turn, issuing all of a
// unit's loads before using any, so 2 * DECODE_UNROLL 16-byte loads a lane are in flight.
template <int D, int GH, typename KV, bool FOLD>
__device__ __forceinline__ void decode_attention(
    const bf16* __restrict__ q, const typename KV::T* __restrict__ k_cache,
    const typename KV::T* __restrict__ v_cache,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_page_ids,
    const int* __restrict__ kv_page_lens, const int* __restrict__ slot_indptr,
    bf16* __restrict__ out, float* __restrict__ lse, float* __restrict__ part_o,
    float* __restrict__ part_lse, int num_seqs, int num_q_heads, int num_kv_heads,
    int page_size, int page_shift, int num_pages, float sm_scale, int min_range, float k_scale,
    float v_scale, LevelParts parts) {
    using Rows = DecodeRows<D, GH, KV>;
    constexpr int CH = Rows::TPW * DECODE_UNROLL;  // slots a warp handles per iteration
    static_assert(SLOT_ALIGN % CH == 0, "ranges must hold whole iterations");
    __shared__ DecodeMerge<D, GH, FOLD> sm;
    __shared__ int s_first;

    let_next_kernel_start();  // the merge's blocks wait for this kernel's pieces
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ts = lane / Rows::LPT, dc = lane % Rows::LPT;  // token slot in the warp, chunk of the row
    const int groups = num_q_heads / GH;
    const int first = first_entry(slot_indptr, num_seqs);
    const auto [begin, end] = block_part(slot_indptr, num_seqs, groups, min_range);
    if (begin >= end) {
        end_after_previous_kernel();
        return;
    }
    int seq = first_sequence(begin, slot_indptr, num_seqs, groups, s_first, first);

    const float scale = sm_scale * LOG2E;
    long long pos = begin;
    while (pos < end) {
        const DecodeSegment sg =
            segment_at(pos, end, seq, slot_indptr, kv_indptr, groups, GH, num_q_heads,
                       num_kv_heads, CH);
        Rows r;
        r.begin(q, sg.seq, num_q_heads, sg.head0, dc, scale, k_scale);
        // The page table entries of a unit's slots, read a unit ahead: only a segment's first
        // unit waits for its entries before its K/V loads, the next ones' arrive meanwhile.
        int page[DECODE_UNROLL], len[DECODE_UNROLL];
        auto entries = [&](int u) {
#pragma unroll
            for (int uu = 0; uu < DECODE_UNROLL; ++uu) {
                const int e = (u * CH + uu * Rows::TPW + ts) >> page_shift;
                const bool in = u < sg.u_end && e < sg.num_entries;
                page[uu] = in ? kv_page_ids[sg.e0 + e] : -1;
                len[uu] = in ? kv_page_lens[sg.e0 + e] : 0;
            }
        };
        entries(sg.u_begin + warp);
        for (int u = sg.u_begin + warp; u < sg.u_end; u += DECODE_WARPS) {
            uint4 kc[DECODE_UNROLL], vc[DECODE_UNROLL];
            bool valid[DECODE_UNROLL];
            // Issue every load of this iteration first, then use them.
#pragma unroll
            for (int uu = 0; uu < DECODE_UNROLL; ++uu) {
                const int offset = (u * CH + uu * Rows::TPW + ts) & (page_size - 1);
                valid[uu] = offset < len[uu] && page[uu] >= 0 && page[uu] < num_pages;
                if (valid[uu]) {
                    const size_t row =
                        ((size_t)page[uu] * num_kv_heads + sg.kv_head) * page_size + offset;
                    kc[uu] = load_kv(k_cache + row * D + dc * 8);
                    vc[uu] = load_kv(v_cache + row * D + dc * 8);
                } else {
                    kc[uu] = vc[uu] = make_uint4(0, 0, 0, 0);
                }
            }
            entries(u + DECODE_WARPS);
            r.attend(kc, vc, valid);
        }
        r.merge_token_groups();
        write_segment(r, sm, sg, pos == begin, num_q_heads, v_scale, out, lse, part_o, part_lse,
                      parts, [] { __syncthreads(); });
        pos = sg.next();
    }
    end_after_previous_kernel();
}

#if __CUDA_ARCH__ >= 900
// On Hopper, head_dim 128: the copy engine loads K/V into a ring of shared-memory stages and the
// warps read them from there (FlashInfer's decode also stages K/V through shared memory, with
// cp.async; here one bulk copy a page piece, cp.async.bulk, needs no thread per 16 bytes). Why:
// with every lane loading its own chunks, the loads in flight are what the warps' registers
// hold, and a warp issues its next loads only after using its last. Over an FP8 cache that
// held the memory back most: a row is 128 bytes, a lane's load 8, so half the bytes of bf16's
// loads were in flight. A producer warp keeps a 32 KiB ring of stages of BULK_SLOTS slots in
// flight a block (2 stages of bf16, 4 of FP8), walking the same units as the consumers, whatever
// they are computing. Measured on an H100 against the per-lane loads, two q heads a block: FP8
// 7-19% less time a call; bf16 from 3% less on large batches to 6% more on 16-64 serving
// sequences, so bf16 keeps the per-lane loads (rings of 48 and 64 KiB, eight
// consumer warps, or registers capped for more blocks an SM were all slower). At four or eight
// heads a block the consumers' registers leave it half the blocks an SM, and FP8 is slower.
//
//   block = DECODE_WARPS consumer warps, then one producer warp. Stage t holds unit i's K and V
//   rows (i % STAGES == t); a unit of BULK_SLOTS slots lies in one page of 32 slots or more, or
//   in two pages of 16, each copied by one instruction a tensor (the HND layout keeps a page's
//   rows of one KV head contiguous). The producer reads the page table for 32 units at once,
//   one lane a unit, and lane 0 waits for each stage to be free ("empty", one arrival a
//   consumer warp), writes how many of each page piece's slots hold tokens, and starts the
//   copies, whose bytes complete the stage's "full" mbarrier. Each consumer warp takes one
//   DECODE_UNROLL iteration of the stage, its loads from shared memory, and releases the stage
//   before computing.
#define BULK_RING_BYTES 32768
#define BULK_SLOTS 32
#define BULK_CONSUMERS_BARRIER 1

// A lane's chunk of a cache row in shared memory: 16 bytes of bf16, or 8 FP8 codes in the low
// half.
template <typename KV>
__device__ __forceinline__ uint4 shared_kv(const unsigned char* p) {
    if constexpr (KV::FP8) {
        const uint2 h = *reinterpret_cast<const uint2*>(p);
        return make_uint4(h.x, h.y, 0u, 0u);
    } else {
        return *reinterpret_cast<const uint4*>(p);
    }
}

template <int GH, typename KV>
__device__ __forceinline__ void decode_attention_bulk(
    const bf16* __restrict__ q, const typename KV::T* __restrict__ k_cache,
    const typename KV::T* __restrict__ v_cache,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_page_ids,
    const int* __restrict__ kv_page_lens, const int* __restrict__ slot_indptr,
    bf16* __restrict__ out, float* __restrict__ lse, float* __restrict__ part_o,
    float* __restrict__ part_lse, int num_seqs, int num_q_heads, int num_kv_heads,
    int page_size, int page_shift, int num_pages, float sm_scale, int min_range, float k_scale,
    float v_scale) {
    constexpr int D = 128;
    using Rows = DecodeRows<D, GH, KV>;
    constexpr int ROW = D * (int)sizeof(typename KV::T);  // bytes of a cache row
    constexpr int TENSOR = BULK_SLOTS * ROW;              // a stage's K, or its V
    constexpr int STAGES = BULK_RING_BYTES / (2 * TENSOR);
    constexpr int WARP_SLOTS = Rows::TPW * DECODE_UNROLL;
    static_assert(WARP_SLOTS * DECODE_WARPS == BULK_SLOTS, "a stage is an iteration a warp");
    static_assert(SLOT_ALIGN % BULK_SLOTS == 0, "ranges must hold whole units");
    extern __shared__ __align__(128) unsigned char ring[];  // [stage][K, V][slot][ROW]
    __shared__ u64 full[STAGES], empty[STAGES];
    __shared__ int held[STAGES][2];  // slots holding tokens, from each page piece's first
    __shared__ DecodeMerge<D, GH, false> sm;
    __shared__ int s_first;

    let_next_kernel_start();  // the merge's blocks wait for this kernel's pieces
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int groups = num_q_heads / GH;
    const int first = first_entry(slot_indptr, num_seqs);
    const auto [begin, end] = block_part(slot_indptr, num_seqs, groups, min_range);
    if (begin >= end) {
        end_after_previous_kernel();
        return;
    }
    if (threadIdx.x == 0) {
        for (int t = 0; t < STAGES; ++t) {
            mbarrier_init(&full[t], 1);
            mbarrier_init(&empty[t], DECODE_WARPS);
        }
        mbarrier_init_fence();
    }
    // Its block-wide barriers also publish the mbarriers' initialisation.
    int seq = first_sequence(begin, slot_indptr, num_seqs, groups, s_first, first);
    // A page piece: the slots of a unit in one page.
    const int piece_slots = min(page_size, BULK_SLOTS);

    int unit = 0;  // units walked so far: unit i uses stage i % STAGES
    long long pos = begin;
    if (warp == DECODE_WARPS) {
        while (pos < end) {
            const DecodeSegment sg =
                segment_at(pos, end, seq, slot_indptr, kv_indptr, groups, GH, num_q_heads,
                           num_kv_heads, BULK_SLOTS);
            for (int u0 = sg.u_begin; u0 < sg.u_end; u0 += 32) {
                // Lane l reads unit u0 + l's pages: each piece's first cache row and how many
                // of its slots hold tokens.
                int row[2] = {0, 0}, n[2] = {0, 0};
                const int u = u0 + lane;
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int slot = u * BULK_SLOTS + j * piece_slots;
                    const int e = slot >> page_shift, offset = slot & (page_size - 1);
                    if (u < sg.u_end && j * piece_slots < BULK_SLOTS && e < sg.num_entries) {
                        const int len = min(kv_page_lens[sg.e0 + e], page_size);
                        const int page = kv_page_ids[sg.e0 + e];
                        if (page >= 0 && page < num_pages) {
                            n[j] = max(0, min(len - offset, piece_slots));
                            row[j] = (page * num_kv_heads + sg.kv_head) * page_size + offset;
                        }
                    }
                }
                const int count = min(32, sg.u_end - u0);
                for (int i = 0; i < count; ++i, ++unit) {
                    const int r0 = __shfl_sync(FULL_MASK, row[0], i);
                    const int n0 = __shfl_sync(FULL_MASK, n[0], i);
                    const int r1 = __shfl_sync(FULL_MASK, row[1], i);
                    const int n1 = __shfl_sync(FULL_MASK, n[1], i);
                    if (lane != 0) continue;
                    const int t = unit % STAGES;
                    if (unit >= STAGES) mbarrier_wait(&empty[t], ((unit / STAGES) & 1) ^ 1);
                    held[t][0] = n0;
                    held[t][1] = n1;
                    mbarrier_arrive_expect_tx(&full[t], (u32)(2 * (n0 + n1) * ROW));
                    unsigned char* stage = ring + t * 2 * TENSOR;  // K, then V
                    if (n0 > 0) {
                        bulk_copy_to_shared(stage, k_cache + (size_t)r0 * D, n0 * ROW, &full[t]);
                        bulk_copy_to_shared(stage + TENSOR, v_cache + (size_t)r0 * D, n0 * ROW,
                                            &full[t]);
                    }
                    if (n1 > 0) {
                        unsigned char* dst = stage + piece_slots * ROW;
                        bulk_copy_to_shared(dst, k_cache + (size_t)r1 * D, n1 * ROW, &full[t]);
                        bulk_copy_to_shared(dst + TENSOR, v_cache + (size_t)r1 * D, n1 * ROW,
                                            &full[t]);
                    }
                }
            }
            pos = sg.next();
        }
        end_after_previous_kernel();  // the producer: the consumers may be computing still
        return;
    }

    const int ts = lane / Rows::LPT, dc = lane % Rows::LPT;  // token slot in the warp, chunk of the row
    const float scale = sm_scale * LOG2E;
    while (pos < end) {
        const DecodeSegment sg =
            segment_at(pos, end, seq, slot_indptr, kv_indptr, groups, GH, num_q_heads,
                       num_kv_heads, BULK_SLOTS);
        Rows r;
        r.begin(q, sg.seq, num_q_heads, sg.head0, dc, scale, k_scale);
        for (int u = sg.u_begin; u < sg.u_end; ++u, ++unit) {
            const int t = unit % STAGES;
            mbarrier_wait(&full[t], (unit / STAGES) & 1);
            const unsigned char* stage = ring + t * 2 * TENSOR;  // K, then V
            uint4 kc[DECODE_UNROLL], vc[DECODE_UNROLL];
            bool valid[DECODE_UNROLL];
#pragma unroll
            for (int uu = 0; uu < DECODE_UNROLL; ++uu) {
                const int slot = warp * WARP_SLOTS + uu * Rows::TPW + ts;  // in the stage
                const int j = slot / piece_slots, offset = slot & (piece_slots - 1);
                valid[uu] = offset < held[t][j];
                const int at = slot * ROW + dc * 8 * (int)sizeof(typename KV::T);
                kc[uu] = valid[uu] ? shared_kv<KV>(stage + at) : make_uint4(0, 0, 0, 0);
                vc[uu] = valid[uu] ? shared_kv<KV>(stage + TENSOR + at) : make_uint4(0, 0, 0, 0);
            }
            __syncwarp();
            if (lane == 0) mbarrier_arrive(&empty[t]);
            r.attend(kc, vc, valid);
        }
        r.merge_token_groups();
        write_segment(r, sm, sg, pos == begin, num_q_heads, v_scale, out, lse, part_o, part_lse,
                      LevelParts{}, [] {
                          asm volatile("bar.sync %0, %1;\n" ::"n"(BULK_CONSUMERS_BARRIER),
                                       "n"(DECODE_WARPS * 32)
                                       : "memory");
                      });
        pos = sg.next();
    }
}
#endif

#ifndef DECODE_FOLDING
// Combines the pieces of every segment that two or more blocks shared; rows of segments a block
// held whole were written by it, and rows of empty segments (no KV) get zeros and lse -inf.
// One warp per (sequence, q head): lanes take pieces 32 at a time for the weights, then each
// lane owns D/32 of the output's dims, reading four pieces' outputs at once (a long sequence is
// cut into dozens of pieces, and one piece at a time waited on each read in turn: 2 x 32k tokens
// 6% slower). `blocks`, `min_range` and `gh` are the decode call's. Only the segment layout is
// read before waiting for the decode kernel, and every thread waits, even one with nothing to
// merge: a kernel after this one on the stream waits for this one only, so this one may not end
// before the decode kernel has. Beside a cascade level it is launched only where it writes
// some row: merge_has_work (kernels/src/decode.rs) applies its test on the host.
extern "C" __global__ void decode_merge_pieces(const int* __restrict__ slot_indptr,
                                               const float* __restrict__ part_o,
                                               const float* __restrict__ part_lse,
                                               bf16* __restrict__ out, float* __restrict__ lse,
                                               int num_seqs, int num_q_heads, int head_dim,
                                               int gh, int blocks, int min_range) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const bool past_end = row >= num_seqs * num_q_heads;
    const int seq = past_end ? 0 : row / num_q_heads, head = row % num_q_heads;
    const int g = head / gh, h = head % gh, groups = num_q_heads / gh;
    const int seg = slot_indptr[seq + 1] - slot_indptr[seq], all_slots = slot_indptr[num_seqs];
    wait_for_previous_kernel();
    if (past_end) return;  // the whole warp leaves together
    if (seg == 0) {
        for (int d = lane; d < head_dim; d += 32) out[(size_t)row * head_dim + d] = __float2bfloat16(0.f);
        if (lse != nullptr && lane == 0) lse[row] = neg_inf();
        return;
    }
    const long long range =
        block_range((long long)all_slots * groups, blocks, min_range);
    const long long a = (long long)slot_indptr[seq] * groups + (long long)g * seg;
    const long long c0 = a / range, c1 = (a + seg - 1) / range;
    if (c0 == c1) return;
    const int n = (int)(c1 - c0 + 1);
    // Piece i is block c0 + i's slot 0, except the first when the segment starts inside the
    // first block's range (then it is that block's slot 1).
    const bool first_in_slot1 = a != c0 * range;
    auto piece = [&](int i) -> size_t {
        return ((size_t)(c0 + i) * 2 + (i == 0 && first_in_slot1 ? 1 : 0)) * gh + h;
    };
    float mx = neg_inf();
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, part_lse[piece(i)]);
    mx = warp_max(mx);
    if (mx == neg_inf()) {  // every piece empty
        for (int d = lane; d < head_dim; d += 32) out[(size_t)row * head_dim + d] = __float2bfloat16(0.f);
        if (lse != nullptr && lane == 0) lse[row] = neg_inf();
        return;
    }
    float y[4] = {0.f, 0.f, 0.f, 0.f};  // head_dim <= 128: at most 4 dims a lane
    float total = 0.f;
    for (int i0 = 0; i0 < n; i0 += 32) {
        const int i = i0 + lane;
        const float w = i < n ? expf(part_lse[piece(i)] - mx) : 0.f;
        total += w;
        const int count = min(32, n - i0);
        for (int j0 = 0; j0 < count; j0 += 4) {
            float o[4][4];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                // Past the last piece, the last one again (its weight is not used).
                const float* src = part_o + piece(i0 + min(j0 + jj, count - 1)) * head_dim;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int d = lane + 32 * k;
                    o[jj][k] = d < head_dim ? src[d] : 0.f;
                }
            }
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const float wj = __shfl_sync(FULL_MASK, w, min(j0 + jj, 31));
                if (j0 + jj < count) {
#pragma unroll
                    for (int k = 0; k < 4; ++k) y[k] += wj * o[jj][k];
                }
            }
        }
    }
    total = warp_sum(total);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int d = lane + 32 * k;
        if (d < head_dim) out[(size_t)row * head_dim + d] = __float2bfloat16(y[k] / total);
    }
    if (lse != nullptr && lane == 0) lse[row] = mx + logf(total);
}
#endif

// `k_scale` and `v_scale` are the FP8 cache's scales (unused for bf16). The blocks an SM each
// kernel asks for (its registers), by q heads a block and cache element. One head asks for 7: it
// was named when ptxas, left to itself, gave the bf16 kernel 93-96 registers (5 blocks) where 72
// hold it without spills (since the page table is read ahead it takes 72 unasked). Two heads
// over bf16 ask for 5: with the page table read a unit ahead ptxas takes 124 registers (4
// blocks), 2.5-3.4% faster on 64 sequences of 1,024 tokens and 0.7-1.7% slower on 32-64
// serving sequences on an H100; 96 hold them without spills, as before the entries were read
// ahead, and no case measured there is slower than before. Two heads over FP8 name none: asked
// for 5, ptxas gives them more registers, not fewer (and asking for 1 block gives the bf16
// kernel 139). The larger groups name none. The folding kernels take the same bounds, and ptxas
// gives them the same registers at one and two heads over bf16, without spills.
#define DECODE_BOUNDS_1_KvBf16 __launch_bounds__(DECODE_WARPS * 32, 7)
#define DECODE_BOUNDS_1_KvFp8 __launch_bounds__(DECODE_WARPS * 32, 7)
#define DECODE_BOUNDS_2_KvBf16 __launch_bounds__(DECODE_WARPS * 32, 5)
#define DECODE_BOUNDS_2_KvFp8 __launch_bounds__(DECODE_WARPS * 32)
#define DECODE_BOUNDS_4_KvBf16 __launch_bounds__(DECODE_WARPS * 32)
#define DECODE_BOUNDS_4_KvFp8 __launch_bounds__(DECODE_WARPS * 32)
#define DECODE_BOUNDS_8_KvBf16 __launch_bounds__(DECODE_WARPS * 32)
#define DECODE_BOUNDS_8_KvFp8 __launch_bounds__(DECODE_WARPS * 32)
// Every decode kernel's parameters, and the arguments that pass them on.
#define DECODE_PARAMS(KV)                                                                     \
    const bf16 *q, const KV::T *k_cache, const KV::T *v_cache, const int *kv_indptr,         \
        const int *kv_page_ids, const int *kv_page_lens, const int *slot_indptr, bf16 *out,  \
        float *lse, float *part_o, float *part_lse, int num_seqs, int num_q_heads,           \
        int num_kv_heads, int page_size, int page_shift, int num_pages, float sm_scale,      \
        int min_range, float k_scale, float v_scale
#define DECODE_ARGS                                                                           \
    q, k_cache, v_cache, kv_indptr, kv_page_ids, kv_page_lens, slot_indptr, out, lse, part_o, \
        part_lse, num_seqs, num_q_heads, num_kv_heads, page_size, page_shift, num_pages,     \
        sm_scale, min_range, k_scale, v_scale
#define DECODE_KV(NAME, D, GH, KV)                                                            \
    extern "C" __global__ void DECODE_BOUNDS_##GH##_##KV NAME(DECODE_PARAMS(KV)) {            \
        decode_attention<D, GH, KV, false>(DECODE_ARGS, LevelParts{});                        \
    }
// The folding kernels (decode_attention_folding): a cascade level's parts as four more.
#define DECODE_FOLDING_KV(NAME, D, GH, KV)                                                    \
    extern "C" __global__ void DECODE_BOUNDS_##GH##_##KV NAME(                                \
        DECODE_PARAMS(KV), const bf16* fold_o, const float* fold_lse, int fold_pieces,        \
        int fold_stride) {                                                                    \
        decode_attention<D, GH, KV, true>(DECODE_ARGS,                                        \
                                          LevelParts{fold_o, fold_lse, fold_pieces, fold_stride}); \
    }
// The file is compiled twice (kernels/src/source.rs): as the decode kernels, and with
// DECODE_FOLDING defined as the folding kernels in place of the others (decode_merge_pieces
// included), which only cascade attention runs.
#ifdef DECODE_FOLDING
#define DECODE(D, GH)                                                               \
    DECODE_FOLDING_KV(decode_attention_folding_d##D##_g##GH, D, GH, KvBf16)         \
    DECODE_FOLDING_KV(decode_attention_folding_fp8_d##D##_g##GH, D, GH, KvFp8)
#else
#define DECODE(D, GH)                                                               \
    DECODE_KV(decode_attention_d##D##_g##GH, D, GH, KvBf16)                         \
    DECODE_KV(decode_attention_fp8_d##D##_g##GH, D, GH, KvFp8)
#endif

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

#if __CUDA_ARCH__ >= 900 && !defined(DECODE_FOLDING)
#define DECODE_BULK_KV(NAME, GH, KV)                                                          \
    extern "C" __global__ void __launch_bounds__((DECODE_WARPS + 1) * 32)                     \
        NAME(DECODE_PARAMS(KV)) {                                                             \
        decode_attention_bulk<GH, KV>(DECODE_ARGS);                                           \
    }
#define DECODE_BULK(GH)                                             \
    DECODE_BULK_KV(decode_attention_bulk_d128_g##GH, GH, KvBf16)    \
    DECODE_BULK_KV(decode_attention_bulk_fp8_d128_g##GH, GH, KvFp8)

DECODE_BULK(1)
DECODE_BULK(2)
DECODE_BULK(4)
DECODE_BULK(8)
#endif
