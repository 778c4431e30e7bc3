//! The chapter 1 exercises (`src/exercises/`), one module each:
//! `cargo test -p phase1 --features exercises --test exercises [module]`.

use phase1::exercises::copy_on_write::{PageCopy, append_slot_cow, fork};
use phase1::exercises::page_size_sweep::{Fragmentation, measure, sweep};
use phase1::exercises::watermark::{Admission, Watermark};
use phase1::{BlockTable, Error, KvPool, Slot};
use proptest::prelude::*;

/// A fixed workload: `n` sequences, prompts of 100..612 tokens, outputs of 1..513, from a
/// small linear congruential generator so that every run sees the same lengths.
fn workload(n: usize) -> Vec<(usize, usize)> {
    let mut x: u64 = 12345;
    let mut next = |range: usize| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize % range
    };
    (0..n).map(|_| (100 + next(512), 1 + next(512))).collect()
}

mod page_size_sweep {
    use super::*;

    #[test]
    fn each_sequence_wastes_less_than_one_page() {
        let seqs = workload(200);
        for page_size in [1, 3, 16, 256] {
            let f = measure(&seqs, page_size).unwrap();
            let tokens: usize = seqs.iter().map(|(p, o)| p + o).sum();
            assert_eq!(f.tokens, tokens, "page size {page_size}: tokens stored");
            let pages: usize = seqs.iter().map(|(p, o)| (p + o).div_ceil(page_size)).sum();
            assert_eq!(
                f.pages, pages,
                "page size {page_size}: a sequence of n tokens holds ceil(n / page_size) pages"
            );
            assert!(f.wasted() < seqs.len() * page_size);
        }
        assert_eq!(
            measure(&seqs, 1).unwrap().wasted(),
            0,
            "one-token pages waste nothing"
        );
    }

    #[test]
    fn decode_growth_and_prefill_reserve_the_same_pages() {
        // A prompt of 5 then 4 decoded tokens holds what a 9-token prompt holds.
        let grown = measure(&[(5, 4)], 4).unwrap();
        let whole = measure(&[(9, 0)], 4).unwrap();
        assert_eq!(grown, whole);
        assert_eq!(
            grown,
            Fragmentation {
                page_size: 4,
                tokens: 9,
                pages: 3
            }
        );
        assert_eq!((grown.slots(), grown.wasted()), (12, 3));
    }

    #[test]
    fn the_sweep_shows_bigger_pages_waste_more() {
        let seqs = workload(1000);
        let sizes = [1, 16, 256];
        let swept = sweep(&seqs, &sizes).unwrap();
        let got: Vec<usize> = swept.iter().map(|f| f.page_size).collect();
        assert_eq!(got, sizes, "one result per page size, in order");
        let ratios: Vec<f64> = swept.iter().map(Fragmentation::waste_ratio).collect();
        assert_eq!(ratios[0], 0.0);
        assert!(
            ratios[1] > 0.0 && ratios[1] < 0.02,
            "16-token pages waste about 7.5 slots of ~610 per sequence: {:.4}",
            ratios[1]
        );
        assert!(
            ratios[2] > 0.12 && ratios[2] < 0.25,
            "256-token pages waste about 127 slots per sequence: {:.4}",
            ratios[2]
        );
    }

    proptest! {
        #[test]
        fn a_page_size_that_divides_another_never_wastes_more(
            seqs in prop::collection::vec((1usize..300, 0usize..300), 1..20),
            small in 1usize..9,
            times in 1usize..9,
        ) {
            let fine = measure(&seqs, small).unwrap();
            let coarse = measure(&seqs, small * times).unwrap();
            prop_assert!(fine.wasted() <= coarse.wasted(), "{:?} vs {:?}", fine, coarse);
        }
    }
}

mod watermark {
    use super::*;

    #[test]
    fn now_later_never() {
        let mut pool = KvPool::new(10, 4).unwrap();
        let w = Watermark { pages: 2 };
        assert_eq!(w.check(&pool, 32), Admission::Now, "8 pages + 2 kept = 10");
        assert_eq!(
            w.check(&pool, 33),
            Admission::Never,
            "9 pages + 2 > 10 ever"
        );
        let held = pool.allocate_many(3).unwrap();
        assert_eq!(w.check(&pool, 20), Admission::Now, "5 + 2 of 7 free");
        assert_eq!(w.check(&pool, 21), Admission::Later, "6 + 2 > 7 free");
        pool.free_all(&held).unwrap();
        assert_eq!(w.check(&pool, 21), Admission::Now);
        assert_eq!(Watermark { pages: 0 }.check(&pool, 40), Admission::Now);
        assert_eq!(Watermark::of_pool(&pool, 0.25), Watermark { pages: 2 });
    }

    #[test]
    fn admit_takes_the_pages_or_nothing() {
        let mut pool = KvPool::new(6, 4).unwrap();
        let w = Watermark { pages: 1 };
        let table = w.admit(&mut pool, 13).unwrap();
        assert_eq!((table.num_tokens(), table.pages().len()), (13, 4));
        assert_eq!(pool.num_free(), 2);
        let err = w.admit(&mut pool, 5).unwrap_err();
        assert_eq!(
            err,
            Error::OutOfPages {
                requested: 3,
                free: 2,
                total: 6
            },
            "2 pages for the prompt and 1 kept back"
        );
        assert_eq!(pool.num_free(), 2, "a refused prompt takes nothing");
        let small = w.admit(&mut pool, 4).unwrap();
        assert_eq!(pool.num_free(), 1, "the reserve is left");
        // Decode may use the reserve.
        let mut grown = table;
        for _ in 0..4 {
            grown.append_slot(&mut pool).unwrap();
        }
        assert_eq!(pool.num_free(), 0);
        grown.release(&mut pool).unwrap();
        let mut small = small;
        small.release(&mut pool).unwrap();
        assert_eq!(pool.num_free(), 6);
    }

    /// A little serving loop: admit waiting prompts in order while the watermark allows, then
    /// give every running sequence one decode slot; a sequence that cannot get one is
    /// preempted (its pages released, its work lost, back to the front of the queue).
    /// Returns the number of preemptions and of steps until all are done.
    fn serve(pages: usize, watermark: usize, requests: &[(usize, usize)]) -> (usize, usize) {
        let mut pool = KvPool::new(pages, 4).unwrap();
        let w = Watermark { pages: watermark };
        let mut waiting: std::collections::VecDeque<(usize, usize)> =
            requests.iter().copied().collect();
        let mut running: Vec<(BlockTable, usize)> = Vec::new();
        let (mut preemptions, mut steps) = (0, 0);
        while !waiting.is_empty() || !running.is_empty() {
            steps += 1;
            assert!(steps < 100_000, "no progress");
            while let Some(&(prompt, output)) = waiting.front() {
                match w.check(&pool, prompt) {
                    Admission::Now => {
                        let table = w.admit(&mut pool, prompt).unwrap();
                        running.push((table, output));
                        waiting.pop_front();
                    }
                    Admission::Later => break,
                    Admission::Never => panic!("a {prompt}-token prompt never fits"),
                }
            }
            let mut i = 0;
            while i < running.len() {
                let (table, left) = &mut running[i];
                if *left == 0 {
                    table.release(&mut pool).unwrap();
                    running.swap_remove(i);
                    continue;
                }
                if table.append_slot(&mut pool).is_err() {
                    let (mut table, left) = running.swap_remove(i);
                    waiting.push_front((table.num_tokens(), left));
                    table.release(&mut pool).unwrap();
                    preemptions += 1;
                    continue;
                }
                *left -= 1;
                i += 1;
            }
        }
        assert_eq!(pool.num_free(), pages, "every page back");
        (preemptions, steps)
    }

    #[test]
    fn a_reserve_for_decode_means_fewer_preemptions() {
        let requests: Vec<(usize, usize)> = (0..40).map(|i| (10 + i % 7, 20)).collect();
        let (without, _) = serve(64, 0, &requests);
        let (with, _) = serve(64, 6, &requests);
        assert!(without > 0, "a pool filled to the last page must preempt");
        assert!(
            with < without,
            "a reserve of 6 pages should cut preemptions: {with} with, {without} without"
        );
    }
}

mod copy_on_write {
    use super::*;

    #[test]
    fn a_fork_shares_every_page() {
        let mut pool = KvPool::new(8, 4).unwrap();
        let mut a = BlockTable::new();
        a.append_tokens(&mut pool, 6).unwrap();
        let b = fork(&mut pool, &a).unwrap();
        assert_eq!(b, a, "same pages, same tokens");
        assert_eq!(pool.num_used(), 2, "no page was copied");
        for &p in a.pages() {
            assert_eq!(pool.ref_count(p).unwrap(), 2);
        }
    }

    #[test]
    fn writing_into_a_shared_last_page_copies_it_first() {
        let mut pool = KvPool::new(8, 4).unwrap();
        let mut a = BlockTable::new();
        a.append_tokens(&mut pool, 6).unwrap(); // pages 0 (full), 1 (2 of 4)
        let mut b = fork(&mut pool, &a).unwrap();
        let (slot, copy) = append_slot_cow(&mut b, &mut pool).unwrap();
        let fresh = b.pages()[1];
        assert_ne!(fresh, a.pages()[1], "b writes into a page of its own");
        assert_eq!(
            copy,
            Some(PageCopy {
                from: a.pages()[1],
                to: fresh
            }),
            "the runner must copy the 2 tokens already there"
        );
        assert_eq!(
            slot,
            Slot {
                page: fresh,
                offset: 2
            }
        );
        assert_eq!(b.pages()[0], a.pages()[0], "the full page stays shared");
        assert_eq!(pool.ref_count(a.pages()[0]).unwrap(), 2);
        assert_eq!(pool.ref_count(a.pages()[1]).unwrap(), 1, "b let go of it");
        assert_eq!(a.num_tokens(), 6, "a is untouched");
        // Now both hold their last page alone: no more copies.
        assert_eq!(append_slot_cow(&mut b, &mut pool).unwrap().1, None);
        let (slot, copy) = append_slot_cow(&mut a, &mut pool).unwrap();
        assert_eq!((slot.page, slot.offset, copy), (a.pages()[1], 2, None));
    }

    #[test]
    fn a_full_shared_last_page_needs_no_copy() {
        let mut pool = KvPool::new(8, 4).unwrap();
        let mut a = BlockTable::new();
        a.append_tokens(&mut pool, 8).unwrap();
        let mut b = fork(&mut pool, &a).unwrap();
        let (slot, copy) = append_slot_cow(&mut b, &mut pool).unwrap();
        assert_eq!((copy, slot.offset), (None, 0));
        assert_eq!(b.pages().len(), 3);
        assert_eq!(&b.pages()[..2], a.pages());
    }

    #[test]
    fn no_free_page_leaves_everything_as_it_was() {
        let mut pool = KvPool::new(2, 4).unwrap();
        let mut a = BlockTable::new();
        a.append_tokens(&mut pool, 5).unwrap();
        let mut b = fork(&mut pool, &a).unwrap();
        let before = b.clone();
        assert!(matches!(
            append_slot_cow(&mut b, &mut pool),
            Err(Error::OutOfPages { .. })
        ));
        assert_eq!(b, before);
        assert_eq!(pool.ref_count(a.pages()[1]).unwrap(), 2);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Fork(usize),
        Append(usize),
        Release(usize),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                (0usize..8).prop_map(Op::Fork),
                (0usize..8).prop_map(Op::Append),
                (0usize..8).prop_map(Op::Release),
            ],
            1..80,
        )
    }

    proptest! {
        #[test]
        fn every_write_goes_to_a_page_held_alone_and_no_page_leaks(
            ops in ops(),
            page_size in 1usize..5,
            prompt in 1usize..10,
        ) {
            let num_pages = 48;
            let mut pool = KvPool::new(num_pages, page_size).unwrap();
            let mut first = BlockTable::new();
            first.append_tokens(&mut pool, prompt).unwrap();
            let mut tables = vec![first];
            // What each table's tokens are, and the token each (page, offset) holds.
            let mut contents: Vec<Vec<u32>> = vec![(0..prompt as u32).collect()];
            let mut slots = std::collections::HashMap::new();
            for (i, _) in contents[0].iter().enumerate() {
                let s = tables[0].slot(i, page_size);
                slots.insert((s.page, s.offset), contents[0][i]);
            }
            let mut next_token = 1000;
            for op in ops {
                match op {
                    Op::Fork(i) if !tables.is_empty() => {
                        let i = i % tables.len();
                        let t = fork(&mut pool, &tables[i]).unwrap();
                        tables.push(t);
                        contents.push(contents[i].clone());
                    }
                    Op::Append(i) if !tables.is_empty() => {
                        let i = i % tables.len();
                        let Ok((slot, copy)) = append_slot_cow(&mut tables[i], &mut pool) else {
                            continue;
                        };
                        if let Some(c) = copy {
                            for off in 0..page_size {
                                if let Some(&t) = slots.get(&(c.from, off)) {
                                    slots.insert((c.to, off), t);
                                }
                            }
                        }
                        prop_assert_eq!(
                            pool.ref_count(slot.page).unwrap(), 1,
                            "slot {:?} is in a page another sequence reads", slot
                        );
                        slots.insert((slot.page, slot.offset), next_token);
                        contents[i].push(next_token);
                        next_token += 1;
                    }
                    Op::Release(i) if !tables.is_empty() => {
                        let i = i % tables.len();
                        tables.swap_remove(i).release(&mut pool).unwrap();
                        contents.swap_remove(i);
                    }
                    _ => {}
                }
                // Every table still reads exactly its own tokens through its pages.
                for (t, want) in tables.iter().zip(&contents) {
                    let got: Vec<u32> = (0..t.num_tokens())
                        .map(|j| {
                            let s = t.slot(j, page_size);
                            slots[&(s.page, s.offset)]
                        })
                        .collect();
                    prop_assert_eq!(&got, want);
                }
            }
            for mut t in tables {
                t.release(&mut pool).unwrap();
            }
            prop_assert_eq!(pool.num_free(), num_pages, "every page back");
        }
    }
}
