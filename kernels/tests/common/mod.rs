//! Shared by the GPU tests: opening the device (or saying why the test is skipped), a seeded
//! random source, bf16 conversions, poisoned outputs and the relative-error check.
#![allow(dead_code)]

use kernels::{Error, Gpu, bf16};

/// The GPU, or `None` after printing why the calling test is skipped. Any other failure to
/// open (a missing NVRTC or header folder on a machine with a GPU) fails the test.
pub fn gpu() -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(Error::NoDevice(reason)) => {
            skipped(&reason);
            None
        }
        Err(other) => panic!("a GPU is present but cannot be used: {other}"),
    }
}

/// Says why a test did nothing, on the process's stderr itself: the test harness captures
/// `eprintln!` of passing tests, and a skip must be visible in a plain `cargo test`.
pub fn skipped(reason: &dyn std::fmt::Display) {
    use std::io::Write;
    let name = std::thread::current().name().unwrap_or("test").to_string();
    let line = format!("{name}: skipped: {reason}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// SplitMix64: small, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    pub fn normals(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * scale) as f32).collect()
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// bf16 values as f64, for references computed in double precision.
pub fn wide(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// A quiet-NaN pattern: any element a kernel forgets to write stays NaN.
pub fn poison_bf16(n: usize) -> Vec<bf16> {
    vec![bf16::from_bits(0x7fc1); n]
}

pub fn poison_f32(n: usize) -> Vec<f32> {
    vec![f32::from_bits(0x7fc0_0001); n]
}

/// ||out - ref|| / ||ref||, after checking that every element is finite (was written).
pub fn rel_err(what: &str, out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "{what}: length");
    if let Some(i) = out.iter().position(|x| !x.is_finite()) {
        panic!("{what}: element {i} is {} (not written?)", out[i]);
    }
    let (mut num, mut den) = (0.0, 0.0);
    for (o, r) in out.iter().zip(reference) {
        num += (o - r) * (o - r);
        den += r * r;
    }
    (num / den.max(1e-300)).sqrt()
}

pub fn assert_close(what: &str, out: &[f64], reference: &[f64], tol: f64) {
    let err = rel_err(what, out, reference);
    eprintln!("{what}: relative error {err:.2e}");
    assert!(err <= tol, "{what}: relative error {err:.3e} > {tol:.0e}");
}

/// bf16 outputs: rounding alone gives ~3e-3.
pub const BF16_TOL: f64 = 1e-2;

pub fn round_bf16(x: f64) -> f64 {
    bf16::from_f64(x).to_f64()
}
