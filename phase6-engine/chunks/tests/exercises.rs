//! The chapter 6 exercises (`src/exercises/`), one module each:
//! `cargo test -p phase6 --features exercises --test exercises [module]`.

mod chunk_eviction {
    use phase6::exercises::chunk_eviction::GreedyDualSize;

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

mod token_bucket {
    use std::time::Duration;

    use phase6::exercises::token_bucket::TokenBucket;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_burst_up_to_the_capacity_then_the_rate() {
        let mut b = TokenBucket::new(1000, 100.0);
        assert_eq!(b.try_take(600, Duration::ZERO), Ok(()));
        assert_eq!(b.try_take(400, Duration::ZERO), Ok(()));
        // Empty: 50 tokens take half a second to flow in.
        assert_eq!(b.try_take(50, Duration::ZERO), Err(SEC / 2));
        assert_eq!(
            b.try_take(50, SEC / 4),
            Err(SEC / 4),
            "nothing taken by a refusal"
        );
        assert_eq!(b.try_take(50, SEC / 2), Ok(()));
        assert!(b.available(SEC / 2).abs() < 1e-9);
    }

    #[test]
    fn it_never_holds_more_than_its_capacity() {
        let mut b = TokenBucket::new(1000, 100.0);
        b.try_take(1000, Duration::ZERO).unwrap();
        assert!(
            (b.available(3600 * SEC) - 1000.0).abs() < 1e-9,
            "an hour idle refills to 1000"
        );
        assert_eq!(b.try_take(1000, 3600 * SEC), Ok(()));
        assert_eq!(b.try_take(1, 3600 * SEC), Err(SEC / 100));
    }

    #[test]
    fn a_request_larger_than_the_bucket_can_never_pass() {
        let mut b = TokenBucket::new(100, 10.0);
        assert_eq!(b.try_take(101, Duration::ZERO), Err(Duration::MAX));
        assert!(
            (b.available(Duration::ZERO) - 100.0).abs() < 1e-9,
            "and takes nothing"
        );
    }

    #[test]
    fn time_that_goes_back_adds_nothing() {
        let mut b = TokenBucket::new(100, 10.0);
        b.try_take(100, 5 * SEC).unwrap();
        assert_eq!(
            b.try_take(10, 2 * SEC),
            Err(SEC),
            "an earlier clock reading is now"
        );
        assert_eq!(b.try_take(10, 6 * SEC), Ok(()));
    }

    #[test]
    fn the_long_run_rate_is_the_refill_rate() {
        // A client asking for 50 tokens every 100 ms (500/s) from a bucket of 200 refilled at
        // 100/s gets 200 at once, then 100 a second.
        let mut b = TokenBucket::new(200, 100.0);
        let mut granted = 0;
        for step in 0..=100u32 {
            if b.try_take(50, step * SEC / 10).is_ok() {
                granted += 50;
            }
        }
        assert!(
            (1150..=1250).contains(&granted),
            "granted {granted} tokens over 10 s"
        );
    }
}
