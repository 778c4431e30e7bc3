//! The chapter 6.2 exercise (`src/exercises/`):
//! `cargo test -p phase6-chunks --features exercises --test exercises`.

mod chunk_eviction {
    use phase6_chunks::exercises::chunk_eviction::GreedyDualSize;

    #[test]
    fn equal_cost_per_page_evicts_the_least_recently_touched() {
        let mut g = GreedyDualSize::new();
        for id in [3, 1, 2] {
            g.touch(id, 4, 40.0);
        }
        g.touch(3, 4, 40.0);
        let mut order = Vec::new();
        while let Some(v) = g.victim() {
            assert!(g.evict(v));
            order.push(v);
        }
        assert_eq!(
            order,
            [1, 2, 3],
            "LRU order when every chunk is worth the same"
        );
        assert!(g.is_empty() && g.victim().is_none());
        assert!(!g.evict(7), "an unknown chunk is not evicted");
    }

    #[test]
    fn a_big_cheap_chunk_goes_before_a_small_dear_one() {
        let mut g = GreedyDualSize::new();
        // A 40-token system prompt on one page that took 2 ms to prefill, and a long document
        // on 64 pages that took 30 ms: 2.0 per page against 0.47.
        g.touch(1, 1, 2000.0);
        g.touch(2, 64, 30_000.0);
        assert_eq!(g.victim(), Some(2));
        assert!(g.evict(2));
        assert!(
            (g.inflation() - 30_000.0 / 64.0).abs() < 1e-9,
            "L = the victim's credit"
        );
    }

    #[test]
    fn inflation_ages_out_chunks_nobody_uses() {
        let mut g = GreedyDualSize::new();
        g.touch(1, 1, 100.0); // dear, but never used again
        g.touch(2, 1, 10.0);
        g.touch(3, 1, 10.0);
        // Two cheap chunks at a time come and go and are used: every two evictions raise L by
        // 10. The dear chunk stays until L has caught up with its credit of 100.
        let mut evictions = 0;
        loop {
            let v = g.victim().unwrap();
            if v == 1 {
                break;
            }
            assert!(g.evict(v));
            g.touch(v + 10, 1, 10.0);
            evictions += 1;
            assert!(evictions < 100, "the dear chunk is never evicted");
        }
        // 10, 10, 20, 20, ..., 90, 90: then every chunk has credit 100 and the dear one was
        // touched first.
        assert_eq!(evictions, 18);
        assert_eq!(g.inflation(), 90.0);
        // A touch gives it credit above L again.
        g.touch(1, 1, 100.0);
        assert_ne!(g.victim(), Some(1));
    }

    #[test]
    fn pages_of_zero_count_as_one() {
        let mut g = GreedyDualSize::new();
        g.touch(1, 0, 5.0);
        g.touch(2, 1, 4.0);
        assert_eq!(g.victim(), Some(2));
        g.evict(2);
        assert_eq!(g.inflation(), 4.0);
        assert_eq!(g.len(), 1);
    }
}
