// Sampling the next token on the device: a cluster of thread blocks per row of logits.
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
// Weights are computed as 2^((x - max) * log2(e) / T) with the hardware's exp2 (one instruction,
// relative error below 2^-21 where the CPU's expf is correctly rounded) and summed as 40-bit fixed
// point in 64-bit integers: integer sums do not depend on the order of addition, so every run
// gives the same answer, and the precision (2^-40 per term) is finer than the f32 sums of the
// CPU. The CPU and the GPU can therefore only disagree when the draw lands within a few
// millionths of a boundary between two tokens.
//
// Thresholds are found by radix selection instead of sorting 150k logits (the idea of AIR
// top-k in RAFT; FlashInfer instead samples without sorting by rejection against pivots, which
// draws other tokens than this procedure): logits map to unsigned keys with the same order, a
// histogram of the top 12 bits of the keys tells which bin holds the k-th logit (counts) or the
// top-p crossing (weights), and only that bin is looked at again.
//
// The layout, and why:
// - A cluster of blocks per row (Hopper's thread-block clusters), each block owning a contiguous
//   part of the row: 8 blocks of 256 threads while the batch's rows all fit on the device at
//   once (62 on an H100), else 2 blocks of 512 (132 fit), so every SM reads, where one block per
//   row left half of an H100 idle and read each row at one SM's bandwidth.
// - The blocks of a cluster can read and write each other's shared memory (distributed shared
//   memory, DSMEM), and wait for each other at a cluster barrier. Histograms are merged into
//   the first block of the cluster ("rank 0") with atomics on its shared memory, and rank 0's
//   decisions are written into every block's shared memory: no global atomics, no workspace,
//   one launch.
// - Once the bin is known, its logits (usually tens to a few thousand) are gathered into rank
//   0's shared memory (a "list" of key << 32 | index entries), where the rest of the selection
//   finishes without another pass over the row. With top-k on, the list holds every logit of
//   the k-th logit's bin and above, hence every candidate: rank 0 also draws the token from it
//   (a list of few more than k by ranking each entry against the others, finish_small).
// - Top-p without top-k guesses the bins' masses in the pass that finds the maximum (each logit
//   weighed against its own bin's largest value) and gathers the bins around the guessed
//   crossing in a second pass that also sums the exact weights; rank 0 checks exactly that the
//   crossing is among them, else the histogram of masses decides as above.
// - When a bin is too full to gather (many equal logits), the next 12 bits, then the last 8, are
//   histogrammed among the logits of that bin: slower, same answer.
// - Top-k with a small k on a large vocabulary skips the histogram: pass 1 keeps every warp's k
//   largest logits behind a threshold that rises as the warp reads (filter_top_k), the largest
//   threshold of the cluster bounds the row's k-th logit from below, and the logits at or above
//   it go to rank 0's list, which is cut to few more than k and finished as above. Logits the
//   warp's bound cannot tell apart (equal ones, a masked vocabulary's -inf) that fill its
//   segment, or more logits above the floor than rank 0's list holds, send the row back to the
//   histogram.
// - A gather appends to each block's own list, then copies it into rank 0's with one atomic on
//   rank 0's count a block: atomics on another block's shared memory wait for another SM.
// - The draw: each block's candidate mass tells which block holds the token, and that block's
//   per-warp masses which warp's stretch of the row (the pass that summed the masses read the
//   slice a warp a stretch: Layout); the block cuts the stretch into one small piece per thread,
//   a scan over the pieces finds the piece, and its thread walks it.
// Before Hopper the same code runs with a cluster of one block per row (cluster barriers are
// block barriers, "remote" shared memory is the block's own).
//
// Every write into another block's shared memory is followed by a cluster barrier before the
// owner reads it, and targets memory its owner no longer reads until that barrier; a block
// leaves only after the last barrier after which no other block touches its shared memory.

// The kernels at the end of the file differ only in their shape: blocks a row (the cluster) and
// threads a block; the code reads both at run time.
#define MAX_CLUSTER 8        // blocks a row at most (arrays indexed by a block's rank)
#define MAX_WARPS 32         // warps a block at most
#define SAMPLE_BINS 4096     // 12-bit histograms
#define SAMPLE_LIST 5120     // entries rank 0 can gather (40 KB, shared with the histogram)
#define SORT_LIST 2048       // the histogram path's top-k list that rank 0 sorts (a power of two)
#define FILTER_LIST 2560     // the filter's gathered top-k list: the list's first half (the second
                             // is cut_list's scratch)
#define SEGMENT_PER_LANE 10  // a warp's segment holds at most 32 x this many entries
#define SMALL_BINS 256       // rank 0's small histograms (s.small): a byte of the keys
#define LIST_BITS 10         // list_select's rounds where their histogram fits after the list
#define LIST_BINS (1 << LIST_BITS)
#define SMALL_LIST 256       // a list this short is finished without sorting (finish_small): at
                             // most a block's threads, one entry each
#define FIXED_ONE 1099511627776.0f  // 2^40

struct SampleParams {
    float temperature;
    int top_k;
    float top_p;
    u32 pad;
    u64 seed;
    u64 step;
};

// What rank 0 decides, written into every block of the cluster and read after the next cluster
// barrier.
struct Decision {
    u64 above;  // count or mass of the selected logits above the chosen bin (all levels so far)
    u64 mass;   // the chosen bin's count or mass
    u64 need;   // what the selection must reach
    u64 kept[MAX_CLUSTER];  // each block's candidate mass, once a weighted selection is done
    u32 bin;
    u32 try_list;  // the chosen bin is small enough to gather into rank 0's list
    u32 resolved;  // rank 0 found the key in its list
    u32 key;
};
#define DECISION_WORDS (sizeof(Decision) / 8)

struct alignas(16) SampleShared {  // aligned for 16-byte accesses to the histogram
    union {
        u32 hist[2 * SAMPLE_BINS];  // counts, or the low then the high 32 bits of masses
        u64 list[SAMPLE_LIST];      // rank 0's gathered logits: key << 32 | index
    };
    u32 small[2 * SMALL_BINS];      // rank 0's histograms over its list
    u64 scratch[MAX_WARPS];
    Decision d, stage;              // rank 0's decision as received, and as being written
    u64 sums[3][MAX_CLUSTER];    // every block's slice sums (see slice_sums)
    u64 acc[MAX_CLUSTER];        // rank 0: each block's candidate mass above the list's bin
    u64 warp_kept[MAX_WARPS];    // each warp's candidate mass in its stretch, where a pass knew it
    u64 warp_list[MAX_WARPS];    // each warp's candidate mass in rank 0's list (rank 0's)
    u64 best[MAX_CLUSTER];       // rank 0: each block's greedy pick
    float maxes[MAX_CLUSTER];    // each block's maximum
    u64 found[2];
    u32 found_bin;
    u32 list_count;  // entries gathered into rank 0's list (the filter: into every block's count)
    u32 floor;       // the filter: the largest warp threshold of the cluster
    u32 filled;      // the filter: warps whose segment filled with keys its bound cannot split
    u32 block_floor; // the filter: the largest warp threshold of the block so far
};

// Cluster primitives (inline PTX, sm_90): shared addresses are 32-bit offsets in the shared
// window; mapa turns one into the same variable's address in another block of the cluster.

#if __CUDA_ARCH__ >= 900
#define DSMEM ".shared::cluster"
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ u32 cluster_index() {
    u32 r;
    asm("mov.u32 %0, %%clusterid.x;" : "=r"(r));
    return r;
}
__device__ __forceinline__ int cluster_ranks() {
    u32 r;
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return (int)r;
}
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}
// The address of shared variable `p` in block `rank` of the cluster.
__device__ __forceinline__ u32 remote(const void* p, u32 rank) {
    u32 a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(a)
                 : "r"((u32)__cvta_generic_to_shared(p)), "r"(rank));
    return a;
}
#else
#define DSMEM ".shared"
__device__ __forceinline__ u32 cluster_rank() { return 0; }
__device__ __forceinline__ u32 cluster_index() { return blockIdx.x; }
__device__ __forceinline__ int cluster_ranks() { return 1; }
__device__ __forceinline__ void cluster_arrive() {}
__device__ __forceinline__ void cluster_wait() {}
__device__ __forceinline__ void cluster_sync() { __syncthreads(); }
__device__ __forceinline__ u32 remote(const void* p, u32) {
    return (u32)__cvta_generic_to_shared(p);
}
#endif

__device__ __forceinline__ void store_remote(u32 a, u64 v) {
    asm volatile("st" DSMEM ".u64 [%0], %1;" ::"r"(a), "l"(v) : "memory");
}
__device__ __forceinline__ void store_remote(u32 a, float v) {
    asm volatile("st" DSMEM ".f32 [%0], %1;" ::"r"(a), "f"(v) : "memory");
}
__device__ __forceinline__ u32 atomic_add_remote(u32 a, u32 v) {
    u32 old;
    asm volatile("atom" DSMEM ".add.u32 %0, [%1], %2;" : "=r"(old) : "r"(a), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ void add_remote(u32 a, u32 v) {
    asm volatile("red" DSMEM ".add.u32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}

// An atomic add on the block's own shared memory, as one instruction: atomicAdd from divergent
// threads makes the compiler pool the warp's adds first (a vote and a five-step scan), which costs
// more than the few adds that meet on one address.
__device__ __forceinline__ u32 atomic_add_own(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.shared.add.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "r"((u32)__cvta_generic_to_shared(p)), "r"(v)
                 : "memory");
    return old;
}

__device__ __forceinline__ int block_size() { return (int)blockDim.x; }

__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Maps a float to an unsigned key with the same order (that of f32::total_cmp, except that -0
// and +0, equal as floats, share one key): for any two non-NaN logits, x >= y exactly when
// key(x) >= key(y), so "candidate" can be tested on keys.
__device__ __forceinline__ u32 order_key(float x) {
    u32 b = __float_as_uint(x);
    b = b == 0x80000000u ? 0u : b;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// 2^x in one instruction.
__device__ __forceinline__ float fast_exp2(float x) {
    float w;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(w) : "f"(x));
    return w;
}

// The weight of logit x in fixed point; `scale` is log2(e) / T, so the exponent is one multiply.
__device__ __forceinline__ u64 fixed_weight(float x, float max, float scale) {
    return (u64)(fast_exp2((x - max) * scale) * FIXED_ONE);
}

// ceil(top_p * total), at least 1: the mass the top-p head must reach.
__device__ __forceinline__ u64 top_p_need(float top_p, u64 total) {
    const double need = ceil((double)top_p * (double)total);
    return need < 1.0 ? 1ull : (u64)need;
}

// floor(kept * u) for u = the request's 24 random bits / 2^24, exact in 128 bits.
__device__ __forceinline__ u64 draw_target(u64 kept, const SampleParams& p) {
    const u64 bits = splitmix64(p.seed ^ splitmix64(p.step)) >> 40;
    const u64 lo = kept * bits, hi = __umul64hi(kept, bits);
    return (hi << 40) | (lo >> 24);
}

__device__ __forceinline__ float load_logit(const float* row, int i) { return row[i]; }
__device__ __forceinline__ float load_logit(const bf16* row, int i) { return __bfloat162float(row[i]); }

// Logit j of a 16-byte chunk. Selects rather than an indexed array, so that the chunk stays in
// registers while j varies.
__device__ __forceinline__ u32 chunk_word(const uint4 c, int w) {
    return w == 0 ? c.x : w == 1 ? c.y : w == 2 ? c.z : c.w;
}
__device__ __forceinline__ float chunk_logit(const float*, const uint4 c, int j) {
    return __uint_as_float(chunk_word(c, j));
}
__device__ __forceinline__ float chunk_logit(const bf16*, const uint4 c, int j) {
    const u32 w = chunk_word(c, j >> 1);
    return __uint_as_float(j & 1 ? w & 0xffff0000u : w << 16);
}

// One row, as one block of its cluster sees it.
template <typename T>
struct Ctx {
    const T* row;
    int vocab;
    int per;  // logits per block (a multiple of 16: aligned 16-byte loads in every slice)
    u32 rank;
    int ranks;  // blocks in the cluster
    u32 row_index;
    SampleParams p;
    float max;
    float scale;  // log2(e) / temperature: weights are 2^((x - max) * scale)
};

// a / b for 0 <= a < 2^24 and b > 0, with inv = 1.0f / b: a float multiply, off by at most one,
// and a correction either way, instead of an integer division, which the hardware does not have
// (tens of instructions).
__device__ __forceinline__ int divide(int a, int b, float inv) {
    int q = (int)((float)a * inv);
    q -= q * b > a;
    q += (q + 1) * b <= a;
    return q;
}

// How a block's slice of a row is shared out among its warps: the unaligned head (fewer logits
// than a 16-byte chunk holds), whole chunks, and the tail. Each warp owns one run of `run`
// consecutive chunks (a multiple of 32: in each turn a warp reads 32 neighbouring chunks, 512
// bytes), the first warp also the head and the warp of the last chunk the tail. A warp's logits
// are thus one stretch of the row, so a pass's per-warp sums say which stretch holds a running
// sum's crossing (the draw), where sums per thread would not: a thread's chunks are 32 apart.
// Runs are sized for a full slice, so every block's warps split their slices alike (slices start
// at multiples of 16 logits, so their heads are alike too), and the last, shorter slice leaves
// its last warps idle.
template <typename T>
struct Layout {
    static constexpr int V = 16 / sizeof(T);
    int begin, body, tail, end;  // the head is [begin, body), the chunks [body, tail)
    int run;                     // chunks a warp owns
    int last;                    // the warp of the last chunk, which takes the tail too
    float inv_span;              // 1 / (run * V): a run's logits

    __device__ Layout(const Ctx<T>& c, int rank) {
        begin = min(c.vocab, rank * c.per);
        end = min(c.vocab, begin + c.per);
        const int misaligned = (int)((reinterpret_cast<size_t>(c.row + begin) & 15) / sizeof(T));
        const int head = misaligned ? V - misaligned : 0;
        body = min(end, begin + head);
        const int n = (end - body) / V;
        tail = body + n * V;
        const int warps = block_size() >> 5;
        run = ((max(c.per - head, 0) / V + warps - 1) / warps + 31) / 32 * 32;
        last = n > 0 ? (n - 1) / run : 0;
        inv_span = run > 0 ? 1.f / (float)(run * V) : 0.f;
    }
    __device__ int chunks() const { return (tail - body) / V; }
    // The logits warp w reads: [lo, hi), empty past the last warp.
    __device__ void stretch(int w, int& lo, int& hi) const {
        lo = w == 0 ? begin : w > last ? end : body + w * run * V;
        hi = w >= last ? (w == last ? end : lo) : body + (w + 1) * run * V;
    }
    // The warp that reads logit i of the slice.
    __device__ int warp_of(int i) const {
        return i < body ? 0 : min(divide(i - body, run * V, inv_span), last);
    }
};

// Calls g(index, x, valid) for the logits of the block's slice in 16-byte chunks: x holds a
// chunk's logits (16 / sizeof(T) of them) from `index` on, and the first `valid` are the thread's
// (0 when it has none this turn); the head and the tail come one logit per thread. The others read
// as 0, or with NEG_INF_PAD as -inf, which weighs 0 and lies below every range top-p's passes look
// for, so that they need not test `valid` (a select a logit); the other passes test it anyway and
// keep 0. With STRETCHES, each warp reads its own stretch as Layout says (for a pass whose
// per-warp sums the draw reads); without, the block reads the slice front to back, its threads
// side by side in each turn, which keeps its loads in one window of the row (a pass for the
// maximum over 64 rows took about 4 us less). Every thread of the block makes the same number of
// calls, so that g may use warp-wide intrinsics. A pass over a row is bound by the loads in
// flight: each thread keeps AHEAD chunks in flight (streamed past the L1 cache), and the loop is
// unrolled over them so that each stays in its own registers: slot a is read, then reloaded with
// the chunk AHEAD turns later. A queue shifted one slot a turn would wait, at the shift, for every
// load in it, leaving one in flight.
#define LOADS_AHEAD 4
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

template <bool STRETCHES = false, int AHEAD = LOADS_AHEAD, bool NEG_INF_PAD = false, typename T,
          typename G>
__device__ __forceinline__ void for_each_chunk(const Ctx<T>& c, G g) {
    constexpr int V = 16 / sizeof(T);
    const T* row = c.row;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const Layout<T> L(c, c.rank);
    float x[V];
    const float lacking = NEG_INF_PAD ? neg_inf() : 0.f;  // a logit the thread does not have
    const auto one_logit = [&](int i, bool ok) {
#pragma unroll
        for (int j = 0; j < V; ++j) x[j] = lacking;
        x[0] = ok ? load_logit(row, i) : lacking;
        g(i, x, ok ? 1 : 0);
    };
    if (L.begin < L.body) one_logit(L.begin + t, L.begin + t < L.body);
    const uint4* chunks = reinterpret_cast<const uint4*>(row + L.body);
    // This thread's chunk in turn 0, the chunks between its turns, the end of its chunks, and the
    // turns every thread makes.
    const int first = STRETCHES ? warp * L.run + lane : t;
    const int stride = STRETCHES ? 32 : block_size();
    const int stop = STRETCHES ? min(L.chunks(), (warp + 1) * L.run) : L.chunks();
    const int turns = STRETCHES ? L.run / 32 : (L.chunks() + stride - 1) / stride;
    const u32 pad = NEG_INF_PAD ? (sizeof(T) == 4 ? 0xFF800000u : 0xFF80FF80u) : 0u;  // bf16: 2
    const uint4 none = make_uint4(pad, pad, pad, pad);
    uint4 ahead[AHEAD];
#pragma unroll
    for (int a = 0; a < AHEAD; ++a) {
        const int c = first + stride * a;
        ahead[a] = c < stop ? load_stream(chunks + c) : none;
    }
#pragma unroll 1
    for (int r0 = 0; r0 < turns; r0 += AHEAD) {
#pragma unroll
        for (int a = 0; a < AHEAD; ++a) {
            if (r0 + a >= turns) break;  // the same turn for every thread
            const int c = first + stride * (r0 + a);
#pragma unroll
            for (int j = 0; j < V; ++j) x[j] = chunk_logit(row, ahead[a], j);
            g(L.body + c * V, x, c < stop ? V : 0);
            const int next = c + stride * AHEAD;
            ahead[a] = next < stop ? load_stream(chunks + next) : none;
        }
    }
    if (L.tail < L.end) {
        const int mine = STRETCHES ? t - 32 * L.last : t;  // with stretches, the last warp's lanes
        one_logit(L.tail + mine, mine >= 0 && L.tail + mine < L.end);
    }
}

// Calls f(index, logit, ok) for the logits of the block's slice as for_each_chunk shares them out,
// logit by logit (ok false where the thread has none).
template <bool STRETCHES = false, int AHEAD = LOADS_AHEAD, bool NEG_INF_PAD = false, typename T,
          typename F>
__device__ __forceinline__ void for_each_logit(const Ctx<T>& c, F f) {
    for_each_chunk<STRETCHES, AHEAD, NEG_INF_PAD>(c, [&](int i, const float* x, int valid) {
#pragma unroll
        for (int j = 0; j < 16 / (int)sizeof(T); ++j) f(i + j, x[j], j < valid);
    });
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Block-wide reductions: every thread of the block calls them and gets the result.
__device__ __forceinline__ u64 block_sum_u64(u64 v, SampleShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_u64(v);
    __syncthreads();  // s.scratch may still be read by a previous reduction
    if (lane == 0) s.scratch[warp] = v;
    __syncthreads();
    u64 total = 0;
    for (int w = 0; w < block_size() >> 5; ++w) total += s.scratch[w];
    return total;
}

__device__ __forceinline__ u64 block_max_u64(u64 v, SampleShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();
    if (lane == 0) s.scratch[warp] = v;
    __syncthreads();
    for (int w = 0; w < block_size() >> 5; ++w) v = max(v, s.scratch[w]);
    return v;
}

// Maximum, NaN ignored (as f32::max does).
__device__ __forceinline__ float block_max(float v, SampleShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) s.scratch[warp] = __float_as_uint(v);
    __syncthreads();
    for (int w = 0; w < block_size() >> 5; ++w) v = fmaxf(v, __uint_as_float((u32)s.scratch[w]));
    return v;
}

// The sum of v over this lane and the lanes before it in the warp.
__device__ __forceinline__ u64 warp_inclusive_scan_u64(u64 v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_up_sync(FULL_MASK, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

// The sum of v over the threads before this one; `total` gets the sum over all.
__device__ __forceinline__ u64 block_exclusive_scan(u64 v, u64& total, SampleShared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u64 incl = warp_inclusive_scan_u64(v);
    __syncthreads();
    if (lane == 31) s.scratch[warp] = incl;
    __syncthreads();
    u64 before = 0;
    total = 0;
    for (int w = 0; w < block_size() >> 5; ++w) {
        const u64 t = s.scratch[w];
        before += w < warp ? t : 0;
        total += t;
    }
    return before + incl - v;
}

// Histograms in shared memory. A mass is 64 bits, but a 64-bit shared-memory atomic add is a
// compare-and-swap loop: it is kept as two 32-bit words instead, the high word taking the carry
// out of the low one, which the low word's atomic tells by the value it returns.

template <bool WEIGHTED>
__device__ __forceinline__ void hist_add(u32* lo, u32* hi, u32 bin, u64 c) {
    if (!WEIGHTED) {
        atomicAdd(&lo[bin], (u32)c);
        return;
    }
    const u32 low = (u32)c;
    const u32 old = atomicAdd(&lo[bin], low);
    const u32 high = (u32)(c >> 32) + (old + low < old ? 1u : 0u);
    if (high) atomicAdd(&hi[bin], high);
}

template <bool WEIGHTED>
__device__ __forceinline__ u64 hist_mass(const u32* lo, const u32* hi, int bin) {
    return WEIGHTED ? ((u64)hi[bin] << 32) + lo[bin] : (u64)lo[bin];
}

// Adds c to `bin` for the lanes where `take`. Every lane of the warp calls it. When every
// taking lane falls into the same bin (equal logits, a masked vocabulary), one atomic instead of
// up to 32 queued on one address.
template <bool WEIGHTED>
__device__ __forceinline__ void warp_hist_add(u32* lo, u32* hi, u32 bin, u64 c, bool take) {
    const u32 takers = __ballot_sync(FULL_MASK, take);
    if (takers == 0) return;
    const int lane = threadIdx.x & 31, leader = __ffs(takers) - 1;
    const u32 first = __shfl_sync(FULL_MASK, bin, leader);
    if (__all_sync(FULL_MASK, !take || bin == first)) {
        const u64 sum = WEIGHTED ? warp_sum_u64(take ? c : 0ull) : (u64)__popc(takers);
        if (lane == leader) hist_add<WEIGHTED>(lo, hi, first, sum);
    } else if (take) {
        hist_add<WEIGHTED>(lo, hi, bin, c);
    }
}

// Adds this block's histogram into rank 0's (rank 0 builds into its own, the merge target).
// Only non-zero bins travel; each thread reads four bins at a time.
template <bool WEIGHTED>
__device__ void merge_into_rank0(SampleShared& s, int nbins, u32 rank) {
    if (rank == 0) return;
    __syncthreads();  // this block's histogram is complete
    const u32 lo0 = remote(s.hist, 0), hi0 = remote(s.hist + SAMPLE_BINS, 0);
    const uint4* lo4 = reinterpret_cast<const uint4*>(s.hist);
    const uint4* hi4 = reinterpret_cast<const uint4*>(s.hist + SAMPLE_BINS);
    for (int q = threadIdx.x; q < nbins / 4; q += block_size()) {
        const uint4 l = lo4[q], h = WEIGHTED ? hi4[q] : make_uint4(0, 0, 0, 0);
        const u32 los[4] = {l.x, l.y, l.z, l.w}, his[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 lo = los[j], hi = his[j], at = 4 * (4 * q + j);
            if (lo == 0 && hi == 0) continue;
            if (!WEIGHTED) {
                add_remote(lo0 + at, lo);
                continue;
            }
            const u32 old = atomic_add_remote(lo0 + at, lo);
            const u32 high = hi + (old + lo < old ? 1u : 0u);
            if (high) add_remote(hi0 + at, high);
        }
    }
}

// This block's own mass (or count) in bins [from, to).
template <bool WEIGHTED>
__device__ u64 local_mass(SampleShared& s, int from, int to) {
    u64 m = 0;
    for (int b = from + threadIdx.x; b < to; b += block_size())
        m += hist_mass<WEIGHTED>(s.hist, s.hist + SAMPLE_BINS, b);
    return block_sum_u64(m, s);
}

__device__ __forceinline__ void clear_histogram(SampleShared& s) {
    uint4* words = reinterpret_cast<uint4*>(s.hist);
    for (int b = threadIdx.x; b < 2 * SAMPLE_BINS / 4; b += block_size())
        words[b] = make_uint4(0, 0, 0, 0);
}

struct Found {
    u32 bin;
    u64 above;  // `above` plus the bins above `bin`
    u64 mass;   // the bin's own
    u64 need;
    u64 total;  // the histogram's
};

// The bin at which the running mass (or count) of the histogram, from the top bin down and
// starting at `above`, first reaches need_of(total of the histogram). Run by one block; every
// thread gets the answer. Thread t sums a run of bins from the top; a scan over the threads
// finds the run that crosses, and its thread walks it.
template <bool WEIGHTED, typename Need>
__device__ Found find_crossing(const u32* lo, const u32* hi, int nbins, u64 above, Need need_of,
                               SampleShared& s) {
    const int per = (nbins + block_size() - 1) / block_size();
    const int top = nbins - 1 - (int)threadIdx.x * per;
    u64 mine = 0;
    for (int j = 0; j < per && top - j >= 0; ++j) mine += hist_mass<WEIGHTED>(lo, hi, top - j);
    u64 total;
    const u64 before = block_exclusive_scan(mine, total, s);
    const u64 need = need_of(total);
    if (above + before < need && above + before + mine >= need) {
        u64 run = above + before;
        for (int j = 0; j < per && top - j >= 0; ++j) {
            const u64 m = hist_mass<WEIGHTED>(lo, hi, top - j);
            if (run + m >= need) {
                s.found_bin = top - j;
                s.found[0] = run;
                s.found[1] = m;
                break;
            }
            run += m;
        }
    }
    // Unreachable when need <= above + total; the lowest bin then, as a radix select would.
    if (threadIdx.x == 0 && above + total < need) {
        s.found_bin = 0;
        s.found[1] = hist_mass<WEIGHTED>(lo, hi, 0);
        s.found[0] = above + total - s.found[1];
    }
    __syncthreads();
    return Found{s.found_bin, s.found[0], s.found[1], need, total};
}

// Rank 0: the largest logit key v such that the first `n` list entries (key << 32 | index) with
// key >= v weigh at least `need`, a few bits of the key at a time (histograms of the list). Every
// entry's key starts with `prefix` (the top bits, under `mask`): the rounds start just below it,
// where the entries' keys begin to differ, so the first round spreads them over all its bins
// (rounds at whole bytes left most of the first one's bins empty and its atomics queued on the
// few others). A round takes LIST_BITS bits where its histogram fits in the list's memory after
// the entries (two rounds for the bits under a bin of top-p's guess), else a byte in s.small.
// `listed` gets the weight of all n entries (the first round's histogram holds them all); where
// it falls short of `need`, the key is meaningless.
template <typename W>
__device__ __noinline__ u32 list_select(SampleShared& s, int n, u64 need, u32 prefix, u32 mask,
                                        W weight, u64& listed) {
    const bool wide = n <= SAMPLE_LIST - LIST_BINS;
    const int most = wide ? LIST_BITS : 8, nbins = 1 << most;
    u32* lo = wide ? reinterpret_cast<u32*>(s.list + SAMPLE_LIST - LIST_BINS) : s.small;
    u32* hi = lo + nbins;
    u64 above = 0;
    bool first = true;
    for (int low = 32 - __popc(mask); low > 0;) {
        const int width = min(low, most), shift = low - width;
        const u32 bins = (1u << width) - 1;
        for (int b = threadIdx.x; b < 2 * nbins; b += block_size()) lo[b] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += block_size()) {
            const u64 e = s.list[j];
            const u32 k = (u32)(e >> 32);
            if ((k & mask) != prefix) continue;
            const u64 w = weight(e);
            if (w) hist_add<true>(lo, hi, (k >> shift) & bins, w);
        }
        __syncthreads();
        const Found f =
            find_crossing<true>(lo, hi, (int)bins + 1, above, [=](u64) { return need; }, s);
        if (first) listed = f.total;
        first = false;
        prefix |= f.bin << shift;
        mask |= bins << shift;
        above = f.above;
        low = shift;
    }
    return prefix;
}

// Rank 0: the sum of f(entry) over the first n list entries.
template <typename F>
__device__ u64 list_sum(SampleShared& s, int n, F f) {
    u64 sum = 0;
    for (int j = threadIdx.x; j < n; j += block_size()) sum += f(s.list[j]);
    return block_sum_u64(sum, s);
}

// Which logits a selection counts, and what it must reach.
struct Query {
    bool strict;      // only keys > floor
    u32 floor;
    u64 need;
    bool from_total;  // need = top_p_need(top_p, mass of the whole first histogram)
};

// Rank 0 writes s.stage into every block's s.d (the caller's cluster barrier follows).
__device__ void publish(SampleShared& s) {
    __syncthreads();  // s.stage is complete
    const u64* words = reinterpret_cast<const u64*>(&s.stage);
    u64* to = reinterpret_cast<u64*>(&s.d);
    for (int t = threadIdx.x; t < cluster_ranks() * (int)DECISION_WORDS; t += block_size())
        store_remote(remote(to + t % DECISION_WORDS, t / DECISION_WORDS), words[t % DECISION_WORDS]);
}

// Rank 0, once every block's histogram of this level is merged into its own: the crossing bin,
// and whether its logits are few enough to gather. Clears the histogram for what comes next
// (the list, or the next level's histogram) and publishes.
template <typename T, bool WEIGHTED>
__device__ __noinline__ void decide_level(const Ctx<T>& c, SampleShared& s, int shift, int nbins, u32 prefix,
                             u64 above, const Query& q, bool last) {
    const Found f = find_crossing<WEIGHTED>(
        s.hist, s.hist + SAMPLE_BINS, nbins, above,
        [&](u64 total) { return q.from_total ? top_p_need(c.p.top_p, total) : q.need; }, s);
    if (threadIdx.x == 0) {
        bool fits = f.mass <= SAMPLE_LIST;
        if (WEIGHTED) {
            // Counts are not kept with masses: every logit of the bin weighs at least the weight
            // of the bin's lowest key, which bounds the count. A weight of 0 bounds nothing, so
            // the list is tried (and may overflow).
            u32 low = prefix | ((u32)f.bin << shift);
            if (q.strict) low = max(low, q.floor + 1);
            const u64 w = fixed_weight(key_value(low), c.max, c.scale);
            fits = w == 0 || f.mass / w <= SAMPLE_LIST;
        }
        s.stage.bin = f.bin;
        s.stage.above = f.above;
        s.stage.mass = f.mass;
        s.stage.need = f.need;
        s.stage.try_list = !last && fits;
        s.stage.resolved = 0;
        s.list_count = 0;
    }
    __syncthreads();  // every thread has read the histogram
    clear_histogram(s);
    publish(s);
}

// Histogram of this block's slice at one level: the logits that take part in the query and whose
// key starts with `prefix` (under `mask`), binned by the log2(nbins) bits at `shift`.
template <typename T, bool WEIGHTED>
__device__ void build_histogram(const Ctx<T>& c, SampleShared& s, int shift, int nbins, u32 prefix,
                                u32 mask, const Query& q) {
    // Locals, not loads through `c` and `q` in the loop, which the atomics' memory clobbers
    // would repeat.
    const float mx = c.max, scale = c.scale;
    const bool strict = q.strict;
    const u32 floor = q.floor;
    for_each_logit(c, [&](int, float x, bool ok) {
        const u32 key = order_key(x);
        const bool take = ok && (key & mask) == prefix && (!strict || key > floor);
        u64 w = 1;
        if (WEIGHTED && take) w = fixed_weight(x, mx, scale);
        warp_hist_add<WEIGHTED>(s.hist, s.hist + SAMPLE_BINS, (key >> shift) & (nbins - 1), w,
                                take);
    });
}

// Warp: where each lane's `mine` entries go among the warp's, in lane order (`before`), and how
// many the warp has (`total`): one vote per bit of the counts (mine <= V).
template <int V>
__device__ __forceinline__ void warp_offsets(int mine, int& before, int& total) {
    const u32 below = (1u << (threadIdx.x & 31)) - 1;
    before = total = 0;
#pragma unroll
    for (int bit = 0; (1 << bit) <= V; ++bit) {
        const u32 vote = __ballot_sync(FULL_MASK, mine >> bit & 1);
        before += __popc(vote & below) << bit;
        total += __popc(vote) << bit;
    }
}

// Gathering into rank 0's list happens in two steps. Every block appends (key << 32 | index) of
// its logits with take(x, ok) to its own list, each thread with an atomic on its own block's
// count where it takes any of a chunk's logits (a gathered bin holds a few percent of a row, so
// a warp's atomics rarely meet on the count, and a vote to pool them cost more than it saved);
// then each other block reserves its run of rank 0's list with one atomic on rank 0's count and
// copies its list there: an atomic on another block's shared memory waits for an answer from
// another SM, which one a thread would wait for again and again. The list's order is not the
// row's. Entries past the list's end are counted, not written. `see(x, ok)` is called for every
// logit on the way; with STRETCHES the block reads its slice a warp a stretch, with NEG_INF_PAD
// a logit the thread lacks reads as -inf (for_each_chunk).
// The block's list_count must be 0 (rank 0's as the selection's decision leaves it); the other
// blocks leave theirs at 0 and zero the entries they used, so a histogram that was clear under
// them is again.
template <bool STRETCHES = false, bool NEG_INF_PAD = false, typename T, typename Take, typename See>
__device__ __forceinline__ void gather_into_list(const Ctx<T>& c, SampleShared& s, Take take,
                                                 See see) {
    constexpr int V = 16 / sizeof(T);
    for_each_chunk<STRETCHES, LOADS_AHEAD, NEG_INF_PAD>(c, [&](int i, const float* x, int valid) {
        u32 takes = 0;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            see(x[j], j < valid);
            takes |= take(x[j], j < valid) ? 1u << j : 0u;
        }
        if (takes == 0) return;
        u32 slot = atomic_add_own(&s.list_count, (u32)__popc(takes));
#pragma unroll
        for (int j = 0; j < V; ++j) {
            if (takes >> j & 1) {
                if (slot < SAMPLE_LIST) s.list[slot] = ((u64)order_key(x[j]) << 32) | (u32)(i + j);
                ++slot;
            }
        }
    });
}

// Rank != 0, one thread, once the block's list is complete: the start of this block's run in
// rank 0's list, reserved.
__device__ __forceinline__ u32 reserve_in_rank0(SampleShared& s) {
    return atomic_add_remote(remote(&s.list_count, 0), s.list_count);
}

// Rank != 0: copies the block's list into its run of rank 0's, which thread 0 has reserved into
// s.scratch[0] before this barrier.
__device__ void copy_list_to_rank0(SampleShared& s) {
    const u32 n = s.list_count;
    __syncthreads();  // the run is reserved
    const u32 base = (u32)s.scratch[0], list0 = remote(s.list, 0);
    for (u32 j = threadIdx.x; j < min(n, (u32)SAMPLE_LIST); j += block_size()) {
        if (base + j < SAMPLE_LIST) store_remote(list0 + 8 * (base + j), s.list[j]);
        s.list[j] = 0;
    }
    if (threadIdx.x == 0) s.list_count = 0;
}

// Both steps, where the block has nothing to do between them.
template <typename T, typename Take, typename See>
__device__ __forceinline__ void gather_into_rank0(const Ctx<T>& c, SampleShared& s, Take take,
                                                  See see) {
    gather_into_list(c, s, take, see);
    if (c.rank == 0) return;
    __syncthreads();  // every entry of this block is in its own list
    if (threadIdx.x == 0) s.scratch[0] = reserve_in_rank0(s);
    copy_list_to_rank0(s);
}

// Top-k in one pass: every warp keeps, in its own segment of its block's list, the logits at or
// above a threshold it raises as it reads (a streaming top-k: a logit among the row's k largest
// is among its warp's k largest). When the segment is nearly full, the threshold rises to a lower
// bound on the segment's k-th largest key and the segment keeps only the logits at or above it.
// No histogram and no block barrier while reading: a chunk costs a compare a logit and a few
// votes. The shrinks (three or four a warp on a 151,936-logit row, a few thousand cycles each)
// are what the pass spends beyond its loads.

// Warp: a lower bound on the k-th largest key of the n entries in seg (n >= k) that leaves few
// more than k keys at or above it: the largest v with at least k keys >= v, found bit by bit
// from the highest bit in which the keys differ, over its next SELECT_BITS bits (the bits below
// stay 0). Fewer bits would leave so many keys above the bound, where the keys straddle a power
// of two, that the segment would fill again at once.
#define SELECT_BITS 12
__device__ u32 warp_kth_bound(const u64* seg, int n, int k) {
    const int lane = threadIdx.x & 31;
    u32 keys[SEGMENT_PER_LANE];
    u32 hi = 0, lo = ~0u;
#pragma unroll
    for (int m = 0; m < SEGMENT_PER_LANE; ++m) {
        const bool in = m * 32 + lane < n;
        keys[m] = in ? (u32)(seg[m * 32 + lane] >> 32) : 0u;
        hi = in ? max(hi, keys[m]) : hi;
        lo = in ? min(lo, keys[m]) : lo;
    }
    hi = __reduce_max_sync(FULL_MASK, hi);
    lo = __reduce_min_sync(FULL_MASK, lo);
    if (hi == lo) return lo;
    const int top = 31 - __clz(hi ^ lo);
    u32 v = hi & ~((2u << top) - 1u);  // the bits every key shares; n >= k keys are >= v
    for (int bit = top; bit >= 0 && bit > top - SELECT_BITS; --bit) {
        const u32 t = v | (1u << bit);
        u32 at_least = 0;
#pragma unroll
        for (int m = 0; m < SEGMENT_PER_LANE; ++m) at_least += m * 32 + lane < n && keys[m] >= t;
        if ((int)__reduce_add_sync(FULL_MASK, at_least) >= k) v = t;
    }
    return v;
}

// Warp: keeps the entries of seg with key >= v, in order; returns how many.
__device__ int warp_keep_from(u64* seg, int n, u32 v) {
    const int lane = threadIdx.x & 31;
    u64 e[SEGMENT_PER_LANE];
#pragma unroll
    for (int m = 0; m < SEGMENT_PER_LANE; ++m) e[m] = m * 32 + lane < n ? seg[m * 32 + lane] : 0ull;
    __syncwarp();
    int kept = 0;
#pragma unroll
    for (int m = 0; m < SEGMENT_PER_LANE; ++m) {
        const bool keep = m * 32 + lane < n && (u32)(e[m] >> 32) >= v;
        const u32 b = __ballot_sync(FULL_MASK, keep);
        if (keep) seg[kept + __popc(b & ((1u << lane) - 1))] = e[m];
        kept += __popc(b);
    }
    __syncwarp();
    return kept;
}

// Warp: the segment cut to the keys at or above the larger of warp_kth_bound and `known` (a
// bound the block's other warps found). Returns that threshold << 32 | the entries left.
__device__ __noinline__ u64 shrink_segment(u64* seg, int n, int k, u32 known) {
    __syncwarp();  // every lane's entry is written
    const u32 v = max(warp_kth_bound(seg, n, k), known);
    return (u64)v << 32 | (u32)warp_keep_from(seg, n, v);
}

// Pass 1 of a top-k row: the block's maximum, and every warp's segment holding at least its k
// largest logits (all of them when it has fewer). A chunk at a time: each lane marks its logits
// at or above the threshold, and one vote per bit of the lanes' counts places them. A warp's own
// bound is at most its k-th largest key, hence at most the row's, so the warps of a block share
// the largest (`block_floor`) at each shrink. Returns the warp's threshold, a lower bound on the
// row's k-th largest key (0 when it never shrank); `count` gets its entry count, or -1 when keys
// its bound cannot tell apart filled the segment (the histogram path then takes the row).
template <typename T>
__device__ u32 filter_top_k(const Ctx<T>& c, u64* seg, int capacity, u32* block_floor, float& mx,
                            int& count) {
    constexpr int V = 16 / sizeof(T);
    const int k = c.p.top_k;
    u32 threshold = 0;
    int n = 0;
    bool full = false;
    float m = neg_inf();
    for_each_chunk(c, [&](int i, const float* x, int valid) {
        u32 takes = 0;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            m = j < valid ? fmaxf(m, x[j]) : m;
            takes |= j < valid && order_key(x[j]) >= threshold ? 1u << j : 0u;
        }
        const int mine = full ? 0 : __popc(takes);
        if (!__any_sync(FULL_MASK, mine)) return;
        int before, total;
        warp_offsets<V>(mine, before, total);
        if (mine) {
#pragma unroll
            for (int j = 0; j < V; ++j)
                if (takes >> j & 1) seg[n + before++] = (u64)order_key(x[j]) << 32 | (u32)(i + j);
        }
        n += total;
        if (n > capacity - 32 * V) {
            // Any warp's bound is the row's: the block's largest so far cuts this segment too.
            u32 known = 0;
            if ((threadIdx.x & 31) == 0) known = *(volatile u32*)block_floor;
            const u64 r = shrink_segment(seg, n, k, __shfl_sync(FULL_MASK, known, 0));
            n = (int)(u32)r;
            full = n > capacity - 32 * V;
            u32 shared = 0;
            if ((threadIdx.x & 31) == 0) shared = atomicMax(block_floor, (u32)(r >> 32));
            threshold = max((u32)(r >> 32), __shfl_sync(FULL_MASK, shared, 0));
        }
    });
    mx = m;
    if (!full && n > k) {
        const u64 r = shrink_segment(seg, n, k, threshold);
        threshold = (u32)(r >> 32);
        n = (int)(u32)r;
    }
    count = full ? -1 : n;
    return threshold;
}

// Every warp's threshold is a lower bound on the row's k-th largest key: the largest of them,
// `floor`, is one too. Each warp sends its threshold (or, when its segment filled, a mark) to
// every block of the cluster; the caller's cluster barrier follows.
__device__ void share_floor(SampleShared& s, u32 threshold, int n, int ranks) {
    const int lane = threadIdx.x & 31;
    if (lane >= ranks) return;
    if (n < 0) {
        add_remote(remote(&s.filled, lane), 1);
    } else {
        asm volatile("red" DSMEM ".max.u32 [%0], %1;" ::"r"(remote(&s.floor, lane)), "r"(threshold)
                     : "memory");
    }
}

// Every warp's entries at or above the floor appended to rank 0's list, their count added to
// every block's list_count, so that each block knows the total after the caller's cluster
// barrier. The segments fill the blocks' lists, rank 0's too: each warp keeps its entries at or
// above the floor (warp_keep_from) and takes them into registers, and a cluster barrier passes
// before any is written into rank 0's list.
__device__ void gather_segments(SampleShared& s, u64* seg, int n, u32 floor, int ranks) {
    const int lane = threadIdx.x & 31;
    const int kept = warp_keep_from(seg, n, floor);
    u64 e[SEGMENT_PER_LANE];
#pragma unroll
    for (int m = 0; m < SEGMENT_PER_LANE; ++m) e[m] = m * 32 + lane < kept ? seg[m * 32 + lane] : 0ull;
    cluster_sync();  // every warp of rank 0 holds its entries
    if (kept == 0) return;
    u32 start = 0;
    if (lane == 0) start = atomic_add_remote(remote(&s.list_count, 0), (u32)kept);
    if (lane > 0 && lane < ranks) add_remote(remote(&s.list_count, lane), (u32)kept);
    start = __shfl_sync(FULL_MASK, start, 0);
    const u32 list0 = remote(s.list, 0);
#pragma unroll
    for (int m = 0; m < SEGMENT_PER_LANE; ++m) {
        const u32 at = start + m * 32 + lane;
        if (m * 32 + lane < kept && at < FILTER_LIST) store_remote(list0 + 8 * at, e[m]);
    }
}

// Rank 0: its list (n <= FILTER_LIST entries, among them the row's k largest) cut to few more
// than the k largest, for finish_in_list: rounds of a 256-bin count histogram of the
// highest bit in which the keys differ and the 7 below it, keeping the bins from the top down to
// the one that holds the k-th key, until a round cuts nothing.
__device__ __noinline__ void cut_list(SampleShared& s, int n, int k) {
    for (int round = 0; round < 4 && n > 2 * k; ++round) {
        u64 hi = 0, lo = 0;  // the largest key, and the largest complement: the smallest key
        for (int j = threadIdx.x; j < n; j += block_size()) {
            const u32 key = (u32)(s.list[j] >> 32);
            hi = max(hi, (u64)key);
            lo = max(lo, (u64)~key);
        }
        hi = block_max_u64(hi, s);
        lo = ~(u32)block_max_u64(lo, s);
        if (hi == lo) break;
        const int shift = max(0, 31 - __clz((u32)(hi ^ lo)) - 7);
        for (int b = threadIdx.x; b < SMALL_BINS; b += block_size()) s.small[b] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += block_size())
            atomicAdd(&s.small[(u32)(s.list[j] >> (32 + shift)) & (SMALL_BINS - 1)], 1u);
        __syncthreads();
        const auto need_k = [=](u64) { return (u64)k; };
        const u32 bin = find_crossing<false>(s.small, nullptr, SMALL_BINS, 0, need_k, s).bin;
        if (threadIdx.x == 0) s.list_count = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += block_size()) {
            const u64 e = s.list[j];
            if (((u32)(e >> (32 + shift)) & (SMALL_BINS - 1)) >= bin)
                s.list[FILTER_LIST + atomicAdd(&s.list_count, 1u)] = e;
        }
        __syncthreads();
        const int kept = (int)s.list_count;
        for (int j = threadIdx.x; j < kept; j += block_size()) s.list[j] = s.list[FILTER_LIST + j];
        __syncthreads();
        if (kept == n) break;  // the k-th key is in the lowest bin: the next round would repeat
        n = kept;
    }
    if (threadIdx.x == 0) s.list_count = n;
    __syncthreads();
}

// This block's count and mass of the logits with key > `key`, and count of those at `key`,
// written into every block's s.sums[.][rank] (the caller's cluster barrier follows); each warp's
// candidate mass, counting a logit at `key` as `w_at`, into s.warp_kept.
template <typename T>
__device__ void slice_sums(const Ctx<T>& c, SampleShared& s, u32 key, u64 w_at) {
    const float mx = c.max, scale = c.scale;
    u32 count = 0, at = 0;
    u64 mass = 0;
    for_each_logit<true>(c, [&](int, float x, bool ok) {
        const u32 k = order_key(x);
        const bool above = ok && k > key;
        const u64 w = fixed_weight(x, mx, scale);  // for every logit: no branch a logit
        count += above;
        mass += above ? w : 0ull;
        at += ok && k == key;
    });
    const u64 warp_mass = warp_sum_u64(mass), warp_at = warp_sum_u64(at);
    if ((threadIdx.x & 31) == 0) {
        s.warp_kept[threadIdx.x >> 5] = warp_mass + warp_at * w_at;
        s.warp_list[threadIdx.x >> 5] = 0;
    }
    const u64 counted = block_sum_u64(count, s);
    mass = block_sum_u64(mass, s);
    const u64 at_key = block_sum_u64(at, s);
    if (threadIdx.x < c.ranks) {
        store_remote(remote(&s.sums[0][c.rank], threadIdx.x), counted);
        store_remote(remote(&s.sums[1][c.rank], threadIdx.x), mass);
        store_remote(remote(&s.sums[2][c.rank], threadIdx.x), at_key);
    }
}

// Rank 0, after a weighted selection resolved in its list (the list holds the crossing bin's
// logits, s.acc each other block's mass above that bin): each block's candidate mass, and into
// each block's s.warp_list the mass of the list's candidates that each of its warps reads (the
// caller's cluster barrier follows).
template <typename T>
__device__ __noinline__ void kept_from_list(const Ctx<T>& c, SampleShared& s, int n, u64 above, float threshold) {
    constexpr int BINS = 64;  // a bin a warp of the cluster: 8 x 8, 2 x 16, 1 x 32
    const int warps = block_size() >> 5;
    u32* lo = s.small;
    u32* hi = s.small + BINS;
    // Every slice before the one that holds the row's end is laid out as the first.
    const int final_rank = (c.vocab - 1) / c.per;
    const Layout<T> full(c, 0), final(c, final_rank);
    const float inv_per = 1.f / (float)c.per;
    for (int b = threadIdx.x; b < 2 * BINS; b += block_size()) s.small[b] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += block_size()) {
        const u64 e = s.list[j];
        const float x = key_value((u32)(e >> 32));
        if (x < threshold) continue;
        const int i = (int)(u32)e, r = divide(i, c.per, inv_per), from = r * c.per;
        const int w = r == final_rank ? final.warp_of(i) : full.warp_of(i - from);
        hist_add<true>(lo, hi, r * warps + w, fixed_weight(x, c.max, c.scale));
    }
    __syncthreads();
    // Warp r sums block r's bins, a lane a warp (a cluster has no more blocks than a block warps).
    const int lane = threadIdx.x & 31, r = threadIdx.x >> 5;
    if (r < c.ranks) {
        const u64 listed = lane < warps ? hist_mass<true>(lo, hi, r * warps + lane) : 0ull;
        if (lane < warps) store_remote(remote(&s.warp_list[lane], r), listed);
        const u64 block_listed = warp_sum_u64(listed);
        if (lane == 0) s.scratch[r] = block_listed;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 others = 0;
        for (int b = 1; b < c.ranks; ++b) {
            s.stage.kept[b] = s.acc[b] + s.scratch[b];
            others += s.acc[b];
        }
        s.stage.kept[0] = above - others + s.scratch[0];
    }
}

// The float to compare logits with where a bin range ends at key k (its first or last key): x >=
// range_end(first) and x <= range_end(last) exactly when the key of a non-NaN x is in the range.
// The key just below +0's belongs to no float (-0 shares +0's key), so a range that ends there
// ends at the negative float nearest zero; keys past +inf's and below -inf's are NaN patterns,
// so a range that ends among them ends at the infinity.
__device__ __forceinline__ float range_end(u32 k) {
    if (k == 0x7FFFFFFFu) return __uint_as_float(0x80000001u);
    const float x = key_value(k);
    return x == x ? x : k >> 31 ? -neg_inf() : neg_inf();
}

// Top-p without top-k in two passes over the row, where the general selection takes four
// (maximum, weighted histogram, gathering, draw): pass 1 guesses the mass of every bin of the keys'
// top 13 or 12 bits while it finds the maximum, pass 2 gathers the bins that may hold the crossing
// while it sums the exact weights, and rank 0 checks the guess exactly.
//
// The guess weighs a logit against the largest value of its bin (bin_edge) instead of the row's
// maximum, which pass 1 does not know yet: 2^((x - edge) * scale) is in [0, 1], and the bin's
// mass against the maximum is its sum times 2^((edge - max) * scale). The sums are 32-bit
// integers of `unit`s, small enough that a row's sum fits (a float atomic on shared memory is a
// compare-and-swap loop on Hopper, an integer one a single instruction); at most 2^22, so that
// a term rounds to at most `unit`.
//
// Blocks of 512 threads or more guess 13-bit bins (the histogram's memory holds 8,192 counts where
// it holds 4,096 masses): the gathered bins, which rank 0 selects from, then hold half as many
// logits (top-p 3-4% faster on 2 x 512 at 64 rows). Blocks of 256 keep the general selection's 12
// bits: with 8 blocks merging twice the bins into rank 0, and each of its threads weighing 32, the
// guess cost more than the smaller list saved (top-p 5-14% slower on 8 x 256).
__device__ __forceinline__ int guess_bits() { return block_size() >= 512 ? 13 : 12; }
// A guess bin's key is the key's top guess_bits(): the key shifted right this much.
__device__ __forceinline__ int guess_shift() { return 32 - guess_bits(); }
// The bits under a guess bin.
__device__ __forceinline__ u32 guess_low() { return (1u << guess_shift()) - 1; }
// A guess bin's largest key and value, of a key in it (`low`: the bits under a bin).
__device__ __forceinline__ float bin_edge(u32 key, u32 low) { return key_value(key | low); }

__device__ __forceinline__ float guess_unit(int vocab) {
    return (float)min(0xFFFFFFFFu / (u32)vocab, 1u << 22);
}

// Pass 1: logit x added to its bin's guess. The bin and its edge come straight from the float's
// bits, the sign spread into a mask: -0 falls in the bin below +0's, and an infinite or NaN
// logit's term is 0 (its edge is itself, or NaN), which the guess can afford where an exact key
// could not; so is the -inf of a turn where the thread has no logit, which needs no test. No
// branch: a chunk's logits interleave.
__device__ __forceinline__ void guess_add(SampleShared& s, float x, float scale, float unit,
                                          int shift, u32 low) {
    const u32 b = __float_as_uint(x);
    const u32 negative = (u32)((int)b >> 31);
    const u32 bin = (b ^ (negative | 0x80000000u)) >> shift;
    const float edge = __uint_as_float((b | (low & ~negative)) & ~(low & negative));
    const u32 term = (u32)(fast_exp2((x - edge) * scale) * unit + 0.5f);
    atomicAdd(&s.hist[bin], term);
}

// Rank 0, the guesses merged: the bins [s.stage.bin, s.stage.key] that may hold the top-p
// crossing (the largest bin whose mass, with the bins above it, reaches top_p of the total): the
// crossings of the need plus and minus a margin of 2^-11 of the total for the guesses' rounding.
// s.stage.try_list says whether the guess is worth a pass: not where the maximum's own term
// rounds to fewer than 16 units (a low temperature in a wide bin: the top of the row is lost to
// rounding, and the check would fail), nor where the need plus the margin passes the total (the
// range would reach the lowest bin). Where the guess is not tried, clears the histogram for the
// general selection; where it is, the list takes the histogram's memory, and the check clears it.
__device__ __noinline__ void guess_top_p_bins(SampleShared& s, float mx, float scale, float unit,
                                              float top_p) {
    const int shift = guess_shift(), nbins = 1 << guess_bits();
    const u32 low = guess_low();
    // The thread's bins are [base, base + per), thread 0's the top ones; per is 8 or 16 (blocks
    // of 256 to 1,024 threads), read 4 at a time: a warp's 16-byte loads, 64 bytes apart, pass
    // through the banks 4 times for 4 bins a thread, where one-word loads 8 bins apart had passed
    // 8 times for one.
    const int per = nbins / block_size();
    const int base = nbins - ((int)threadIdx.x + 1) * per;
    const uint4* bins = reinterpret_cast<const uint4*>(s.hist + base);
    // Bin b's guessed mass, of h units, in 2^-24 of the maximum's weight: 0 where h is (0 times
    // a factor, or times the infinity or NaN of a bin above the maximum or of the NaN patterns
    // below -inf, converts to 0).
    const float per_unit = 16777216.f / unit;
    const auto mass = [&](u32 h, int b) {
        const float edge = bin_edge((u32)b << shift, low);
        return (u64)((float)h * per_unit * fast_exp2((edge - mx) * scale));
    };
    if (threadIdx.x == 0) {
        s.stage.bin = 0;               // no bin reaches the need plus the margin
        s.stage.key = nbins - 1;       // the need minus the margin is nothing
        s.list_count = 0;
    }
    // The thread's masses stay in registers for the walk below (weighing the bins again there
    // was a chain of 16 exponentials and conversions in the threads every other one waits for).
    u64 m[16], mine = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint4 v = 4 * q < per ? bins[q] : make_uint4(0, 0, 0, 0);
        const int b = base + 4 * q;
        // Four bins at a time, side by side, and none where all four are empty (most of a row's
        // bins): a test a bin had made each bin's chain of conversions and exponential wait for
        // the one before.
        m[4 * q] = m[4 * q + 1] = m[4 * q + 2] = m[4 * q + 3] = 0;
        if (v.x | v.y | v.z | v.w) {
            m[4 * q] = mass(v.x, b);
            m[4 * q + 1] = mass(v.y, b + 1);
            m[4 * q + 2] = mass(v.z, b + 2);
            m[4 * q + 3] = mass(v.w, b + 3);
        }
        mine += m[4 * q] + m[4 * q + 1] + m[4 * q + 2] + m[4 * q + 3];
    }
    u64 total;
    u64 run = block_exclusive_scan(mine, total, s);
    const u64 margin = total >> 11;
    const u64 need = (u64)((double)top_p * (double)total);
    const u64 need_lo = need - min(need, margin), need_hi = need + margin;
    // Only the threads whose run holds a crossing walk their bins.
    const bool crosses = (run < need_hi && run + mine >= need_hi) ||
                         (run < need_lo && run + mine >= need_lo);
    if (crosses) {
#pragma unroll
        for (int j = 15; j >= 0; --j) {  // from the top
            if (j >= per) continue;
            if (run < need_hi && run + m[j] >= need_hi) s.stage.bin = base + j;
            if (run < need_lo && run + m[j] >= need_lo) s.stage.key = base + j;
            run += m[j];
        }
    }
    if (threadIdx.x == 0) {
        const float max_term = fast_exp2((mx - bin_edge(order_key(mx), low)) * scale) * unit;
        s.stage.try_list = max_term >= 16.f && need_hi <= total;  // pass 2 relies on both
    }
    __syncthreads();  // every thread has read the histogram, and try_list is set
    if (!s.stage.try_list) clear_histogram(s);
}

// Rank 0, pass 2 done (the guessed bins' logits in its list, every block's exact mass above them
// in s.acc and its total in s.sums[1]): the guess holds when the mass above the bins falls short
// of the need and, with the list, reaches it. Then the key and each block's candidate mass, as a
// weighted cluster_select leaves them; otherwise `resolved` stays 0 and the row takes the
// general selection. Clears the histogram and publishes.
template <typename T>
__device__ __noinline__ void check_top_p_guess(const Ctx<T>& c, SampleShared& s, u32 lo_key,
                                               u32 hi_key) {
    u64 total = 0, above = 0;
    for (int r = 0; r < c.ranks; ++r) {
        total += s.sums[1][r];
        above += s.acc[r];
    }
    const u64 need = top_p_need(c.p.top_p, total);
    const int n = (int)s.list_count;
    const float mx = c.max, scale = c.scale;
    const auto weight = [=](u64 e) { return fixed_weight(key_value((u32)(e >> 32)), mx, scale); };
    bool held = n <= SAMPLE_LIST && above < need;
    u32 key = 0;
    if (held) {
        // The keys of the guessed bins share their top bits: list_select's rounds start below them.
        const int common = __clz(lo_key ^ hi_key);
        const u32 mask = common ? ~0u << (32 - common) : 0u;
        u64 listed = 0;
        key = list_select(s, n, need - above, lo_key & mask, mask, weight, listed);
        held = above + listed >= need;
        if (held) kept_from_list(c, s, n, above, key_value(key));
    }
    if (threadIdx.x == 0) {
        s.stage.resolved = held;
        s.stage.key = key;
    }
    __syncthreads();     // the list is read
    clear_histogram(s);  // for the general selection, when the guess missed
    publish(s);
}

// The largest key v such that the logits taking part in q with key >= v reach q.need (their
// count, or their weight). The level-0 histogram of counts may already be decided (top-k). A
// weighted selection also leaves each block's candidate mass (logits with key >= v) in s.d.kept.
template <typename T, bool WEIGHTED>
__device__ __noinline__ u32 cluster_select(const Ctx<T>& c, SampleShared& s, Query q, bool decided) {
    u32 prefix = 0, mask = 0;
    u64 above = 0;
    u64 acc = 0;  // weighted, rank != 0: this block's mass above the chosen bins
    for (int level = 0; level < 3; ++level) {
        const int shift = level == 0 ? 20 : level == 1 ? 8 : 0;
        const int nbins = level == 2 ? 256 : SAMPLE_BINS;
        if (level > 0 || !decided) {
            build_histogram<T, WEIGHTED>(c, s, shift, nbins, prefix, mask, q);
            merge_into_rank0<WEIGHTED>(s, nbins, c.rank);
            cluster_sync();  // rank 0 holds the merged histogram
            if (c.rank == 0) decide_level<T, WEIGHTED>(c, s, shift, nbins, prefix, above, q, level == 2);
            cluster_sync();
        }
        const u32 bin = s.d.bin, try_list = s.d.try_list;
        const u64 bin_mass = s.d.mass;
        above = s.d.above;
        q.need = s.d.need;
        q.from_total = false;
        if (c.rank != 0) {
            if (WEIGHTED) acc += local_mass<true>(s, bin + (level == 2 ? 0 : 1), nbins);
            __syncthreads();
            clear_histogram(s);  // rank 0 cleared its own before deciding
        }
        __syncthreads();
        prefix |= bin << shift;
        mask |= (u32)(nbins - 1) << shift;
        if (level == 2) {
            // Every bit is chosen: the key is known, and so is every block's candidate mass
            // (its mass above the key's bins, the key's own bin included).
            if (WEIGHTED) {
                if (c.rank != 0 && threadIdx.x == 0) store_remote(remote(&s.acc[c.rank], 0), acc);
                cluster_sync();
                if (c.rank == 0) {
                    if (threadIdx.x == 0) {
                        u64 others = 0;
                        for (int r = 1; r < c.ranks; ++r) {
                            s.stage.kept[r] = s.acc[r];
                            others += s.acc[r];
                        }
                        s.stage.kept[0] = above + bin_mass - others;
                    }
                    publish(s);
                }
                cluster_sync();
            }
            return prefix;
        }
        if (try_list) {
            if (WEIGHTED && c.rank != 0 && threadIdx.x == 0) store_remote(remote(&s.acc[c.rank], 0), acc);
            const u32 pre = prefix, msk = mask, floor = q.floor;
            const bool strict = q.strict;
            gather_into_rank0(
                c, s,
                [=](float x, bool ok) {
                    const u32 key = order_key(x);
                    return ok && (key & msk) == pre && (!strict || key > floor);
                },
                [](float, bool) {});
            cluster_sync();  // the list is complete
            if (c.rank == 0) {
                const int n = (int)s.list_count;
                if (n <= SAMPLE_LIST) {
                    const float mx = c.max, scale = c.scale;
                    u64 listed;  // the bin's whole count or mass, which the histogram said reaches
                    const u32 key = list_select(
                        s, n, q.need - above, pre, msk,
                        [=](u64 e) {
                            return WEIGHTED ? fixed_weight(key_value((u32)(e >> 32)), mx, scale)
                                            : 1ull;
                        },
                        listed);
                    if (WEIGHTED) kept_from_list(c, s, n, above, key_value(key));
                    if (threadIdx.x == 0) {
                        s.stage.resolved = 1;
                        s.stage.key = key;
                    }
                } else if (threadIdx.x == 0) {
                    s.stage.resolved = 0;
                }
                __syncthreads();     // the list is read
                clear_histogram(s);  // for the next level, or a later selection
                publish(s);
            }
            cluster_sync();
            if (s.d.resolved) return s.d.key;
        }
    }
    return prefix;  // not reached: level 2 returns
}

// Rank 0: sorts the first n entries of its list in descending order, a bitonic sort of the
// entries zero-padded to a power of two (zeros sort last): log2(size)^2 / 2 compare-exchange
// rounds shared out among the block's threads, a barrier after each. Lists of up to SMALL_LIST
// entries do not come here (finish_small).
__device__ void sort_list(SampleShared& s, int n) {
    int size = 1;
    while (size < n) size <<= 1;
    for (int i = n + threadIdx.x; i < size; i += block_size()) s.list[i] = 0;
    __syncthreads();
    for (int k = 2; k <= size; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < size / 2; i += block_size()) {
                const int a = 2 * i - (i & (j - 1)), b = a + j;
                const u64 x = s.list[a], y = s.list[b];
                if ((a & k) == 0 ? x < y : x > y) {
                    s.list[a] = y;
                    s.list[b] = x;
                }
            }
            __syncthreads();
        }
    }
}

// Rank 0: the first position of its (sorted) list at which the running sum of weight(entry) from
// the front reaches `need`; n when it never does. Each thread sums a run of positions, a scan over
// the threads finds the run that crosses, and its thread walks it.
template <typename W>
__device__ int first_reaching(SampleShared& s, int n, u64 need, W weight) {
    const int per = (n + block_size() - 1) / block_size();
    const int from = min(n, (int)threadIdx.x * per), to = min(n, from + per);
    u64 mine = 0;
    for (int i = from; i < to; ++i) mine += weight(s.list[i]);
    u64 total;
    u64 run = block_exclusive_scan(mine, total, s);
    if (threadIdx.x == 0) s.found_bin = n;
    __syncthreads();
    if (run < need && run + mine >= need) {
        for (int i = from; i < to; ++i) {
            run += weight(s.list[i]);
            if (run >= need) {
                s.found_bin = i;
                break;
            }
        }
    }
    __syncthreads();
    return (int)s.found_bin;
}

// Rank 0: finish_in_list for a list of at most SMALL_LIST entries (a one-pass top-k cut to few
// more than k, or a histogram path's short list), without sorting: thread t takes entry t and
// sums, over the whole list, what lies above it (entries, and their mass) and, once the
// candidates are known, the candidates' mass at or before it in vocabulary order. The k-th key, the top-p threshold and the token are each the
// entry whose sums say so. Two loops over the list and four barriers: 2.8 us a row, where the
// two sorts below took 6-10 (a barrier at each round, or a warp's shuffles).
template <typename T>
__device__ __noinline__ void finish_small(const Ctx<T>& c, SampleShared& s, int n, u32* out) {
    const SampleParams& p = c.p;
    const int k = p.top_k;  // <= n
    const int t = threadIdx.x;
    u64* weight = s.list + FILTER_LIST;  // past every list that reaches here (<= FILTER_LIST)
    const u64 e = t < n ? s.list[t] : 0ull;
    const u32 key = (u32)(e >> 32);
    const u64 w = t < n ? fixed_weight(key_value(key), c.max, c.scale) : 0ull;
    if (t < n) weight[t] = w;
    __syncthreads();
    int gt = 0, eq = 0;  // entries with a larger key, and with this key
    u64 mass_gt = 0;
    if (t < n) {
        for (int j = 0; j < n; ++j) {
            const u32 kj = (u32)(s.list[j] >> 32);
            gt += kj > key;
            eq += kj == key;
            mass_gt += kj > key ? weight[j] : 0ull;
        }
        // The k-th key: fewer than k entries above it, k or more at or above it. The top-k list
        // (exactly k entries) weighs what lies above it and k - gt of its copies.
        if (gt < k && k <= gt + eq) {
            s.found_bin = key;
            s.found[0] = mass_gt + (u64)(k - gt) * w;
            s.found[1] = mass_gt;
        }
    }
    __syncthreads();
    u32 threshold = s.found_bin;
    if (p.top_p < 1.f) {
        const u64 need = top_p_need(p.top_p, s.found[0]);
        if (s.found[1] >= need) {
            // The shortest head reaching need ends among the keys above the k-th: at the key
            // whose entries and those above it reach need, where those above alone do not.
            const u32 k_key = threshold;
            __syncthreads();  // every thread has read found_bin
            if (t < n && key > k_key && mass_gt < need && need <= mass_gt + (u64)eq * w)
                s.found_bin = key;
            __syncthreads();
            threshold = s.found_bin;
        }
    }
    if (t >= n) return;
    u64 kept = 0, upto = 0;  // candidates' mass: all of it, and at or before this index
    for (int j = 0; j < n; ++j) {
        const u64 ej = s.list[j];
        const u64 wj = (u32)(ej >> 32) >= threshold ? weight[j] : 0ull;
        kept += wj;
        upto += (u32)ej <= (u32)e ? wj : 0ull;
    }
    if (kept == 0) return;  // nothing kept
    // The first candidate in vocabulary order whose running weight exceeds target.
    const u64 target = draw_target(kept, p);
    if (key >= threshold && upto > target && upto - w <= target) out[c.row_index] = (u32)e;
}

// Rank 0, top-k on and its list holding every logit at or above the k-th one (at most
// FILTER_LIST of them; a short list goes to finish_small, a longer one is sorted, padded to a
// power of two within the list): the whole selection and the draw. The k-th logit is at position
// k - 1; the top-k list of exactly k entries is the first k positions; the top-p threshold is
// where their running mass reaches its share; the candidates (every logit at or above the
// threshold) are then sorted again into vocabulary order for the draw.
template <typename T>
__device__ __noinline__ void finish_in_list(const Ctx<T>& c, SampleShared& s, u32* out) {
    const int n = (int)s.list_count;
    if (n <= SMALL_LIST) {
        finish_small(c, s, n, out);
        return;
    }
    const SampleParams& p = c.p;
    const float mx = c.max, scale = c.scale;
    const int k = p.top_k;  // <= n
    sort_list(s, n);
    const auto weight = [=](u64 e) {
        return fixed_weight(key_value((u32)(e >> 32)), mx, scale);
    };
    const u32 k_key = (u32)(s.list[k - 1] >> 32);
    const u64 total = list_sum(s, k, weight);
    u32 key = k_key;
    if (p.top_p < 1.f) {
        const u64 need = top_p_need(p.top_p, total);
        const u64 sum_gt =
            list_sum(s, k, [&](u64 e) { return (u32)(e >> 32) > k_key ? weight(e) : 0ull; });
        if (sum_gt >= need) key = (u32)(s.list[first_reaching(s, k, need, weight)] >> 32);
    }
    // Candidates as (~index << 32 | key), the rest as zeros: sorted, they come in vocabulary order.
    __syncthreads();  // every thread has read the threshold's entry before the list is rewritten
    for (int i = threadIdx.x; i < n; i += block_size()) {
        const u64 e = s.list[i];
        const u32 ek = (u32)(e >> 32);
        s.list[i] = ek >= key ? ((u64)~(u32)e << 32) | ek : 0ull;
    }
    __syncthreads();
    sort_list(s, n);
    const auto candidate_weight = [=](u64 e) {
        return e ? fixed_weight(key_value((u32)e), mx, scale) : 0ull;
    };
    const u64 kept = list_sum(s, n, candidate_weight);
    if (kept == 0) return;  // nothing kept
    // The first candidate in vocabulary order whose running weight exceeds target.
    const int at = first_reaching(s, n, draw_target(kept, p) + 1, candidate_weight);
    if (threadIdx.x == 0) out[c.row_index] = ~(u32)(s.list[at] >> 32);
}

// Calls f(index, x, valid) for the logits in [begin, end), in order, until f returns true: x holds
// `valid` logits from index on, a 16-byte chunk's where the range is aligned (four loads in
// flight: the draw's pieces are tens of logits, which one load at a time would wait for one by
// one), else one. A call a chunk, not a logit, lets the chunk's weights be computed together.
template <typename T, typename F>
__device__ __forceinline__ void walk_piece(const T* row, int begin, int end, F f) {
    constexpr int V = 16 / sizeof(T);
    float x[V];
    int i = begin;
    if ((reinterpret_cast<size_t>(row + begin) & 15) == 0) {
        const uint4* chunks = reinterpret_cast<const uint4*>(row + begin);
        const int n = (end - begin) / V;
        for (int c0 = 0; c0 < n; c0 += 4) {
            uint4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = c0 + u < n ? chunks[c0 + u] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                if (c0 + u >= n) break;
#pragma unroll
                for (int j = 0; j < V; ++j) x[j] = chunk_logit(row, v[u], j);
                if (f(begin + (c0 + u) * V, x, V)) return;
            }
        }
        i = begin + n * V;
    }
#pragma unroll
    for (int j = 1; j < V; ++j) x[j] = 0.f;
    for (; i < end; ++i) {
        x[0] = load_logit(row, i);
        if (f(i, x, 1)) return;
    }
}

// The token, from every block's candidate mass (s.d.kept, the same in every block): the first
// candidate in vocabulary order at which the running mass exceeds target. The masses tell which
// block holds it, and that block's warp masses (s.warp_kept plus s.warp_list where `warps_known`,
// else from a pass over its slice now) which warp's stretch; the block cuts that stretch into one
// piece per thread (whole 16-byte chunks), a scan finds the piece, and its thread walks it. A
// stretch is a warp's share of a block's slice, a few thousand logits where the slice has tens of
// thousands.
template <typename T>
__device__ __noinline__ void draw(const Ctx<T>& c, SampleShared& s, float threshold,
                                  bool warps_known, u32* out) {
    constexpr int V = 16 / sizeof(T);
    u64 total = 0;
    for (int r = 0; r < c.ranks; ++r) total += s.d.kept[r];
    if (total == 0) return;  // nothing kept
    const u64 target = draw_target(total, c.p);
    int owner = 0;
    u64 before = 0;
    while (target >= before + s.d.kept[owner]) before += s.d.kept[owner++];
    if ((int)c.rank != owner) return;
    const float mx = c.max, scale = c.scale;
    const auto weights = [=](const float* x, int valid, u64* w) {
        u64 sum = 0;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const u64 wj = fixed_weight(x[j], mx, scale);
            w[j] = j < valid && x[j] >= threshold ? wj : 0ull;
            sum += w[j];
        }
        return sum;
    };
    const int warps = block_size() >> 5;
    if (!warps_known) {
        u64 mine = 0;
        for_each_chunk<true>(c, [&](int, const float* x, int valid) {
            u64 w[V];
            mine += weights(x, valid, w);
        });
        mine = warp_sum_u64(mine);
        if ((threadIdx.x & 31) == 0) {
            s.warp_kept[threadIdx.x >> 5] = mine;
            s.warp_list[threadIdx.x >> 5] = 0;
        }
    }
    __syncthreads();  // the warp masses are in place
    // The stretch: the first warp whose running mass passes target (the last one at most), found
    // by every warp with a lane a warp's mass and a scan, where a loop over the warps had waited
    // for one shared load after another.
    const int lane = threadIdx.x & 31;
    const u64 m = lane < warps ? s.warp_kept[lane] + s.warp_list[lane] : 0ull;
    const u64 incl = warp_inclusive_scan_u64(m);
    const u32 past = __ballot_sync(FULL_MASK, lane < warps && target < before + incl);
    const int stretch = past ? __ffs(past) - 1 : warps - 1;
    before += __shfl_sync(FULL_MASK, incl - m, stretch);
    int lo, hi;
    Layout<T>(c, c.rank).stretch(stretch, lo, hi);
    const int threads = block_size();
    const int piece = ((hi - lo + threads - 1) / threads + V - 1) / V * V;
    const int lb = min(hi, lo + (int)threadIdx.x * piece);
    const int le = min(hi, lb + piece);
    u64 mine = 0;
    walk_piece(c.row, lb, le, [&](int, const float* x, int valid) {
        u64 w[V];
        mine += weights(x, valid, w);
        return false;
    });
    u64 stretch_total;
    u64 run = before + block_exclusive_scan(mine, stretch_total, s);
    if (target < run || target >= run + mine) return;
    // Running weight only grows at candidates, so the first index past target is one.
    walk_piece(c.row, lb, le, [&](int i, const float* x, int valid) {
        u64 w[V];
        const u64 sum = weights(x, valid, w);
        if (run + sum <= target) {
            run += sum;
            return false;
        }
#pragma unroll
        for (int j = 0; j < V; ++j) {
            run += w[j];
            if (run > target) {
                out[c.row_index] = (u32)(i + j);
                break;
            }
        }
        return true;
    });
}

// Greedy: the first index of the largest logit above -inf; index 0 when there is none, as on the
// CPU. Each thread keeps its largest logit and where it first saw it (it sees its indices in
// increasing order); threads and blocks then compare (key << 32 | ~index), whose maximum is that
// first index of the largest key.
template <typename T>
__device__ void argmax(const Ctx<T>& c, SampleShared& s, u32* out) {
    float top = neg_inf();
    int at = -1;
    for_each_logit(c, [&](int i, float x, bool ok) {
        const bool better = ok && x > top;  // false for NaN, and for -inf
        top = better ? x : top;
        at = better ? i : at;
    });
    u64 best = at < 0 ? 0ull : ((u64)order_key(top) << 32) | (u32)~at;
    best = block_max_u64(best, s);
    cluster_wait();  // every block of the cluster has started
    if (threadIdx.x == 0) store_remote(remote(&s.best[c.rank], 0), best);
    cluster_sync();
    if (c.rank == 0 && threadIdx.x == 0) {
        for (int r = 0; r < c.ranks; ++r) best = max(best, s.best[r]);
        out[c.row_index] = best ? ~(u32)best : 0u;
    }
}

template <typename T>
__device__ __forceinline__ void sample_row(const T* __restrict__ logits, int vocab,
                                           const SampleParams* __restrict__ params,
                                           u32* __restrict__ out) {
    __shared__ SampleShared s;
    Ctx<T> c;
    c.row_index = cluster_index();
    c.rank = cluster_rank();
    c.row = logits + (size_t)c.row_index * vocab;
    c.vocab = vocab;
    c.ranks = cluster_ranks();
    c.per = ((vocab + c.ranks - 1) / c.ranks + 15) / 16 * 16;
    c.p = params[c.row_index];
    c.max = 0.f;
    c.scale = LOG2E / c.p.temperature;

    if (c.p.temperature == 0.f) {
        cluster_arrive();  // waited for before the first access to another block's shared memory
        argmax(c, s, out);
        return;
    }
    const bool top_k_on = c.p.top_k > 0 && c.p.top_k < vocab;
    const bool top_p_on = c.p.top_p < 1.f;
    // The one-pass top-k (filter_top_k) where it pays: a warp's segment (32 * SEGMENT_PER_LANE
    // entries of the list at most) holds a chunk from every lane on top of twice k; every warp of
    // the cluster sends rank 0 about k logits, which its list must hold; and a warp reads far
    // more logits than k (a small vocabulary's warps would each keep most of what they read).
    const int warps = block_size() >> 5;
    const int chunk = 16 / (int)sizeof(T);
    const int capacity = min(32 * SEGMENT_PER_LANE, SAMPLE_LIST / warps);
    const bool filter = top_k_on && 2 * c.p.top_k + 32 * chunk <= capacity &&
                        c.ranks * warps * c.p.top_k <= FILTER_LIST &&
                        c.per >= 32 * c.p.top_k * warps;
    if (filter) {
        if (threadIdx.x == 0) s.list_count = s.floor = s.filled = s.block_floor = 0;
    } else {
        clear_histogram(s);
        if (threadIdx.x == 0) s.list_count = 0;
    }
    __syncthreads();
    cluster_arrive();  // as above; rank 0's histogram or list is clear before any block adds to it

    // Pass 1: the maximum; with top-k, every warp's k largest logits, or, where the one-pass
    // top-k does not apply, a histogram of counts of the keys' top 12 bits.
    float mx = neg_inf();
    u64* segment = s.list + (threadIdx.x >> 5) * capacity;
    int segment_count = 0;
    u32 threshold = 0;
    if (filter) {
        threshold = filter_top_k(c, segment, capacity, &s.block_floor, mx, segment_count);
    } else if (top_k_on) {
        for_each_logit(c, [&](int, float x, bool ok) {
            mx = ok ? fmaxf(mx, x) : mx;
            warp_hist_add<false>(s.hist, nullptr, order_key(x) >> 20, 1, ok);
        });
    } else if (top_p_on) {
        const float scale = c.scale, unit = guess_unit(vocab);
        const int shift = guess_shift();
        const u32 low = guess_low();
        for_each_logit<false, LOADS_AHEAD, true>(c, [&](int, float x, bool) {  // lacking: -inf
            mx = fmaxf(mx, x);
            guess_add(s, x, scale, unit, shift, low);
        });
    } else {
        // The maximum alone does too little a logit to hide four loads' wait: eight in flight.
        for_each_logit<false, 8>(c, [&](int, float x, bool ok) {
            mx = ok ? fmaxf(mx, x) : mx;
        });
    }
    mx = block_max(mx, s);
    cluster_wait();
    if (threadIdx.x < c.ranks) store_remote(remote(&s.maxes[c.rank], threadIdx.x), mx);
    if (filter) {
        share_floor(s, threshold, segment_count, c.ranks);
    } else if (top_k_on) {
        merge_into_rank0<false>(s, SAMPLE_BINS, c.rank);
    } else if (top_p_on) {
        merge_into_rank0<false>(s, 1 << guess_bits(), c.rank);
    }
    cluster_sync();
    for (int r = 0; r < c.ranks; ++r) mx = fmaxf(mx, s.maxes[r]);
    c.max = mx;

    if (filter) {
        if (s.filled == 0) {
            gather_segments(s, segment, segment_count, s.floor, c.ranks);
            cluster_sync();  // rank 0's list is complete, and every block knows its length
        }
        const int n = (int)s.list_count;
        if (s.filled == 0 && n <= FILTER_LIST) {
            if (c.rank == 0) {
                cut_list(s, n, c.p.top_k);
                finish_in_list(c, s, out);
            }
            return;
        }
        // A segment filled with keys its bound could not tell apart, or more logits above the
        // floor than the list holds: the histogram of counts, in a pass of its own.
        clear_histogram(s);
        __syncthreads();  // every thread has read n
        if (threadIdx.x == 0) s.list_count = 0;
        cluster_sync();  // every block's histogram is clear, rank 0's before any block adds to it
        build_histogram<T, false>(c, s, 20, SAMPLE_BINS, 0, 0,
                                  Query{false, 0, (u64)c.p.top_k, false});
        merge_into_rank0<false>(s, SAMPLE_BINS, c.rank);
        cluster_sync();
    }
    if (top_k_on) {
        const u64 k = (u64)c.p.top_k;
        if (c.rank == 0)
            decide_level<T, false>(c, s, 20, SAMPLE_BINS, 0, 0, Query{false, 0, k, false}, false);
        cluster_sync();
        if (s.d.above + s.d.mass <= SORT_LIST) {
            const u32 low = s.d.bin << 20;
            gather_into_rank0(
                c, s, [=](float x, bool ok) { return ok && order_key(x) >= low; },
                [](float, bool) {});
            cluster_sync();
            if (c.rank == 0) finish_in_list(c, s, out);
            return;
        }
        const u32 k_key = cluster_select<T, false>(c, s, Query{false, 0, k, false}, true);
        const u64 w_k = fixed_weight(key_value(k_key), mx, c.scale);
        slice_sums(c, s, k_key, w_k);
        cluster_sync();
        u64 count_gt = 0, sum_gt = 0;
        for (int r = 0; r < c.ranks; ++r) {
            count_gt += s.sums[0][r];
            sum_gt += s.sums[1][r];
        }
        const u64 total = sum_gt + (k - count_gt) * w_k;
        if (top_p_on) {
            const u64 need = top_p_need(c.p.top_p, total);
            if (sum_gt >= need) {
                const u32 key = cluster_select<T, true>(c, s, Query{true, k_key, need, false}, false);
                draw(c, s, key_value(key), false, out);
                return;
            }
        }
        // Candidates: the logits above the k-th key, and those at it.
        if (threadIdx.x < c.ranks) s.d.kept[threadIdx.x] = s.sums[1][threadIdx.x] + s.sums[2][threadIdx.x] * w_k;
        __syncthreads();
        draw(c, s, key_value(k_key), true, out);
    } else if (top_p_on) {
        if (c.rank == 0) {
            guess_top_p_bins(s, mx, c.scale, guess_unit(vocab), c.p.top_p);
            publish(s);
        }
        cluster_sync();
        bool resolved = false;  // by the guess
        if (s.d.try_list) {
            // Pass 2: the guessed bins' logits into the block's list, and every logit's exact
            // weight. Compared as floats, which order as their keys do (a NaN, weighing 0, is in
            // neither). A logit the thread lacks (-inf, weight 0) needs no test because lo >
            // -inf: try_list holds only where the maximum's term is at least 16 units, so the
            // need plus the margin is positive, and at most the total, so a bin of positive mass
            // crosses it (guess_top_p_bins); no bin that holds -inf's key holds a finite logit.
            const u32 lo_key = s.d.bin << guess_shift();
            const u32 hi_key = s.d.key << guess_shift() | guess_low();
            const float lo = range_end(lo_key), hi = range_end(hi_key), scale = c.scale;
            u64 above = 0, total = 0;
            gather_into_list<true, true>(
                c, s, [=](float x, bool) { return x >= lo && x <= hi; },
                [&](float x, bool) {
                    const u64 w = fixed_weight(x, mx, scale);
                    total += w;
                    above += x > hi ? w : 0ull;
                });
            // Each warp's sums (its mass above the bins: the list adds the rest, kept_from_list),
            // then the block's, added by thread 0 while its reservation in rank 0's list is on
            // the way: two block barriers where sums and copy took six (rank 0: one where four).
            const int warp = threadIdx.x >> 5;
            above = warp_sum_u64(above);
            total = warp_sum_u64(total);
            if ((threadIdx.x & 31) == 0) {
                s.warp_kept[warp] = above;
                s.scratch[warp] = total;
            }
            __syncthreads();  // the block's list and its warps' sums are complete
            if (threadIdx.x == 0) {
                const u32 base = c.rank != 0 ? reserve_in_rank0(s) : 0u;
                above = total = 0;
                for (int w = 0; w < warps; ++w) {
                    above += s.warp_kept[w];
                    total += s.scratch[w];
                }
                store_remote(remote(&s.acc[c.rank], 0), above);
                store_remote(remote(&s.sums[1][c.rank], 0), total);
                s.scratch[0] = base;
            }
            if (c.rank != 0) copy_list_to_rank0(s);
            cluster_sync();  // rank 0's list is complete, and it has every block's sums
            if (c.rank == 0) {
                check_top_p_guess(c, s, lo_key, hi_key);
            } else {
                clear_histogram(s);
            }
            cluster_sync();
            resolved = s.d.resolved;
        } else {
            if (c.rank != 0) clear_histogram(s);
            __syncthreads();
        }
        const u32 key = resolved ? s.d.key
                                 : cluster_select<T, true>(c, s, Query{false, 0, 0, true}, false);
        draw(c, s, key_value(key), resolved, out);
    } else {
        slice_sums(c, s, 0, 0);  // key 0 is a NaN's: every other logit counts
        cluster_sync();
        if (threadIdx.x < c.ranks) s.d.kept[threadIdx.x] = s.sums[1][threadIdx.x];
        __syncthreads();
        draw(c, s, neg_inf(), true, out);
    }
}

// The shapes sampling.rs chooses from (`launch_shape`). From Hopper on: a cluster of 8 blocks of
// 256 threads a row, the shortest time a row, while every row of the batch fits on the device at
// once (62 rows on an H100); beyond that, 2 blocks of 512 threads a row, of which 132 fit, since
// a second wave of clusters costs a whole row's time. Before Hopper, one block of 1,024 threads.
#if __CUDA_ARCH__ >= 900
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(256, 4)
    sample_f32_8x256(const float* logits, int vocab, const SampleParams* params, u32* out) {
    sample_row<float>(logits, vocab, params, out);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(256, 4)
    sample_bf16_8x256(const bf16* logits, int vocab, const SampleParams* params, u32* out) {
    sample_row<bf16>(logits, vocab, params, out);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(512, 2)
    sample_f32_2x512(const float* logits, int vocab, const SampleParams* params, u32* out) {
    sample_row<float>(logits, vocab, params, out);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(512, 2)
    sample_bf16_2x512(const bf16* logits, int vocab, const SampleParams* params, u32* out) {
    sample_row<bf16>(logits, vocab, params, out);
}
#else
extern "C" __global__ void __launch_bounds__(1024, 1)
    sample_f32_1x1024(const float* logits, int vocab, const SampleParams* params, u32* out) {
    sample_row<float>(logits, vocab, params, out);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    sample_bf16_1x1024(const bf16* logits, int vocab, const SampleParams* params, u32* out) {
    sample_row<bf16>(logits, vocab, params, out);
}
#endif
