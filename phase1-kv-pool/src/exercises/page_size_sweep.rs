//! Exercise 1.1: a page-size sweep, measuring what paging wastes.
//!
//! Build: [`measure`], which lays sequences of given lengths out in a [`KvPool`] of one page
//! size the way the engine does (a block table per sequence: the prompt reserved at once,
//! then one slot per decoded token) and counts the slots reserved against the tokens stored;
//! and [`sweep`], the same for several page sizes.
//!
//! Why: a page wastes at most `page_size - 1` slots per sequence, so small pages waste less;
//! yet engines use 16 (vLLM) to 256 (nano-vllm) because attention kernels read a page at a
//! time and every page costs a block-table entry. The numbers tell you how much the bigger
//! page costs in memory, the price paid for the faster kernel.
//!
//! Checked by `cargo test -p phase1 --features exercises --test exercises page_size_sweep`.

use crate::{BlockTable, Error, KvPool};

/// How one set of sequences fits in pages of one size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragmentation {
    pub page_size: usize,
    /// Tokens stored: the sum of the lengths.
    pub tokens: usize,
    /// Pages the sequences hold.
    pub pages: usize,
}

impl Fragmentation {
    /// Slots reserved: every held page is reserved whole.
    pub fn slots(&self) -> usize {
        self.pages * self.page_size
    }

    /// Slots reserved but holding no token.
    pub fn wasted(&self) -> usize {
        self.slots() - self.tokens
    }

    /// The wasted share of the reserved memory (0 when nothing is reserved).
    pub fn waste_ratio(&self) -> f64 {
        match self.slots() {
            0 => 0.0,
            slots => self.wasted() as f64 / slots as f64,
        }
    }
}

/// Each sequence is `(prompt_len, output_len)`: its prompt is reserved in one go (prefill),
/// then every output token takes one more slot (decode). Runs them all in one pool of
/// `page_size`-token pages, big enough for all of them at once, and reports the pages held
/// at the end (when every sequence is at full length). The pool is what counts the pages:
/// use it, do not compute the answer on paper.
pub fn measure(sequences: &[(usize, usize)], page_size: usize) -> Result<Fragmentation, Error> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 1.1: lay the sequences out in a pool and count its used pages");
    }
    // BEGIN SOLUTION
    let most_pages = sequences
        .iter()
        .map(|&(prompt, output)| (prompt + output).div_ceil(page_size.max(1)))
        .sum();
    let mut pool = KvPool::new(most_pages, page_size)?;
    let mut tables = Vec::with_capacity(sequences.len());
    for &(prompt, output) in sequences {
        let mut table = BlockTable::new();
        table.append_tokens(&mut pool, prompt)?;
        for _ in 0..output {
            table.append_slot(&mut pool)?;
        }
        tables.push(table);
    }
    Ok(Fragmentation {
        page_size,
        tokens: tables.iter().map(BlockTable::num_tokens).sum(),
        pages: pool.num_used(),
    })
    // END SOLUTION
}

/// [`measure`] for each page size, in the order given.
pub fn sweep(
    sequences: &[(usize, usize)],
    page_sizes: &[usize],
) -> Result<Vec<Fragmentation>, Error> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 1.1: measure every page size");
    }
    // BEGIN SOLUTION
    page_sizes
        .iter()
        .map(|&page_size| measure(sequences, page_size))
        .collect()
    // END SOLUTION
}
