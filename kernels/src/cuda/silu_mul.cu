// SwiGLU's activation (Shazeer, 2020): the MLP computes gate and up projections in one fused
// GEMM, giving rows [gate | up] of width 2I; this kernel produces silu(gate) * up, width I.
//     silu(g) = g / (1 + exp(-g))
//
// A grid-stride loop over 16-byte chunks of the output: each thread reads one chunk of gate
// and the matching chunk of up, and writes one chunk of the result.
extern "C" __global__ void silu_mul(const bf16* __restrict__ gate_up,
                                    bf16* __restrict__ out,
                                    int rows,
                                    int inter) {
    const int chunks_per_row = inter / 8;
    const size_t total = (size_t)rows * chunks_per_row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / chunks_per_row;
        const int c = (int)(i % chunks_per_row);
        const uint4* in = reinterpret_cast<const uint4*>(gate_up + row * 2 * inter);
        float g[8], u[8], y[8];
        chunk_to_float(in[c], g);
        chunk_to_float(in[chunks_per_row + c], u);
#pragma unroll
        for (int k = 0; k < 8; ++k) y[k] = g[k] / (1.f + expf(-g[k])) * u[k];
        reinterpret_cast<uint4*>(out + row * inter)[c] = float_to_chunk(y);
    }
}
