"""The baseline a user would otherwise reach for: Hugging Face `transformers` `generate` on the
same throughput workload as `nanoserve bench`.

`nanoserve bench --workload-out workload.json` writes the workload (prompt token ids and output
lengths, drawn from its seed); this script runs it through `generate` in bf16 with SDPA
attention, batched with left padding, and reports output tokens per second counted the same
way (the requested output tokens over the wall time). `generate` runs every sequence of a batch
to the longest requested length, which is what static batching costs.

    python3 tools/hf_bench.py --config configs/qwen3-0.6b.json --workload workload.json \
        --json hf_bench.json
"""

import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList


class Progress(StoppingCriteria):
    """Prints the step count and the time every `every` decode steps; never stops generation."""

    def __init__(self, every, began):
        self.every, self.began, self.steps = every, began, 0

    def __call__(self, input_ids, scores, **kwargs):
        self.steps += 1
        if self.steps % self.every == 0:
            torch.cuda.synchronize() if input_ids.is_cuda else None
            print(f"  step {self.steps}: {time.time() - self.began:.1f} s", flush=True)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="config.json of the architecture (random weights)")
    ap.add_argument("--workload", required=True, help="JSON written by nanoserve bench --workload-out")
    ap.add_argument("--batch-size", type=int, default=0, help="sequences per generate call (0: all at once)")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default="hf_bench.json")
    ap.add_argument("--progress-every", type=int, default=128, help="print the time every N steps")
    args = ap.parse_args()

    torch.manual_seed(0)
    began = time.time()
    config = AutoConfig.from_pretrained(args.config)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(args.device).eval()
    requests = json.load(open(args.workload))["requests"]
    prompts = [r["prompt_ids"] for r in requests]
    outputs = [r["max_tokens"] for r in requests]
    pad = config.eos_token_id if isinstance(config.eos_token_id, int) else 0
    batch = args.batch_size or len(prompts)

    def run(ids, new_tokens):
        width = max(len(p) for p in ids)
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, p in enumerate(ids):
            input_ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.inference_mode():
            model.generate(
                input_ids=input_ids.to(args.device),
                attention_mask=mask.to(args.device),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                temperature=args.temperature,
                top_k=0,
                top_p=1.0,
                pad_token_id=pad,
                stopping_criteria=StoppingCriteriaList([Progress(args.progress_every, time.time())]),
            )

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    run([prompts[0][:16]], 4)  # warm-up
    sync()
    print(f"model ready in {time.time() - began:.1f} s", flush=True)
    start = time.time()
    generated = 0
    for i in range(0, len(prompts), batch):
        chunk_out = outputs[i:i + batch]
        run(prompts[i:i + batch], max(chunk_out))
        generated += max(chunk_out) * len(chunk_out)
        sync()
        done = sum(outputs[:i + batch])
        print(f"{min(i + batch, len(prompts))} sequences done, {done} output tokens "
              f"in {time.time() - start:.1f} s", flush=True)
    sync()
    seconds = time.time() - start
    result = {
        "engine": "transformers generate (bf16, sdpa, left-padded batches)",
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "num_seqs": len(prompts),
        "batch_size": batch,
        "prompt_tokens": sum(len(p) for p in prompts),
        "output_tokens": sum(outputs),
        "generated_tokens_including_padding_waste": generated,
        "seconds": seconds,
        "output_tok_s": sum(outputs) / seconds,
    }
    json.dump(result, open(args.json, "w"), indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
