//! What a page costs in bytes, so that a memory budget becomes a number of pages.
//!
//! One token stores a key and a value vector of `head_dim` numbers for each KV head in each
//! layer. With grouped-query attention there are fewer KV heads than query heads, which is
//! exactly why GQA models fit more tokens in the same memory.

/// The number type of the stored K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
    BF16,
    /// One byte: 8-bit floats (e4m3) with a scale per layer, as vLLM's `kv_cache_dtype="fp8"`.
    Fp8E4m3,
}

impl KvDtype {
    pub fn size_bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::BF16 => 2,
            KvDtype::Fp8E4m3 => 1,
        }
    }
}

/// The model dimensions that decide the size of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub dtype: KvDtype,
}

impl KvLayout {
    /// K and V, every layer, every KV head.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.size_bytes()
    }

    pub fn page_bytes(&self, page_size: usize) -> usize {
        self.bytes_per_token() * page_size
    }

    /// How many whole pages fit in `budget_bytes`.
    pub fn pages_in_budget(&self, budget_bytes: usize, page_size: usize) -> usize {
        match self.page_bytes(page_size) {
            0 => 0,
            page => budget_bytes / page,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_0_6b_costs_112_kib_per_token_in_bf16() {
        // 28 layers, 8 KV heads of 128: the public Qwen3-0.6B configuration.
        let layout = KvLayout {
            num_layers: 28,
            num_kv_heads: 8,
            head_dim: 128,
            dtype: KvDtype::BF16,
        };
        assert_eq!(layout.bytes_per_token(), 114_688);
        assert_eq!(layout.page_bytes(256), 29_360_128);
        // 10 GiB holds 365 pages of 256 tokens: about 93k tokens.
        assert_eq!(layout.pages_in_budget(10 << 30, 256), 365);
    }

    #[test]
    fn one_byte_elements_halve_the_bf16_cost() {
        let fp8 = KvLayout {
            num_layers: 28,
            num_kv_heads: 8,
            head_dim: 128,
            dtype: KvDtype::Fp8E4m3,
        };
        assert_eq!(fp8.bytes_per_token(), 57_344);
        assert_eq!(fp8.pages_in_budget(10 << 30, 256), 731);
    }

    #[test]
    fn budget_smaller_than_a_page_holds_none() {
        let layout = KvLayout {
            num_layers: 2,
            num_kv_heads: 1,
            head_dim: 4,
            dtype: KvDtype::F32,
        };
        assert_eq!(layout.page_bytes(16), 1024);
        assert_eq!(layout.pages_in_budget(1023, 16), 0);
        assert_eq!(layout.pages_in_budget(4096, 16), 4);
    }
}
