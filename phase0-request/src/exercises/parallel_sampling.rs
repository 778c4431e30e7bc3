//! Exercise 0.3: parallel sampling, one prompt and `n` answers.
//!
//! Build: [`fan_out`], which turns one request into `n` sequences that share its prompt and
//! differ only in their random stream, and [`Group`], which tells when all of them are done.
//!
//! Why: "give me 4 candidates" is one request in the OpenAI API (`n`), and an engine that
//! runs it as `n` sequences over the same prompt pages (chapter 1's sharing) pays for the
//! prompt once; vLLM's `SequenceGroup` made this the unit of scheduling.
//!
//! Checked by `cargo test -p phase0 --features exercises --test exercises parallel_sampling`.

use crate::{Error, Request, SeqId, Sequence};

/// The `n` sequences of one request.
#[derive(Debug, Clone)]
pub struct Group {
    pub seqs: Vec<Sequence>,
}

/// Makes `n` sequences of `request`, with ids `first_id, first_id + 1, ...` and the same
/// prompt and parameters, except the seed: with a seed `s`, sequence `i` gets `s + i`
/// (wrapping), so the answers differ and the whole group is reproducible; without one, each
/// keeps `None` (the engine draws a seed per sequence). `n == 0` is an
/// `InvalidSamplingParams` error naming `"n"`; so are the request's own bad parameters.
pub fn fan_out(request: &Request, n: usize, first_id: SeqId) -> Result<Group, Error> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 0.3: fan one request out into `n` sequences with their own seeds");
    }
    // BEGIN SOLUTION
    if n == 0 {
        return Err(Error::InvalidSamplingParams {
            field: "n",
            value: "0".into(),
            reason: "must be >= 1",
        });
    }
    let seqs = (0..n)
        .map(|i| {
            let mut params = request.params.clone();
            params.seed = params.seed.map(|s| s.wrapping_add(i as u64));
            Sequence::new(Request::new(
                first_id + i as SeqId,
                request.prompt.clone(),
                params,
            ))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Group { seqs })
    // END SOLUTION
}

impl Group {
    /// True once every sequence finished (for any reason): the request can be answered.
    pub fn is_finished(&self) -> bool {
        if !cfg!(feature = "solutions") {
            todo!("exercise 0.3: a group is done when all its sequences are");
        }
        // BEGIN SOLUTION
        self.seqs.iter().all(Sequence::is_finished)
        // END SOLUTION
    }

    /// Sequences still waiting or running.
    pub fn num_unfinished(&self) -> usize {
        if !cfg!(feature = "solutions") {
            todo!("exercise 0.3: count the unfinished sequences of the group");
        }
        // BEGIN SOLUTION
        self.seqs.iter().filter(|s| !s.is_finished()).count()
        // END SOLUTION
    }
}
