//! Chapter 6.5: the collective operations tensor parallelism needs, behind one small trait.
//!
//! Megatron-LM's split (Shoeybi et al. 2019) leaves each rank with a partial sum after the
//! attention output and MLP down projections, and a slice of the vocabulary's logits: two
//! all-reduces per layer and one gather per step. On GPUs an existing library moves those bytes
//! (NCCL, as vLLM and SGLang use); on the CPU the ranks are threads and [`ThreadGroup`] adds
//! their pieces in rank order, so a run gives the same bits every time.

use std::sync::{Arc, Barrier, Mutex};

/// What a rank's forward pass asks of the others.
pub trait Collective: Send {
    /// This rank's index, `0..world_size`.
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Every rank's `data` becomes the element-wise sum of all ranks' `data`.
    fn all_reduce_sum(&mut self, data: &mut [f32]);
    /// Every rank's `local` laid end to end in rank order, on every rank (each rank may give a
    /// different length).
    fn all_gather(&mut self, local: &[f32]) -> Vec<f32>;
}

/// The shared board of a group of thread ranks: a slot per rank and a barrier.
struct Board {
    slots: Vec<Mutex<Vec<f32>>>,
    barrier: Barrier,
}

/// One rank of a group of threads that exchange through shared memory.
pub struct ThreadGroup {
    rank: usize,
    board: Arc<Board>,
}

impl ThreadGroup {
    /// The `world_size` ranks of a new group; give each to its own thread.
    pub fn new(world_size: usize) -> Vec<Self> {
        assert!(world_size > 0, "a group has at least one rank");
        let board = Arc::new(Board {
            slots: (0..world_size).map(|_| Mutex::new(Vec::new())).collect(),
            barrier: Barrier::new(world_size),
        });
        (0..world_size)
            .map(|rank| Self {
                rank,
                board: board.clone(),
            })
            .collect()
    }

    /// Posts `data`, waits until every rank has posted, and hands every rank's post to `read`
    /// in rank order; waits again so no rank posts the next round while another still reads.
    fn exchange<T>(&mut self, data: &[f32], read: impl FnOnce(&[&[f32]]) -> T) -> T {
        let b = &self.board;
        {
            let mut slot = b.slots[self.rank].lock().expect("no rank panicked");
            slot.clear();
            slot.extend_from_slice(data);
        }
        b.barrier.wait();
        let guards: Vec<_> = b
            .slots
            .iter()
            .map(|s| s.lock().expect("no rank panicked"))
            .collect();
        let posts: Vec<&[f32]> = guards.iter().map(|g| g.as_slice()).collect();
        let out = read(&posts);
        drop(guards);
        b.barrier.wait();
        out
    }
}

impl Collective for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.board.slots.len()
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) {
        if self.world_size() == 1 {
            return;
        }
        let local = data.to_vec();
        self.exchange(&local, |posts| {
            // Rank order on every rank: the same additions, so the same bits everywhere.
            data.copy_from_slice(posts[0]);
            for post in &posts[1..] {
                data.iter_mut().zip(*post).for_each(|(d, p)| *d += p);
            }
        });
    }

    fn all_gather(&mut self, local: &[f32]) -> Vec<f32> {
        if self.world_size() == 1 {
            return local.to_vec();
        }
        self.exchange(local, |posts| posts.concat())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send>(n: usize, f: impl Fn(ThreadGroup) -> T + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let handles: Vec<_> = ThreadGroup::new(n)
                .into_iter()
                .map(|g| s.spawn(|| f(g)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_sums_in_rank_order_on_every_rank() {
        let out = run(4, |mut g| {
            let r = g.rank() as f32;
            let mut data = vec![r, 10.0 * r, 1e8, -1e8 + r];
            g.all_reduce_sum(&mut data);
            // Two rounds in a row must not mix.
            let mut again = vec![1.0];
            g.all_reduce_sum(&mut again);
            (data, again)
        });
        for (data, again) in &out {
            assert_eq!(data, &out[0].0);
            assert_eq!(again, &vec![4.0]);
        }
        assert_eq!(out[0].0[..2], [6.0, 60.0]);
    }

    #[test]
    fn all_gather_concatenates_uneven_pieces() {
        let out = run(3, |mut g| {
            let piece: Vec<f32> = (0..=g.rank()).map(|i| (10 * g.rank() + i) as f32).collect();
            g.all_gather(&piece)
        });
        for o in out {
            assert_eq!(o, vec![0.0, 10.0, 11.0, 20.0, 21.0, 22.0]);
        }
    }
}
