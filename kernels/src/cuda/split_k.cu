// Split-K for thin products (the K-splitting of CUTLASS's and cuBLAS's split-K GEMMs).
//
// A decode step multiplies a few hundred rows by each weight matrix. The output then has so few
// tiles that most SMs idle while the rest stream the weights: a 134 x 1024 output is 16 tiles of
// 128 x 64 for 132 SMs. Cutting K into S ranges and running one GEMM per range (one strided-
// batched cuBLAS call) gives S times the tiles; each writes f32 partial sums
//     partials[s][row][col] = sum over k in range s of x[row][k] * w[col][k]
// and the consumer adds the S partials as it reads them (the add + RMSNorm kernel reads them
// instead of a bf16 product; sum_splits below serves any other consumer).

// Grid-stride over 16-byte chunks of the output: each thread sums one chunk of every split.
extern "C" __global__ void sum_splits(const float* __restrict__ partials,
                                      bf16* __restrict__ out,
                                      int splits,
                                      long long split_stride,
                                      long long chunks) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < chunks;
         i += (long long)gridDim.x * blockDim.x) {
        float y[8];
        split_sum_chunk(partials, splits, split_stride, i * 8, y);
        reinterpret_cast<uint4*>(out)[i] = float_to_chunk(y);
    }
}
