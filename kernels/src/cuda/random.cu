// Random weights generated in place, for benchmarks of real shapes without a checkpoint.
//
// Element i of a tensor is a pure function of (key, i): SplitMix64's finaliser over the
// counter key + (i + 1) * golden ratio, whose top 23 bits give a uniform u in (0, 1) with 24
// significant bits. The value is mean + half_width * (2u - 1), with the product and the sum
// rounded separately (__fmul_rn / __fadd_rn forbid the fused multiply-add), then rounded to
// bf16: the same bits as the host's recipe (phase2's random_weights module), so a GPU runner
// and a CPU runner of the same seed hold the same model. A grid-stride loop writes one value per
// thread and iteration: a whole 8B model is written in tens of milliseconds, far from mattering.
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float uniform_value(u64 key, u64 index, float mean, float half_width) {
    const u64 h = mix64(key + (index + 1) * 0x9e3779b97f4a7c15ULL);
    const float u = ((float)(h >> 41) + 0.5f) * 0x1p-23f;
    const float x = 2.f * u - 1.f;  // exact: u has 24 significant bits
    return __fadd_rn(mean, __fmul_rn(half_width, x));
}

// Output element i, in row i / width and column i % width, is element first + row * stride +
// column of the stream: a whole tensor is one window onto its own stream, and a tensor-parallel
// rank's rows or columns of a tensor are a window onto the whole tensor's.
extern "C" __global__ void fill_uniform_bf16(bf16* __restrict__ out,
                                             u64 n,
                                             u64 key,
                                             float mean,
                                             float half_width,
                                             u64 first,
                                             u64 width,
                                             u64 stride) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 index = first + (i / width) * stride + i % width;
        out[i] = __float2bfloat16_rn(uniform_value(key, index, mean, half_width));
    }
}
