// Bias of a linear layer: y[r, :] += bias for every row r (Qwen2's q/k/v projections).
//
// cuBLAS computes X W^T without the bias; this adds it afterwards in one pass over y, a
// grid-stride loop over 16-byte chunks: each thread adds one chunk of the bias (which stays in
// L1/L2, it is a single row) to one chunk of y.
extern "C" __global__ void add_bias(bf16* __restrict__ y,
                                    const bf16* __restrict__ bias,
                                    int rows,
                                    int width) {
    const int chunks_per_row = width / 8;
    const size_t total = (size_t)rows * chunks_per_row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % chunks_per_row);
        float a[8], b[8];
        chunk_to_float(reinterpret_cast<const uint4*>(y)[i], a);
        chunk_to_float(reinterpret_cast<const uint4*>(bias)[c], b);
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] += b[k];
        reinterpret_cast<uint4*>(y)[i] = float_to_chunk(a);
    }
}
