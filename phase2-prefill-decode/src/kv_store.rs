//! The K/V numbers of the CPU runner, indexed by page id.
//!
//! The pool of chapter 1 decides which page holds which tokens; this store holds what is in
//! them. Each layer has a K and a V array laid out `[page][kv_head][slot][head_dim]` ("HND"):
//! the keys of one head in one page are contiguous, so attention reads a page of a head as
//! one run of memory. The CUDA runner uses the same layout in bf16.

#[derive(Debug, Clone)]
pub struct KvStore {
    num_pages: usize,
    page_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
    /// Per layer: (K, V).
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl KvStore {
    pub fn new(
        num_layers: usize,
        num_pages: usize,
        page_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let len = num_pages * num_kv_heads * page_size * head_dim;
        Self {
            num_pages,
            page_size,
            num_kv_heads,
            head_dim,
            layers: (0..num_layers)
                .map(|_| (vec![0.0; len], vec![0.0; len]))
                .collect(),
        }
    }

    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_kv_heads
    }

    /// Start of head `head`'s vectors in page `page`: `page_size * head_dim` floats follow.
    fn offset(&self, page: u32, head: usize) -> usize {
        ((page as usize * self.num_kv_heads + head) * self.page_size) * self.head_dim
    }

    /// Writes one token's K and V (`num_kv_heads * head_dim` each) into a slot.
    pub fn write(&mut self, layer: usize, page: u32, slot: usize, k: &[f32], v: &[f32]) {
        let d = self.head_dim;
        for h in 0..self.num_kv_heads {
            let at = self.offset(page, h) + slot * d;
            let (ks, vs) = &mut self.layers[layer];
            ks[at..at + d].copy_from_slice(&k[h * d..(h + 1) * d]);
            vs[at..at + d].copy_from_slice(&v[h * d..(h + 1) * d]);
        }
    }

    /// Copies one token's K and V (all heads) from a slot to another, turning every key head
    /// through `turn(head_vector)` (a RoPE rotation by a position shift).
    pub fn copy_slot(
        &mut self,
        layer: usize,
        from: (u32, usize),
        to: (u32, usize),
        turn: impl Fn(&mut [f32]),
    ) {
        let d = self.head_dim;
        for h in 0..self.num_kv_heads {
            let src = self.offset(from.0, h) + from.1 * d;
            let dst = self.offset(to.0, h) + to.1 * d;
            let (ks, vs) = &mut self.layers[layer];
            let mut k = ks[src..src + d].to_vec();
            turn(&mut k);
            ks[dst..dst + d].copy_from_slice(&k);
            vs.copy_within(src..src + d, dst);
        }
    }

    /// The keys and values of one head in one page: `page_size` rows of `head_dim`.
    pub fn page(&self, layer: usize, page: u32, head: usize) -> (&[f32], &[f32]) {
        let at = self.offset(page, head);
        let n = self.page_size * self.head_dim;
        let (ks, vs) = &self.layers[layer];
        (&ks[at..at + n], &vs[at..at + n])
    }
}
