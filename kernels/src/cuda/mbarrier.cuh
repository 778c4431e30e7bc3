// Hopper's asynchronous copies and the shared-memory barriers they complete on (mbarriers):
// a producer starts a copy into a stage of shared memory, the copy engine counts its bytes off
// the stage's mbarrier as they land, and the readers wait on that mbarrier's phase. Shared by
// the warp-specialized prefill kernel (prefill_hopper_ws.cu) and decode attention's bulk-copy
// kernel (decode_attention.cu). Every instruction here needs sm_90.

__device__ __forceinline__ u32 shared_address(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbarrier_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)),
                 "r"(count)
                 : "memory");
}

// Makes this thread's mbarrier initialisations visible to the copy engine, which completes
// copies on them (the block barrier after it publishes them to the other threads).
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives on `bar` (release: this thread's earlier writes are seen by whoever waits for it).
__device__ __forceinline__ void mbarrier_arrive(u64* bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                     shared_address(bar))
                 : "memory");
}

// Adds `bytes` to what the current phase of `bar` waits for besides its arrivals: the copies
// that complete on it count their bytes off.
__device__ __forceinline__ void mbarrier_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(
                     shared_address(bar)),
                 "r"(bytes)
                 : "memory");
}

// mbarrier_expect_tx then mbarrier_arrive, in one instruction.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile(
        "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
            shared_address(bar)),
        "r"(bytes)
        : "memory");
}

// Waits until the phase of parity `parity` of `bar` has completed (acquire).
__device__ __forceinline__ void mbarrier_wait(u64* bar, int parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(shared_address(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

// Starts the copy of `bytes` contiguous bytes (a multiple of 16, both ends 16-byte aligned)
// from global memory into `dst`, counted on `bar` when they land: one instruction from one
// thread, however many bytes.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, u32 bytes,
                                                    u64* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            shared_address(dst)),
        "l"(src), "r"(bytes), "r"(shared_address(bar))
        : "memory");
}
