//! Attention throughput at a Qwen3-0.6B-like shape (16 q heads, 8 KV heads, head_dim 128):
//! decode in GB/s of K/V read, prefill in TFLOP/s, and the time of device sampling. Times come
//! from CUDA events around many launches; a summary table is printed at the end. Without a GPU
//! it says so and exits.

mod common;
// The tests' seeded normal logits.
#[path = "../tests/common/mod.rs"]
mod test_data;

use std::time::Duration;

use common::{device_time, fill, time};
use criterion::{Criterion, Throughput};
use kernels::decode::{DecodeKernel, DecodeWorkspace, decode_attention_on};
use kernels::paged::{AttentionInputs, CacheShape, DevicePageTable, Fp8Cache, HostPageTable};
use kernels::prefill::{PrefillKernel, PrefillQueries, prefill_attention_on};
use kernels::sampling::{SampleParams, SampleShape, launch_shape, rows_at_once, sample};
use kernels::{CudaSlice, Gpu, bf16};

const HQ: usize = 16;
const HKV: usize = 8;
const D: usize = 128;

struct Setup {
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    q: CudaSlice<bf16>,
    table: DevicePageTable,
    shape: CacheShape,
}

/// `seqs` sequences of `len` tokens each on pages of `page_size`, with `q_rows` query rows.
fn setup(gpu: &Gpu, seqs: usize, len: usize, page_size: usize, q_rows: usize) -> Setup {
    setup_lens(gpu, &vec![len; seqs], page_size, q_rows)
}

/// One sequence per entry of `lens`, on consecutive pages of `page_size`.
fn setup_lens(gpu: &Gpu, lens: &[usize], page_size: usize, q_rows: usize) -> Setup {
    let num_pages = lens.iter().map(|l| l.div_ceil(page_size)).sum();
    let shape = CacheShape {
        num_pages,
        num_kv_heads: HKV,
        page_size,
        head_dim: D,
    };
    let mut table = HostPageTable::new(page_size);
    let mut first = 0;
    for &len in lens {
        let pages = len.div_ceil(page_size);
        table.push_seq((0..pages).map(|p| {
            let n = page_size.min(len - p * page_size);
            ((first + p) as u32, n)
        }));
        first += pages;
    }
    Setup {
        k: gpu.upload(&fill(shape.elements(), 1)).unwrap(),
        v: gpu.upload(&fill(shape.elements(), 2)).unwrap(),
        q: gpu.upload(&fill(q_rows * HQ * D, 3)).unwrap(),
        table: table.upload(gpu).unwrap(),
        shape,
    }
}

impl Setup {
    fn inputs(&self) -> AttentionInputs<'_> {
        AttentionInputs {
            q: self.q.as_view(),
            k_cache: self.k.as_view(),
            v_cache: self.v.as_view(),
            cache: self.shape,
            table: self.table.view(),
            num_q_heads: HQ,
            sm_scale: 1.0 / (D as f32).sqrt(),
        }
    }
}

/// What decode attention is measured against: a kernel that only reads a 4 GiB buffer in 16-byte
/// loads (4 in flight per thread, through the same read-only path as the decode kernel) and
/// keeps an xor of it, so each byte crosses from memory once. Returns bytes per second.
fn read_ceiling(gpu: &Gpu) -> f64 {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    const SRC: &str = r#"
extern "C" __global__ void read_all(const uint4* __restrict__ p, unsigned long long n,
                                    unsigned* __restrict__ sink) {
    unsigned x = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const unsigned long long j = i + k * stride;
            v[k] = make_uint4(0, 0, 0, 0);
            if (j < n)
                asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                    : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(p + j));
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) x ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (x == 0x9e3779b9u) *sink = x;
}
"#;
    let compiler = kernels::Compiler::from_env().unwrap();
    let cubin = compiler
        .compile("read_ceiling.cu", SRC, gpu.arch())
        .unwrap();
    let module = gpu
        .context()
        .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
        .unwrap();
    let f = module.load_function("read_all").unwrap();
    let bytes = 4usize << 30;
    let buf = gpu.zeros::<u8>(bytes).unwrap();
    let mut sink = gpu.zeros::<u32>(1).unwrap();
    let n = (bytes / 16) as u64;
    let config = LaunchConfig {
        grid_dim: (gpu.num_sms() as u32 * 8, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let secs = time(gpu, &mut || {
        let mut launch = gpu.stream().launch_builder(&f);
        launch.arg(&buf).arg(&n).arg(&mut sink);
        unsafe { launch.launch(config) }.unwrap();
    });
    bytes as f64 / secs
}

/// Runs `run` under criterion in `group` (its report, with `throughput`), then times it for the
/// summary table; seconds per call.
fn criterion_then_time(
    c: &mut Criterion,
    gpu: &Gpu,
    group: &str,
    name: &str,
    throughput: Throughput,
    run: &mut impl FnMut(),
) -> f64 {
    let mut group = c.benchmark_group(group);
    group.throughput(throughput);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| device_time(gpu, iters, run))
    });
    group.finish();
    gpu.synchronize().unwrap();
    time(gpu, run)
}

fn main() {
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("attention bench skipped: {e}");
            return;
        }
    };
    gpu.preload().unwrap();
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10);
    let mut summary = Vec::new();
    summary.push(format!(
        "{:<40} {:>9} {:>11.0} GB/s",
        "read ceiling (4 GiB, 16-byte loads)",
        "",
        read_ceiling(&gpu) / 1e9
    ));

    // Decode: batch x context chosen so K/V (268 MB) is far larger than L2. Every kernel the
    // device has; the one the engine runs is the line without a tag.
    let mut ws = DecodeWorkspace::new(&gpu, D).unwrap();
    let decode_kernels = |fp8: bool| -> Vec<(DecodeKernel, &str)> {
        [
            (DecodeKernel::Loads, " loads"),
            (DecodeKernel::BulkCopies, " bulk"),
        ]
        .into_iter()
        .filter(|(k, _)| k.runs_on(&gpu, D))
        .map(|(k, tag)| {
            (
                k,
                if k == DecodeKernel::best(&gpu, D, HQ / HKV, fp8) {
                    ""
                } else {
                    tag
                },
            )
        })
        .collect()
    };
    for (batch, len, page) in [(64, 1024, 16), (64, 1024, 256), (2, 32768, 16)] {
        let s = setup(&gpu, batch, len, page, batch);
        let mut out = gpu.zeros::<bf16>(batch * HQ * D).unwrap();
        let bytes = (2 * batch * len * HKV * D * 2) as u64;
        for (kernel, tag) in decode_kernels(false) {
            let name = format!("decode b{batch} ctx{len} page{page}{tag}");
            let mut run =
                || decode_attention_on(kernel, &gpu, &s.inputs(), &mut ws, &mut out, None).unwrap();
            let secs = criterion_then_time(
                &mut c,
                &gpu,
                "decode",
                &name,
                Throughput::Bytes(bytes),
                &mut run,
            );
            summary.push(format!(
                "{name:<40} {:>9.1} us {:>8.0} GB/s",
                secs * 1e6,
                bytes as f64 / secs / 1e9
            ));
        }
    }

    // Decode over serving batches: 1 to 256 sequences of 100..=2047 tokens (a continuous batch
    // of nano-vllm's workload), pages of 256. Lengths differ by 20x: the kernel shares the KV out
    // evenly among its blocks whatever they are.
    let all_lens: Vec<usize> = (0..256u64)
        .map(|i| 100 + (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % 1948)
        .collect();
    for batch in [1, 16, 32, 64, 128, 256] {
        let lens = &all_lens[..batch];
        let s = setup_lens(&gpu, lens, 256, batch);
        let bytes = (2 * lens.iter().sum::<usize>() * HKV * D * 2) as u64;
        let mut out = gpu.zeros::<bf16>(batch * HQ * D).unwrap();
        for (kernel, tag) in decode_kernels(false) {
            let secs = time(&gpu, &mut || {
                decode_attention_on(kernel, &gpu, &s.inputs(), &mut ws, &mut out, None).unwrap()
            });
            summary.push(format!(
                "{:<40} {:>9.1} us {:>8.0} GB/s",
                format!("decode b{batch} ctx100-2047 page256{tag}"),
                secs * 1e6,
                bytes as f64 / secs / 1e9
            ));
        }
    }

    // Decode over an FP8 cache (one byte an element, read as code * scale): GB/s of the bytes
    // read, which are half of bf16's for the same tokens.
    for (name, lens, page) in [
        ("decode fp8 b64 ctx1024 page16", vec![1024; 64], 16),
        ("decode fp8 b64 ctx1024 page256", vec![1024; 64], 256),
        ("decode fp8 b2 ctx32768 page16", vec![32768; 2], 16),
        (
            "decode fp8 b16 ctx100-2047 page256",
            all_lens[..16].to_vec(),
            256,
        ),
        (
            "decode fp8 b64 ctx100-2047 page256",
            all_lens[..64].to_vec(),
            256,
        ),
        ("decode fp8 b256 ctx100-2047 page256", all_lens.clone(), 256),
    ] {
        let s = setup_lens(&gpu, &lens, page, lens.len());
        // Codes of small magnitudes (bit 6 clear: never the NaN code 0x7f or 0xff).
        let codes: Vec<u8> = (0..s.shape.elements()).map(|i| (i as u8) & 0xb7).collect();
        let (k, v) = (gpu.upload(&codes).unwrap(), gpu.upload(&codes).unwrap());
        let inputs = || AttentionInputs {
            k_cache: Fp8Cache {
                codes: k.as_view(),
                scale: 0.5,
            },
            v_cache: Fp8Cache {
                codes: v.as_view(),
                scale: 0.5,
            },
            q: s.q.as_view(),
            cache: s.shape,
            table: s.table.view(),
            num_q_heads: HQ,
            sm_scale: 1.0 / (D as f32).sqrt(),
        };
        let bytes = (2 * lens.iter().sum::<usize>() * HKV * D) as u64;
        let mut out = gpu.zeros::<bf16>(lens.len() * HQ * D).unwrap();
        for (kernel, tag) in decode_kernels(true) {
            let secs = time(&gpu, &mut || {
                decode_attention_on(kernel, &gpu, &inputs(), &mut ws, &mut out, None).unwrap()
            });
            summary.push(format!(
                "{:<40} {:>9.1} us {:>8.0} GB/s",
                format!("{name}{tag}"),
                secs * 1e6,
                bytes as f64 / secs / 1e9
            ));
        }
    }

    // Prefill: causal, whole prompts, FLOPs of the unmasked half (QK^T and PV, 2 flops a MAC),
    // on each kernel the device has.
    for (seqs, len, page) in [(1, 4096, 16), (4, 2048, 256), (16, 512, 16)] {
        let s = setup(&gpu, seqs, len, page, seqs * len);
        let indptr: Vec<i32> = (0..=seqs).map(|i| (i * len) as i32).collect();
        let indptr = gpu.upload(&indptr).unwrap();
        let mut out = gpu.zeros::<bf16>(seqs * len * HQ * D).unwrap();
        let flops = 4.0 * (seqs * HQ * D) as f64 * (len * (len + 1) / 2) as f64;
        for kernel in [
            PrefillKernel::Mma,
            PrefillKernel::Wgmma,
            PrefillKernel::WgmmaWarpSpecialized,
        ] {
            if !kernel.runs(&gpu, &s.inputs()) {
                continue;
            }
            let tag = match kernel {
                PrefillKernel::Mma => "mma",
                PrefillKernel::Wgmma => "wgmma",
                PrefillKernel::WgmmaWarpSpecialized => "wgmma-ws",
            };
            let name = format!("prefill {seqs}x{len} page{page} {tag}");
            let mut run = || {
                let queries = PrefillQueries {
                    indptr: indptr.as_view(),
                    max_len: len,
                };
                prefill_attention_on(&gpu, kernel, &s.inputs(), &queries, true, &mut out, None)
                    .unwrap()
            };
            let throughput = Throughput::Elements(flops as u64);
            let secs = criterion_then_time(&mut c, &gpu, "prefill", &name, throughput, &mut run);
            summary.push(format!(
                "{name:<40} {:>9.1} us {:>8.1} TFLOP/s",
                secs * 1e6,
                flops / secs / 1e12
            ));
        }
    }
    // Sampling is not attention, but it ends every step: 64 rows of a Qwen3-sized vocabulary.
    // Which path the kernel takes depends on how the logits spread, so each case runs on four
    // kinds, named at the end of the line as tools/peer_kernels.py names FlashInfer's: "fill*8",
    // a few thousand bf16 values of magnitude 2^-4..8 spread evenly over 128 of the histogram's
    // bins; "flat", normal logits (top-p 0.9 keeps about 40% of the vocabulary); "peaked",
    // normal logits times 8 (a few logits hold the mass); and "tiny model", real logits of the
    // embedded tiny Shakespeare model (the 9 prompts of its reference fixture, repeated to 64
    // rows of its 2,048-token vocabulary).
    let rows = 64;
    let mut rng = test_data::Rng::new(4);
    let fill8: Vec<f32> = fill(rows * 151_936, 4)
        .iter()
        .map(|x| x.to_f32() * 8.0)
        .collect();
    let fixture = phase2::models_dir().join("fixtures/tiny-shakespeare.json");
    let model_rows = phase2::Fixture::read(&fixture).unwrap().cases;
    let model: Vec<f32> = (0..rows)
        .flat_map(|r| model_rows[r % model_rows.len()].logits.iter().copied())
        .collect();
    let mut out = gpu.zeros::<u32>(rows).unwrap();
    for &shape in SampleShape::available(gpu.arch()) {
        summary.push(format!(
            "sample: {} x {} threads a row: {} rows of f32 logits at once",
            shape.blocks,
            shape.threads,
            rows_at_once::<f32>(&gpu, shape).unwrap()
        ));
    }
    let shape = launch_shape::<f32>(&gpu, rows).unwrap();
    summary.push(format!(
        "sample: {rows} rows run as {} x {} threads a row",
        shape.blocks, shape.threads
    ));
    for (kind, logits) in [
        ("fill*8", fill8),
        ("flat", rng.normals(rows * 151_936, 1.0)),
        ("peaked", rng.normals(rows * 151_936, 8.0)),
        ("tiny model", model),
    ] {
        let vocab = logits.len() / rows;
        let logits = gpu.upload(&logits).unwrap();
        for (what, params) in [
            ("greedy", SampleParams::greedy()),
            ("T 0.7", SampleParams::new(0.7, -1, 1.0, 1, 0)),
            ("T 0.7 top-k 50", SampleParams::new(0.7, 50, 1.0, 1, 0)),
            ("T 0.7 top-p 0.9", SampleParams::new(0.7, -1, 0.9, 1, 0)),
            (
                "T 0.7 top-k 50 top-p 0.9",
                SampleParams::new(0.7, 50, 0.9, 1, 0),
            ),
        ] {
            let params = gpu.upload(&vec![params; rows]).unwrap();
            let secs = time(&gpu, &mut || {
                sample(&gpu, &logits, &params, &mut out, rows, vocab).unwrap()
            });
            summary.push(format!(
                "{:<40} {:>9.1} us",
                format!("sample {rows}x{vocab} {what} {kind}"),
                secs * 1e6
            ));
        }
    }
    c.final_summary();
    println!("\nattention on {} ({}):", gpu.name().unwrap(), gpu.arch());
    for line in summary {
        println!("  {line}");
    }
}
