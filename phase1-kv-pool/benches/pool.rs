//! How fast the bookkeeping is: it runs for every page of every sequence of every step, so it
//! must cost nothing next to the model.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use phase1::{BlockTable, KvPool};
use std::hint::black_box;

fn allocate_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    let n = 4096;
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function("allocate+free 4096 pages", |b| {
        let mut pool = KvPool::new(n, 16).unwrap();
        let mut pages = Vec::with_capacity(n);
        b.iter(|| {
            for _ in 0..n {
                pages.push(pool.allocate().unwrap());
            }
            for p in pages.drain(..) {
                pool.free(black_box(p)).unwrap();
            }
        })
    });
    let tokens = 16 * 1024;
    group.throughput(Throughput::Elements(tokens as u64));
    group.bench_function("append_slot 16k tokens (page 16)", |b| {
        let mut pool = KvPool::new(1024, 16).unwrap();
        b.iter(|| {
            let mut table = BlockTable::new();
            for _ in 0..tokens {
                black_box(table.append_slot(&mut pool).unwrap());
            }
            table.release(&mut pool).unwrap();
        })
    });
    group.finish();
}

criterion_group!(benches, allocate_free);
criterion_main!(benches);
