//! Radix tree operations per second with 10,000 cached sequences: a lookup happens for every
//! admitted request, so it must be cheap next to even a short prefill.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use phase0::TokenId;
use phase1::KvPool;
use phase4::RadixTree;
use std::hint::black_box;

const PAGE: usize = 16;

/// 10,000 sequences of 256 tokens: 100 system prompts of 128 tokens, each followed by 100
/// different 128-token continuations.
fn sequence(i: usize) -> Vec<TokenId> {
    let system = (i % 100) as u32;
    let mut t: Vec<TokenId> = (0..128).map(|j| system * 1000 + j).collect();
    t.extend((0..128).map(|j| 1_000_000 + (i as u32) * 131 + j));
    t
}

fn filled_tree(pool: &mut KvPool) -> RadixTree {
    let mut tree = RadixTree::new(PAGE);
    for i in 0..10_000 {
        let t = sequence(i);
        let pages = pool.allocate_many(t.len() / PAGE).unwrap();
        tree.insert(pool, &t, &pages).unwrap();
        pool.free_all(&pages).unwrap();
    }
    tree
}

fn radix(c: &mut Criterion) {
    let mut pool = KvPool::new(200_000, PAGE).unwrap();
    let mut tree = filled_tree(&mut pool);
    let mut group = c.benchmark_group("radix tree, 10k cached sequences");
    group.throughput(Throughput::Elements(1));
    let queries: Vec<Vec<TokenId>> = (0..1000).map(|i| sequence(i * 7 % 10_000)).collect();
    let mut q = 0;
    group.bench_function("match_prefix (256-token hit)", |b| {
        b.iter(|| {
            q = (q + 1) % queries.len();
            black_box(tree.match_prefix(&queries[q]))
        })
    });
    let mut next = 10_000;
    group.bench_function("insert (new 128-token suffix)", |b| {
        b.iter(|| {
            next += 1;
            let t = sequence(next);
            let pages = pool.allocate_many(t.len() / PAGE).unwrap();
            black_box(tree.insert(&mut pool, &t, &pages).unwrap());
            pool.free_all(&pages).unwrap();
            if pool.num_free() < 1000 {
                tree.evict(&mut pool, 50_000);
            }
        })
    });
    group.finish();
}

criterion_group!(benches, radix);
criterion_main!(benches);
