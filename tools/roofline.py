"""The memory floor of a `nanoserve bench` run's decode steps, next to what the run measured.

A decode step must at least read every weight once and every running sequence's K/V once, so
its floor is (weight bytes + K/V bytes) / the device's copy bandwidth (bytes read plus written
by a large device-to-device copy, measured on the same machine). This script replays the
workload written by `nanoserve bench --workload-out`, assuming what the run reports when it
says `preemptions: 0`: every sequence is admitted at the start and decodes one token a step
until its length is reached. Decode step j then reads the K/V of every sequence still running,
(prompt + j) tokens each.

    python3 tools/roofline.py --config configs/qwen3-0.6b.json --workload workload.json \
        --bench bench.json --bandwidth-gbs 3030
"""

import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the model's config.json")
    ap.add_argument("--workload", required=True, help="JSON from nanoserve bench --workload-out")
    ap.add_argument("--bench", help="JSON from nanoserve bench --json (the measured run)")
    ap.add_argument("--bandwidth-gbs", type=float, required=True, help="measured copy bandwidth, GB/s")
    ap.add_argument("--bytes-per-value", type=int, default=2, help="2 for bf16 weights and KV")
    args = ap.parse_args()

    c = json.load(open(args.config))
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    layers, kv_heads, hidden = c["num_hidden_layers"], c["num_key_value_heads"], c["hidden_size"]
    q_heads, inter, vocab = c["num_attention_heads"], c["intermediate_size"], c["vocab_size"]
    per_layer = (
        hidden * (q_heads + 2 * kv_heads) * head_dim  # q, k, v projections
        + q_heads * head_dim * hidden  # o projection
        + 3 * hidden * inter  # gate, up, down
    )
    # The lm_head is read every step; the embedding table only a row per token.
    weights = (layers * per_layer + vocab * hidden) * args.bytes_per_value
    kv_per_token = layers * 2 * kv_heads * head_dim * args.bytes_per_value

    requests = json.load(open(args.workload))["requests"]
    prompts = [len(r["prompt_ids"]) for r in requests]
    outputs = [r["max_tokens"] for r in requests]
    bandwidth = args.bandwidth_gbs * 1e9
    # The first output token comes from prefill; decode steps make the rest.
    steps = max(outputs) - 1
    kv_bytes = [
        sum((p + j) * kv_per_token for p, o in zip(prompts, outputs) if o - 1 > j)
        for j in range(steps)
    ]
    floor_s = sum(weights + b for b in kv_bytes) / bandwidth
    print(f"weights read per step: {weights / 1e9:.2f} GB; K/V per token: {kv_per_token} bytes")
    print(f"decode steps: {steps}; K/V read over the run: {sum(kv_bytes) / 1e12:.2f} TB")
    print(f"decode floor at {args.bandwidth_gbs:.0f} GB/s: {floor_s:.2f} s in all, "
          f"{floor_s / steps * 1e3:.2f} ms a step on average")
    print(f"output tokens over the decode floor: {sum(outputs) / floor_s:.0f} tok/s (an upper bound: "
          "prefill adds its own time)")
    if args.bench:
        b = json.load(open(args.bench))
        measured = b["mean_decode_step_ms"]
        print(f"measured: mean decode step {measured:.2f} ms = "
              f"{measured / (floor_s / steps * 1e3):.2f}x the floor; "
              f"{b['output_tok_s']:.0f} output tok/s over {b['seconds']:.2f} s")


if __name__ == "__main__":
    main()
