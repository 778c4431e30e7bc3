// Paged prefill attention on Hopper (sm_90a) with a producer warpgroup: prefill_hopper.cu's
// products, softmax and overlap, fed the way FlashAttention-3 feeds them ("warp specialization",
// Shah et al., 2024).
//
// Why: in prefill_hopper.cu every thread copies the next tile and waits for its own copies, and
// a block-wide barrier a tile publishes them. The profiler shows that kernel latency-bound, its
// warps stalled on that barrier and on their copies, the tensor cores idle two thirds of the
// time. Here the copies are a separate warpgroup's job, and the hand-over is per stage:
//
//   block = three warpgroups (384 threads): warpgroup 0 the producer, warpgroups 1 and 2 the
//   consumers, owning rows 0..63 and 64..127 of the block's 128 as the two warpgroups of
//   prefill_hopper.cu do, with the same step (tile j's Q K^T issued with tile j-1's P V).
//
//   The producer walks the tiles ahead of the consumers: for tile j it reads the slots from the
//   page table, waits until the stage it refills is free ("empty" mbarrier), writes the slot
//   table (page_tiles.cuh) and starts the copies of K and V, each completing on the stage's
//   "full" mbarrier. Nobody waits for a copy but the warps that read it. A tile whose pages
//   are all full is copied by the TMA, a box a page (FlashAttention-3's loads, made paged);
//   any other by cp.async, slot by slot (cp.async.mbarrier.arrive). Counted by the consumers'
//   waits, the cp.async copies had set the pace: 128 threads issuing 32 copies a tile each kept
//   the consumers waiting for K a third of the time.
//   K and its slot table use a ring of two stages, V a ring of three: a consumer releases tile
//   j's K and table once its scores are masked in step j, and tile j's V only in step j+1,
//   after the P V that reads it.
//
//   setmaxnreg moves registers from the producer (which needs few) to the consumers (which hold
//   the 64 x 128 scores and output accumulators of their rows).
//
//   The consumers take turns at the tensor cores ("ping-pong", FlashAttention-3 section 3.1,
//   https://arxiv.org/abs/2407.08608). Left alone, both are released by the same full barrier,
//   issue their products together and then both compute their softmax while the tensor cores
//   idle. Here a consumer issues a step's products only on its turn and hands the turn over
//   once they are issued: consumer 0's tile j, consumer 1's tile j, consumer 0's tile j + 1, ...
//   The tensor cores run in that order, so one consumer's products fill the time of the other's
//   softmax. A turn is a named barrier a consumer (256 threads: its own 128 wait with bar.sync,
//   the other's 128 arrive with bar.arrive).
//
// No block-wide barrier after the start. Where the walk ends early (causally, the first tile
// wholly in the future of the block's last row), the producer still publishes that tile's slot
// table, without copies, and stops: both consumers read the same `start` and stop there too, so
// every barrier a warp waits on is one that the other side completes. For the turns this means
// both consumers take the same number (one a tile walked, one for the last P V): consumer 0
// takes its first without waiting and consumer 1 hands none over after its last, so each
// arrival meets a wait and no barrier is left half-completed at exit.

#define WS_THREADS 384
#define WS_PRODUCER_THREADS 128
#define WS_CONSUMER_WARPS 8
// Registers a thread after the split, within the launch's 384 x 168 (65,536 for 384 threads,
// rounded down to a multiple of 8): 128 x 32 + 256 x 232. ptxas compiles each side to its own
// limit; the consumers' step fits in 192 without spills, the producer's walk spills at 24. The
// producer's pace shows in the whole kernel's: given 40 to carry more state (tile 0's slots read
// before the first barrier) it spilled 24 bytes, and every bench shape lost 2-13%.
#define WS_PRODUCER_REGS 32
#define WS_CONSUMER_REGS 232
// The named barriers: the producer's threads meet at 1 (0 is __syncthreads'), consumer c waits
// for its turn at WS_TURN_BARRIER + c.
#define WS_PRODUCER_BARRIER 1
#define WS_TURN_BARRIER 2
#define WS_STORE_BARRIER 4
#define WS_CONSUMER_THREADS 256

struct WsShared {
    bf16 q[HOP_M * HOP_D];  // [2 column blocks][128 rows][64], swizzled
    bf16 k[2][HOP_N * HOP_D];
    bf16 v[3][HOP_N * HOP_D];
    SlotTable<HOP_N> tab[2];  // with K's stages: tile j's table is released with its K
    int dense[2];             // whether tile j's every slot holds the next token
    u64 full_k[2], empty_k[2], full_v[3], empty_v[3];
    int reduce[WS_THREADS / 32];
};

// Arrives on `bar` once every cp.async this thread has issued so far has landed. `noinc`: the
// arrival counts against the count `bar` was initialised with.
__device__ __forceinline__ void cp_async_arrive(u64* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                     shared_address(bar))
                 : "memory");
}

// A tensor map (the driver's 128-byte description of a tensor for the TMA, kernels/src/tma.rs),
// passed by value as a __grid_constant__ parameter.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

// Starts the TMA copy of the box of `map` whose first element is (column x, row y) into `dst`,
// counted on `bar` when it lands.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, int x, int y,
                                            u64* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(shared_address(dst)),
        "l"(reinterpret_cast<u64>(map)), "r"(x), "r"(y), "r"(shared_address(bar))
        : "memory");
}

// The producer's 128 threads meet; true when `pred` holds for all of them.
__device__ __forceinline__ bool producer_all(bool pred) {
    u32 all;
    asm volatile(
        "{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\n"
        "bar.red.and.pred p, %2, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(all)
        : "r"((u32)pred), "n"(WS_PRODUCER_BARRIER), "n"(WS_PRODUCER_THREADS)
        : "memory");
    return all;
}

// Waits at named barrier `id` until `WS_CONSUMER_THREADS` threads have arrived or waited there.
__device__ __forceinline__ void named_barrier_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(WS_CONSUMER_THREADS) : "memory");
}

// Arrives at named barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(WS_CONSUMER_THREADS) : "memory");
}

// Warpgroup 0 (threads 0..127): fills the stages of tiles 0, 1, ... Tile j's K and slot table
// go to stage j % 2 once both consumers released tile j-2's, its V to stage j % 3 once they
// released tile j-3's. The parity a wait names is that of the stage's use: its
// (j / stages)-th completion.
struct WsProducer {
    WsShared& s;
    const bf16* k_cache;
    const bf16* v_cache;
    const int* page_ids;
    const int* page_lens;
    int num_entries, page_size, page_shift, num_pages, num_kv_heads, kv_head, num_tiles;
    int q_hi;  // the last KV index the block's last row sees
    const TensorMap* k_map;
    const TensorMap* v_map;

    // This thread's slot of tile j, read from the page table.
    __device__ __forceinline__ Slot find(const int j, SlotWalker& walker) const {
        return find_slot<HOP_N>(j, walker, page_ids, page_lens, num_entries, page_size,
                                page_shift, num_pages, num_kv_heads, kv_head);
    }

    // Copies one tile of K or V (`map`, over `cache`) into `dst`, counted on `bar`. A dense
    // tile (every slot holds the next token, so each page's slots are consecutive cache rows)
    // goes through the TMA: a box of up to 128 rows and 64 columns a page and half, which the
    // copy engine writes swizzled, with no copy instructions in the other threads. The 16 boxes
    // of 16-slot pages are asked for by 16 lanes at once, each its own; fewer, by one thread.
    // The producer's pace is the kernel's, so how it asks shows: on the 1 x 4096 prompt 16
    // lanes gave 334 TFLOP/s against 301 from one thread, one thread beat 4 lanes on pages of 64
    // (489 against 450), and the same split written as one strided loop (lane b asking for boxes
    // b, b + lanes, ...) lost 7-13% on pages of 16-64. Any other tile (a page partly filled or
    // missing) is gathered slot by slot with cp.async, empty slots as zeros. Either way every
    // thread then arrives on `bar` as its copies count.
    __device__ __forceinline__ void copy_tile(bf16* dst, const TensorMap* map, const bf16* cache,
                                              const int* rows, bool dense, u64* bar) {
        if (dense) {
            const int box = min(page_size, HOP_N), t = threadIdx.x;
            if (t == 0) mbarrier_expect_tx(bar, HOP_N * HOP_D * (int)sizeof(bf16));
            if (box == 16) {
                const int half = t & 1, i = (t >> 1) * 16;  // lane t: page t / 2, half t % 2
                if (t < 16)
                    tma_load_2d(reinterpret_cast<char*>(dst) + (half * HOP_N + i) * 128, map,
                                half * 64, rows[i], bar);
            } else if (t == 0) {
                for (int i = 0; i < HOP_N; i += box)
                    for (int half = 0; half < 2; ++half)
                        tma_load_2d(reinterpret_cast<char*>(dst) + (half * HOP_N + i) * 128, map,
                                    half * 64, rows[i], bar);
            }
        } else {
            hopper_load_kv<WS_PRODUCER_THREADS>(dst, nullptr, rows, cache, nullptr);
        }
        cp_async_arrive(bar);
    }

    // The walk; Q's copies, issued before, complete on tile 0's full barrier with its K.
    // Tile j + 1's slots are read at the end of tile j, before waiting for their stage: the
    // page table's latency passes while the consumers still hold it.
    __device__ __forceinline__ void run() {
        SlotWalker walker{0};
        Slot slot = find(0, walker);
        for (int j = 0; j < num_tiles; ++j) {
            const int ks = j & 1, vs = j % 3;
            if (j >= 2) mbarrier_wait(&s.empty_k[ks], ((j >> 1) & 1) ^ 1);
            write_slot(s.tab[ks], slot);
            const int start = slot.start;
            // The meeting also makes the table whole before any thread copies by it, and keeps
            // a thread from rewriting table j + 2 while another still copies by table j.
            const int c = threadIdx.x;
            const bool dense = producer_all(slot.logical == start + c);
            if (threadIdx.x == 0) s.dense[ks] = dense;
            mbarrier_arrive(&s.full_k[ks]);  // the table
            const bool stop = start > q_hi;  // causal: this tile and all later are future
            if (stop) {
                cp_async_arrive(&s.full_k[ks]);  // no copies
                break;
            }
            copy_tile(s.k[ks], k_map, k_cache, s.tab[ks].row, dense, &s.full_k[ks]);
            if (j >= 3) mbarrier_wait(&s.empty_v[vs], ((j / 3) & 1) ^ 1);
            copy_tile(s.v[vs], v_map, v_cache, s.tab[ks].row, dense, &s.full_v[vs]);
            if (j + 1 < num_tiles) slot = find(j + 1, walker);
        }
        // The consumers wait for every copy they read.
        cp_async_drain();
    }
};

// A consumer warpgroup's walk over the KV tiles: prefill_hopper.cu's step, with the stage
// hand-over of mbarriers in place of the block-wide barrier and the products issued in turns.
struct WsConsumer {
    WsShared& s;
    int c;           // which consumer: 0 (rows 0..63) or 1 (rows 64..127)
    int q_index[2];  // the last KV index each of this thread's rows sees (-1: no row)
    int q_lo, q_hi;  // the same for the block's first and last rows
    u32 q_addr;      // this warpgroup's first Q row in shared memory
    float scale;     // sm_scale in log2 units
    float o_lo[32], o_hi[32];  // output columns 0..63 and 64..127
    u32 pa[HOP_N / 16][4];     // the previous tile's P
    float m[2], l[2];

    // Waits for tile j's V; its shared address.
    __device__ __forceinline__ u32 wait_v(const int j) {
        mbarrier_wait(&s.full_v[j % 3], (j / 3) & 1);
        return shared_address(s.v[j % 3]);
    }

    // Releases a stage: every lane of the warp is done with it (its wgmmas waited for, its
    // reads of the slot table made), then one arrival a warp.
    __device__ __forceinline__ void release(u64* bar) {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) mbarrier_arrive(bar);
    }

    // Waits until this consumer may issue products. Consumer 0's first turn is its own.
    template <bool FIRST>
    __device__ __forceinline__ void take_turn() {
        if (!FIRST || c == 1) named_barrier_sync(WS_TURN_BARRIER + c);
    }

    // Hands the turn to the other consumer, whose wait needs this warpgroup's 128 arrivals.
    // After consumer 1's last products (LAST) there is no turn to hand over.
    template <bool LAST>
    __device__ __forceinline__ void pass_turn() {
        if (!LAST || c == 0) named_barrier_arrive(WS_TURN_BARRIER + (c ^ 1));
    }

    // One tile: false when causality ends the walk before it. The data are waited for, and the
    // stop decided, before the turn: a consumer that stops takes no turn for this tile.
    template <bool FIRST>
    __device__ __forceinline__ bool step(const int j) {
        const int ks = j & 1;
        mbarrier_wait(&s.full_k[ks], (j >> 1) & 1);
        if (s.tab[ks].start > q_hi) return false;
        u32 v_addr = 0;
        if constexpr (!FIRST) v_addr = wait_v(j - 1);
        // cp.async writes shared memory through the generic proxy, wgmma reads it through the
        // async proxy: the mbarriers' acquire orders the copies before this thread's later
        // accesses, and the proxy fence extends that order to its wgmma reads.
        fence_async_shared();
        float sc[HOP_N / 2];
        take_turn<FIRST>();
        issue_step<FIRST>(sc, o_lo, o_hi, pa, q_addr, shared_address(s.k[ks]), v_addr);
        pass_turn<false>();
        wgmma_wait<FIRST ? 0 : 1>();  // the scores; P V may still run
        fence_registers(sc);

        mask_tile(sc, s.tab[ks], s.dense[ks], q_lo, q_index);
        release(&s.empty_k[ks]);
        float alpha[2];
        online_softmax(sc, m, l, alpha, scale);

        settle_step(o_lo, o_hi, pa, sc, alpha);
        if constexpr (!FIRST) release(&s.empty_v[(j - 1) % 3]);  // the P V that read it is done
        return true;
    }

    // The last tile's P V, once the walk has computed `done` tiles' scores: a turn of its own
    // (none when no tile was walked, as then neither consumer took any). Its V stage needs no
    // release: the producer has stopped.
    __device__ __forceinline__ void finish(const int done) {
        if (done == 0) return;
        const u32 v_addr = wait_v(done - 1);
        fence_async_shared();
        take_turn<false>();
        issue_last_pv(o_lo, o_hi, pa, v_addr);
        pass_turn<true>();
        settle_last_pv(o_lo, o_hi, pa);
    }
};

// Writes a consumer's 64 rows (rows 64 c.. of the block) through shared memory: each thread
// puts its normalised values (wgmma's layout: 4 bytes of a row a column group) into the
// warpgroup's part of Q's tile, which no wgmma reads any more, then every thread copies 16-byte
// pieces of whole rows out. Written from registers, a warp's 4-byte stores touched 8 rows at
// once, a quarter of every sector written. Staged rows are 256 bytes, their 16-byte chunk k at
// k ^ (row % 8): the 8 rows a warp writes at once hit 32 different banks. A block's fixed costs
// weigh on short prompts: 16 x 512 went from 139 to 150 TFLOP/s, 4 x 2048 from 312 to 329.
__device__ __forceinline__ void store_rows_staged(WsShared& s, int c, bf16* out, float* lse,
                                                  const float (&o_lo)[32], const float (&o_hi)[32],
                                                  const float (&m)[2], const float (&l)[2],
                                                  int row0, int rows, int group, int kv_head,
                                                  int q0, int num_q_heads) {
    const int t = threadIdx.x & 127, lane = t & 31;
    // Q's two 64-column blocks hold 128 rows of 128 bytes each; this warpgroup's 64 rows of each
    // are 8 KiB, 32 staged rows: staged row rr in the block rr / 32.
    char* const stage = reinterpret_cast<char*>(s.q) + c * 8192;
    auto chunk_at = [stage](int rr, int k) {
        return stage + (rr >> 5) * (HOP_M * 128) + (rr & 31) * 256 + ((k ^ (rr & 7)) << 4);
    };
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float total = quad_total(l[h]);
        const int rr = (t >> 5) * 16 + (lane >> 2) + 8 * h;  // the warpgroup's row
        const float inv = total > 0.f ? 1.f / total : 0.f;
        const int at = (lane & 3) * 4;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            *reinterpret_cast<__nv_bfloat162*>(chunk_at(rr, j) + at) =
                __floats2bfloat162_rn(o_lo[4 * j + 2 * h] * inv, o_lo[4 * j + 2 * h + 1] * inv);
            *reinterpret_cast<__nv_bfloat162*>(chunk_at(rr, 8 + j) + at) =
                __floats2bfloat162_rn(o_hi[4 * j + 2 * h] * inv, o_hi[4 * j + 2 * h + 1] * inv);
        }
        const int gr = row0 + c * 64 + rr;
        if (lse != nullptr && (lane & 3) == 0 && gr < rows) {
            lse[folded_row(gr, group, kv_head, q0, num_q_heads)] = row_lse(m[h], total);
        }
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(WS_STORE_BARRIER + c) : "memory");
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int idx = t + 128 * i, rr = idx >> 4, k = idx & 15;
        const int gr = row0 + c * 64 + rr;
        if (gr >= rows) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(chunk_at(rr, k));
        *reinterpret_cast<uint4*>(out + folded_row(gr, group, kv_head, q0, num_q_heads) * HOP_D +
                                  k * 8) = v;
    }
}

// One block an SM: 128 rows, 128-slot tiles, a producer and two consumer warpgroups.
extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) prefill_attention_hopper_ws_d128(
    const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ q_indptr,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_page_ids,
    const int* __restrict__ kv_page_lens, bf16* __restrict__ out, float* __restrict__ lse,
    int num_q_heads, int num_kv_heads, int page_size, int page_shift, int num_pages,
    float sm_scale, int causal, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map) {
    extern __shared__ unsigned char raw_smem[];
    auto& s = aligned_shared<WsShared>(raw_smem);
    const auto [seq, kv_head, group, q0, q_len, rows, row0] =
        hopper_block(q_indptr, num_q_heads, num_kv_heads);
    if (row0 >= rows) return;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;
    if (tid == 0) {
        // full_k: each producer thread arrives once for the slot table, once for its copies.
        for (int i = 0; i < 2; ++i) {
            mbarrier_init(&s.full_k[i], 2 * WS_PRODUCER_THREADS);
            mbarrier_init(&s.empty_k[i], WS_CONSUMER_WARPS);
        }
        for (int i = 0; i < 3; ++i) {
            mbarrier_init(&s.full_v[i], WS_PRODUCER_THREADS);
            mbarrier_init(&s.empty_v[i], WS_CONSUMER_WARPS);
        }
        mbarrier_init_fence();
    }
    // Its block-wide barrier also publishes the mbarriers' initialisation.
    const SequencePages sp =
        sequence_pages(kv_indptr, kv_page_ids, kv_page_lens, seq, page_size, s.reduce);
    const int kv_len = sp.kv_len;
    const int num_tiles = count_tiles<HOP_N>(sp.num_entries, page_size);
    const int last_row = min(rows, row0 + HOP_M) - 1;
    const int q_hi = last_visible(last_row, rows, group, causal, kv_len, q_len);

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PRODUCER_REGS));
        WsProducer p{s, k_cache, v_cache, sp.page_ids, sp.page_lens, sp.num_entries,
                     page_size, page_shift, num_pages, num_kv_heads, kv_head, num_tiles, q_hi,
                     &k_map, &v_map};
        // Q lands with tile 0's K. Without tiles nobody would wait for it, and the consumers'
        // staged stores reuse its memory: no Q is copied then.
        if (num_tiles > 0)
            hopper_load_q<WS_PRODUCER_THREADS>(s.q, q, row0, rows, group, kv_head, q0,
                                               num_q_heads);
        p.run();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WS_CONSUMER_REGS));

    // This thread's two rows (block-relative r and r + 8) and the last KV index each sees.
    const int c = wg - 1;  // consumer: rows 64 c ..
    const int my_row = c * 64 + (warp & 3) * 16 + (lane >> 2);
    int q_index[2], q_token[2];
    hopper_thread_rows(my_row, row0, rows, group, causal, kv_len, q_len, q_token, q_index);
    const int q_lo = last_visible(row0, rows, group, causal, kv_len, q_len);

    const u32 q_addr = shared_address(s.q) + c * 64 * 128;
    WsConsumer w{s, c, {q_index[0], q_index[1]}, q_lo, q_hi, q_addr, sm_scale * LOG2E};
    hopper_walk(w, num_tiles);
    store_rows_staged(s, c, out, lse, w.o_lo, w.o_hi, w.m, w.l, row0, rows, group, kv_head, q0,
                      num_q_heads);
}
