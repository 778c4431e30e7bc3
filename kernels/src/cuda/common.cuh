// Helpers shared by every kernel file. The Rust side prepends this text to each .cu source
// before handing it to NVRTC, so a kernel file can use these names without an #include.
//
// Conventions used everywhere:
// - tensors are bf16 in memory, arithmetic is f32 (bf16 has only 8 bits of mantissa, so sums
//   and products are carried in f32 and rounded once, when stored);
// - a "chunk" is 8 bf16 = 16 bytes, the widest load one thread can issue in one instruction;
//   rows are moved chunk by chunk so that a warp reads 512 contiguous bytes at a time.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef __nv_bfloat16 bf16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu
// Attention keeps its softmax in log2 units (exp2f is one instruction): scores times LOG2E,
// and a log-sum-exp back in natural log times LN2.
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// A row's softmax sum over the four lanes that hold its columns in the tensor cores'
// accumulator layout (lanes 4r..4r+3 of a warp).
__device__ __forceinline__ float quad_total(float x) {
    x += __shfl_xor_sync(FULL_MASK, x, 1);
    return x + __shfl_xor_sync(FULL_MASK, x, 2);
}

// A row's natural log-sum-exp from its running maximum `m` (log2 units) and its softmax sum
// below it; -inf for a row that saw no key.
__device__ __forceinline__ float row_lse(float m, float total) {
    return total > 0.f ? (m + log2f(total)) * LN2 : neg_inf();
}

// Unpacks one 16-byte chunk (8 bf16) into 8 floats.
__device__ __forceinline__ void chunk_to_float(const uint4 c, float out[8]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

// Packs 8 floats into one 16-byte chunk of bf16, rounding to nearest even.
__device__ __forceinline__ uint4 float_to_chunk(const float v[8]) {
    uint4 c;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&c);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    return c;
}

// Adds one state (its log-sum-exp l and its chunk of output) to a running sum (total, y) kept
// relative to a maximum m that is at least l: FlashInfer's merge_state over many states at once.
// An empty state (l = -inf) weighs nothing, whatever its chunk holds.
__device__ __forceinline__ void add_state(float m, float& total, float (&y)[8], float l,
                                          uint4 chunk) {
    if (l == neg_inf()) return;
    const float w = expf(l - m);
    float b[8];
    chunk_to_float(chunk, b);
#pragma unroll
    for (int k = 0; k < 8; ++k) y[k] += w * b[k];
    total += w;
}

// Adds N states loaded together (empty ones have l = -inf) to the running sum (m, total, y): the
// sum is rescaled once, to their largest lse if that is above m, and then every state is weighed
// on its own (folded one at a time, each rescaling the sum when its lse was the largest so far,
// every weight waited for the one before). `count` states are added, the same number for every
// thread of a warp.
template <int N>
__device__ __forceinline__ void add_states(float& m, float& total, float (&y)[8],
                                           const float (&l)[N], const uint4 (&chunk)[N],
                                           int count) {
    float top = m;
#pragma unroll
    for (int k = 0; k < N; ++k) top = fmaxf(top, l[k]);
    if (top == neg_inf()) return;  // all of them empty
    if (top > m) {
        const float s = expf(m - top);  // 0 while nothing is summed (m = -inf)
        total *= s;
#pragma unroll
        for (int k = 0; k < 8; ++k) y[k] *= s;
        m = top;
    }
#pragma unroll
    for (int k = 0; k < N; ++k)
        if (k < count) add_state(m, total, y, l[k], chunk[k]);
}

// How the paged KV cache holds an element: bf16, or an FP8 E4M3 code of value / scale (the
// "fn" variant: no infinities, saturating at +-448, round to nearest even), read back as
// code * scale. A kernel templated on one of these reads and writes either cache.
struct KvBf16 {
    typedef bf16 T;
    static constexpr bool FP8 = false;
    static __device__ __forceinline__ float get(const T* p, int i, float) {
        return __bfloat162float(p[i]);
    }
    static __device__ __forceinline__ void put(T* p, int i, float x, float) {
        p[i] = __float2bfloat16(x);
    }
};

struct KvFp8 {
    typedef unsigned char T;
    static constexpr bool FP8 = true;
    static __device__ __forceinline__ float decode(unsigned char c) {
        return __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3)));
    }
    static __device__ __forceinline__ float get(const T* p, int i, float scale) {
        return decode(p[i]) * scale;
    }
    // The code of x / scale, divided exactly as `e4m3::encode(x / scale)` on the host.
    static __device__ __forceinline__ void put(T* p, int i, float x, float scale) {
        p[i] = __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
    }
};

// Unpacks 8 FP8 E4M3 codes (the low 8 bytes of `c`) into 8 floats times `scale`, two at a time
// (one conversion instruction per pair on GPUs that have it).
__device__ __forceinline__ void fp8_chunk_to_float(const uint4 c, float out[8], float scale) {
    const unsigned short* pairs = reinterpret_cast<const unsigned short*>(&c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3));
        const float2 f = __half22float2(h);
        out[2 * i] = f.x * scale;
        out[2 * i + 1] = f.y * scale;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over the whole block. `scratch` holds one float per warp; every thread gets the result.
// Contains __syncthreads, so every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < warps; ++w) total += scratch[w];
    return total;
}

// The 8 values at `offset` of a split-K product (see split_k.cu): the sum of its `splits` f32
// partials, `split_stride` floats apart, rounded to bf16 and back, as a bf16 GEMM output would
// have been.
__device__ __forceinline__ void split_sum_chunk(const float* __restrict__ partials, int splits,
                                                long long split_stride, long long offset,
                                                float y[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float4* p = reinterpret_cast<const float4*>(partials + s * split_stride + offset);
        const float4 a = p[0], b = p[1];
        y[0] += a.x; y[1] += a.y; y[2] += a.z; y[3] += a.w;
        y[4] += b.x; y[5] += b.y; y[6] += b.z; y[7] += b.w;
    }
    chunk_to_float(float_to_chunk(y), y);
}

// Programmatic dependent launch (sm_90): the kernel after this one on the stream, if launched as
// a programmatic dependent, may be started now; it still waits, at wait_for_previous_kernel,
// until this one has finished and its writes are visible. Before Hopper both are no-ops and
// kernels run one after the other as usual.
__device__ __forceinline__ void let_next_kernel_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
