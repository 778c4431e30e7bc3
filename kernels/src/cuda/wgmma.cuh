// Hopper's warpgroup matrix multiply (wgmma, sm_90a), written as inline PTX.
//
// A warpgroup is 4 consecutive warps (128 threads). `wgmma.mma_async` multiplies a 64 x 16 tile
// A by a 16 x N tile B into a 64 x N f32 accumulator spread over the warpgroup's registers, and
// runs asynchronously: the instruction is issued, the warps go on, and `wgmma.wait_group` waits
// for it. B always comes from shared memory, described by a 64-bit "matrix descriptor"; A comes
// from shared memory too or from registers (in the same fragment layout as mma.sync's A, which
// is what lets attention feed its probabilities P from registers, as the FA2 kernel does).
//
// Accumulator layout (m64nN, f32): warp w of the warpgroup holds rows 16w..16w+15; within it,
// lane l holds, for each 8-column group j, d[4j+0..1] = (row l/4, cols 8j + 2(l%4) + 0..1) and
// d[4j+2..3] = (row l/4 + 8, same cols): mma.sync's C layout, repeated N/8 times.
//
// Shared-memory layout: every operand tile here is stored as blocks of 64 columns (128 bytes a
// row) with the 128-byte swizzle: the 16-byte chunk c of row r sits at chunk c ^ (r % 8), so that
// 8 consecutive rows read at one column hit 8 different bank groups. Blocks start on 1024-byte
// boundaries (the swizzle repeats every 8 rows of 128 bytes).

// Byte offset of element (row r, column c) in a tile stored as 128-byte-swizzled blocks of 64
// columns, `rows` rows per block.
__device__ __forceinline__ u32 swizzled_offset(int r, int c, int rows) {
    const int block = c >> 6, chunk = (c >> 3) & 7;
    return (u32)(block * rows * 128 + r * 128 + ((chunk ^ (r & 7)) << 4) + (c & 7) * 2);
}

// The matrix descriptor of a 128-byte-swizzled tile starting at shared address `addr`:
// bits 0-13 the address / 16, 16-29 the leading byte offset / 16, 32-45 the stride byte offset
// / 16, 62-63 the layout (1: 128-byte swizzle). With the swizzle, the stride is the step
// between groups of 8 rows (8 x 128 bytes) in either operand orientation. The leading offset
// `lbo` only matters for an MN-major operand (rows of K, the MN dimension contiguous) that one
// instruction reads across two 64-column blocks: it is the step between those blocks.
__device__ __forceinline__ u64 smem_descriptor(u32 addr, u32 lbo = 1024) {
    const u64 stride = 1024 >> 4, leading = (lbo >> 4) & 0x3fff;
    return (u64)((addr >> 4) & 0x3fff) | (leading << 16) | (stride << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across the
// asynchronous region between an issue and its wait.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for A fragments in registers, which an issued wgmma may still be reading: without
// it the compiler could reuse their registers before the wait.
template <int N>
__device__ __forceinline__ void fence_registers(u32 (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int k = 0; k < 4; ++k) asm volatile("" : "+r"(a[i][k])::"memory");
}

// Makes this thread's ordinary (and cp.async) shared-memory writes visible to the tensor
// cores' reads of shared memory, which go through the "async proxy".
__device__ __forceinline__ void fence_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d (64 x 128, f32) = A (64 x 16, bf16, shared, K-major) * B (16 x 128, bf16, shared, stored
// as 128 rows of K: "K-major") + (accumulate ? d : 0).
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], u64 desc_a, u64 desc_b,
                                                    int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d (64 x 128, f32, held as columns 0..63 in `lo` and 64..127 in `hi`: the m64n128 accumulator
// layout is two m64n64 ones one after the other) += A (64 x 16, bf16, registers in mma.sync's A
// layout) * B (16 x 128, bf16, shared, stored as 16 rows of N: "MN-major", hence the transpose
// flag), its two 64-column blocks as far apart as desc_b's leading offset says.
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&lo)[32], float (&hi)[32],
                                                    const u32 a[4], u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(lo[0]), "+f"(lo[1]), "+f"(lo[2]), "+f"(lo[3]), "+f"(lo[4]), "+f"(lo[5]), "+f"(lo[6]), "+f"(lo[7]), "+f"(lo[8]), "+f"(lo[9]), "+f"(lo[10]), "+f"(lo[11]), "+f"(lo[12]), "+f"(lo[13]), "+f"(lo[14]), "+f"(lo[15]), "+f"(lo[16]), "+f"(lo[17]), "+f"(lo[18]), "+f"(lo[19]), "+f"(lo[20]), "+f"(lo[21]), "+f"(lo[22]), "+f"(lo[23]), "+f"(lo[24]), "+f"(lo[25]), "+f"(lo[26]), "+f"(lo[27]), "+f"(lo[28]), "+f"(lo[29]), "+f"(lo[30]), "+f"(lo[31]), "+f"(hi[0]), "+f"(hi[1]), "+f"(hi[2]), "+f"(hi[3]), "+f"(hi[4]), "+f"(hi[5]), "+f"(hi[6]), "+f"(hi[7]), "+f"(hi[8]), "+f"(hi[9]), "+f"(hi[10]), "+f"(hi[11]), "+f"(hi[12]), "+f"(hi[13]), "+f"(hi[14]), "+f"(hi[15]), "+f"(hi[16]), "+f"(hi[17]), "+f"(hi[18]), "+f"(hi[19]), "+f"(hi[20]), "+f"(hi[21]), "+f"(hi[22]), "+f"(hi[23]), "+f"(hi[24]), "+f"(hi[25]), "+f"(hi[26]), "+f"(hi[27]), "+f"(hi[28]), "+f"(hi[29]), "+f"(hi[30]), "+f"(hi[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
