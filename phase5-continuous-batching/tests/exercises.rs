//! The chapter 5 exercises (`src/exercises/`), one module each:
//! `cargo test -p phase5 --features exercises --test exercises [module]`.
//!
//! Policies are measured on the real engine with the stand-in `HashRunner`: requests arrive at
//! given steps, the policy reorders the waiting queue before every step, and each request's
//! first-token and finish steps are recorded.

use std::collections::HashMap;

use phase0::{Request, SamplingParams, SeqId, Sequence, TokenId};
use phase2::{HashRunner, SeqState};
use phase5::exercises::max_wait::MaxWait;
use phase5::exercises::shortest_job_first::{job_size, shortest_job_first};
use phase5::{Batching, Engine, Scheduler, SchedulerConfig};

const VOCAB: usize = 300;

#[derive(Debug, Clone, Copy)]
struct Job {
    arrival: u64,
    prompt_len: usize,
    max_tokens: usize,
}

fn job(arrival: u64, prompt_len: usize, max_tokens: usize) -> Job {
    Job {
        arrival,
        prompt_len,
        max_tokens,
    }
}

trait Policy {
    fn arrived(&mut self, _id: SeqId, _step: u64) {}
    fn finished(&mut self, _id: SeqId) {}
    fn order(&mut self, scheduler: &mut Scheduler, now: u64);
}

struct Fcfs;
impl Policy for Fcfs {
    fn order(&mut self, _: &mut Scheduler, _: u64) {}
}

struct Sjf;
impl Policy for Sjf {
    fn order(&mut self, scheduler: &mut Scheduler, _: u64) {
        shortest_job_first(scheduler);
    }
}

impl Policy for MaxWait {
    fn arrived(&mut self, id: SeqId, step: u64) {
        MaxWait::arrived(self, id, step);
    }
    fn finished(&mut self, id: SeqId) {
        MaxWait::finished(self, id);
    }
    fn order(&mut self, scheduler: &mut Scheduler, now: u64) {
        MaxWait::order(self, scheduler, now);
    }
}

fn engine(seats: usize) -> Engine<HashRunner> {
    let config = SchedulerConfig {
        max_num_batched_tokens: 4096,
        max_num_seqs: seats,
        chunk_size: None,
        enable_prefix_caching: false,
        batching: Batching::Continuous,
        max_model_len: 4096,
    };
    // No EOS: every request produces exactly `max_tokens` tokens.
    Engine::new(HashRunner::new(1024, 4, VOCAB), config, vec![], 7).unwrap()
}

fn prompt(i: usize, len: usize) -> Vec<TokenId> {
    (0..len)
        .map(|j| 1 + ((j * 7 + i * 13) % 250) as TokenId)
        .collect()
}

/// What happened to each job, by index.
#[derive(Debug)]
struct Served {
    first_token: Vec<u64>,
    finished: Vec<u64>,
    outputs: Vec<Vec<TokenId>>,
}

impl Served {
    /// Mean steps from arrival to the last token.
    fn mean_latency(&self, jobs: &[Job]) -> f64 {
        let total: u64 = jobs
            .iter()
            .zip(&self.finished)
            .map(|(j, f)| f + 1 - j.arrival)
            .sum();
        total as f64 / jobs.len() as f64
    }
}

fn serve(jobs: &[Job], seats: usize, policy: &mut dyn Policy) -> Served {
    let mut engine = engine(seats);
    let mut index: HashMap<SeqId, usize> = HashMap::new();
    let n = jobs.len();
    let (mut first_token, mut finished) = (vec![None; n], vec![None; n]);
    let mut outputs = vec![Vec::new(); n];
    let mut step = 0;
    while finished.iter().any(Option::is_none) {
        for (i, j) in jobs.iter().enumerate().filter(|(_, j)| j.arrival == step) {
            let params = SamplingParams::greedy().with_max_tokens(j.max_tokens);
            let id = engine.add_request(prompt(i, j.prompt_len), params).unwrap();
            index.insert(id, i);
            policy.arrived(id, step);
        }
        if !engine.is_finished() {
            policy.order(engine.scheduler_mut(), step);
            let out = engine.step().unwrap();
            for (id, _) in out.tokens {
                first_token[index[&id]].get_or_insert(step);
            }
            for f in out.finished {
                let i = index[&f.id];
                finished[i] = Some(step);
                outputs[i] = f.output;
                policy.finished(f.id);
            }
        }
        step += 1;
        assert!(step < 10_000, "no progress");
    }
    Served {
        first_token: first_token.into_iter().map(Option::unwrap).collect(),
        finished: finished.into_iter().map(Option::unwrap).collect(),
        outputs,
    }
}

/// Eight requests at once with very different lengths, one seat.
fn mixed() -> Vec<Job> {
    [60, 5, 40, 3, 25, 8, 50, 2]
        .into_iter()
        .map(|max_tokens| job(0, 6, max_tokens))
        .collect()
}

/// A 30-token job arrives while a short one runs; then a 3-token job every 2 steps for 60
/// steps, faster than one seat serves them.
fn stream() -> Vec<Job> {
    let mut jobs = vec![job(0, 4, 3), job(1, 4, 30)];
    jobs.extend((1..=30).map(|k| job(2 * k, 4, 3)));
    jobs
}

fn waiting_ids(engine: &Engine<HashRunner>) -> Vec<SeqId> {
    engine.scheduler().waiting().map(SeqState::id).collect()
}

mod shortest_job_first {
    use super::*;

    #[test]
    fn job_size_counts_what_is_left() {
        let params = SamplingParams::greedy().with_max_tokens(5);
        let seq = Sequence::new(Request::new(1, vec![7; 10], params)).unwrap();
        let mut state = SeqState::new(seq, 0);
        assert_eq!(
            job_size(&state),
            15,
            "10 prompt tokens to compute, 5 to generate"
        );
        state.seq.start().unwrap();
        state.seq.append_token(3, &[]).unwrap();
        state.seq.append_token(4, &[]).unwrap();
        state.num_computed = 11;
        assert_eq!(
            job_size(&state),
            1 + 3,
            "one token to feed, three to generate"
        );
        state.num_computed = 0;
        assert_eq!(
            job_size(&state),
            12 + 3,
            "preempted: everything is recomputed"
        );
    }

    #[test]
    fn the_queue_is_sorted_smallest_first_and_ties_keep_arrival_order() {
        let mut e = engine(1);
        let add = |e: &mut Engine<HashRunner>, len, max| {
            let params = SamplingParams::greedy().with_max_tokens(max);
            e.add_request(prompt(0, len), params).unwrap()
        };
        let ids = [
            add(&mut e, 10, 20),
            add(&mut e, 5, 5),
            add(&mut e, 20, 1),
            add(&mut e, 5, 5),
        ];
        shortest_job_first(e.scheduler_mut());
        assert_eq!(waiting_ids(&e), vec![ids[1], ids[3], ids[2], ids[0]]);
    }

    #[test]
    fn mean_latency_is_far_below_first_come_first_served() {
        let jobs = mixed();
        let fcfs = serve(&jobs, 1, &mut Fcfs);
        let sjf = serve(&jobs, 1, &mut Sjf);
        assert_eq!(
            sjf.outputs, fcfs.outputs,
            "a policy never changes the tokens"
        );
        let (f, s) = (fcfs.mean_latency(&jobs), sjf.mean_latency(&jobs));
        assert!(
            s < 0.6 * f,
            "mean latency in steps: {s:.1} shortest first, {f:.1} FCFS"
        );
    }

    #[test]
    fn a_stream_of_short_jobs_starves_a_long_one() {
        let jobs = stream();
        let fcfs = serve(&jobs, 1, &mut Fcfs);
        let sjf = serve(&jobs, 1, &mut Sjf);
        assert!(
            fcfs.first_token[1] < 10,
            "FCFS starts it at step {}",
            fcfs.first_token[1]
        );
        assert!(
            sjf.first_token[1] > 60,
            "shortest first should hold the long job until the stream ends; it started at step {}",
            sjf.first_token[1]
        );
    }
}

mod max_wait {
    use super::*;

    #[test]
    fn overdue_requests_go_first_oldest_first() {
        let mut e = engine(1);
        let mut policy = MaxWait::new(4);
        let mut add = |e: &mut Engine<HashRunner>, step, max| {
            let params = SamplingParams::greedy().with_max_tokens(max);
            let id = e.add_request(prompt(0, 4), params).unwrap();
            policy.arrived(id, step);
            id
        };
        let long = add(&mut e, 0, 50);
        let longer = add(&mut e, 5, 60);
        let short = add(&mut e, 9, 2);
        policy.order(e.scheduler_mut(), 10);
        assert_eq!(
            waiting_ids(&e),
            vec![long, longer, short],
            "at step 10 both long ones are overdue"
        );
        policy.order(e.scheduler_mut(), 8);
        assert_eq!(
            waiting_ids(&e),
            vec![long, short, longer],
            "at step 8 only the first is"
        );
        policy.finished(long);
        policy.order(e.scheduler_mut(), 100);
        assert_eq!(
            waiting_ids(&e),
            vec![longer, short, long],
            "a request it does not know arrived now"
        );
    }

    #[test]
    fn the_long_job_starts_within_the_bound() {
        let jobs = stream();
        let bound = 10;
        let served = serve(&jobs, 1, &mut MaxWait::new(bound));
        // Once overdue it is first in line; the short job then running takes at most 3 steps.
        assert!(
            served.first_token[1] <= jobs[1].arrival + bound + 4,
            "waited from step {} to {}",
            jobs[1].arrival,
            served.first_token[1]
        );
    }

    #[test]
    fn with_a_loose_bound_it_keeps_most_of_the_gain() {
        let jobs = mixed();
        let fcfs = serve(&jobs, 1, &mut Fcfs).mean_latency(&jobs);
        let sjf = serve(&jobs, 1, &mut Sjf).mean_latency(&jobs);
        let never = serve(&jobs, 1, &mut MaxWait::new(10_000)).mean_latency(&jobs);
        assert_eq!(never, sjf, "a bound nobody reaches is shortest job first");
        let bounded = serve(&jobs, 1, &mut MaxWait::new(60)).mean_latency(&jobs);
        assert!(
            bounded < 0.8 * fcfs,
            "mean latency in steps: {bounded:.1} with a bound of 60, {fcfs:.1} FCFS"
        );
    }
}
