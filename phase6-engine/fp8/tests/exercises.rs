//! The chapter 6.6 exercise (`src/exercises/`):
//! `cargo test -p phase6-fp8 --features exercises --test exercises`.

mod common;

mod e5m2 {
    use half::f16;
    use phase6_fp8::exercises::e5m2::encode_e5m2;
    use proptest::prelude::*;

    /// An E5M2 code is the top byte of an f16.
    fn decode(code: u8) -> f32 {
        f16::from_bits(u16::from(code) << 8).to_f32()
    }

    fn nearest(x: f32) -> u8 {
        crate::common::nearest(x, decode)
    }

    #[test]
    fn every_finite_code_encodes_to_itself() {
        for code in 0..=255u8 {
            let v = decode(code);
            if v.is_finite() {
                assert_eq!(encode_e5m2(v), code, "{v} (code {code:#04x})");
            }
        }
    }

    #[test]
    fn out_of_range_saturates_and_nan_stays_nan() {
        assert_eq!(encode_e5m2(1e9), 0x7b);
        assert_eq!(encode_e5m2(f32::NEG_INFINITY), 0xfb);
        assert_eq!(decode(encode_e5m2(60000.0)), 57344.0);
        assert_eq!(encode_e5m2(f32::NAN), 0x7f);
    }

    proptest! {
        #[test]
        fn the_nearest_value_ties_to_even(x in -60000.0f32..60000.0) {
            prop_assert_eq!(encode_e5m2(x), nearest(x), "x = {}", x);
        }

        #[test]
        fn small_values_round_to_the_nearest_subnormal(x in -1e-3f32..1e-3) {
            prop_assert_eq!(encode_e5m2(x), nearest(x), "x = {}", x);
        }

        #[test]
        fn midpoints_go_to_the_even_code(code in 0u8..0x7b) {
            let mid = (decode(code) + decode(code + 1)) / 2.0;
            let even = if code % 2 == 0 { code } else { code + 1 };
            prop_assert_eq!(encode_e5m2(mid), even);
        }
    }
}
