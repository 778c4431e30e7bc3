//! What one scheduling decision costs with 1,000 prompts waiting and 256 decoding: the
//! scheduler runs on the host between GPU steps, so it must stay far below a step's time.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use phase0::{Request, SamplingParams, Sequence};
use phase1::KvPool;
use phase2::SeqState;
use phase3::{ChunkedPrefillConfig, ChunkedScheduler};
use std::hint::black_box;

fn loaded_scheduler() -> ChunkedScheduler {
    let config = ChunkedPrefillConfig {
        max_num_batched_tokens: 16384,
        max_num_seqs: 512,
        chunk_size: 512,
    };
    let mut s = ChunkedScheduler::new(KvPool::new(64 * 1024, 16).unwrap(), config, vec![]);
    let params = SamplingParams::greedy().with_max_tokens(1 << 20);
    for id in 0..1256u64 {
        let len = 100 + (id as usize * 37) % 900;
        let seq = Sequence::new(Request::new(id, vec![1; len], params.clone())).unwrap();
        s.add(SeqState::new(seq, id));
    }
    // Run steps (without a model) until 256 sequences decode and the rest wait.
    while s.decode.num_running() < 256 {
        let step = s.schedule().unwrap();
        let n = step.forward.num_sampled();
        s.complete(step, &vec![0; n]);
    }
    s
}

fn schedule_step(c: &mut Criterion) {
    let base = loaded_scheduler();
    let waiting = base.prefill.num_waiting();
    let running = base.decode.num_running();
    let mut group = c.benchmark_group("chunked scheduler");
    group.sample_size(20);
    group.bench_function(
        format!("schedule+complete, {waiting} waiting, {running} decoding"),
        |b| {
            b.iter_batched(
                loaded_scheduler,
                |mut s| {
                    let step = s.schedule().unwrap();
                    let n = step.forward.num_sampled();
                    black_box(s.complete(step, &vec![0; n]));
                    s
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.finish();
}

criterion_group!(benches, schedule_step);
criterion_main!(benches);
