//! Exercise 6.6.1: encode an `f32` as FP8 E5M2, vLLM's `fp8_e5m2`.
//!
//! E5M2 trades a mantissa bit of E4M3 for an exponent bit: 5 exponent bits (bias 15) and 2
//! mantissa bits, so it spans 2^-16 to 57,344 but rounds twice as coarsely. It is exactly the
//! top byte of an IEEE half (`f16`), infinities (0x7c, 0xfc) and NaNs (0x7d..=0x7f) included.
//! Write the encoder the way `e4m3::encode` is written: the nearest value, ties to the even
//! code, saturating beyond the largest finite value (+-57,344, code 0x7b) as a cache does, and
//! any NaN to 0x7f.

/// The E5M2 code of the value nearest `x`.
pub fn encode_e5m2(x: f32) -> u8 {
    if !cfg!(feature = "solutions") {
        todo!("exercise 6.6.1: the E5M2 code nearest `x`, ties to even, saturating at +-57344");
    }
    // BEGIN SOLUTION
    if x.is_nan() {
        return 0x7f;
    }
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a >= 57344.0 {
        return sign | 0x7b;
    }
    // Subnormals step by 2^-16; 4 steps is 2^-14, the smallest normal value's code.
    if a < 1.0 / 16384.0 {
        return sign | (a * 65536.0).round_ties_even() as u8;
    }
    let bits = a.to_bits();
    let dropped = 21;
    let odd = (bits >> dropped) & 1;
    let rounded = (bits + (1 << (dropped - 1)) - 1 + odd) >> dropped;
    sign | (rounded - ((127 - 15) << 2)) as u8
    // END SOLUTION
}
