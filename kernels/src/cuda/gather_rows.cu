// Row gather: out[i, :] = table[index[i], :].
//
// The same copy serves two purposes in a transformer step: the embedding lookup (the table is
// the embedding matrix, the indices are token ids) and picking the last token's hidden state
// of every sequence that samples before the lm_head GEMM (the table is the hidden states).
//
// One block per output row; each thread moves 16-byte chunks, so a warp copies 512 contiguous
// bytes per instruction. An index outside the table writes a row of zeros instead of reading
// out of bounds.
extern "C" __global__ void gather_rows(const u32* __restrict__ index,
                                       const bf16* __restrict__ table,
                                       bf16* __restrict__ out,
                                       u32 table_rows,
                                       int width) {
    const u32 row = index[blockIdx.x];
    const int chunks = width / 8;
    const uint4* src = reinterpret_cast<const uint4*>(table + (size_t)row * width);
    uint4* dst = reinterpret_cast<uint4*>(out + (size_t)blockIdx.x * width);
    const bool inside = row < table_rows;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        dst[c] = inside ? src[c] : make_uint4(0, 0, 0, 0);
    }
}

// Inputs of a step launched while the step before it still ran (overlap scheduling): an id with
// the top bit set is "row r of the previous step's sampled ids", r in the low 31 bits, and is
// replaced by that token before the embedding reads it.
extern "C" __global__ void take_pending_ids(u32* __restrict__ ids, const u32* __restrict__ prev,
                                            int n, int prev_rows) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u32 id = ids[i];
    if (id & 0x80000000u) {
        const int r = (int)(id & 0x7fffffffu);
        ids[i] = r < prev_rows ? prev[r] : 0xffffffffu;  // out of range: the embedding's zero row
    }
}
