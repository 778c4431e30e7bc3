#!/usr/bin/env python3
"""Write a random checkpoint of a real architecture in the Hugging Face hub's layout.

Start-up time is measured on files laid out as a user downloads them: several
`model-0000K-of-0000N.safetensors` shards of about 4 GiB with a
`model.safetensors.index.json`, bf16, the config copied verbatim, and a
tokenizer beside them. The values are random (drawn on the GPU when there is
one): only the layout and the size matter here.

    python3 tools/random_checkpoint.py configs/qwen3-8b.json /tmp/qwen3-8b \\
        --tokenizer-from models/tiny-shakespeare
"""

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

SHARD_BYTES = 4 << 30


def tensor_shapes(c):
    """Every tensor of a Llama/Qwen/Mistral decoder, in the hub's naming."""
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    d = c.get("head_dim") or h // heads
    inter, vocab = c["intermediate_size"], c["vocab_size"]
    qwen2 = c.get("model_type") == "qwen2"
    out = [("model.embed_tokens.weight", (vocab, h))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}"
        out += [(f"{p}.input_layernorm.weight", (h,)),
                (f"{p}.self_attn.q_proj.weight", (heads * d, h)),
                (f"{p}.self_attn.k_proj.weight", (kv * d, h)),
                (f"{p}.self_attn.v_proj.weight", (kv * d, h)),
                (f"{p}.self_attn.o_proj.weight", (h, heads * d))]
        if qwen2 or c.get("attention_bias"):
            out += [(f"{p}.self_attn.q_proj.bias", (heads * d,)),
                    (f"{p}.self_attn.k_proj.bias", (kv * d,)),
                    (f"{p}.self_attn.v_proj.bias", (kv * d,))]
        if c.get("model_type") == "qwen3":
            out += [(f"{p}.self_attn.q_norm.weight", (d,)), (f"{p}.self_attn.k_norm.weight", (d,))]
        out += [(f"{p}.post_attention_layernorm.weight", (h,)),
                (f"{p}.mlp.gate_proj.weight", (inter, h)),
                (f"{p}.mlp.up_proj.weight", (inter, h)),
                (f"{p}.mlp.down_proj.weight", (h, inter))]
    out.append(("model.norm.weight", (h,)))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (vocab, h)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("out")
    p.add_argument("--tokenizer-from", help="a model folder whose tokenizer files are copied")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(args.seed)
    shards, current, size = [], {}, 0
    for name, shape in tensor_shapes(config):
        std = 1.0 / shape[1] ** 0.5 if len(shape) == 2 else 0.02
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std
        if name.endswith("norm.weight"):
            t += 1.0
        t = t.to(torch.bfloat16).cpu()
        if current and size + t.numel() * 2 > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += t.numel() * 2
    shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(args.out, file), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = file
            total += t.numel() * 2
        print(f"{file}: {len(shard)} tensors", flush=True)
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    shutil.copyfile(args.config, os.path.join(args.out, "config.json"))
    if args.tokenizer_from:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(args.tokenizer_from, name), os.path.join(args.out, name))
    print(f"{args.out}: {total / 2**30:.2f} GiB in {len(shards)} shards")


if __name__ == "__main__":
    main()
