//! A guided tour of the paged KV pool: two requests with a shared system prompt, decode
//! growing their tables, and the pages coming back when they finish.
//!
//! Run with `cargo run -p phase1 --example pool_demo`.

use phase1::{BlockTable, KvDtype, KvLayout, KvPool};

fn main() -> Result<(), phase1::Error> {
    let page_size = 4;
    // The embedded tiny model's shape: 8 layers, 2 KV heads of 64, kept in f32 on the CPU.
    let layout = KvLayout {
        num_layers: 8,
        num_kv_heads: 2,
        head_dim: 64,
        dtype: KvDtype::F32,
    };
    let budget = 512 * 1024;
    let num_pages = layout.pages_in_budget(budget, page_size);
    println!(
        "one token costs {} bytes of KV, a page of {page_size} tokens {} bytes: a {budget}-byte budget holds {num_pages} pages",
        layout.bytes_per_token(),
        layout.page_bytes(page_size),
    );
    let mut pool = KvPool::new(num_pages, page_size)?;

    let system: Vec<u32> = (100..108).collect();
    let mut prompt_a = system.clone();
    prompt_a.extend([1, 2, 3]);
    let mut prompt_b = system.clone();
    prompt_b.extend([7, 8]);

    let (mut a, cached) = BlockTable::allocate_prompt(&mut pool, &prompt_a)?;
    println!(
        "\nrequest A ({} tokens): {a}, {cached} cached",
        prompt_a.len()
    );
    // Pretend the model computed A's prompt: its full pages become findable by prefix hash.
    a.cache_full_pages(&mut pool, &prompt_a)?;

    let (mut b, cached) = BlockTable::allocate_prompt(&mut pool, &prompt_b)?;
    println!(
        "request B ({} tokens): {b}, {cached} cached (the shared system prompt)",
        prompt_b.len()
    );

    println!("\ndecode: each step appends one slot per sequence");
    for step in 1..=3 {
        let sa = a.append_slot(&mut pool)?;
        let sb = b.append_slot(&mut pool)?;
        println!(
            "step {step}: A writes page {} slot {}, B writes page {} slot {}; {} pages free",
            sa.page,
            sa.offset,
            sb.page,
            sb.offset,
            pool.num_free()
        );
    }
    println!("\n{pool}");

    a.release(&mut pool)?;
    b.release(&mut pool)?;
    println!(
        "both finished: {} of {} pages free again",
        pool.num_free(),
        pool.num_pages()
    );
    Ok(())
}
