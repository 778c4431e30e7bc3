// Row gather: out[i, :] = table[index[i], :].
//
// The same copy serves two purposes in a transformer step: the embedding lookup (the table is
// the embedding matrix, the indices are token ids) and picking the last token's hidden state
// of every sequence that samples before the lm_head GEMM (the table is the hidden states).
//
// One block per output row; each thread moves 16-byte chunks, so a warp copies 512 contiguous
// bytes per instruction. The table holds rows first..first + table_rows of a larger one (a
// tensor-parallel rank's slice of the vocabulary; first is 0 otherwise): an index outside it
// writes a row of zeros instead of reading out of bounds (below first, the unsigned difference
// wraps past table_rows).
extern "C" __global__ void gather_rows(const u32* __restrict__ index,
                                       const bf16* __restrict__ table,
                                       bf16* __restrict__ out,
                                       u32 first,
                                       u32 table_rows,
                                       int width) {
    const u32 row = index[blockIdx.x] - first;
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

// Tensor-parallel logits: every rank computed the logits of its slice of `each` vocabulary ids
// for `rows` rows, and an all-gather laid them end to end, parts[rank][row][0..each]; this
// writes them as out[row][0..vocab] (the last slice may be padded past vocab). One thread per
// output element.
extern "C" __global__ void join_vocab_slices(const float* __restrict__ parts,
                                             float* __restrict__ out,
                                             int rows, int vocab, int each) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * vocab) return;
    const int row = (int)(i / vocab), col = (int)(i % vocab);
    const int rank = col / each;
    out[i] = parts[((long long)rank * rows + row) * each + (col - rank * each)];
}
