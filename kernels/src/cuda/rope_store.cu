// The step between the QKV projection and attention, in one pass over the fused QKV output:
//   1. optional RMSNorm of every q and k head (Qwen3's q_norm / k_norm; Llama has none),
//   2. rotary position embedding (Su et al., RoFormer) on q and k, in the Hugging Face
//      "rotate_half" layout: element i is paired with element i + D/2, and the pair is turned
//      by the angle position * inv_freq[i]. The frequencies are the model's table, computed on
//      the host once (theta^(-2i/D), rescaled for long contexts by llama3 / YaRN / linear
//      RoPE scaling), and cos and sin are multiplied by its attention factor (YaRN's),
//   3. the rotated q goes to q_out [T, Hq, D]; the rotated k and the plain v are stored into the
//      paged KV cache at the token's slot, so attention never needs a separate copy kernel.
//
// The cache of one layer is two buffers [num_pages][Hkv][page_size][D] ("HND": within a page,
// the tokens of one head are contiguous rows, which is what attention streams through).
//
// Input row of token t: [q_0 .. q_{Hq-1} | k_0 .. k_{Hkv-1} | v_0 .. v_{Hkv-1}], each D wide.
// Grid: (T, ceil((Hq + 2 Hkv) / WARPS)); each warp handles one head of one token. Lane l owns
// the rotation pairs (p, p + D/2) for p = l, l + 32, ... so a pair never crosses threads.
// The warps of a block share one token, so the block computes the token's D/2 angles once
// (RopeAngles) and every head it rotates reads them: the precise sincosf costs more than moving
// a head, and there are up to Hq + Hkv heads to rotate per token.

// cos and sin of pair p's angle, position * inv_freq[p], times a scale, for one position.
template <int D>
struct RopeAngles {
    float cos[D / 2];
    float sin[D / 2];
};

// Fills `a` for `position`; it synchronises the block, so every thread of it must get here.
template <int D>
__device__ __forceinline__ void rope_angles(RopeAngles<D>& a, float position,
                                            const float* __restrict__ inv_freq, float scale) {
    for (int p = threadIdx.x; p < D / 2; p += blockDim.x) {
        // Precise sincosf: angles reach tens of thousands of radians for long contexts, where
        // the fast approximation loses all accuracy.
        float s, c;
        sincosf(position * inv_freq[p], &s, &c);
        a.sin[p] = s * scale;
        a.cos[p] = c * scale;
    }
    __syncthreads();
}

// One head: optional RMSNorm, then the rotation by `angles` (none when it is null). `src` is
// read as `In` elements (times `in_scale` when FP8), `dst` written as `Out` elements (divided
// by `out_scale` before rounding when FP8).
template <int D, typename In, typename Out>
__device__ __forceinline__ void rope_head(const typename In::T* __restrict__ src,
                                          typename Out::T* __restrict__ dst,
                                          const bf16* __restrict__ norm_w,
                                          float eps,
                                          const RopeAngles<D>* angles,
                                          float in_scale, float out_scale) {
    constexpr int HALF = D / 2;
    constexpr int PAIRS = (HALF + 31) / 32;  // pairs per lane
    const int lane = threadIdx.x & 31;
    float a[PAIRS], b[PAIRS];
    float sq = 0.f;
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
        const int p = lane + 32 * j;
        a[j] = p < HALF ? In::get(src, p, in_scale) : 0.f;
        b[j] = p < HALF ? In::get(src, p + HALF, in_scale) : 0.f;
        sq += a[j] * a[j] + b[j] * b[j];
    }
    if (norm_w != nullptr) {
        const float inv_rms = rsqrtf(warp_sum(sq) / D + eps);
#pragma unroll
        for (int j = 0; j < PAIRS; ++j) {
            const int p = lane + 32 * j;
            if (p < HALF) {
                a[j] *= inv_rms * __bfloat162float(norm_w[p]);
                b[j] *= inv_rms * __bfloat162float(norm_w[p + HALF]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
        const int p = lane + 32 * j;
        if (p >= HALF) continue;
        float x1 = a[j], x2 = b[j];
        if (angles != nullptr) {
            const float c = angles->cos[p], s = angles->sin[p];
            x1 = a[j] * c - b[j] * s;
            x2 = b[j] * c + a[j] * s;
        }
        Out::put(dst, p, x1, out_scale);
        Out::put(dst, p + HALF, x2, out_scale);
    }
}

template <int D, typename KV>
__device__ __forceinline__ void qk_norm_rope_store(const bf16* __restrict__ qkv,
                                                   bf16* __restrict__ q_out,
                                                   typename KV::T* __restrict__ k_cache,
                                                   typename KV::T* __restrict__ v_cache,
                                                   const int* __restrict__ positions,
                                                   const int* __restrict__ slots,
                                                   const bf16* __restrict__ q_norm_w,
                                                   const bf16* __restrict__ k_norm_w,
                                                   int num_q_heads,
                                                   int num_kv_heads,
                                                   int page_size,
                                                   int num_pages,
                                                   float eps,
                                                   const float* __restrict__ inv_freq,
                                                   float attention_factor, float k_scale,
                                                   float v_scale) {
    const int t = blockIdx.x;
    const int first_head = blockIdx.y * (blockDim.x / 32);
    const int head = first_head + (threadIdx.x >> 5);
    const int heads = num_q_heads + 2 * num_kv_heads;
    __shared__ RopeAngles<D> angles;
    if (first_head < num_q_heads + num_kv_heads) {  // the same for the whole block
        rope_angles<D>(angles, (float)positions[t], inv_freq, attention_factor);
    }
    if (head >= heads) return;
    const bf16* src = qkv + ((size_t)t * heads + head) * D;

    if (head < num_q_heads) {
        bf16* dst = q_out + ((size_t)t * num_q_heads + head) * D;
        rope_head<D, KvBf16, KvBf16>(src, dst, q_norm_w, eps, &angles, 1.f, 1.f);
        return;
    }
    // K and V go to the cache. A slot outside the cache (page < 0 marks padding) stores nothing.
    const int page = slots[2 * t], offset = slots[2 * t + 1];
    if (page < 0 || page >= num_pages || offset < 0 || offset >= page_size) return;
    const bool is_k = head < num_q_heads + num_kv_heads;
    const int kv_head = is_k ? head - num_q_heads : head - num_q_heads - num_kv_heads;
    const size_t row = ((size_t)page * num_kv_heads + kv_head) * page_size + offset;
    if (is_k) {
        rope_head<D, KvBf16, KV>(src, k_cache + row * D, k_norm_w, eps, &angles, 1.f, k_scale);
    } else {
        rope_head<D, KvBf16, KV>(src, v_cache + row * D, nullptr, eps, nullptr, 1.f, v_scale);
    }
}

// `k_scale` and `v_scale` are the FP8 cache's scales (1 for a bf16 cache).
#define ROPE_STORE(NAME, D, KV)                                                              \
    extern "C" __global__ void NAME(                                                         \
        const bf16* qkv, bf16* q_out, KV::T* k_cache, KV::T* v_cache, const int* positions,  \
        const int* slots, const bf16* q_norm_w, const bf16* k_norm_w, int num_q_heads,       \
        int num_kv_heads, int page_size, int num_pages, float eps, const float* inv_freq,     \
        float attention_factor, float k_scale, float v_scale) {                              \
        qk_norm_rope_store<D, KV>(qkv, q_out, k_cache, v_cache, positions, slots, q_norm_w,  \
                                  k_norm_w, num_q_heads, num_kv_heads, page_size, num_pages,  \
                                  eps, inv_freq, attention_factor, k_scale, v_scale);         \
    }

ROPE_STORE(qk_norm_rope_store_d32, 32, KvBf16)
ROPE_STORE(qk_norm_rope_store_d64, 64, KvBf16)
ROPE_STORE(qk_norm_rope_store_d128, 128, KvBf16)
ROPE_STORE(qk_norm_rope_store_fp8_d32, 32, KvFp8)
ROPE_STORE(qk_norm_rope_store_fp8_d64, 64, KvFp8)
ROPE_STORE(qk_norm_rope_store_fp8_d128, 128, KvFp8)

// Copies the K/V of n tokens from one set of slots to another in one layer's cache, turning
// each key by `shift` positions on the way. RoPE rotations compose, so a key rotated for
// position p becomes exactly the key for position p + shift (before bf16 rounding): the chunk
// API's independent mode moves a context prefilled at position 0 behind a prefix this way.
// The turn is a pure rotation: the attention factor was applied when the key was stored.
// Slots are (page, offset) pairs as above; the two sets must not share a page.
// Grid: (n, ceil(2 Hkv / WARPS)); a warp per (token, K head or V head).
template <int D, typename KV>
__device__ __forceinline__ void copy_kv_rotated(typename KV::T* __restrict__ k_cache,
                                                typename KV::T* __restrict__ v_cache,
                                                const int* __restrict__ src_slots,
                                                const int* __restrict__ dst_slots,
                                                const float* __restrict__ inv_freq,
                                                int num_kv_heads, int page_size, int num_pages,
                                                float shift, float k_scale, float v_scale) {
    const int t = blockIdx.x;
    const int first_head = blockIdx.y * (blockDim.x / 32);
    const int head = first_head + (threadIdx.x >> 5);
    __shared__ RopeAngles<D> angles;  // the same shift for every token
    if (first_head < num_kv_heads) rope_angles<D>(angles, shift, inv_freq, 1.f);
    if (head >= 2 * num_kv_heads) return;
    const int sp = src_slots[2 * t], so = src_slots[2 * t + 1];
    const int dp = dst_slots[2 * t], dof = dst_slots[2 * t + 1];
    if (sp < 0 || sp >= num_pages || dp < 0 || dp >= num_pages) return;
    if (so < 0 || so >= page_size || dof < 0 || dof >= page_size) return;
    const bool is_k = head < num_kv_heads;
    const int kv_head = is_k ? head : head - num_kv_heads;
    const size_t src_row = ((size_t)sp * num_kv_heads + kv_head) * page_size + so;
    const size_t dst_row = ((size_t)dp * num_kv_heads + kv_head) * page_size + dof;
    typename KV::T* cache = is_k ? k_cache : v_cache;
    const float scale = is_k ? k_scale : v_scale;
    rope_head<D, KV, KV>(cache + src_row * D, cache + dst_row * D, nullptr, 0.f,
                         is_k ? &angles : nullptr, scale, scale);
}

// An FP8 key is read (code * scale), turned and rounded to a code again.
#define COPY_KV(NAME, D, KV)                                                                     \
    extern "C" __global__ void NAME(                                                            \
        KV::T* k_cache, KV::T* v_cache, const int* src_slots, const int* dst_slots,              \
        const float* inv_freq, int num_kv_heads, int page_size, int num_pages, float shift,     \
        float k_scale, float v_scale) {                                                         \
        copy_kv_rotated<D, KV>(k_cache, v_cache, src_slots, dst_slots, inv_freq, num_kv_heads,   \
                               page_size, num_pages, shift, k_scale, v_scale);                   \
    }

COPY_KV(copy_kv_rotated_d32, 32, KvBf16)
COPY_KV(copy_kv_rotated_d64, 64, KvBf16)
COPY_KV(copy_kv_rotated_d128, 128, KvBf16)
COPY_KV(copy_kv_rotated_fp8_d32, 32, KvFp8)
COPY_KV(copy_kv_rotated_fp8_d64, 64, KvFp8)
COPY_KV(copy_kv_rotated_fp8_d128, 128, KvFp8)
