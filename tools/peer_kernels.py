"""FlashInfer 0.5.0 on exactly the shapes of the kernel benches, timed the way they time ours.

The kernel benches (`cargo bench -p kernels --bench attention` and `--bench cascade`) measure
decode and prefill attention, cascade attention and sampling at Qwen3-0.6B's attention shape
(16 q heads, 8 KV heads, head_dim 128, bf16). This script runs FlashInfer's kernels on the same
shapes, page sizes and sequence lengths, and reports the same rates, so that each line of the
benches' summaries has a peer line here with the same name:

    decode:   64 x 1,024 page 16 and page 256, 2 x 32,768 page 16, and the serving batches of
              1-256 sequences of 100-2,047 tokens on pages of 256; GB/s of K/V read
              (2 * tokens * 8 * 128 * 2 bytes / time). BatchDecodeWithPagedKVCacheWrapper, with
              use_tensor_cores off and on: the line shows the faster, the JSON both.
    prefill:  causal 1 x 4,096 page 16, 4 x 2,048 page 256, 16 x 512 page 16; TFLOP/s of the
              unmasked half (4 * seqs * 16 * 128 * len * (len + 1) / 2 / time).
              BatchPrefillWithPagedKVCacheWrapper with backend "fa2" and "fa3".
    cascade:  64/128/256 requests sharing a 4k-32k-token prefix, 64 own tokens each, pages of 16:
              "flat" (the decode wrapper over each request's whole table) and "cascade"
              (MultiLevelCascadeAttentionWrapper, 2 levels: the prefix for all queries, then each
              request's own pages), its levels on fa2 and on fa3; us, and the largest difference
              between the cascade and flat outputs.
    sampling: 64 x 151,936 f32 logits, three sets (the bench's `fill` values times 8, exactly;
              torch.randn: flat; torch.randn * 8: peaked): greedy, T 0.7, and T 0.7 with top-k 50,
              top-p 0.9 or both, in us. What each line times is in its note and in the JSON.

Timing is the benches' own: after one warm-up call, CUDA events around 10 calls in a row, the
median per call of 15 such batches. A Python call that takes longer on the host than its
kernels take on the device leaves the device idle between calls, so each case is also timed a
second way, "queued": a sleep kernel keeps the device busy while the host enqueues the 10 calls,
so the events enclose device time only. `plan` runs outside the timed region, `run` inside.
K/V are in FlashInfer's NHD layout (`--kv-layout HND` for the other), one K and one V tensor of
[pages, page_size, 8, 128] (ours is [pages, 8, page_size, 128]); their values are random
(attention's time does not depend on them). Workspace: 256 MB.

It needs a CUDA GPU, PyTorch, and flashinfer-python==0.5.0 with apache-tvm-ffi<0.2 (plus
ninja, einops, tabulate and nvidia-ml-py). FlashInfer compiles its kernels with the machine's
nvcc on first use and keeps them under ~/.cache/flashinfer; this script builds the modules its
sections use, and only those, all at once before the first case (a few minutes the first time;
stderr says when it starts and how long each took). From the repository root, with the two
wheels in the current folder (from
`pip download --no-deps flashinfer-python==0.5.0 "apache-tvm-ffi<0.2"`):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site \
        flashinfer_python-0.5.0-*.whl apache_tvm_ffi-*.whl
    PYTHONPATH=/tmp/site python3 tools/peer_kernels.py --out peer.json

A table goes to stdout, progress to stderr, and every figure, with the FlashInfer, PyTorch and
CUDA versions and the GPU's name, to the JSON file (rewritten after each case, so a run cut
short keeps what it measured). A case that fails is recorded with its error and the run goes on;
the exit status is then 2 (1 when nothing could run: no PyTorch, no GPU, no FlashInfer).
`--only decode,prefill,cascade,sampling` picks sections.
"""

import argparse
import json
import os
import sys
import time
import traceback
from array import array

HQ = 16
HKV = 8
D = 128
SECTIONS = ("decode", "prefill", "cascade", "sampling")
WORKSPACE_BYTES = 256 << 20
CASCADE_PAGE = 16
CASCADE_SUFFIX = 64
SAMPLE_ROWS = 64
SAMPLE_VOCAB = 151_936
# The host may take this long to enqueue a batch of 10 calls while the device sleeps.
QUEUE_SLEEP_MS = 20.0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def serving_lens():
    """The attention bench's 256 serving lengths, 100..=2047 tokens."""
    mask = (1 << 64) - 1
    return [100 + (((i * 0x9E3779B97F4A7C15) & mask) >> 40) % 1948 for i in range(256)]


def fill_bits(n, seed):
    """The bits of the benches' `fill(n, seed)`: xorshift64 into bf16 of magnitude 2^-7..2."""
    mask = (1 << 64) - 1
    x = seed
    out = array("H", bytes(2 * n))
    for i in range(n):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        out[i] = 0x3C00 | (x & 0x83FF)
    return out


class Timer:
    """The benches' timing (median of 15 batches of 10 calls between CUDA events), and the same
    with the host's enqueueing hidden behind a sleep kernel."""

    def __init__(self, torch):
        self.torch = torch
        self.sleep_cycles = None
        try:
            start, end = self._events()
            torch.cuda._sleep(1000)  # loads the kernel before it is timed
            torch.cuda.synchronize()
            start.record()
            torch.cuda._sleep(10_000_000)
            end.record()
            end.synchronize()
            cycles_per_ms = 10_000_000 / start.elapsed_time(end)
            self.sleep_cycles = int(cycles_per_ms * QUEUE_SLEEP_MS)
        except Exception as e:  # an old or new PyTorch without torch.cuda._sleep
            log(f"no sleep kernel ({e!r}): only the benches' timing")

    def _events(self):
        cuda = self.torch.cuda
        return cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)

    def measure(self, fn):
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        start, end = self._events()
        plain = []
        for _ in range(15):
            start.record()
            for _ in range(10):
                fn()
            end.record()
            end.synchronize()
            plain.append(start.elapsed_time(end) / 10)
        result = {"time_us": median(plain) * 1e3, "batches_us": [t * 1e3 for t in plain]}
        if self.sleep_cycles is None:
            return result
        queued, host = [], []
        for _ in range(15):
            torch.cuda._sleep(self.sleep_cycles)
            start.record()
            t0 = time.perf_counter()
            for _ in range(10):
                fn()
            host.append((time.perf_counter() - t0) / 10)
            end.record()
            end.synchronize()
            queued.append(start.elapsed_time(end) / 10)
        result["queued_us"] = median(queued) * 1e3
        result["host_us_per_call"] = median(host) * 1e6
        # If enqueueing outlasted the sleep, the device waited on the host after all.
        result["queue_held"] = max(host) * 10 * 1e3 < 0.9 * QUEUE_SLEEP_MS
        return result


def median(samples):
    return sorted(samples)[len(samples) // 2]


class Bench:
    def __init__(self, args):
        self.args = args
        self.doc = {
            "format": 1,
            "what": "FlashInfer on the shapes of kernels/benches/attention.rs and cascade.rs",
            "timing": "after a warm-up call, CUDA events around 10 calls, median per call of 15 "
            "batches; queued_us: the same with a sleep kernel ahead of the start event so the "
            "host's enqueueing is hidden; host_us_per_call: the host's time to enqueue a call",
            "shape": {"q_heads": HQ, "kv_heads": HKV, "head_dim": D, "dtype": "bfloat16"},
            "kv_layout": args.kv_layout,
            "workspace_bytes": WORKSPACE_BYTES,
            "sections": args.only,
            "jit_seconds": {},
            "cases": [],
        }
        self.jit_seen = set()
        self.torch = None
        self.fi = None
        self.timer = None

    def save(self):
        tmp = self.args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
        os.replace(tmp, self.args.out)

    def prebuild(self):
        """Compiles the FlashInfer modules that the chosen sections use, all at once: each is a
        ninja build of its own, and together they keep the machine's cores busier than one
        after the other. A module that fails here is built (or fails) again at first use."""
        import importlib
        from concurrent.futures import ThreadPoolExecutor

        torch, only = self.torch, set(self.args.only)
        jit = importlib.import_module("flashinfer.jit")
        bf = torch.bfloat16
        # The arguments the wrappers pass for bf16, int32 indices, head_dim 128, no RoPE,
        # no sliding window, no soft cap (and no fp16 QK reduction for prefill).
        attn = (bf, bf, bf, torch.int32, D, D, 0, False, False)
        specs = {}
        if only & {"decode", "cascade"}:
            specs["batch decode"] = lambda: jit.gen_batch_decode_module(*attn)
        if only & {"decode", "prefill", "cascade"}:
            specs["batch prefill fa2"] = lambda: jit.gen_batch_prefill_module("fa2", *attn, False)
        if only & {"prefill", "cascade"}:
            specs["batch prefill fa3"] = lambda: jit.gen_batch_prefill_module("fa3", *attn, False)
            specs["page"] = lambda: importlib.import_module("flashinfer.jit.page").gen_page_module()
        if "cascade" in only:
            specs["cascade"] = (
                lambda: importlib.import_module("flashinfer.jit.cascade").gen_cascade_module()
            )
        if "sampling" in only:
            specs["sampling"] = (
                lambda: importlib.import_module("flashinfer.jit.sampling").gen_sampling_module()
            )

        def build(name):
            t0 = time.time()
            specs[name]().build(False)
            return time.time() - t0

        log(f"FlashInfer: compiling {', '.join(specs)} with nvcc in parallel, unless already "
            "built (first time: minutes)...")
        t0 = time.time()
        with ThreadPoolExecutor(len(specs)) as pool:
            futures = {name: pool.submit(build, name) for name in specs}
            for name, future in futures.items():
                try:
                    secs = future.result()
                    self.doc["jit_seconds"][f"build {name}"] = round(secs, 1)
                    log(f"  {name}: built in {secs:.1f} s")
                except Exception as e:
                    self.doc.setdefault("jit_errors", {})[name] = f"{type(e).__name__}: {e}"
                    log(f"  {name}: not built ahead ({type(e).__name__}: {str(e)[-2000:]})")
        self.doc["jit_seconds"]["build all"] = round(time.time() - t0, 1)
        log(f"FlashInfer: modules ready after {time.time() - t0:.1f} s")
        self.save()

    def jit(self, key, fn):
        """Runs `fn` (a plan or a first call), which loads the FlashInfer module `key`, or
        compiles it if the build ahead did not."""
        if key in self.jit_seen:
            return fn()
        self.jit_seen.add(key)
        log(f"  FlashInfer {key}: loading (compiling with nvcc if not built yet: minutes)...")
        t0 = time.time()
        try:
            return fn()
        finally:
            secs = time.time() - t0
            self.doc["jit_seconds"][key] = round(secs, 1)
            log(f"  FlashInfer {key}: ready after {secs:.1f} s")

    def case(self, section, name, fn, *args):
        """Runs one case; `fn(*args)` returns its fields. An error is recorded, not raised."""
        log(f"[{section}] {name}")
        row = {"section": section, "name": name}
        try:
            row.update(fn(*args))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
            row["traceback"] = traceback.format_exc()
            log(f"  failed: {row['error']}")
        else:
            log("  " + summary(row))
        self.doc["cases"].append(row)
        self.save()
        if self.torch is not None:
            self.torch.cuda.empty_cache()
        return row

    def alloc_kv(self, pages, page):
        torch = self.torch
        shape = (pages, page, HKV, D) if self.args.kv_layout == "NHD" else (pages, HKV, page, D)
        k = torch.empty(shape, dtype=torch.bfloat16, device="cuda").normal_(0, 0.5)
        v = torch.empty(shape, dtype=torch.bfloat16, device="cuda").normal_(0, 0.5)
        return k, v

    def workspace(self):
        return self.torch.zeros(WORKSPACE_BYTES, dtype=self.torch.uint8, device="cuda")

    def paged_tables(self, lens, page):
        """Consecutive pages for each sequence, as the bench lays them: (indptr, indices,
        last_page_len, total pages)."""
        torch = self.torch
        indptr, last = [0], []
        for n in lens:
            pages = -(-n // page)
            indptr.append(indptr[-1] + pages)
            last.append(n - (pages - 1) * page)
        total = indptr[-1]

        def dev(x):
            return torch.tensor(x, dtype=torch.int32, device="cuda")

        return dev(indptr), torch.arange(total, dtype=torch.int32, device="cuda"), dev(last), total

    # Decode: the faster of CUDA cores and tensor cores under the bench's name, both in the JSON.

    def decode_variants(self, q, kv, tables, page):
        """Times the decode wrapper both ways over `tables`; returns the fields of the faster
        (with the other's), and the two outputs."""
        variants, outs = {}, {}
        for tc in (False, True):
            label = "tensor cores" if tc else "CUDA cores"
            try:
                variants[label], outs[label] = self.decode_one(q, kv, tables, page, tc)
            except Exception as e:
                variants[label] = {"error": f"{type(e).__name__}: {e}"}
                log(f"  {label} failed: {variants[label]['error']}")
        timed = {k: v for k, v in variants.items() if "time_us" in v}
        if not timed:
            raise RuntimeError("; ".join(f"{k}: {v['error']}" for k, v in variants.items()))
        best = min(timed, key=lambda k: timed[k]["time_us"])
        row = dict(timed[best])
        row["variant"] = best
        row["variants"] = variants
        row["note"] = best
        for other, t in variants.items():
            if other != best:
                row["note"] += f"; {other}: " + (
                    f"{t['time_us']:.1f} us" if "time_us" in t else "failed"
                )
        if len(outs) == 2:
            a, b = outs.values()
            row["max_abs_diff_between_variants"] = (a.float() - b.float()).abs().max().item()
        return row, outs

    def decode_one(self, q, kv, tables, page, tensor_cores):
        torch = self.torch
        indptr, indices, last, _ = tables
        wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace(), self.args.kv_layout, use_tensor_cores=tensor_cores
        )
        self.jit(
            "batch prefill fa2 (decode on tensor cores)" if tensor_cores else "batch decode",
            lambda: wrapper.plan(
                indptr, indices, last, HQ, HKV, D, page,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
            ),
        )
        out = torch.empty_like(q)
        t = self.timer.measure(lambda: wrapper.run(q, kv, out=out))
        t["timed"] = (
            f"BatchDecodeWithPagedKVCacheWrapper.run, use_tensor_cores={tensor_cores} "
            "(plan outside)"
        )
        return t, out

    def decode_case(self, lens, page):
        torch = self.torch
        tables = self.paged_tables(lens, page)
        k, v = self.alloc_kv(tables[3], page)
        q = torch.randn(len(lens), HQ, D, dtype=torch.bfloat16, device="cuda")
        row, _ = self.decode_variants(q, (k, v), tables, page)
        nbytes = 2 * sum(lens) * HKV * D * 2
        row.update(rate=nbytes / (row["time_us"] * 1e-6) / 1e9, unit="GB/s", bytes=nbytes)
        if "queued_us" in row:
            row["queued_rate"] = nbytes / (row["queued_us"] * 1e-6) / 1e9
        return row

    def run_decode(self):
        for batch, n, page in [(64, 1024, 16), (64, 1024, 256), (2, 32768, 16)]:
            self.case("decode", f"decode b{batch} ctx{n} page{page}", self.decode_case,
                      [n] * batch, page)
        lens = serving_lens()
        for batch in [1, 16, 32, 64, 128, 256]:
            self.case("decode", f"decode b{batch} ctx100-2047 page256", self.decode_case,
                      lens[:batch], 256)

    # Prefill: causal, whole prompts, one case per backend.

    def prefill_case(self, seqs, n, page, backend):
        torch, fi = self.torch, self.fi
        tables = self.paged_tables([n] * seqs, page)
        k, v = self.alloc_kv(tables[3], page)
        q = torch.randn(seqs * n, HQ, D, dtype=torch.bfloat16, device="cuda")
        qo_indptr = torch.arange(0, (seqs + 1) * n, n, dtype=torch.int32, device="cuda")
        wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace(), self.args.kv_layout, backend=backend
        )
        indptr, indices, last, _ = tables
        self.jit(
            f"batch prefill {backend}",
            lambda: wrapper.plan(
                qo_indptr, indptr, indices, last, HQ, HKV, D, page, causal=True,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
            ),
        )
        out = torch.empty_like(q)
        run = lambda: wrapper.run(q, (k, v), out=out)  # noqa: E731
        if backend == "fa3":
            self.jit("page (fa3's run turns page indices into token offsets)", run)
        row = self.timer.measure(run)
        flops = 4.0 * seqs * HQ * D * (n * (n + 1) / 2)
        row.update(rate=flops / (row["time_us"] * 1e-6) / 1e12, unit="TFLOP/s", flops=flops)
        if "queued_us" in row:
            row["queued_rate"] = flops / (row["queued_us"] * 1e-6) / 1e12
        row["timed"] = f"BatchPrefillWithPagedKVCacheWrapper.run, backend {backend}, causal"
        if backend == "fa3":
            row["timed"] += " (run also turns page indices into token offsets, a small kernel)"
        row["note"] = backend
        return row

    def run_prefill(self):
        for seqs, n, page in [(1, 4096, 16), (4, 2048, 256), (16, 512, 16)]:
            for backend in ("fa2", "fa3"):
                self.case("prefill", f"prefill {seqs}x{n} page{page} {backend}",
                          self.prefill_case, seqs, n, page, backend)

    # Cascade: the prefix's pages first, then each request's own 64 tokens (4 pages).

    def run_cascade(self):
        torch = self.torch
        try:
            auto = "fa3" if self.fi.utils.is_sm90a_supported(torch.device("cuda")) else "fa2"
            self.doc["cascade_auto_backend"] = auto
            log(f"[cascade] MultiLevelCascadeAttentionWrapper's 'auto' picks {auto} here")
        except Exception as e:
            log(f"[cascade] could not tell what 'auto' picks: {e!r}")
        for batch in [64, 128, 256]:
            for prefix in [4096, 8192, 16384, 32768]:
                name = f"cascade b{batch} p{prefix}"
                # The shape's K/V and queries, shared by its three cases.
                state = {"batch": batch, "prefix_pages": prefix // CASCADE_PAGE}
                flat_row = self.case("cascade", f"{name} flat", self.cascade_flat, state)
                for backend in ("fa2", "fa3"):
                    self.case("cascade", f"{name} cascade {backend}", self.cascade_case,
                              state, backend, flat_row)
                state.clear()

    def cascade_inputs(self, state):
        """The prefix's pages first, then each request's own pages, and one query a request."""
        if "kv" not in state:
            own_pages = CASCADE_SUFFIX // CASCADE_PAGE
            batch = state["batch"]
            state["kv"] = self.alloc_kv(state["prefix_pages"] + batch * own_pages, CASCADE_PAGE)
            state["q"] = self.torch.randn(batch, HQ, D, dtype=self.torch.bfloat16, device="cuda")
        return state["q"], state["kv"]

    def cascade_flat(self, state):
        torch = self.torch
        q, kv = self.cascade_inputs(state)
        batch, prefix_pages = state["batch"], state["prefix_pages"]
        own_pages = CASCADE_SUFFIX // CASCADE_PAGE
        # Each request's table: the prefix's pages, then its own.
        indices = []
        for r in range(batch):
            first = prefix_pages + r * own_pages
            indices += list(range(prefix_pages)) + list(range(first, first + own_pages))
        per_seq = prefix_pages + own_pages
        tables = (
            torch.arange(0, (batch + 1) * per_seq, per_seq, dtype=torch.int32, device="cuda"),
            torch.tensor(indices, dtype=torch.int32, device="cuda"),
            torch.full((batch,), CASCADE_PAGE, dtype=torch.int32, device="cuda"),
            prefix_pages + batch * own_pages,
        )
        row, outs = self.decode_variants(q, kv, tables, CASCADE_PAGE)
        state["flat_out"] = next(iter(outs.values()), None)
        return row

    def cascade_case(self, state, backend, flat_row):
        torch, fi = self.torch, self.fi
        q, kv = self.cascade_inputs(state)
        batch, prefix_pages = state["batch"], state["prefix_pages"]
        own_pages = CASCADE_SUFFIX // CASCADE_PAGE
        wrapper = fi.MultiLevelCascadeAttentionWrapper(2, self.workspace(), self.args.kv_layout)
        default = None
        for level in wrapper._batch_prefill_wrappers:
            # Each level is a BatchPrefillWithPagedKVCacheWrapper built with backend "auto"
            # (fa3 on Hopper); its backend is read at plan time.
            default = level._backend
            level._backend = backend

        def dev(x):
            return torch.tensor(x, dtype=torch.int32, device="cuda")

        self.jit(
            f"batch prefill {backend}",
            lambda: wrapper.plan(
                [dev([0, batch]), torch.arange(batch + 1, dtype=torch.int32, device="cuda")],
                [dev([0, prefix_pages]),
                 torch.arange(0, (batch + 1) * own_pages, own_pages, dtype=torch.int32,
                              device="cuda")],
                [torch.arange(prefix_pages, dtype=torch.int32, device="cuda"),
                 torch.arange(prefix_pages, prefix_pages + batch * own_pages, dtype=torch.int32,
                              device="cuda")],
                [dev([CASCADE_PAGE]),
                 torch.full((batch,), CASCADE_PAGE, dtype=torch.int32, device="cuda")],
                HQ, HKV, D, CASCADE_PAGE,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
            ),
        )
        run = lambda: wrapper.run(q, kv)  # noqa: E731
        first = "cascade (merge_state_in_place)"
        if backend == "fa3":
            first += " and page (fa3's token offsets)"
        self.jit(first, run)
        row = self.timer.measure(run)
        row["timed"] = (
            f"MultiLevelCascadeAttentionWrapper.run, both levels on {backend} (level 1: each "
            f"request's own {CASCADE_SUFFIX} tokens, level 0: the shared prefix for all queries, "
            f"then merge_state_in_place); the wrapper's own default is backend {default!r}"
        )
        row["note"] = backend
        if flat_row.get("time_us"):
            row["speedup_over_flat"] = flat_row["time_us"] / row["time_us"]
            row["note"] += f"; {row['speedup_over_flat']:.1f}x flat"
        if flat_row.get("queued_us") and row.get("queued_us"):
            row["queued_speedup_over_flat"] = flat_row["queued_us"] / row["queued_us"]
        if state.get("flat_out") is not None:
            out = run()
            diff = (out.float() - state["flat_out"].float()).abs().max().item()
            row["max_abs_diff_vs_flat"] = diff
            row["note"] += f"; diff {row['max_abs_diff_vs_flat']:.1e}"
        return row

    # Sampling: what a serving engine calls after the LM head, from f32 logits.

    def run_sampling(self):
        torch, fi = self.torch, self.fi
        rows, vocab = SAMPLE_ROWS, SAMPLE_VOCAB
        log(f"[sampling] making the bench's fill({rows * vocab}, 4) in Python (seconds)...")
        bits = fill_bits(rows * vocab, 4)
        fill8 = torch.frombuffer(bits, dtype=torch.int16).clone().view(torch.bfloat16)
        fill8 = fill8.to(torch.float32).reshape(rows, vocab).cuda() * 8.0
        gen = torch.Generator(device="cuda")
        gen.manual_seed(0)
        cpu = torch.Generator().manual_seed(0)
        logit_sets = {
            "fill*8": fill8,
            "flat": torch.randn(rows, vocab, generator=cpu).cuda(),
            "peaked": (torch.randn(rows, vocab, generator=cpu) * 8).cuda(),
        }
        # Per-request parameters as tensors, as an engine with mixed requests passes them.
        temp = torch.full((rows,), 0.7, dtype=torch.float32, device="cuda")
        top_k = torch.full((rows,), 50, dtype=torch.int32, device="cuda")
        top_p = torch.full((rows,), 0.9, dtype=torch.float32, device="cuda")
        s = fi.sampling
        try:
            self.jit("sampling", lambda: s.softmax(logit_sets["flat"], temperature=temp))
        except Exception as e:  # its cases say so one by one; the torch ones still run
            log(f"  FlashInfer sampling failed to load: {type(e).__name__}: {e}")

        def probs(x):
            return s.softmax(x, temperature=temp)

        # (case, variant, short note, what is timed, the call)
        softmax_t = "flashinfer.sampling.softmax(logits, temperature=T[rows])"
        cases = [
            ("greedy", "", "argmax", "torch.argmax(logits, -1)",
             lambda x: torch.argmax(x, dim=-1)),
            ("T 0.7", "", "softmax(T) + sampling_from_probs",
             f"{softmax_t} + sampling_from_probs",
             lambda x: s.sampling_from_probs(probs(x), generator=gen)),
            ("T 0.7", "from logits", "logits / T + sampling_from_logits",
             "logits / T[rows, None] (a torch kernel) + sampling_from_logits",
             lambda x: s.sampling_from_logits(x / temp[:, None], generator=gen)),
            ("T 0.7", "torch", "torch softmax + multinomial",
             "torch.softmax(logits / T[rows, None], -1) + torch.multinomial(probs, 1)",
             lambda x: torch.multinomial(torch.softmax(x / temp[:, None], dim=-1), 1)),
            ("T 0.7 top-k 50", "", "softmax(T) + top_k_sampling_from_probs",
             f"{softmax_t} + top_k_sampling_from_probs(probs, k[rows])",
             lambda x: s.top_k_sampling_from_probs(probs(x), top_k, generator=gen)),
            ("T 0.7 top-p 0.9", "", "softmax(T) + top_p_sampling_from_probs",
             f"{softmax_t} + top_p_sampling_from_probs(probs, p[rows])",
             lambda x: s.top_p_sampling_from_probs(probs(x), top_p, generator=gen)),
            ("T 0.7 top-k 50 top-p 0.9", "", "softmax(T) + top_k_top_p (joint)",
             f"{softmax_t} + top_k_top_p_sampling_from_probs(probs, k[rows], p[rows], "
             "filter_apply_order='joint'): one sampling kernel",
             lambda x: s.top_k_top_p_sampling_from_probs(
                 probs(x), top_k, top_p, filter_apply_order="joint", generator=gen)),
            ("T 0.7 top-k 50 top-p 0.9", "top_k_first", "softmax(T) + top_k_top_p (top_k_first)",
             f"{softmax_t} + top_k_top_p_sampling_from_probs(probs, k[rows], p[rows], "
             "filter_apply_order='top_k_first'): top_k_renorm_probs + top_p_sampling_from_probs",
             lambda x: s.top_k_top_p_sampling_from_probs(
                 probs(x), top_k, top_p, filter_apply_order="top_k_first", generator=gen)),
        ]
        for dist, logits in logit_sets.items():
            for what, variant, note, timed, fn in cases:
                name = f"sample {rows}x{vocab} {what} {dist}" + (f" [{variant}]" if variant else "")
                self.case("sampling", name, self.sample_case, fn, logits, timed, note)

    def sample_case(self, fn, logits, timed, note):
        row = self.timer.measure(lambda: fn(logits))
        row.update(timed=timed, note=note)
        return row

    def main(self):
        args = self.args
        try:
            import torch
        except Exception as e:
            self.doc["error"] = f"PyTorch is missing: {e!r}"
            self.save()
            log(self.doc["error"])
            return 1
        self.torch = torch
        self.doc["torch"] = torch.__version__
        self.doc["cuda"] = torch.version.cuda
        if not torch.cuda.is_available():
            self.doc["error"] = "no CUDA device"
            self.save()
            log("no CUDA device: nothing to time")
            return 1
        props = torch.cuda.get_device_properties(0)
        self.doc["gpu"] = torch.cuda.get_device_name(0)
        self.doc["sm_count"] = props.multi_processor_count
        self.doc["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        try:
            import flashinfer

            self.fi = flashinfer
            self.doc["flashinfer"] = getattr(flashinfer, "__version__", "unknown")
        except Exception as e:
            self.doc["error"] = f"import flashinfer failed: {type(e).__name__}: {e}"
            self.doc["traceback"] = traceback.format_exc()
            self.save()
            log(self.doc["traceback"])
            return 1
        log(f"{self.doc['gpu']} ({self.doc['sm_count']} SMs), torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, flashinfer {self.doc['flashinfer']}")
        torch.manual_seed(0)
        self.timer = Timer(torch)
        self.doc["queue_sleep_cycles"] = self.timer.sleep_cycles
        self.save()
        try:
            self.prebuild()
        except Exception as e:  # the lazy path builds what is needed anyway
            log(f"building ahead failed: {type(e).__name__}: {e}")
        for section in args.only:
            try:
                getattr(self, f"run_{section}")()
            except Exception as e:  # a failure outside any one case
                self.doc.setdefault("section_errors", {})[section] = f"{type(e).__name__}: {e}"
                log(traceback.format_exc())
                self.save()
        print_table(self.doc)
        failed = [c["name"] for c in self.doc["cases"] if "error" in c]
        log(f"wrote {args.out}: {len(self.doc['cases'])} cases, {len(failed)} failed")
        return 0 if not failed and "section_errors" not in self.doc else 2


def summary(row):
    parts = [f"{row['time_us']:.1f} us"]
    if "rate" in row:
        parts.append(f"{row['rate']:.1f} {row['unit']}")
    if "queued_us" in row:
        parts.append(f"queued {row['queued_us']:.1f} us")
    if row.get("note"):
        parts.append(row["note"])
    return ", ".join(parts)


def print_table(doc):
    print(f"\nFlashInfer {doc.get('flashinfer')} on {doc.get('gpu')} (torch {doc.get('torch')}, "
          f"CUDA {doc.get('cuda')}), K/V layout {doc['kv_layout']}")
    print("time: the benches' method (events around 10 calls, median of 15 batches); queued: "
          "the same with the host's enqueueing hidden (* where it could not be)")
    width = max([len(row["name"]) for row in doc["cases"]] + [40])
    print(f"  {'case':<{width}} {'time':>11} {'rate':>16} {'queued':>11} {'host/call':>10}  note")
    for row in doc["cases"]:
        if "error" in row:
            print(f"  {row['name']:<{width}} failed: {row['error'].splitlines()[0][:120]}")
            continue
        rate = f"{row['rate']:.1f} {row['unit']}" if "rate" in row else ""
        queued = f"{row['queued_us']:.1f} us" if "queued_us" in row else ""
        if queued and not row.get("queue_held", True):
            queued += "*"
        host = f"{row['host_us_per_call']:.1f} us" if "host_us_per_call" in row else ""
        print(f"  {row['name']:<{width}} {row['time_us']:>8.1f} us {rate:>16} {queued:>11} "
              f"{host:>10}  {row.get('note', '')}")
    for section, err in doc.get("section_errors", {}).items():
        print(f"  section {section} stopped: {err}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(
        description="FlashInfer 0.5.0 on the kernel benches' shapes (decode, prefill, cascade "
        "attention, sampling), timed as the benches time ours."
    )
    ap.add_argument("--out", default="peer_kernels.json", help="the JSON file of every figure")
    ap.add_argument(
        "--only", default=",".join(SECTIONS),
        help="comma-separated sections to run, of: " + ",".join(SECTIONS),
    )
    ap.add_argument("--kv-layout", choices=("NHD", "HND"), default="NHD",
                    help="FlashInfer's K/V page layout (default NHD)")
    args = ap.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown or not only:
        ap.error(f"--only takes some of {','.join(SECTIONS)}; got {args.only!r}")
    args.only = only
    return Bench(args).main()


if __name__ == "__main__":
    sys.exit(main())
