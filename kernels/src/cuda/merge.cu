// Merging partial attention results by their log-sum-exp.
//
// Softmax attention over a set of keys can be split: if o_a, lse_a is attention over part A of
// the keys and o_b, lse_b over part B, then attention over A u B is
//     lse = log(exp(lse_a) + exp(lse_b))
//     o   = o_a * exp(lse_a - lse) + o_b * exp(lse_b - lse)
// This is FlashInfer's merge_state, the step that makes cascade attention (shared prefix read
// once for a group of queries, the rest per query) and split-K decode exact. An empty part has
// lse = -inf and weight 0. lse is in natural-log units throughout.

// Cascade: two bf16 partial outputs [rows, D] with f32 lse [rows] -> bf16 output (+ lse).
// One thread per 16-byte chunk of the output.
extern "C" __global__ void merge_state(const bf16* __restrict__ o_a, const float* __restrict__ lse_a,
                                       const bf16* __restrict__ o_b, const float* __restrict__ lse_b,
                                       bf16* __restrict__ o_out, float* __restrict__ lse_out,
                                       int rows, int head_dim) {
    const int chunks = head_dim / 8;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * chunks) return;
    const size_t row = i / chunks;
    const float la = lse_a[row], lb = lse_b[row];
    const float m = fmaxf(la, lb);
    float y[8];
    float total = 0.f;
    if (m == neg_inf()) {
#pragma unroll
        for (int k = 0; k < 8; ++k) y[k] = 0.f;
    } else {
        const float wa = expf(la - m), wb = expf(lb - m);
        total = wa + wb;
        float a[8], b[8];
        chunk_to_float(reinterpret_cast<const uint4*>(o_a)[i], a);
        chunk_to_float(reinterpret_cast<const uint4*>(o_b)[i], b);
#pragma unroll
        for (int k = 0; k < 8; ++k) y[k] = (a[k] * wa + b[k] * wb) / total;
    }
    reinterpret_cast<uint4*>(o_out)[i] = float_to_chunk(y);
    if (lse_out != nullptr && i % chunks == 0) lse_out[row] = m == neg_inf() ? m : m + logf(total);
}

// Pieces whose states a thread loads at once, before adding any of them.
#define MERGE_BATCH 16

// Cascade and split-KV: `pieces` partial states computed for a level's rows (its row i is
// token index[i]; piece p's state of row i, head h is at
// [(p * rows + i) * heads + h]) folded into the main state (o [T, H, D], lse [T, H]) in one pass.
// Indices at or past `out_rows` are skipped. One thread per 16-byte chunk of a (gathered row,
// head): it keeps the weighted sum in f32, so the result is rounded to bf16 once (a tree of
// pairwise merges rounds at every level, and takes a launch a level). It loads the main state and
// up to MERGE_BATCH pieces' lse and chunks, takes their largest lse, rescales what it summed
// before once, and then weighs every state of the batch on its own. Loaded one piece after the
// other, each load waiting for the fold before it, 8 pieces had taken 5.7 us on an H100 (the
// log's "Cascade at small batches"); folded one at a time, each rescaling the sum when its lse
// was the largest so far, every piece's weight waited for the one before, and 16 pieces took
// two batches of 8: the split cascade was 1-2 us slower (the log's "A merge of sixteen pieces at
// once"). The threads of a row are one warp's neighbours: all of them read the row's old lse
// before its first chunk's thread rewrites it. On Hopper it is a programmatic dependent launch:
// its blocks may start while the kernel before it ends, read their rows' indices (written before
// that kernel) and wait for it before touching the states; every thread waits, since later work
// on the stream waits for this kernel only.
extern "C" __global__ void merge_pieces_into(bf16* __restrict__ o, float* __restrict__ lse,
                                             const bf16* __restrict__ o_parts,
                                             const float* __restrict__ lse_parts,
                                             const u32* __restrict__ index, int rows,
                                             int out_rows, int heads, int head_dim, int pieces) {
    const int chunks = head_dim / 8;
    const size_t stride = (size_t)rows * heads;  // one piece's rows
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t row = i / chunks;               // (gathered row, head)
    const int c = (int)(i % chunks);
    const u32 token = row < stride ? index[row / heads] : (u32)out_rows;
    wait_for_previous_kernel();
    const bool live = token < (u32)out_rows;
    const size_t dst = (size_t)token * heads + row % heads;
    float m = neg_inf(), total = 0.f;
    float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int p0 = 0; live && p0 < pieces; p0 += MERGE_BATCH) {
        // The main state comes first in the first batch.
        float l[MERGE_BATCH + 1];
        uint4 b[MERGE_BATCH + 1];
        l[0] = p0 == 0 ? lse[dst] : neg_inf();
        b[0] = p0 == 0 ? reinterpret_cast<const uint4*>(o + dst * head_dim)[c]
                       : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < MERGE_BATCH; ++k) {
            const size_t at = (p0 + k) * stride + row;
            const bool here = p0 + k < pieces;
            l[k + 1] = here ? lse_parts[at] : neg_inf();
            b[k + 1] = here ? reinterpret_cast<const uint4*>(o_parts + at * head_dim)[c]
                            : make_uint4(0, 0, 0, 0);
        }
        add_states<MERGE_BATCH + 1>(m, total, y, l, b, 1 + pieces - p0);
    }
    __syncwarp();  // every thread of the row has read its old lse
    if (total == 0.f) return;  // no state weighs anything (or the row is skipped)
#pragma unroll
    for (int k = 0; k < 8; ++k) y[k] /= total;
    reinterpret_cast<uint4*>(o + dst * head_dim)[c] = float_to_chunk(y);
    if (c == 0) lse[dst] = m + logf(total);
}
