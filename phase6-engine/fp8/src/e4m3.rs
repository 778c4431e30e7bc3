//! Chapter 6.6: the FP8 E4M3 number format, one byte per K/V element.
//!
//! The "fn" variant of the OCP 8-bit float spec, the one NVIDIA's `__nv_fp8_e4m3` and vLLM's
//! `fp8_e4m3` cache use: a sign bit, 4 exponent bits (bias 7) and 3 mantissa bits. It has no
//! infinities: of the exponent-15 codes only `S.1111.111` (0x7f, 0xff) is NaN, so the largest
//! finite value is 1.75 x 2^8 = 448. Exponent 0 holds the subnormals m x 2^-9, down to 2^-9.
//! Every value has 3 bits of mantissa, so a normal value is off by at most 1/16 of itself once
//! rounded (6.25 %, half a step of 1/8).
//!
//! These functions are the definition of the format for the whole workspace: the CUDA store
//! kernel must give the same byte for the same `f32` (round to nearest, ties to even, saturating
//! like `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`).

/// The largest finite value.
pub const MAX: f32 = 448.0;

/// The code of NaN (any NaN encodes to it; 0xff decodes to NaN too).
pub const NAN: u8 = 0x7f;

/// The nearest E4M3 value to `x`, ties to the even code; beyond +-448 (infinities included)
/// the largest finite value of the same sign. NaN stays NaN.
pub fn encode(x: f32) -> u8 {
    // BEGIN SOLUTION
    if x.is_nan() {
        return NAN;
    }
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a >= MAX {
        return sign | 0x7e;
    }
    // Below the smallest normal value (2^-6) the step is fixed at 2^-9: count the steps.
    // Multiplying by 2^9 is exact, and 8 steps is the code of 2^-6 itself.
    if a < 1.0 / 64.0 {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // A normal value: keep the f32's exponent and the top 3 of its 23 mantissa bits, rounding
    // the 20 dropped bits to nearest, ties to even. A carry out of the mantissa moves the
    // exponent up, which is the right answer (1.1111 rounds to 10.000).
    let bits = a.to_bits();
    let dropped = 20;
    let odd = (bits >> dropped) & 1;
    let rounded = (bits + (1 << (dropped - 1)) - 1 + odd) >> dropped;
    // `rounded` is the f32's (exponent << 3 | mantissa); the exponent's bias goes 127 -> 7.
    sign | (rounded - ((127 - 7) << 3)) as u8
    // END SOLUTION
}

/// The value of an E4M3 code (NaN for 0x7f and 0xff). Every code is exactly an `f32`.
pub fn decode(code: u8) -> f32 {
    if code & 0x7f == NAN {
        return f32::NAN;
    }
    let sign = u32::from(code & 0x80) << 24;
    let exponent = u32::from((code >> 3) & 0x0f);
    let mantissa = u32::from(code & 0x07);
    if exponent == 0 {
        // m x 2^-9, exact: a 3-bit integer times a power of two.
        let magnitude = mantissa as f32 / 512.0;
        return f32::from_bits(sign | magnitude.to_bits());
    }
    f32::from_bits(sign | (exponent + 127 - 7) << 23 | mantissa << 20)
}
