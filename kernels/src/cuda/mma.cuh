// Tensor-core building blocks (sm_80+), written as inline PTX so NVRTC needs no extra headers.
//
// mma.sync m16n8k16 multiplies a 16x16 bf16 tile A by a 16x8 bf16 tile B into a 16x8 f32 tile C,
// cooperatively across the 32 lanes of a warp. With g = lane / 4 and q = lane % 4, each lane holds
//   A: a0 = (row g,   cols 2q, 2q+1)   a1 = (row g+8, cols 2q, 2q+1)
//      a2 = (row g,   cols 2q+8, +9)   a3 = (row g+8, cols 2q+8, +9)
//   B: b0 = (rows 2q, 2q+1, col g)     b1 = (rows 2q+8, 2q+9, col g)
//   C: c0, c1 = (row g, cols 2q, 2q+1) c2, c3 = (row g+8, cols 2q, 2q+1)
// (each a/b register packs two bf16, the lower column/row in the low half).
// Because C's layout matches A's, a tile of scores S = Q K^T can be fed straight back as the A
// operand of P V without leaving registers: the heart of FlashAttention-2.

__device__ __forceinline__ void mma_bf16_16816(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix loads four 8x8 bf16 matrices from shared memory; lanes 8m..8m+7 give the row
// addresses of matrix m, and register m of every lane receives (row lane/4, cols 2(lane%4), +1)
// of matrix m. The .trans form hands out the transposed matrix instead.
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const void* smem) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const void* smem) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<u32*>(&h);
}

// Asynchronous 16-byte copy global -> shared (sm_80+): the copy runs while the warp computes.
// With src_bytes = 0 nothing is read and the 16 bytes are zero-filled, which is how empty
// slots of a KV tile become harmless zeros.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
                 "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Waits for every cp.async this thread issued, in a committed group or not: copies that complete
// on an mbarrier (cp.async.mbarrier.arrive) belong to no group until this commits them.
__device__ __forceinline__ void cp_async_drain() {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}
