//! Chapter 0's benchmark: what the request bookkeeping costs per token. `append_token` and its
//! stop rules run once for every token every sequence produces: nothing next to a model step.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use phase0::{Request, SamplingParams, Sequence};
use std::hint::black_box;

fn append_token(c: &mut Criterion) {
    let mut group = c.benchmark_group("sequence");
    let n = 1024;
    let eos = [0];
    let params = SamplingParams::default()
        .with_max_tokens(n)
        .with_stop_token_ids((1..=8).collect());
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function("append_token x 1024 (EOS, 8 stop ids, max_tokens)", |b| {
        b.iter(|| {
            let mut seq = Sequence::new(Request::new(1, vec![5; 128], params.clone())).unwrap();
            seq.start().unwrap();
            for i in 0..n as u32 {
                black_box(seq.append_token(100 + i % 1000, &eos).unwrap());
            }
            seq
        })
    });
    group.throughput(Throughput::Elements(1));
    group.bench_function("validate", |b| b.iter(|| black_box(&params).validate()));
    group.finish();
}

criterion_group!(benches, append_token);
criterion_main!(benches);
