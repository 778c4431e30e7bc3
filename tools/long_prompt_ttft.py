#!/usr/bin/env python3
"""Time to first token of one long prompt in `transformers`, the baseline for `nanoserve bench
--num-seqs 1 --min-input N --max-input N --min-output 1 --max-output 1`.

Random bf16 weights of the config's shape on the GPU, SDPA attention, one forward pass over
the prompt that keeps only the last position's logits (what a server needs for the first
token); the median of a few timed passes after a warm-up.

    python3 tools/long_prompt_ttft.py configs/qwen3-8b.json --tokens 8192 32768
"""

import argparse
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    config = AutoConfig.from_pretrained(args.config)
    config.max_position_embeddings = max(config.max_position_embeddings, max(args.tokens))
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in args.tokens:
        ids = torch.randint(0, config.vocab_size, (1, n), device="cuda", generator=gen)
        times = []
        with torch.no_grad():
            for i in range(args.repeat + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(input_ids=ids, logits_to_keep=1, use_cache=False)
                torch.cuda.synchronize()
                if i > 0:
                    times.append(time.perf_counter() - t0)
        print(f"transformers forward of {n} tokens: {1000 * statistics.median(times):.0f} ms "
              f"(median of {args.repeat})", flush=True)


if __name__ == "__main__":
    main()
