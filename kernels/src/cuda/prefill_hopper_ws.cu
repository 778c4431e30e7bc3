// Paged prefill attention on Hopper (sm_90a) with a producer warpgroup: prefill_hopper.cu's
// products, softmax and overlap, fed the way FlashAttention-3 feeds them ("warp specialization",
// Shah et al., 2024), by blocks that stay on their multiprocessor and take work items one after
// another (FlashAttention-3's persistent kernel).
//
// Why: in prefill_hopper.cu every thread copies the next tile and waits for its own copies, and
// a block-wide barrier a tile publishes them. The profiler shows that kernel latency-bound, its
// warps stalled on that barrier and on their copies, the tensor cores idle two thirds of the
// time. Here the copies are a separate warpgroup's job, and the hand-over is per stage:
//
//   block = three warpgroups (384 threads): warpgroup 0 the producer, warpgroups 1 and 2 the
//   consumers, owning rows 0..63 and 64..127 of a work item's 128 as the two warpgroups of
//   prefill_hopper.cu do, with the same step (tile j's Q K^T issued with tile j-1's P V).
//
//   The producer walks the tiles ahead of the consumers: for tile j it reads the slots from the
//   page table, waits until the stage it refills is free ("empty" mbarrier), writes the slot
//   table (page_tiles.cuh) and starts the copies of K and V, each completing on the stage's
//   "full" mbarrier. Nobody waits for a copy but the warps that read it. A tile whose pages
//   are all full is copied by the TMA in boxes of 16 rows and 64 columns (FlashAttention-3's
//   loads, made paged); any other by cp.async, slot by slot (cp.async.mbarrier.arrive).
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
// Work items. An item is the rows of one query tile of one (sequence, KV head), as one block of
// prefill_hopper.cu. The grid is one block an SM; block b starts with item b and then takes the
// next untaken item from a counter in global memory as its producer finishes the one before.
// Taken as blocks free up, the items are scheduled as the hardware schedules a grid of blocks,
// but a block's fixed costs now overlap its work: the next item's page table, Q and first K and
// V load while the consumers still compute the item before, and no block waits for another to
// leave its SM. A block of one item had waited 7-9 us from its start for its first K on an H100
// (block timestamps in docs/benchmarks/LOG.md), and a prompt of 512 tokens walks one to four
// tiles an item.
//
// The order of the items (ws_item). The query tiles of one (sequence, KV head) read the same K/V
// tiles. Where no sequence of the call has more than WS_RANK_BLOCK of them (short prompts), a
// pair's tiles are taken one after the other, heaviest (last) first, and the multiprocessors that
// take them at about the same time read each K/V tile from memory once and from L2 after that. In
// prefill_hopper.cu's order (every pair's heaviest tile, then every second heaviest, ...) the
// profiler counted 114 MB read from memory for 16 prompts of 512 tokens on an H100, the K/V read
// again after the queries and outputs in between had evicted it; in this order 67 MB, and 8-9% less
// time (32 x 256: 12-16%). A call with a longer prompt keeps prefill_hopper.cu's order, longest
// first: whole pairs one after the other were 8% slower on 4 x 2,048, whose heaviest tiles (16 K/V
// tiles each) then start in the last wave, and blocks of 8 ranks 3% slower on 1 x 4,096.
//
// The stages' rings run on across items: counters of K and V stage uses, not tile indices, give
// each wait its stage and parity. The producer writes each item's description into the K stage
// of its first tile, so the consumers read it with that tile; a stage whose tile is in the
// future of every row (causal) or past the item's pages carries no copies and ends the item's
// walk. Q has two buffers, each with its own mbarriers, used in turn by the items that load one:
// the consumers stage an item's output rows through its Q buffer, and once both have stored
// them the producer may load the buffer's next Q (two Q-loading items on). With one buffer the
// next item's Q could only start after the last item's rows were out, and every item began
// with the consumers waiting for its Q. An item that walks no tile loads no Q and writes its
// zero rows straight out, so that every stage of rows through a Q buffer is fenced from the
// next one by a Q load both consumers waited for.
//
// The ping-pong runs on across items too: each consumer takes one turn a tile walked and one
// for the last P V, so the turns alternate for the whole kernel. Consumer 0's first turn is its
// own; consumer 1 hands the turn over after every one of its turns, and consumer 0 takes the
// last hand-over at the end, so no barrier is left half-completed at exit. A value that decides
// whether a warp takes a turn or leaves a loop is made warp-uniform (a vote or a reduction):
// when ptxas cannot prove a branch around the products uniform it guards them with extra
// synchronization, and the whole kernel was up to 4% slower.

#define WS_THREADS 384
#define WS_PRODUCER_THREADS 128
#define WS_CONSUMER_WARPS 8
// Registers a thread after the split, within the launch's 384 x 168 (65,536 for 384 threads,
// rounded down to a multiple of 8): 128 x 56 + 256 x 216. Neither side spills. The consumers'
// step fits in 192 without spills; given 232 (the producer 40) the kernel was 0-4% slower.
#define WS_PRODUCER_REGS 56
#define WS_CONSUMER_REGS 216
// The named barriers: the producer's threads meet at 1 (0 is __syncthreads'), consumer c waits
// for its turn at WS_TURN_BARRIER + c and stores its rows at WS_STORE_BARRIER + c.
#define WS_PRODUCER_BARRIER 1
#define WS_TURN_BARRIER 2
#define WS_STORE_BARRIER 4
#define WS_CONSUMER_THREADS 256

// The most ranks (query tiles, heaviest first) of one (sequence, KV head) that are taken one
// after the other; see "The order of the items" above.
#define WS_RANK_BLOCK 8

// Item `item` of num_seqs x num_kv_heads x `ranks`: its (sequence, KV head, rank). Up to
// WS_RANK_BLOCK ranks, each (sequence, KV head)'s ranks one after the other; more, rank-major
// with the sequences fastest (prefill_hopper.cu's grid order).
__device__ __forceinline__ int3 ws_item(int item, int num_seqs, int num_kv_heads, int ranks) {
    if (ranks <= WS_RANK_BLOCK) {
        const int pair = item / ranks;
        return make_int3(pair / num_kv_heads, pair % num_kv_heads, item % ranks);
    }
    return make_int3(item % num_seqs, (item / num_seqs) % num_kv_heads,
                     item / (num_seqs * num_kv_heads));
}

// A work item as the consumers need it; seq < 0: no more work.
struct WsItem {
    int seq, kv_head, row0, q0, q_len, kv_len, num_tiles;
};

struct WsShared {
    bf16 q[2][HOP_M * HOP_D];  // two items' Q: [2 column blocks][128 rows][64], swizzled
    bf16 k[2][HOP_N * HOP_D];
    bf16 v[3][HOP_N * HOP_D];
    SlotTable<HOP_N> tab[2];  // with K's stages: tile j's table is released with its K
    int dense[2];             // whether tile j's every slot holds the next token
    WsItem item[2];           // with K's stages: the item whose first tile the stage holds
    u64 full_k[2], empty_k[2], full_v[3], empty_v[3], q_full[2], q_empty[2];
    int reduce[WS_PRODUCER_THREADS / 32];
    int next;  // the producer's next item
};
// PrefillKernel::shared_bytes (kernels/src/prefill.rs) asks for this and WS_ALIGN_SLACK bytes for
// alignment: a full 1 KiB would pass the 232,448 bytes a block may have.
#define WS_ALIGN_SLACK 512
static_assert(sizeof(WsShared) == 231632, "the launch's shared memory follows WsShared");

// The next untaken work item past the grid's first ones, and how many blocks have taken their
// last: the last block to finish sets both back to zero for the next launch. A module's globals
// belong to its context, and the launches that share them run one after the other on its
// stream.
__device__ unsigned int ws_next_item;
__device__ unsigned int ws_blocks_done;

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

// Starts the TMA copy of the box of the 3-dimensional `map` whose first element is (x, y, z) into
// `dst`, counted on `bar` when it lands.
__device__ __forceinline__ void tma_load_3d(void* dst, const TensorMap* map, int x, int y, int z,
                                            u64* bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(shared_address(dst)),
        "l"(reinterpret_cast<u64>(map)), "r"(x), "r"(y), "r"(z), "r"(shared_address(bar))
        : "memory");
}

// Starts the TMA store of `src` into the box of the 3-dimensional `map` whose first element is
// (x, y, z), in this thread's bulk group.
__device__ __forceinline__ void tma_store_3d(const TensorMap* map, int x, int y, int z,
                                             const void* src) {
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
            reinterpret_cast<u64>(map)),
        "r"(x), "r"(y), "r"(z), "r"(shared_address(src))
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

// The producer's 128 threads meet.
__device__ __forceinline__ void producer_sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(WS_PRODUCER_BARRIER), "n"(WS_PRODUCER_THREADS)
                 : "memory");
}

// Waits at named barrier `id` until `WS_CONSUMER_THREADS` threads have arrived or waited there.
__device__ __forceinline__ void named_barrier_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(WS_CONSUMER_THREADS) : "memory");
}

// Arrives at named barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(WS_CONSUMER_THREADS) : "memory");
}

// The same value in every lane, as the compiler can see (a reduction's result is uniform).
__device__ __forceinline__ int warp_uniform(int x) {
    return (int)__reduce_max_sync(FULL_MASK, (unsigned)x);
}

// Warpgroup 0 (threads 0..127): takes the block's work items and fills the stages of their
// tiles. The u-th use of K's ring (counted over the kernel's items, including a stage with a
// description and no tile, and one whose tile is causally in the future and carries no copies)
// is stage u % 2, once both consumers released that stage's use before; the u-th tile's V is
// stage u % 3 likewise. The parity a wait names is that of the stage's use: its
// (uses / stages)-th completion.
struct WsProducer {
    WsShared& s;
    const bf16* q;
    const bf16* k_cache;
    const bf16* v_cache;
    const int* q_indptr;
    const int* kv_indptr;
    const int* kv_page_ids;
    const int* kv_page_lens;
    const TensorMap* k_map;
    const TensorMap* v_map;
    const TensorMap* q_map;  // when q_tma: Q as [token][q head][128], in boxes of an item's rows
    int q_tma;
    int num_q_heads, num_kv_heads, page_size, page_shift, num_pages, q_rows, causal, num_seqs,
        ranks;
    int kt = 0, vt = 0, qs = 0;  // K and V stage uses, Qs loaded
    // The item being walked: its pages, its KV head and the last KV index its last row sees.
    const int* page_ids = nullptr;
    const int* page_lens = nullptr;
    int num_entries = 0, kv_head = 0, q_hi = 0;

    // Before the block first writes anything or reads Q: launched as a programmatic dependent
    // of the kernel before (prefill_attention_pieces), the block has so far read its page
    // table, the queries' indptr and K/V, and it now waits for that kernel; only then may the
    // kernel after this one start (cascade's decode beside it reads the same queries).
    // Launched as usual, the wait returns at once. Once a Q is loaded the block has waited.
    __device__ __forceinline__ void wait_before_writing() {
        if (qs > 0) return;
        wait_for_previous_kernel();
        let_next_kernel_start();
    }

    // The next untaken item, for every producer thread. The counter is shared with any grid
    // of this kernel still running: a block waits for the kernel before it first.
    __device__ __forceinline__ int take_item() {
        wait_before_writing();
        if (threadIdx.x == 0) s.next = gridDim.x + atomicAdd(&ws_next_item, 1u);
        producer_sync();
        const int item = warp_uniform(s.next);
        producer_sync();  // every thread has read it before it is written again
        return item;
    }

    // Waits until K's next stage is free; its index.
    __device__ __forceinline__ int next_k_stage() {
        const int ks = kt & 1;
        if (kt >= 2) mbarrier_wait(&s.empty_k[ks], ((kt >> 1) & 1) ^ 1);
        return ks;
    }

    // This thread's entry of tile j: its length and page, read a tile ahead.
    struct Entry {
        int len, page;
    };
    __device__ __forceinline__ Entry load_entry(const int j) const {
        const int c = threadIdx.x;
        const bool big = page_shift >= 7;  // a page of at least one tile
        const int e = big ? j >> (page_shift - 7) : j * (HOP_N >> page_shift) + (c >> page_shift);
        if (e >= num_entries) return {0, -1};
        return {page_lens[e], page_ids[e]};
    }

    // Writes tile j's slots into `tab` and meets the other producer threads; whether the tile
    // is dense (every slot holds the next token). The common case needs only this thread's own
    // entry: the tile is dense when every thread's slot is filled and, for pages smaller than a
    // tile, every page is full. Anything else takes the general walk of page_tiles.cuh, which
    // reads every entry of the tile in every thread: at pages of 16 that was the producer's
    // pace on long walks.
    __device__ __forceinline__ int publish_slots(const int j, const Entry a, SlotWalker& w,
                                                 SlotTable<HOP_N>& tab, bool& dense) const {
        const int c = threadIdx.x;
        const bool big = page_shift >= 7;
        const int per_entry = big ? 1 << (page_shift - 7) : 1;  // tiles an entry
        const int sub = j & (per_entry - 1);
        const int offset = big ? sub * HOP_N + c : c & (page_size - 1);
        const int len = min(max(a.len, 0), page_size);
        const bool ok =
            offset < len && a.page >= 0 && a.page < num_pages && (big || len == page_size);
        const int start = w.base + sub * HOP_N;
        write_slot(tab, Slot{start + c, (a.page * num_kv_heads + kv_head) * page_size + offset,
                             start});
        if (producer_all(ok)) {
            if (sub == per_entry - 1) w.base += big ? page_size : HOP_N;
            dense = true;
            return start;
        }
        const Slot slot = find_slot<HOP_N>(j, w, page_ids, page_lens, num_entries, page_size,
                                           page_shift, num_pages, num_kv_heads, kv_head);
        write_slot(tab, slot);
        dense = producer_all(slot.logical == slot.start + c);
        return slot.start;
    }

    // Copies one tile of K or V (`map`, over `cache`) into `dst`, counted on `bar`. A dense
    // tile (each page's slots are consecutive cache rows) goes through the TMA: 16 boxes of 16
    // rows and 64 columns, which the copy engine writes swizzled, with no copy instructions in
    // the other threads. Lanes 0..3 of each producer warp ask for a box each: the
    // producer's pace is the kernel's, and with 16 lanes of one warp asking, long prompts on
    // pages of 16 took a quarter to a third longer. Any other tile (a page partly filled or
    // missing) is gathered slot by slot with cp.async, empty slots as zeros. Either way every
    // thread then arrives on `bar` as its copies count.
    __device__ __forceinline__ void copy_tile(bf16* dst, const TensorMap* map, const bf16* cache,
                                              const int* rows, bool dense, u64* bar) const {
        if (dense) {
            const int t = threadIdx.x;
            if (t == 0) mbarrier_expect_tx(bar, HOP_N * HOP_D * (int)sizeof(bf16));
            const int b = (t >> 5) * 4 + (t & 3);  // box b: 16 slots from 16 (b / 2), half b % 2
            const int half = b & 1, i = (b >> 1) * 16;
            if ((t & 31) < 4)
                tma_load_2d(reinterpret_cast<char*>(dst) + (half * HOP_N + i) * 128, map,
                            half * 64, rows[i], bar);
        } else {
            hopper_load_kv<WS_PRODUCER_THREADS>(dst, nullptr, rows, cache, nullptr);
        }
        cp_async_arrive(bar);
    }

    // Publishes `it` in the next K stage with no tile: an item without pages, or the end.
    __device__ __forceinline__ void publish_alone(const WsItem& it) {
        const int ks = next_k_stage();
        if (threadIdx.x == 0) s.item[ks] = it;
        mbarrier_arrive(&s.full_k[ks]);
        cp_async_arrive(&s.full_k[ks]);
        ++kt;
    }

    // Starts the item's Q in buffer qs % 2 once both consumers have stored, through that
    // buffer, the rows of the item that loaded the Q two before; it lands on that buffer's
    // q_full. One completion of a buffer's q_empty a Q it held, each waited for before the
    // buffer's next Q: a wait never has two outstanding.
    //
    // The item's 128 rows are 128 / group tokens of its group of q heads: with q_tma, one box
    // a 64-column half, asked for by one thread, and the other threads arrive without waiting
    // for their own copies (a tile's cp.async gathers may be in flight). The box's rows past
    // the sequence's last are another sequence's queries (or zeros past the batch's last
    // token): their scores are computed and never stored. Asked for with cp.async by the 128
    // threads, the rows' addresses cost the producer 3 us an item, which the consumers waited
    // through.
    __device__ __forceinline__ void load_q(const HopperBlock& b) {
        // The block's first Q: it has read its page table and started its first K and V while
        // the kernel before ended.
        wait_before_writing();
        const int qb = qs & 1;
        if (qs >= 2) mbarrier_wait(&s.q_empty[qb], ((qs >> 1) - 1) & 1);
        const int q_src = b.q0 % q_rows;  // pieces read the same rows of Q
        if (q_tma) {
            if (threadIdx.x == 0) {
                mbarrier_expect_tx(&s.q_full[qb], HOP_M * HOP_D * (int)sizeof(bf16));
                for (int half = 0; half < 2; ++half)
                    tma_load_3d(s.q[qb] + half * HOP_M * 64, q_map, half * 64,
                                b.kv_head * b.group.size, q_src + b.row0 / b.group,
                                &s.q_full[qb]);
            }
            mbarrier_arrive(&s.q_full[qb]);
        } else {
            hopper_load_q<WS_PRODUCER_THREADS>(s.q[qb], q, b.row0, b.rows, b.group, b.kv_head,
                                               q_src, num_q_heads);
            cp_async_arrive(&s.q_full[qb]);
        }
        ++qs;
    }

    // Publishes the tiles of item `it` (block rows `b`), the first with the description, until
    // they end or causality ends them. Tile j + 1's entries are read at the end of tile j,
    // before waiting for their stage: the page table's latency passes while the consumers
    // still hold it.
    __device__ __forceinline__ void walk(const WsItem& it, const HopperBlock& b) {
        if (it.num_tiles == 0) {
            wait_before_writing();  // the consumers write the item's rows
            publish_alone(it);
            return;
        }
        SlotWalker walker{0};
        Entry a = load_entry(0);
        for (int j = 0; j < it.num_tiles; ++j) {
            const int ks = next_k_stage();
            if (j == 0 && threadIdx.x == 0) s.item[ks] = it;
            // The meeting in publish_slots also makes the table whole before any thread copies
            // by it, and keeps a thread from rewriting this stage's table while another still
            // copies by it.
            bool dense;
            const int start = publish_slots(j, a, walker, s.tab[ks], dense);
            if (threadIdx.x == 0) s.dense[ks] = dense;
            mbarrier_arrive(&s.full_k[ks]);  // the table
            ++kt;
            // Causal: this tile and all later ones are in the future of every row.
            if (__any_sync(FULL_MASK, start > q_hi)) {
                cp_async_arrive(&s.full_k[ks]);  // no copies
                return;
            }
            copy_tile(s.k[ks], k_map, k_cache, s.tab[ks].row, dense, &s.full_k[ks]);
            // The block's first Q waits for the kernel before this one: its first V goes ahead.
            const bool q_after_v = j == 0 && qs == 0;
            if (j == 0 && !q_after_v) load_q(b);
            const int vs = vt % 3;
            if (vt >= 3) mbarrier_wait(&s.empty_v[vs], ((vt / 3) & 1) ^ 1);
            copy_tile(s.v[vs], v_map, v_cache, s.tab[ks].row, dense, &s.full_v[vs]);
            ++vt;
            if (q_after_v) load_q(b);
            if (j + 1 < it.num_tiles) a = load_entry(j + 1);
        }
    }

    // Walks the block's items, then tells the consumers to stop; the last block out resets the
    // counter of items.
    __device__ __forceinline__ void run() {
        const int total = num_seqs * num_kv_heads * ranks;
        for (int item = blockIdx.x; item < total; item = take_item()) {
            const int3 at = ws_item(item, num_seqs, num_kv_heads, ranks);
            const HopperBlock b =
                hopper_block(q_indptr, num_q_heads, num_kv_heads, at.x, at.y, at.z);
            if (__any_sync(FULL_MASK, b.row0 >= b.rows)) continue;  // a shorter sequence
            // Its meeting's scratch is free again: take_item met twice since the last use.
            const SequencePages sp =
                sequence_pages(kv_indptr, kv_page_ids, kv_page_lens, b.seq, page_size, s.reduce,
                               WS_PRODUCER_THREADS, [] { producer_sync(); });
            page_ids = sp.page_ids;
            page_lens = sp.page_lens;
            num_entries = sp.num_entries;
            kv_head = b.kv_head;
            q_hi = block_last_visible(b.row0, b.rows, b.group, causal, sp.kv_len, b.q_len);
            const int num_tiles = warp_uniform(count_tiles<HOP_N>(sp.num_entries, page_size));
            walk(WsItem{b.seq, b.kv_head, b.row0, b.q0, b.q_len, sp.kv_len, num_tiles}, b);
        }
        publish_alone(WsItem{-1, 0, 0, 0, 0, 0, 0});
        // Later work on the stream waits for this kernel alone: a block that loaded no Q still
        // ends after the kernel before it.
        wait_for_previous_kernel();
        // The consumers wait for every copy they read.
        cp_async_drain();
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(&ws_blocks_done, 1u) == gridDim.x - 1) {
                ws_next_item = 0;
                ws_blocks_done = 0;
            }
        }
    }
};

// Writes a consumer's 64 rows (rows 64 c.. of the block) through shared memory: each thread
// puts its normalised values (wgmma's layout: 4 bytes of a row a column group) into the
// warpgroup's rows of its item's Q buffer, which no wgmma reads any more, laid out as Q was (two
// 64-column halves of 128-byte rows, 16-byte chunk k of row r at k ^ (r % 8): the 8 rows a warp
// writes at once hit 32 different banks). Written from registers, a warp's 4-byte stores touched
// 8 rows at once, a quarter of every sector written. With `o_map` (the rows are whole tokens of
// the group, and all of them are rows of the sequence), one thread then asks the TMA to store
// both halves, and waits only until it has read them; otherwise every thread copies 16-byte
// pieces of whole rows out (a sequence's last rows, whose box would overwrite the next
// sequence's). Copied by the 128 threads, the rows had cost a consumer 0.6 us an item.
__device__ __forceinline__ void store_rows_staged(bf16* q_tile, int c, bf16* out, float* lse,
                                                  const TensorMap* o_map,
                                                  const float (&o_lo)[32], const float (&o_hi)[32],
                                                  const float (&m)[2], const float (&l)[2],
                                                  int row0, int rows, Group group, int kv_head,
                                                  int q0, int num_q_heads) {
    const int t = threadIdx.x & 127, lane = t & 31;
    char* const stage = reinterpret_cast<char*>(q_tile) + c * 64 * 128;
    auto chunk_at = [stage](int rr, int k) {  // k: 0..15 over both halves
        return stage + (k >> 3) * (HOP_M * 128) + rr * 128 + (((k & 7) ^ (rr & 7)) << 4);
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
    // The rows, written by this thread, before the TMA reads them (a store) or writes over them
    // (the Q two loads on, once this buffer is released).
    fence_async_shared();
    if (o_map != nullptr) {
        asm volatile("bar.sync %0, 128;\n" ::"r"(WS_STORE_BARRIER + c) : "memory");
        if (t == 0) {
            const int token = q0 + (row0 + c * 64) / group;
            for (int half = 0; half < 2; ++half)
                tma_store_3d(o_map, half * 64, kv_head * group.size, token,
                             stage + half * (HOP_M * 128));
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        }
        return;
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

// A consumer warpgroup: walks the items the producer publishes, a tile a step (prefill_hopper.cu's
// step, with the stage hand-over of mbarriers in place of the block-wide barrier and the products
// issued in turns), and stores each item's rows.
struct WsConsumer {
    WsShared& s;
    int c;  // which consumer: 0 (rows 0..63) or 1 (rows 64..127)
    Group group;
    int causal;
    u32 q_addr;   // this warpgroup's first Q row in the item's Q buffer
    float scale;  // sm_scale in log2 units
    int kt = 0, vt = 0, qs = 0, turns = 0;  // K and V stage uses, Qs and turns taken
    int q_index[2];  // the last KV index each of this thread's rows sees (-1: no row)
    int q_lo, q_hi;  // the same for the item's first and last rows
    float o_lo[32], o_hi[32];  // output columns 0..63 and 64..127
    u32 pa[HOP_N / 16][4];     // the previous tile's P
    float m[2], l[2];

    // Waits for V's use `use`; its shared address.
    __device__ __forceinline__ u32 wait_v(const int use) {
        mbarrier_wait(&s.full_v[use % 3], (use / 3) & 1);
        return shared_address(s.v[use % 3]);
    }

    // Releases a stage: every lane of the warp is done with it (its wgmmas waited for, its
    // reads of the slot table made), then one arrival a warp.
    __device__ __forceinline__ void release(u64* bar) {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) mbarrier_arrive(bar);
    }

    // Waits until this consumer may issue products: consumer 0's first turn of the kernel is
    // its own. Only an item's first step can be that turn.
    template <bool FIRST>
    __device__ __forceinline__ void take_turn() {
        if (!FIRST || __any_sync(FULL_MASK, c == 1 || turns > 0))
            named_barrier_sync(WS_TURN_BARRIER + c);
        ++turns;
    }

    // Hands the turn to the other consumer, whose wait needs this warpgroup's 128 arrivals.
    __device__ __forceinline__ void pass_turn() {
        named_barrier_arrive(WS_TURN_BARRIER + (c ^ 1));
    }

    // The item's tile j: false when causality ends the walk before it (its stage, which holds
    // no copies, is released). Tile 0's K stage was waited for with the item's description.
    template <bool FIRST>
    __device__ __forceinline__ bool step(const int j) {
        const int ks = kt & 1;
        if (!FIRST) mbarrier_wait(&s.full_k[ks], (kt >> 1) & 1);
        if (__any_sync(FULL_MASK, s.tab[ks].start > q_hi)) {
            release(&s.empty_k[ks]);
            ++kt;
            return false;
        }
        if (FIRST) {
            const int qb = qs & 1;
            mbarrier_wait(&s.q_full[qb], (qs >> 1) & 1);
            q_addr = shared_address(s.q[qb]) + c * 64 * 128;
            ++qs;
        }
        u32 v_addr = 0;
        if constexpr (!FIRST) v_addr = wait_v(vt + j - 1);
        // cp.async writes shared memory through the generic proxy, wgmma reads it through the
        // async proxy: the mbarriers' acquire orders the copies before this thread's later
        // accesses, and the proxy fence extends that order to its wgmma reads.
        fence_async_shared();
        float sc[HOP_N / 2];
        take_turn<FIRST>();
        issue_step<FIRST>(sc, o_lo, o_hi, pa, q_addr, shared_address(s.k[ks]), v_addr);
        pass_turn();
        wgmma_wait<FIRST ? 0 : 1>();  // the scores; P V may still run
        fence_registers(sc);

        mask_tile(sc, s.tab[ks], s.dense[ks], q_lo, q_index);
        release(&s.empty_k[ks]);
        ++kt;
        float alpha[2];
        online_softmax(sc, m, l, alpha, scale);

        settle_step(o_lo, o_hi, pa, sc, alpha);
        if constexpr (!FIRST) release(&s.empty_v[(vt + j - 1) % 3]);  // its P V is done
        return true;
    }

    // The last tile's P V, once the walk has computed `done` tiles' scores: a turn of its own
    // (none when no tile was walked, as then neither consumer took any).
    __device__ __forceinline__ void finish(const int done) {
        if (done > 0) {
            const u32 v_addr = wait_v(vt + done - 1);
            fence_async_shared();
            take_turn<false>();
            issue_last_pv(o_lo, o_hi, pa, v_addr);
            pass_turn();
            settle_last_pv(o_lo, o_hi, pa);
            release(&s.empty_v[(vt + done - 1) % 3]);
        }
        vt += done;
    }

    // Walks the items until the producer's end, storing each one's rows: through Q's memory
    // when it loaded a Q (then released for the next), else straight out (zeros).
    // `o_map`: the output's map when the items' rows are whole tokens (else null).
    __device__ __forceinline__ void run(bf16* out, float* lse, const TensorMap* o_map,
                                        int num_q_heads, int my_row) {
        for (;;) {
            const int ks = kt & 1;
            mbarrier_wait(&s.full_k[ks], (kt >> 1) & 1);
            const WsItem it = s.item[ks];
            if (__any_sync(FULL_MASK, it.seq < 0)) break;
            const int rows = it.q_len * group.size;
            q_hi = block_last_visible(it.row0, rows, group, causal, it.kv_len, it.q_len);
            q_lo = last_visible(it.row0, rows, group, causal, it.kv_len, it.q_len);
            int q_token[2];
            hopper_thread_rows(my_row, it.row0, rows, group, causal, it.kv_len, it.q_len, q_token,
                               q_index);
            const int num_tiles = warp_uniform(it.num_tiles);
            if (num_tiles == 0) {  // the stage holds the description alone
                release(&s.empty_k[ks]);
                ++kt;
            }
            const int qs_before = qs;
            hopper_walk(*this, num_tiles);
            if (__any_sync(FULL_MASK, qs != qs_before)) {
                const int qb = (qs - 1) & 1;
                const bool whole = it.row0 + c * 64 + 64 <= rows;  // every row a sequence row
                store_rows_staged(s.q[qb], c, out, lse, whole ? o_map : nullptr, o_lo, o_hi, m, l,
                                  it.row0, rows, group, it.kv_head, it.q0, num_q_heads);
                release(&s.q_empty[qb]);
            } else {
                hopper_store_rows(out, lse, o_lo, o_hi, m, l, q_token, it.row0, my_row, group,
                                  it.kv_head, it.q0, num_q_heads);
            }
        }
        if (c == 0 && turns > 0) named_barrier_sync(WS_TURN_BARRIER);  // consumer 1's last
        // The TMA's stores have landed before the kernel ends.
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    }
};

// One block an SM, walking work items: 128 rows, 128-slot tiles, a producer and two consumer
// warpgroups. `ranks`: the longest sequence's query tiles (an item's third index). `q_rows`:
// Q's rows; sequence s's queries start at row q_indptr[s] mod q_rows (pieces of one KV share
// one copy of their queries; otherwise q_indptr[s] itself). The kernel after this one, launched
// as its programmatic dependent, may start once every block has waited for the kernel before
// (cascade's decode of the requests' own pages, on the multiprocessors this grid leaves free:
// at 64 requests in 8 parts, 64 items, half the GPU). `q_tma`:
// whether `q_map` describes Q (a group of q heads divides an item's 128 rows; else the
// producer's threads copy Q); `o_tma`, whether `o_map` describes the output in boxes of a
// consumer's 64 rows.
extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) prefill_attention_hopper_ws_d128(
    const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ q_indptr,
    const int* __restrict__ kv_indptr, const int* __restrict__ kv_page_ids,
    const int* __restrict__ kv_page_lens, bf16* __restrict__ out, float* __restrict__ lse,
    int num_q_heads, int num_kv_heads, int page_size, int page_shift, int num_pages, int q_rows,
    float sm_scale, int causal, const __grid_constant__ TensorMap k_map,
    const __grid_constant__ TensorMap v_map, const __grid_constant__ TensorMap q_map, int q_tma,
    const __grid_constant__ TensorMap o_map, int o_tma, int num_seqs, int ranks) {
    extern __shared__ unsigned char raw_smem[];
    if (((0u - shared_address(raw_smem)) & 1023u) > WS_ALIGN_SLACK) __trap();
    auto& s = aligned_shared<WsShared>(raw_smem);
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
        for (int i = 0; i < 2; ++i) {
            mbarrier_init(&s.q_full[i], WS_PRODUCER_THREADS);
            mbarrier_init(&s.q_empty[i], WS_CONSUMER_WARPS);
        }
        mbarrier_init_fence();
    }
    __syncthreads();  // publishes the mbarriers' initialisation

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PRODUCER_REGS));
        WsProducer p{s,         q,           k_cache,      v_cache,      q_indptr,
                     kv_indptr, kv_page_ids, kv_page_lens, &k_map,       &v_map,
                     &q_map,    q_tma,       num_q_heads,  num_kv_heads, page_size,
                     page_shift, num_pages,  q_rows,       causal,       num_seqs,
                     ranks};
        p.run();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WS_CONSUMER_REGS));
    const int c = wg - 1;  // consumer: rows 64 c ..
    WsConsumer w{s, c, make_group(num_q_heads / num_kv_heads), causal, 0, sm_scale * LOG2E};
    w.run(out, lse, o_tma ? &o_map : nullptr, num_q_heads, c * 64 + (warp & 3) * 16 + (lane >> 2));
}
