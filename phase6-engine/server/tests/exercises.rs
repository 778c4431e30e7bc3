//! The chapter 6.3 exercise (`src/exercises/`):
//! `cargo test -p phase6-server --features exercises --test exercises`.

mod token_bucket {
    use std::time::Duration;

    use phase6_server::exercises::token_bucket::TokenBucket;

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
