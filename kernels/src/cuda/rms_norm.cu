// RMSNorm (Zhang & Sennrich, 2019), as Llama and Qwen use it:
//     y = x / sqrt(mean(x^2) + eps) * w
// and the fused form that every decoder layer runs twice:
//     residual += x;  x = rmsnorm(residual) * w
// Fusing the residual add saves one full read and write of the hidden states per norm.
//
// One block per row (token). Each thread owns whole 16-byte chunks of the row; the sum of
// squares is reduced first inside each warp with shuffles, then across warps in shared memory.
// The row is read twice (once for the statistic, once to scale it): the second read comes
// from L1/L2, since a row is only a few KiB.

__device__ __forceinline__ void scale_row(const bf16* src, const bf16* w, bf16* dst,
                                          int chunks, float inv_rms) {
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        float x[8], g[8], y[8];
        chunk_to_float(reinterpret_cast<const uint4*>(src)[c], x);
        chunk_to_float(reinterpret_cast<const uint4*>(w)[c], g);
#pragma unroll
        for (int i = 0; i < 8; ++i) y[i] = x[i] * inv_rms * g[i];
        reinterpret_cast<uint4*>(dst)[c] = float_to_chunk(y);
    }
}

extern "C" __global__ void rms_norm(const bf16* __restrict__ x,
                                    const bf16* __restrict__ w,
                                    bf16* __restrict__ out,
                                    int hidden,
                                    float eps) {
    __shared__ float scratch[32];
    const bf16* row = x + (size_t)blockIdx.x * hidden;
    const int chunks = hidden / 8;
    float sq = 0.f;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        float v[8];
        chunk_to_float(reinterpret_cast<const uint4*>(row)[c], v);
#pragma unroll
        for (int i = 0; i < 8; ++i) sq += v[i] * v[i];
    }
    const float inv_rms = rsqrtf(block_sum(sq, scratch) / hidden + eps);
    scale_row(row, w, out + (size_t)blockIdx.x * hidden, chunks, inv_rms);
}

// residual += x, then x = rmsnorm(residual) * w, for one row; `load_x(c, a)` gives chunk c of
// x as floats. The sum is rounded to bf16 before it is stored and normalised, exactly as a
// framework that keeps the residual stream in bf16 does.
template <typename LoadX>
__device__ __forceinline__ void add_rms_norm_row(LoadX load_x, bf16* __restrict__ xrow,
                                                 bf16* __restrict__ rrow,
                                                 const bf16* __restrict__ w, int hidden,
                                                 float eps, float* scratch) {
    const int chunks = hidden / 8;
    float sq = 0.f;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        float a[8], b[8];
        load_x(c, a);
        chunk_to_float(reinterpret_cast<const uint4*>(rrow)[c], b);
#pragma unroll
        for (int i = 0; i < 8; ++i) b[i] += a[i];
        const uint4 sum = float_to_chunk(b);
        reinterpret_cast<uint4*>(rrow)[c] = sum;
        chunk_to_float(sum, b);  // the statistic of what was stored, not of the f32 sum
#pragma unroll
        for (int i = 0; i < 8; ++i) sq += b[i] * b[i];
    }
    const float inv_rms = rsqrtf(block_sum(sq, scratch) / hidden + eps);
    // Each thread re-reads only the chunks it wrote itself, so no barrier is needed here.
    scale_row(rrow, w, xrow, chunks, inv_rms);
}

// residual and x are both updated in place.
extern "C" __global__ void add_rms_norm(bf16* __restrict__ x,
                                        bf16* __restrict__ residual,
                                        const bf16* __restrict__ w,
                                        int hidden,
                                        float eps) {
    __shared__ float scratch[32];
    bf16* xrow = x + (size_t)blockIdx.x * hidden;
    bf16* rrow = residual + (size_t)blockIdx.x * hidden;
    const auto load_x = [&](int c, float a[8]) {
        chunk_to_float(reinterpret_cast<const uint4*>(xrow)[c], a);
    };
    add_rms_norm_row(load_x, xrow, rrow, w, hidden, eps, scratch);
}

// The same with x given as a split-K product's f32 partials (split_k.cu): the partials are
// summed as they are read, so the split product costs no pass of its own. x is written.
extern "C" __global__ void add_split_rms_norm(const float* __restrict__ partials,
                                              int splits,
                                              long long split_stride,
                                              bf16* __restrict__ x,
                                              bf16* __restrict__ residual,
                                              const bf16* __restrict__ w,
                                              int hidden,
                                              float eps) {
    __shared__ float scratch[32];
    const long long row0 = (long long)blockIdx.x * hidden;
    const auto load_x = [&](int c, float a[8]) {
        split_sum_chunk(partials, splits, split_stride, row0 + c * 8, a);
    };
    add_rms_norm_row(load_x, x + row0, residual + row0, w, hidden, eps, scratch);
}
