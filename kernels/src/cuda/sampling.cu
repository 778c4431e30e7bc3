// Sampling the next token on the device, one block per row of logits.
//
// Greedy (temperature 0) is an argmax, lowest index on ties. Otherwise the procedure is the one
// of phase2's sampler.rs, step for step, so that a seeded request draws the same token on the
// CPU and on the GPU:
//   weight(x) = exp((x - max) / T)
//   top-k: the threshold is the k-th largest logit (ties at it stay candidates);
//   top-p: among the top-k list (exactly k entries, in descending order), the shortest head whose
//          mass reaches top_p of the list's mass; its last logit is the threshold;
//   candidates are the logits >= threshold; u = uniform(seed, step) (SplitMix64), and the token
//   is the first candidate, in vocabulary order, at which the running weight exceeds
//   u * (total candidate weight).
// Instead of sorting 150k logits, thresholds are found by radix selection over the logits'
// bits: logits are mapped to unsigned keys with the same order, and four passes pick the key
// one byte at a time from a 256-bin histogram of counts (top-k) or weights (top-p).
//
// Weights are summed as 40-bit fixed point in 64-bit integers: integer sums do not depend on
// the order of addition, so every run gives the same answer, and the precision (2^-40 per term)
// is finer than the f32 sums of the CPU. The CPU and the GPU can therefore only disagree when
// the draw lands within f32 rounding of a boundary between two tokens.

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define FIXED_ONE 1099511627776.0f  // 2^40

struct SampleParams {
    float temperature;
    int top_k;
    float top_p;
    u32 pad;
    u64 seed;
    u64 step;
};

struct SampleShared {
    u64 hist[256];
    u64 scan[SAMPLE_WARPS];
    float fval[SAMPLE_WARPS];
    int fidx[SAMPLE_WARPS];
    u32 bin;
    u64 above;
};

__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Maps a float to an unsigned key with the same order (the order of f32::total_cmp).
__device__ __forceinline__ u32 order_key(float x) {
    const u32 b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ float load_logit(const float* row, int i) { return row[i]; }
__device__ __forceinline__ float load_logit(const bf16* row, int i) { return __bfloat162float(row[i]); }

// Passes the logits of the 16-byte chunk c, which starts at index i, to f(index, value).
template <typename F>
__device__ __forceinline__ void visit_chunk(const float*, const uint4 c, int i, F& f) {
    f(i, __uint_as_float(c.x));
    f(i + 1, __uint_as_float(c.y));
    f(i + 2, __uint_as_float(c.z));
    f(i + 3, __uint_as_float(c.w));
}

template <typename F>
__device__ __forceinline__ void visit_chunk(const bf16*, const uint4 c, int i, F& f) {
    const u32 w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        f(i + 2 * j, __uint_as_float(w[j] << 16));
        f(i + 2 * j + 1, __uint_as_float(w[j] & 0xffff0000u));
    }
}

// Calls f(index, logit) for the logits in [begin, end) that `worker` of `workers` owns when they
// walk the range in 16-byte chunks, four chunks in flight per worker: a pass over a row of
// 150k logits is bound by how many loads are in flight, not by arithmetic. One logit at a time
// where the range is not 16-byte aligned. Each worker sees its indices in increasing order.
template <typename T, typename F>
__device__ __forceinline__ void for_each_logit(const T* row, int begin, int end, int worker,
                                               int workers, F f) {
    constexpr int V = 16 / sizeof(T);
    int tail = begin;
    if ((reinterpret_cast<size_t>(row + begin) & 15) == 0) {
        const uint4* chunks = reinterpret_cast<const uint4*>(row + begin);
        const int n = (end - begin) / V;
        int c = worker;
        for (; c + 3 * workers < n; c += 4 * workers) {
            uint4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = chunks[c + u * workers];
#pragma unroll
            for (int u = 0; u < 4; ++u) visit_chunk(row, v[u], begin + (c + u * workers) * V, f);
        }
        for (; c < n; c += workers) visit_chunk(row, chunks[c], begin + c * V, f);
        tail = begin + n * V;
    }
    for (int i = tail + worker; i < end; i += workers) f(i, load_logit(row, i));
}

// Precise expf and a true division, as on the CPU.
__device__ __forceinline__ u64 fixed_weight(float x, float max, float temperature) {
    return (u64)(expf((x - max) / temperature) * FIXED_ONE);
}

__device__ __forceinline__ u64 block_sum_u64(u64 v, SampleShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();
    if (lane == 0) s.scan[warp] = v;
    __syncthreads();
    u64 total = 0;
    for (int w = 0; w < SAMPLE_WARPS; ++w) total += s.scan[w];
    return total;
}

// Adds every lane's `c` to hist[bin] (bin 256: nothing to add) with one shared-memory atomic
// per distinct bin in the warp. Logits cluster in a few exponent bins, so plain per-lane atomics
// would queue on the same few addresses; instead the lanes of a bin are found with
// __match_any_sync and their contributions summed first (a popcount for counts, shuffles for
// weights). Every lane of the warp must call this.
template <bool WEIGHTED>
__device__ __forceinline__ void add_to_histogram(u64* hist, u32 bin, u64 c, int lane) {
    const u32 peers = __match_any_sync(FULL_MASK, bin);
    u32 leaders = __ballot_sync(FULL_MASK, lane == __ffs(peers) - 1 && bin < 256);
    while (leaders) {  // the same on every lane: the loop stays converged
        const int l = __ffs(leaders) - 1;
        leaders &= leaders - 1;
        const u32 group = __shfl_sync(FULL_MASK, peers, l);
        u64 v;
        if (WEIGHTED) {
            v = (group >> lane) & 1u ? c : 0ull;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
        } else {
            v = __popc(group);
        }
        if (lane == l) atomicAdd(&hist[bin], v);
    }
}

// The largest key v such that the participating elements with key >= v add up to >= need
// (their count, or their fixed-point weight). Participating: every element, or with `strict`
// only those with key > lo_key. Four passes, one byte of the key each, most significant first.
template <typename T, bool WEIGHTED>
__device__ u32 radix_select(const T* row, int vocab, u64 need, bool strict, u32 lo_key, float max,
                            float temperature, SampleShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 prefix = 0, mask = 0;
    u64 above = 0;  // what the elements above the chosen prefix range already contribute
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += SAMPLE_THREADS) s.hist[i] = 0;
        __syncthreads();
        // The loop bound is the same for the whole block, so warps stay converged for the
        // warp-wide intrinsics in add_to_histogram.
        for (int base = 0; base < vocab; base += SAMPLE_THREADS) {
            const int i = base + threadIdx.x;
            u32 bin = 256;
            u64 c = 0;
            if (i < vocab) {
                const float x = load_logit(row, i);
                const u32 k = order_key(x);
                if (!(strict && k <= lo_key) && (k & mask) == prefix) {
                    bin = (k >> shift) & 255;
                    c = WEIGHTED ? fixed_weight(x, max, temperature) : 1ull;
                }
            }
            add_to_histogram<WEIGHTED>(s.hist, bin, c, lane);
        }
        __syncthreads();
        if (warp == 0) {
            // Lane l sums bins 255-8l down to 248-8l; a scan over lanes runs from the top bin down.
            u64 local = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) local += s.hist[255 - 8 * lane - j];
            u64 incl = local;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u64 t = __shfl_up_sync(FULL_MASK, incl, o);
                if (lane >= o) incl += t;
            }
            const u64 excl = incl - local;
            const bool crosses = above + excl < need && above + incl >= need;
            if (crosses) {
                u64 run = above + excl;
                for (int j = 0; j < 8; ++j) {
                    const int b = 255 - 8 * lane - j;
                    if (run + s.hist[b] >= need) {
                        s.bin = b;
                        s.above = run;
                        break;
                    }
                    run += s.hist[b];
                }
            }
            // Unreachable when need <= the total; keep the lowest bin then.
            const u64 all = __shfl_sync(FULL_MASK, incl, 31);
            const bool none = __ballot_sync(FULL_MASK, crosses) == 0;
            if (none && lane == 0) {
                s.bin = 0;
                s.above = above + all - s.hist[0];
            }
        }
        __syncthreads();
        prefix |= s.bin << shift;
        mask |= 0xffu << shift;
        above = s.above;
    }
    return prefix;
}

template <typename T>
__device__ __forceinline__ void sample_row(const T* __restrict__ logits, int vocab,
                                           const SampleParams* __restrict__ params,
                                           u32* __restrict__ out) {
    __shared__ SampleShared s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const T* row = logits + (size_t)blockIdx.x * vocab;
    const SampleParams p = params[blockIdx.x];

    if (p.temperature == 0.f) {
        // Argmax; each thread sees increasing indices, so a strict > keeps the first maximum.
        float best = neg_inf();
        int idx = 0x7fffffff;
        for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
            const float x = load_logit(row, i);
            if (x > best) {
                best = x;
                idx = i;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(FULL_MASK, best, o);
            const int oi = __shfl_xor_sync(FULL_MASK, idx, o);
            if (ob > best || (ob == best && oi < idx)) {
                best = ob;
                idx = oi;
            }
        }
        if (lane == 0) {
            s.fval[warp] = best;
            s.fidx[warp] = idx;
        }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < SAMPLE_WARPS; ++w) {
                if (s.fval[w] > best || (s.fval[w] == best && s.fidx[w] < idx)) {
                    best = s.fval[w];
                    idx = s.fidx[w];
                }
            }
            out[blockIdx.x] = idx == 0x7fffffff ? 0u : (u32)idx;  // all -inf: index 0, as the CPU
        }
        return;
    }

    // Maximum (NaN ignored, as f32::max does).
    float mx = neg_inf();
    for_each_logit(row, 0, vocab, tid, SAMPLE_THREADS, [&](int, float x) { mx = fmaxf(mx, x); });
    mx = warp_max(mx);
    if (lane == 0) s.fval[warp] = mx;
    __syncthreads();
    for (int w = 0; w < SAMPLE_WARPS; ++w) mx = fmaxf(mx, s.fval[w]);
    const float temp = p.temperature;

    const bool top_k_on = p.top_k > 0 && p.top_k < vocab;
    const bool top_p_on = p.top_p < 1.f;
    float threshold = neg_inf();
    if (top_k_on || top_p_on) {
        u32 k_key = 0;
        u64 sum_gt = 0, total = 0;
        if (top_k_on) {
            k_key = radix_select<T, false>(row, vocab, (u64)p.top_k, false, 0, mx, temp, s);
            // The list of exactly k entries: everything above the k-th value, then copies of it.
            u64 cnt = 0, sum = 0;
            for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
                const float x = load_logit(row, i);
                if (order_key(x) > k_key) {
                    cnt += 1;
                    sum += fixed_weight(x, mx, temp);
                }
            }
            const u64 cnt_gt = block_sum_u64(cnt, s);
            sum_gt = block_sum_u64(sum, s);
            total = sum_gt + ((u64)p.top_k - cnt_gt) * fixed_weight(key_value(k_key), mx, temp);
        } else {
            u64 sum = 0;
            for (int i = tid; i < vocab; i += SAMPLE_THREADS)
                sum += fixed_weight(load_logit(row, i), mx, temp);
            total = block_sum_u64(sum, s);
        }
        u32 key = k_key;
        if (top_p_on) {
            double need_f = ceil((double)p.top_p * (double)total);
            const u64 need = need_f < 1.0 ? 1ull : (u64)need_f;
            if (!top_k_on)
                key = radix_select<T, true>(row, vocab, need, false, 0, mx, temp, s);
            else if (sum_gt >= need)
                key = radix_select<T, true>(row, vocab, need, true, k_key, mx, temp, s);
        }
        threshold = key_value(key);
    }

    // The draw. Each warp owns a contiguous range of the vocabulary (a multiple of 256 logits,
    // so that its lanes' 16-byte loads are aligned); warp totals in warp order are then prefix
    // sums in vocabulary order.
    const int per_warp = ((vocab + SAMPLE_WARPS - 1) / SAMPLE_WARPS + 255) / 256 * 256;
    const int begin = min(vocab, warp * per_warp), end = min(vocab, begin + per_warp);
    u64 local = 0;
    for_each_logit(row, begin, end, lane, 32, [&](int, float x) {
        if (x >= threshold) local += fixed_weight(x, mx, temp);
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(FULL_MASK, local, o);
    __syncthreads();  // s.scan may still be read by the last block_sum_u64
    if (lane == 0) s.scan[warp] = local;
    __syncthreads();
    u64 kept = 0;
    for (int w = 0; w < SAMPLE_WARPS; ++w) kept += s.scan[w];
    const u64 bits = splitmix64(p.seed ^ splitmix64(p.step)) >> 40;  // 24 random bits
    // target = floor(kept * u), u = bits / 2^24, computed exactly in 128 bits.
    const u64 lo = kept * bits, hi = __umul64hi(kept, bits);
    const u64 target = (hi << 40) | (lo >> 24);
    // Exactly one warp's range holds the first candidate whose running weight exceeds target
    // (the same answer in every thread).
    int owner = -1;
    u64 before = 0;
    for (int w = 0; w < SAMPLE_WARPS && owner < 0; ++w) {
        if (target < before + s.scan[w])
            owner = w;
        else
            before += s.scan[w];
    }
    if (owner < 0) return;  // nothing kept
    // The whole block searches that range rather than one warp: each thread sums its own
    // contiguous piece of a few logits, a scan over the block picks the one thread whose piece
    // holds target, and that thread walks its piece in order. (A warp doing this alone walked
    // 150 logits per lane, twice, each with a precise expf and a division: a third of the time
    // of a row.)
    const int ob = min(vocab, owner * per_warp), oe = min(vocab, ob + per_warp);
    const int piece = (per_warp + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lb = min(oe, ob + tid * piece), le = min(oe, lb + piece);
    u64 mine = 0;
    for_each_logit(row, lb, le, 0, 1, [&](int, float x) {
        if (x >= threshold) mine += fixed_weight(x, mx, temp);
    });
    u64 incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads();  // every thread has read s.scan above
    if (lane == 31) s.scan[warp] = incl;
    __syncthreads();
    u64 run = before + incl - mine;
    for (int w = 0; w < warp; ++w) run += s.scan[w];
    if (target < run || target >= run + mine) return;
    // Running weight only grows at candidates, so the first index past target is one.
    int chosen = -1;
    for_each_logit(row, lb, le, 0, 1, [&](int i, float x) {
        if (chosen < 0 && x >= threshold) {
            run += fixed_weight(x, mx, temp);
            if (run > target) chosen = i;
        }
    });
    out[blockIdx.x] = (u32)chosen;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_f32(const float* logits, int vocab, const SampleParams* params, u32* out) {
    sample_row<float>(logits, vocab, params, out);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_bf16(const bf16* logits, int vocab, const SampleParams* params, u32* out) {
    sample_row<bf16>(logits, vocab, params, out);
}
