//! Property tests: whatever sequence of operations a scheduler performs, the pool's counts
//! stay true. A model (a plain list of "who holds which page") is checked against the pool
//! after every operation.

use std::collections::HashMap;

use phase1::{BlockTable, Error, KvPool, PageHash, PageId};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Allocate,
    Share(usize),
    Free(usize),
    FreeUnheld,
    Cache(usize, u8),
    Lookup(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Allocate),
        2 => any::<usize>().prop_map(Op::Share),
        3 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::FreeUnheld),
        1 => (any::<usize>(), 0u8..4).prop_map(|(i, k)| Op::Cache(i, k)),
        1 => (0u8..4).prop_map(Op::Lookup),
    ]
}

fn hash(key: u8) -> PageHash {
    PageHash::chain(None, &[key as u32])
}

proptest! {
    #[test]
    fn ref_counts_equal_holders_and_nothing_leaks(
        num_pages in 1usize..12,
        ops in prop::collection::vec(op(), 0..200),
    ) {
        let mut pool = KvPool::new(num_pages, 4).unwrap();
        // One entry per holder: a page held twice appears twice.
        let mut holders: Vec<PageId> = Vec::new();
        let mut cache: HashMap<u8, PageId> = HashMap::new();
        let mut hashed: HashMap<PageId, u8> = HashMap::new();

        for op in ops {
            match op {
                Op::Allocate => match pool.allocate() {
                    Ok(p) => {
                        prop_assert!(!holders.contains(&p), "allocated a held page {}", p);
                        if let Some(k) = hashed.remove(&p) {
                            cache.remove(&k);
                        }
                        holders.push(p);
                    }
                    Err(Error::OutOfPages { free, .. }) => {
                        prop_assert_eq!(free, 0);
                        prop_assert_eq!(holders.iter().collect::<std::collections::HashSet<_>>().len(), num_pages);
                    }
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                },
                Op::Share(i) if !holders.is_empty() => {
                    let p = holders[i % holders.len()];
                    pool.share(p).unwrap();
                    holders.push(p);
                }
                Op::Free(i) if !holders.is_empty() => {
                    let p = holders.swap_remove(i % holders.len());
                    pool.free(p).unwrap();
                }
                Op::FreeUnheld => {
                    if let Some(p) = (0..num_pages as PageId).find(|p| !holders.contains(p)) {
                        prop_assert_eq!(pool.free(p), Err(Error::NotAllocated(p)));
                        prop_assert_eq!(pool.share(p), Err(Error::NotAllocated(p)));
                    }
                }
                Op::Cache(i, k) if !holders.is_empty() => {
                    let p = holders[i % holders.len()];
                    pool.cache_page(p, hash(k)).unwrap();
                    if !hashed.contains_key(&p) && !cache.contains_key(&k) {
                        hashed.insert(p, k);
                        cache.insert(k, p);
                    }
                }
                Op::Lookup(k) => {
                    let found = pool.lookup(&hash(k));
                    prop_assert_eq!(found, cache.get(&k).copied());
                    if let Some(p) = found {
                        holders.push(p);
                    }
                }
                _ => {}
            }
            for p in 0..num_pages as PageId {
                let held = holders.iter().filter(|&&h| h == p).count() as u32;
                prop_assert_eq!(pool.ref_count(p).unwrap(), held, "page {}", p);
            }
            let distinct = holders.iter().collect::<std::collections::HashSet<_>>().len();
            prop_assert_eq!(pool.num_free(), num_pages - distinct);
        }

        for p in holders.drain(..) {
            pool.free(p).unwrap();
        }
        prop_assert_eq!(pool.num_free(), num_pages, "free count returns to its start");
    }

    #[test]
    fn block_tables_hold_exactly_the_pages_they_need(
        page_size in 1usize..6,
        grows in prop::collection::vec((0usize..4, 0usize..9, any::<bool>()), 0..60),
    ) {
        let num_pages = 16;
        let mut pool = KvPool::new(num_pages, page_size).unwrap();
        let mut tables = vec![BlockTable::new(); 4];
        for (t, n, one_by_one) in grows {
            let table = &mut tables[t];
            let before = (table.num_tokens(), table.pages().len(), pool.num_free());
            let result = if one_by_one {
                (0..n).try_for_each(|_| table.append_slot(&mut pool).map(|_| ()))
            } else {
                table.append_tokens(&mut pool, n)
            };
            if result.is_err() && !one_by_one {
                prop_assert_eq!(before, (table.num_tokens(), table.pages().len(), pool.num_free()));
            }
            for table in &tables {
                prop_assert_eq!(table.pages().len(), table.num_tokens().div_ceil(page_size));
            }
            let used: usize = tables.iter().map(|t| t.pages().len()).sum();
            prop_assert_eq!(pool.num_used(), used);
        }
        for table in &mut tables {
            table.release(&mut pool).unwrap();
        }
        prop_assert_eq!(pool.num_free(), num_pages);
    }
}
