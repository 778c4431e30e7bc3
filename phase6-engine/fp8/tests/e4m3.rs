//! The E4M3 codec against its definition: every code round-trips, encoding is the nearest
//! value with ties to even (checked by searching all 256 codes), monotone, saturating at 448,
//! and rounding through a scale twice is rounding once.

use phase6_fp8::e4m3::{MAX, NAN, decode, encode};
use phase6_fp8::scales::{KvScales, through_fp8};
use proptest::prelude::*;

mod common;

/// The code a correct encoder gives: beyond 448 the largest finite value, else the nearest.
fn nearest(x: f32) -> u8 {
    common::nearest(x.clamp(-MAX, MAX), decode)
}

#[test]
fn every_code_decodes_and_encodes_back_except_nan() {
    for code in 0..=255u8 {
        let v = decode(code);
        if code & 0x7f == NAN {
            assert!(v.is_nan(), "{code:#04x}");
        } else {
            assert_eq!(encode(v), code, "{v} (code {code:#04x})");
        }
    }
}

#[test]
fn the_format_spans_2_to_the_minus_9_to_448() {
    assert_eq!(decode(0x7e), 448.0);
    assert_eq!(decode(0x01), 2f32.powi(-9));
    assert_eq!(decode(0x08), 2f32.powi(-6));
    assert_eq!(decode(0x38), 1.0);
    assert_eq!(decode(0xb8), -1.0);
    let positive: Vec<f32> = (0..0x7f).map(decode).collect();
    assert!(
        positive.windows(2).all(|w| w[0] < w[1]),
        "codes 0..0x7f ascend"
    );
}

#[test]
fn out_of_range_saturates_and_nan_stays_nan() {
    assert_eq!(encode(448.0), 0x7e);
    assert_eq!(encode(463.9), 0x7e);
    assert_eq!(encode(1e6), 0x7e);
    assert_eq!(encode(f32::INFINITY), 0x7e);
    assert_eq!(encode(f32::NEG_INFINITY), 0xfe);
    assert_eq!(encode(-500.0), 0xfe);
    assert_eq!(encode(f32::NAN), NAN);
    assert!(decode(encode(-f32::NAN)).is_nan());
    assert_eq!(encode(-0.0), 0x80);
    assert_eq!(
        encode(2f32.powi(-11)),
        0x00,
        "half the smallest subnormal ties to zero"
    );
    assert_eq!(encode(-1e-30), 0x80);
}

#[test]
fn calibrated_scales_map_the_largest_magnitude_to_448() {
    let s = KvScales::from_amax(896.0, 0.0);
    assert_eq!(s.k_scale, 2.0);
    assert_eq!(s.v_scale, 1.0, "nothing seen keeps 1.0");
    assert_eq!(through_fp8(896.0, s.k_scale), 896.0);
    assert_eq!(through_fp8(-1000.0, s.k_scale), -896.0);
}

proptest! {
    #[test]
    fn encode_is_the_nearest_value_ties_to_even(x in -500.0f32..500.0) {
        prop_assert_eq!(encode(x), nearest(x), "x = {}", x);
    }

    #[test]
    fn small_values_round_to_the_nearest_subnormal(x in -0.05f32..0.05) {
        prop_assert_eq!(encode(x), nearest(x), "x = {}", x);
    }

    #[test]
    fn midpoints_go_to_the_even_code(code in 0u8..0x7e) {
        let mid = (decode(code) + decode(code + 1)) / 2.0;
        let even = if code % 2 == 0 { code } else { code + 1 };
        prop_assert_eq!(encode(mid), even);
        prop_assert_eq!(encode(-mid), even | 0x80);
    }

    #[test]
    fn encode_is_monotone(a in -600.0f32..600.0, b in -600.0f32..600.0) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(decode(encode(lo)) <= decode(encode(hi)));
    }

    #[test]
    fn a_normal_value_moves_at_most_a_sixteenth(x in 0.015625f32..448.0) {
        let r = decode(encode(x));
        prop_assert!((r - x).abs() <= x / 16.0, "{} -> {}", x, r);
    }

    #[test]
    fn rounding_through_a_scale_twice_is_rounding_once(x in -1e4f32..1e4, scale in 1e-3f32..30.0) {
        let once = through_fp8(x, scale);
        prop_assert_eq!(through_fp8(once, scale), once);
    }
}
