#!/usr/bin/env python3
"""Write reference outputs from `transformers` that the Rust forward pass is tested against.

For the trained tiny-shakespeare model and for a few tiny random checkpoints
(each differing from it where implementations tend to go wrong), this writes
`models/fixtures/<name>.json` with, per prompt: the prompt ids, the greedy
continuation, the top-1/top-2 logit gap of every greedy step, and the full
last-position logits of the prefill. The random checkpoints themselves are
written to `models/fixtures/<name>/` as ordinary Hugging Face folders.

Everything is computed on CPU in float32 with eager attention, one thread, from
fixed seeds, so a rerun reproduces every file bit for bit:

    python3 tools/reference_outputs.py

tools/README.md describes the JSON format.
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch

FORMAT_VERSION = 1
GREEDY_TOKENS = 32
# A greedy step whose top two logits are closer than MIN_GAP is a near-tie: a
# correct implementation could pick either token, so no prompt may contain one.
# Prompts whose every step clears PREFERRED_GAP are chosen when one exists, which
# leaves room for lower-precision (bf16) kernels to still agree on the tokens.
MIN_GAP = 1e-3
PREFERRED_GAP = 1e-2
MAX_POSITIONS = 2048
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# The random checkpoints. Each is small (2 layers, hidden 128) and each changes
# something the trained model does not exercise: the head size, the grouping of
# KV heads (one shared head, or none shared), heads whose total width differs
# from the hidden size, an untied lm_head, a large RoPE base, attention biases,
# and the absence of q/k norms (Llama, Qwen2).
RANDOM_MODELS = [
    {
        "name": "qwen3-hd32-kv1-untied",
        "purpose": "Qwen3 with head_dim 32, one KV head for 4 query heads (MQA), "
                   "untied lm_head, rope_theta 1e6",
        "arch": "qwen3", "seed": 101,
        "hidden": 128, "heads": 4, "kv_heads": 1, "head_dim": 32, "intermediate": 256,
        "layers": 2, "tie": False, "rope_theta": 1_000_000.0,
    },
    {
        "name": "qwen3-hd64-mha-wide",
        "purpose": "Qwen3 with KV heads equal to query heads (no grouping), head_dim 64 "
                   "so that heads*head_dim (256) differs from hidden_size (128), tied embeddings",
        "arch": "qwen3", "seed": 102,
        "hidden": 128, "heads": 4, "kv_heads": 4, "head_dim": 64, "intermediate": 256,
        "layers": 2, "tie": True, "rope_theta": 10_000.0,
    },
    {
        "name": "llama-gqa",
        "purpose": "Llama (no q/k norm), GQA 4 query heads over 2 KV heads, head_dim 32, "
                   "tied embeddings, rope_theta 5e5",
        "arch": "llama", "seed": 103,
        "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "intermediate": 256,
        "layers": 2, "tie": True, "rope_theta": 500_000.0,
    },
    {
        "name": "qwen2-bias",
        "purpose": "Qwen2 (biases on q/k/v projections, no q/k norm), GQA 4 over 2, "
                   "head_dim 32, tied embeddings, rope_theta 1e6",
        "arch": "qwen2", "seed": 104,
        "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "intermediate": 256,
        "layers": 2, "tie": True, "rope_theta": 1_000_000.0,
    },
    # Long-context RoPE scaling and the other families. The original context of each scaled
    # model is short (128-512 positions) so that the prompts, up to 2,048 tokens, reach far
    # past it, where the scaled and unscaled frequencies part.
    {
        "name": "llama31-rope-llama3",
        "purpose": "Llama 3.1's RoPE scaling (rope_type llama3, factor 8, low/high frequency "
                   "factors 1/4, original context 256), untied lm_head, GQA 4 over 2",
        "arch": "llama", "seed": 105,
        "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "intermediate": 256,
        "layers": 2, "tie": False, "rope_theta": 500_000.0,
        "rope": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
    },
    {
        "name": "llama32-tied-llama3",
        "purpose": "Llama 3.2's layout: tied embeddings and llama3 RoPE scaling with factor 32 "
                   "(original context 128), head_dim 64, GQA 4 over 1",
        "arch": "llama", "seed": 106,
        "hidden": 128, "heads": 4, "kv_heads": 1, "head_dim": 64, "intermediate": 256,
        "layers": 2, "tie": True, "rope_theta": 500_000.0,
        "rope": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
    },
    {
        "name": "qwen3-yarn",
        "purpose": "Qwen3 with YaRN (factor 4, original context 512, beta 32/1, attention "
                   "factor 0.1 ln 4 + 1 on cos/sin), head_dim 32, GQA 4 over 2",
        "arch": "qwen3", "seed": 107,
        "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "intermediate": 256,
        "layers": 2, "tie": True, "rope_theta": 1_000_000.0,
        "rope": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    },
    {
        "name": "qwen25-yarn",
        "purpose": "Qwen2.5 (q/k/v biases) with YaRN factor 4 over an original context of 512, "
                   "untied lm_head",
        "arch": "qwen2", "seed": 108,
        "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "intermediate": 256,
        "layers": 2, "tie": False, "rope_theta": 1_000_000.0,
        "rope": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    },
    {
        "name": "mistral-linear",
        "purpose": "MistralForCausalLM (no sliding window) with linear RoPE scaling (position "
                   "interpolation, factor 2), GQA 4 over 2, untied lm_head",
        "arch": "mistral", "seed": 109,
        "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "intermediate": 256,
        "layers": 2, "tie": False, "rope_theta": 1_000_000.0,
        "rope": {"rope_type": "linear", "factor": 2.0},
    },
]


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, ".."))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default=os.path.join(root, "models", "tiny-shakespeare"),
                   help="the trained model folder (also the source of the tokenizer files)")
    p.add_argument("--out", default=os.path.join(root, "models", "fixtures"))
    p.add_argument("--data", default=os.path.normpath(os.path.join(root, "..", "shared", "data", "tinyshakespeare.txt")),
                   help="the corpus; long prompts are cut from its validation part")
    p.add_argument("--only", default="",
                   help="comma-separated names of the random checkpoints to (re)write; "
                        "the trained model's fixture is then left as it is")
    return p.parse_args()


def make_config(spec, vocab, eos):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab,
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=spec["tie"],
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    if spec["arch"] == "qwen3":
        cls, extra = Qwen3Config, dict(head_dim=spec["head_dim"], attention_bias=False, use_sliding_window=False)
    elif spec["arch"] == "llama":
        cls, extra = LlamaConfig, dict(head_dim=spec["head_dim"], attention_bias=False, mlp_bias=False)
    elif spec["arch"] == "mistral":
        from transformers import MistralConfig
        cls, extra = MistralConfig, dict(head_dim=spec["head_dim"], sliding_window=None)
    elif spec["arch"] == "qwen2":
        # Qwen2 has no head_dim setting: it is always hidden_size / heads.
        assert spec["hidden"] // spec["heads"] == spec["head_dim"]
        cls, extra = Qwen2Config, dict(use_sliding_window=False)
    else:
        raise ValueError(spec["arch"])
    theta = spec["rope_theta"]
    rope = dict(spec.get("rope", {"rope_type": "default"}))
    try:
        return cls(rope_parameters={**rope, "rope_theta": theta}, **common, **extra)
    except TypeError:
        scaling = None if rope["rope_type"] == "default" else rope
        return cls(rope_theta=theta, rope_scaling=scaling, **common, **extra)


def randomise(model, seed):
    """Overwrite every parameter from one seeded generator, in name order, so the
    checkpoint depends on nothing but the seed. The scales are far above a
    normal initialisation on purpose: a default-initialised random model gives
    nearly flat logits, and then greedy decoding is decided by rounding noise.
    Large weights and norm scales spread between 0.5 and 1.5 make the logits
    peaked, so top-1 and top-2 are well apart and a mismatch means a real bug."""
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    for name in sorted(params):
        p = params[name]
        with torch.no_grad():
            if p.dim() == 1 and name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif p.dim() == 1:  # attention biases (Qwen2)
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def normalise_config(path):
    """Write both spellings of the keys that changed between transformers 4 and 5,
    as the training script does for the trained model."""
    with open(path) as f:
        cfg = json.load(f)
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = cfg.get("rope_theta", rp.get("rope_theta"))
    rp["rope_type"] = rp.get("rope_type", rp.pop("type", "default"))
    rp["rope_theta"] = theta
    cfg["rope_theta"] = theta
    cfg["rope_parameters"] = rp
    # transformers 4 reads the scaling from `rope_scaling` (theta stays outside it).
    scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    cfg["rope_scaling"] = None if rp["rope_type"] == "default" else scaling
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def write_random_checkpoint(spec, tok_dir, out_dir, vocab, eos_ids):
    from transformers import AutoModelForCausalLM

    config = make_config(spec, vocab, eos_ids[0])
    model = AutoModelForCausalLM.from_config(config)
    randomise(model, spec["seed"])
    model = model.to(torch.bfloat16)
    try:
        model.config.dtype = torch.bfloat16
    except Exception:
        model.config.torch_dtype = torch.bfloat16
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    normalise_config(os.path.join(out_dir, "config.json"))
    for f in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(tok_dir, f), os.path.join(out_dir, f))
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": None, "eos_token_id": eos_ids, "pad_token_id": eos_ids[0]}, f, indent=2)
        f.write("\n")


def load_reference_model(path):
    """The bf16 checkpoint as saved, widened to float32, with eager attention:
    the plainest and most deterministic form of the computation."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, attn_implementation="eager")
    return model.float().eval()


@torch.no_grad()
def run_case(model, prompt_ids):
    """Prefill the prompt, then decode GREEDY_TOKENS tokens one at a time through
    the KV cache, the way a serving engine does. Never stops early on EOS, so
    every case has the same number of tokens to compare."""
    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    logits = out.logits[0, -1].float()
    last_logits = logits.clone()
    past = out.past_key_values
    greedy, gaps = [], []
    for i in range(GREEDY_TOKENS):
        top = torch.topk(logits, 2)
        nxt = int(top.indices[0])
        greedy.append(nxt)
        gaps.append(float(top.values[0] - top.values[1]))
        if i + 1 < GREEDY_TOKENS:
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            logits = out.logits[0, -1].float()
            past = out.past_key_values
    return last_logits, greedy, gaps


def f32_json(values):
    """Floats as the shortest decimal that reads back as the same f32, whether a
    reader parses it straight to f32 or, as serde_json does, to f64 and then
    narrows. Checked here for every value rather than assumed."""
    out = []
    for v in np.asarray(values, dtype=np.float32):
        d = float(str(v))  # numpy prints the shortest digits that identify the f32
        assert np.float32(d) == v, (d, v)
        out.append(d)
    return out


def dump_fixture(fixture, path):
    """JSON with one line per field of each case: compact (the logits stay on a
    single line) yet diffs name the case and field that changed."""
    lines = ["{"]
    for k, v in fixture.items():
        if k != "cases":
            lines.append(f" {json.dumps(k)}: {json.dumps(v)},")
    lines.append(' "cases": [')
    for i, case in enumerate(fixture["cases"]):
        fields = [f"   {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in case.items()]
        lines.append("  {\n" + ",\n".join(fields) + "\n  }" + ("," if i + 1 < len(fixture["cases"]) else ""))
    lines.append(" ]")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == fixture
    with open(path, "w") as f:
        f.write(text)


def prompt_cases(tok, text, chat_template_fn, eos_id):
    """The prompts, each as an ordered list of candidates: the first whose greedy
    steps all clear PREFERRED_GAP is used, else the one with the widest gap. Long prompts come from the validation
    tenth of the corpus (text the trained model never saw)."""
    ids = tok.encode(text).ids
    val_start = int(0.9 * len(ids))

    def passage(offset, length):
        # Later candidates shift the window along by a few tokens.
        starts = [val_start + offset + 17 * k for k in range(40)]
        return [ids[s:s + length] for s in starts]

    def texts(*options):
        return [tok.encode(t).ids for t in options]

    romeo = tok.encode("ROMEO:\n").ids
    return [
        ("single-token", [c for c in texts("KING", "Thou", "What", "First") if len(c) == 1]),
        ("short", texts("ROMEO:", "JULIET:", "HAMLET:")),
        ("sentence", texts("First Citizen:\nBefore we proceed any further, hear me speak.\n",
                           "MENENIUS:\nWhy, masters, my good friends, mine honest neighbours,\n")),
        ("passage-200", passage(100, 200)),
        ("passage-700", passage(5000, 700)),
        ("chat", [chat_template_fn([{"role": "user", "content": c}]) for c in (
            "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
            "KING RICHARD II:\nLet's talk of graves, of worms, and epitaphs.",
            "HAMLET:\nTo be, or not to be, that is the question.")]),
        ("chat-two-turns", [chat_template_fn([
            {"role": "user", "content": "First Citizen:\nWe are accounted poor citizens."},
            {"role": "assistant", "content": "MENENIUS:\nWhat work's, my countrymen, in hand?"},
            {"role": "user", "content": u}]) for u in (
                "Second Citizen:\nOur business is not unknown to the senate.",
                "First Citizen:\nCare for us! True, indeed!",
                "Second Citizen:\nWe'll hear Menenius.")]),
        ("eos-separated", [p[:120] + [eos_id] + romeo for p in passage(2000, 120)]),
        # Prompt plus continuation fill the context exactly: positions 0..2047.
        ("near-limit", passage(9000, MAX_POSITIONS - GREEDY_TOKENS)),
    ]


def write_fixture(name, model_path, models_root, out_path, cases, purpose, tok):
    model = load_reference_model(model_path)
    records = []
    for case_name, candidates in cases:
        chosen = None
        for cand in candidates:
            assert len(cand) + GREEDY_TOKENS <= MAX_POSITIONS
            result = (cand,) + run_case(model, cand)
            if chosen is None or min(result[3]) > min(chosen[3]):
                chosen = result
            if min(result[3]) >= PREFERRED_GAP:
                break
        if min(chosen[3]) < MIN_GAP:
            raise SystemExit(f"{name}/{case_name}: every candidate prompt has a near-tie")
        cand, last_logits, greedy, gaps = chosen
        records.append({
            "name": case_name,
            "prompt_len": len(cand),
            "prompt_text": tok.decode(cand, skip_special_tokens=False),
            "prompt_ids": cand,
            "greedy_ids": greedy,
            "greedy_text": tok.decode(greedy, skip_special_tokens=False),
            "greedy_top2_gaps": f32_json(gaps),
            "min_gap": f32_json([min(gaps)])[0],
            "last_logits": f32_json(last_logits.numpy()),
        })
        print(f"  {name}/{case_name}: {len(cand)} prompt tokens, min gap {min(gaps):.4f}", flush=True)
    fixture = {
        "format": FORMAT_VERSION,
        "model": name,
        "model_dir": os.path.relpath(model_path, models_root).replace(os.sep, "/"),
        "purpose": purpose,
        "reference": "transformers, CPU, float32 compute from the bf16 checkpoint, eager attention, "
                     "KV-cached greedy decoding without stopping at EOS",
        "greedy_tokens": GREEDY_TOKENS,
        "vocab_size": int(model.config.vocab_size),
        "cases": records,
    }
    dump_fixture(fixture, out_path)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(args.model_dir)

    def chat(messages):
        text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tok.encode(text).ids

    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    eos = tok.token_to_id("<|endoftext|>")
    eos_ids = [eos, tok.token_to_id("<|im_end|>")]
    cases = prompt_cases(tok, text, chat, eos)
    os.makedirs(args.out, exist_ok=True)
    models_root = os.path.dirname(os.path.abspath(args.out))

    only = {n for n in args.only.split(",") if n}
    unknown = only - {spec["name"] for spec in RANDOM_MODELS}
    if unknown:
        raise SystemExit(f"--only names no random checkpoint: {sorted(unknown)}")
    name = os.path.basename(os.path.normpath(args.model_dir))
    if not only:
        print(f"{name}:", flush=True)
        write_fixture(name, os.path.abspath(args.model_dir), models_root,
                      os.path.join(args.out, f"{name}.json"), cases, "the trained default model", tok)

    # The random models use fewer, cheaper prompts but keep the context-limit one.
    wanted = {"short", "chat", "passage-200", "near-limit"}
    small_cases = [c for c in cases if c[0] in wanted]
    for spec in RANDOM_MODELS:
        if only and spec["name"] not in only:
            continue
        folder = os.path.join(args.out, spec["name"])
        write_random_checkpoint(spec, args.model_dir, folder, tok.get_vocab_size(), eos_ids)
        print(f"{spec['name']}:", flush=True)
        write_fixture(spec["name"], os.path.abspath(folder), models_root,
                      os.path.join(args.out, f"{spec['name']}.json"), small_cases, spec["purpose"], tok)


if __name__ == "__main__":
    main()
