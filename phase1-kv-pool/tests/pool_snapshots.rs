//! What a person sees when they print a pool: checked against committed snapshots so a change
//! in the layout of the dump is a deliberate one. Every value in them follows from chapter 1's
//! text: page ids from the free queue's order (a new pool hands out 0, 1, 2, ...), hashes from
//! the bytes `PageHash::chain` hashes. A snapshot that differs is a difference from the
//! reference: fix the code, never re-record the snapshot.

use phase1::{BlockTable, KvPool};

#[test]
fn two_prompts_sharing_a_prefix() {
    let mut pool = KvPool::new(8, 4).unwrap();
    let a_tokens: Vec<u32> = (1..=10).collect();
    let (a, _) = BlockTable::allocate_prompt(&mut pool, &a_tokens).unwrap();
    a.cache_full_pages(&mut pool, &a_tokens).unwrap();

    let mut b_tokens: Vec<u32> = (1..=8).collect();
    b_tokens.extend([42, 43]);
    let (mut b, cached) = BlockTable::allocate_prompt(&mut pool, &b_tokens).unwrap();
    b.append_slot(&mut pool).unwrap();

    let report = format!("a: {a}\nb: {b} ({cached} tokens cached)\n\n{pool}");
    insta::assert_snapshot!(report);
}

#[test]
fn after_a_finished_request_its_pages_wait_in_the_cache() {
    let mut pool = KvPool::new(4, 2).unwrap();
    let tokens = [5, 6, 7, 8, 9];
    let (mut a, _) = BlockTable::allocate_prompt(&mut pool, &tokens).unwrap();
    a.cache_full_pages(&mut pool, &tokens).unwrap();
    a.release(&mut pool).unwrap();
    insta::assert_snapshot!(pool.to_string());
}
