//! A captured graph replays its launches (a cuBLAS GEMM included) on whatever its fixed input
//! buffers hold at replay time.

mod common;

use common::*;
use kernels::{graph, linear};

#[test]
fn replayed_gemm_and_bias_follow_the_rewritten_input() {
    let Some(mut gpu) = gpu() else { return };
    gpu.fix_blas_workspace(32 << 20).unwrap();
    let mut rng = Rng::new(31);
    let (tokens, hidden, out) = (8, 128, 64);
    let w = gpu
        .upload(&to_bf16(&rng.normals(out * hidden, 0.1)))
        .unwrap();
    let bias = gpu.upload(&to_bf16(&rng.normals(out, 1.0))).unwrap();
    let mut x = gpu
        .upload(&to_bf16(&rng.normals(tokens * hidden, 1.0)))
        .unwrap();
    let mut y = gpu.upload(&poison_bf16(tokens * out)).unwrap();
    gpu.preload().unwrap();

    let step = graph::capture(&gpu, || {
        linear::linear(&gpu, &x, &w, &mut y, tokens, out, hidden)?;
        linear::add_bias(&gpu, &mut y, &bias, tokens, out)
    })
    .unwrap();
    for round in 0..3 {
        let input = to_bf16(&rng.normals(tokens * hidden, 1.0));
        let mut pinned = gpu.pinned::<kernels::bf16>(input.len()).unwrap();
        pinned.as_mut_slice().unwrap().copy_from_slice(&input);
        gpu.copy_to_device(pinned.as_slice().unwrap(), &mut x)
            .unwrap();
        step.launch().unwrap();
        let replayed = gpu.download(&y).unwrap();

        let mut eager = gpu.upload(&poison_bf16(tokens * out)).unwrap();
        linear::linear(&gpu, &x, &w, &mut eager, tokens, out, hidden).unwrap();
        linear::add_bias(&gpu, &mut eager, &bias, tokens, out).unwrap();
        let eager = gpu.download(&eager).unwrap();
        assert_eq!(
            replayed, eager,
            "round {round}: replay equals eager launches"
        );
    }
}
