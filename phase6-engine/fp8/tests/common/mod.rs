//! What the codec tests share: the reference an 8-bit float encoder is checked against.

/// The code a correct encoder gives for `x`, found by searching all 256 codes as `decode`
/// reads them: the nearest finite value (of `x`'s sign for a zero), the even code on a tie.
pub fn nearest(x: f32, decode: impl Fn(u8) -> f32) -> u8 {
    let mut best: Option<(f32, u8)> = None;
    for code in 0..=255u8 {
        let v = decode(code);
        if !v.is_finite() || (v == 0.0 && v.is_sign_negative() != x.is_sign_negative()) {
            continue;
        }
        let err = (v - x).abs();
        best = match best {
            Some((e, c)) if e < err || (e == err && c % 2 == 0) => Some((e, c)),
            _ => Some((err, code)),
        };
    }
    best.expect("some code is finite").1
}
