//! Shared by the kernel benches: test data and device timing with CUDA events.
#![allow(dead_code)]

use std::time::Duration;

use kernels::{Gpu, bf16};

/// Random-looking bf16 of magnitude 2^-7..2 without the cost of a normal generator.
pub fn fill(n: usize, seed: u64) -> Vec<bf16> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bf16::from_bits(0x3c00 | (x as u16 & 0x83ff))
        })
        .collect()
}

/// Device time of `iters` calls of `f`, between two CUDA events.
pub fn device_time(gpu: &Gpu, iters: u64, f: &mut impl FnMut()) -> Duration {
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu.stream().record_event(timing).unwrap();
    for _ in 0..iters {
        f();
    }
    let end = gpu.stream().record_event(timing).unwrap();
    end.synchronize().unwrap();
    Duration::from_secs_f64(start.elapsed_ms(&end).unwrap() as f64 / 1e3)
}

/// Median seconds per call of `f` over 15 batches of 10 calls, after a warm-up call.
pub fn time(gpu: &Gpu, f: &mut impl FnMut()) -> f64 {
    f();
    gpu.synchronize().unwrap();
    let mut samples: Vec<f64> = (0..15)
        .map(|_| device_time(gpu, 10, f).as_secs_f64() / 10.0)
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
