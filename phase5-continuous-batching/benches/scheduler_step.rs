//! Host time of one scheduling decision with 256 and 1,024 sequences decoding. On a GPU a
//! decode step takes a few milliseconds; the scheduler must stay far below that, or it, not
//! the GPU, sets the pace (target: well under 100 µs at 256).

use criterion::{Criterion, criterion_group, criterion_main};
use phase0::SamplingParams;
use phase1::KvPool;
use phase2::SeqState;
use phase5::{Scheduler, SchedulerConfig};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Steps timed on one scheduler before it is rebuilt: every sequence keeps room to grow.
const STEPS_PER_SETUP: u64 = 500;

fn decoding_scheduler(n: usize) -> Scheduler {
    let config = SchedulerConfig {
        max_num_seqs: n,
        max_model_len: 1 << 20,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(KvPool::new(n * 8, 256).unwrap(), config, vec![]);
    let params = SamplingParams::greedy().with_max_tokens(1 << 20);
    for id in 0..n as u64 {
        let prompt = vec![1; 300 + (id as usize * 37) % 700];
        let seq = phase0::Sequence::new(phase0::Request::new(id, prompt, params.clone())).unwrap();
        s.add(SeqState::new(seq, id));
    }
    while s.num_waiting() > 0 || s.num_running() < n {
        let step = s.schedule().unwrap();
        let k = step.forward.num_sampled();
        s.complete(step, &vec![0; k]);
    }
    s
}

fn step(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduler step (decode only, no model)");
    for n in [256, 1024] {
        let tokens = vec![7; n];
        group.bench_function(format!("{n} running"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let mut s = decoding_scheduler(n);
                    let steps = STEPS_PER_SETUP.min(iters - done);
                    let start = Instant::now();
                    for _ in 0..steps {
                        let step = s.schedule().unwrap();
                        assert_eq!(step.forward.seqs.len(), n);
                        black_box(s.complete(step, &tokens));
                    }
                    total += start.elapsed();
                    done += steps;
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
