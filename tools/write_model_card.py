#!/usr/bin/env python3
"""Write models/tiny-shakespeare/README.md, the model card, from the saved folder.

Every figure comes from the folder's config.json and training_log.json, and
every sample is generated here, on CPU, from the committed bf16 weights, so the
card always describes the weights that sit beside it:

    python3 tools/write_model_card.py
"""

import argparse
import json
import os

import torch

SAMPLE_SEED = 0
TEMPERATURE = 0.8
TOP_K = 50


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default=os.path.join(here, "..", "models", "tiny-shakespeare"))
    p.add_argument("--data", default=os.path.normpath(os.path.join(here, "..", "..", "shared", "data", "tinyshakespeare.txt")),
                   help="the corpus (only its length is read, for the card)")
    return p.parse_args()


@torch.no_grad()
def generate(model, ids, n, stop_ids, sample):
    """Greedy, or temperature + top-k sampling from a seeded generator. Written
    out here rather than through `generate()` so that the samples in the card
    do not depend on a library's default generation settings."""
    gen = torch.Generator().manual_seed(SAMPLE_SEED)
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    new = []
    for _ in range(n):
        logits = out.logits[0, -1].float()
        if sample:
            top = torch.topk(logits / TEMPERATURE, TOP_K)
            pick = torch.multinomial(torch.softmax(top.values, -1), 1, generator=gen)
            nxt = int(top.indices[pick])
        else:
            nxt = int(torch.argmax(logits))
        new.append(nxt)
        if nxt in stop_ids:
            break
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return new


def main():
    args = parse_args()
    torch.set_num_threads(1)
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = args.model_dir
    cfg = json.load(open(os.path.join(d, "config.json")))
    log = json.load(open(os.path.join(d, "training_log.json")))
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(d)
    try:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16)
    model = model.float().eval()

    eos, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    prompt = tok.encode("ROMEO:").ids
    greedy = tok.decode(prompt + generate(model, prompt, 60, {eos}, sample=False))
    sampled = tok.decode(prompt + generate(model, prompt, 160, {eos}, sample=True))
    question = "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?"
    chat_text = hf_tok.apply_chat_template([{"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True)
    chat_ids = tok.encode(chat_text).ids
    reply = tok.decode(generate(model, chat_ids, 120, {eos, im_end}, sample=True), skip_special_tokens=False)

    question_shown = question.replace("\n", "\\n")
    n_chat = round(log["args"]["batch_size"] * log["args"]["chat_fraction"])
    kept = log["kept"]
    best = kept["best"]
    a = log["args"]
    tokens = log["tokens"]
    n_params = log["parameters"]
    weights_mb = os.path.getsize(os.path.join(d, "model.safetensors")) / 1e6
    with open(args.data, encoding="utf-8") as f:
        n_chars = len(f.read())
    sweep = "\n".join(
        f"| {r['dropout']} | {r['steps_run']} | {r['best']['step']} | {r['best']['val_loss']:.4f} | "
        f"{r['train_minutes']:.2f} |" for r in log["runs"])
    # Approximate: assumes the validation text has the corpus-wide characters per token.
    nats_per_char = best["val_loss"] * tokens["total"] / n_chars

    card = f"""# tiny-shakespeare

The embedded default model of nano-serving: a {n_params / 1e6:.1f} M-parameter
causal language model with the Qwen3 architecture, trained from scratch on the
tiny Shakespeare corpus. It is small enough to commit ({weights_mb:.1f} MB of bf16
weights) and to run on any CPU, and it exercises every part of a modern decoder
that the engine implements: RMSNorm, RoPE, grouped-query attention, per-head
q/k RMSNorm, a SwiGLU MLP and tied embeddings. It writes Shakespeare-flavoured
nonsense; it is a test and teaching model, not a useful one.

## Architecture

| setting | value |
| --- | --- |
| architecture | `{cfg['architectures'][0]}` (`model_type` `{cfg['model_type']}`) |
| layers | {cfg['num_hidden_layers']} |
| hidden size | {cfg['hidden_size']} |
| query heads / KV heads | {cfg['num_attention_heads']} / {cfg['num_key_value_heads']} (grouped-query attention) |
| head dim | {cfg['head_dim']} |
| MLP intermediate size | {cfg['intermediate_size']} (SwiGLU, SiLU) |
| vocabulary | {cfg['vocab_size']} (byte-level BPE) |
| max positions | {cfg['max_position_embeddings']} |
| RoPE theta | {cfg['rope_theta']:g} |
| RMSNorm epsilon | {cfg['rms_norm_eps']:g} |
| q/k norm | yes (Qwen3) |
| attention biases | no |
| embeddings | tied (`lm_head` reuses `model.embed_tokens.weight`; the file holds no `lm_head.weight`) |
| parameters | {n_params:,} |
| weights | `model.safetensors`, bfloat16, {weights_mb:.2f} MB |

## Tokenizer

Byte-level BPE trained with the `tokenizers` library on the whole corpus:
ByteLevel pre-tokenizer (GPT-2 split pattern, no prefix space), ByteLevel
decoder, no normaliser, {cfg['vocab_size']} tokens in all. Three special tokens:
`<|endoftext|>` (id {eos}, end of text, also used as padding), `<|im_start|>`
(id {tok.token_to_id('<|im_start|>')}) and `<|im_end|>` (id {im_end}). There is no BOS token.
`tokenizer_config.json` holds the ChatML chat template:
`<|im_start|>{{role}}\\n{{content}}<|im_end|>\\n` per message, and
`<|im_start|>assistant\\n` as the generation prompt. `generation_config.json`
stops on either `<|endoftext|>` or `<|im_end|>`.

## Data

The tiny Shakespeare corpus ({n_chars:,} characters), {tokens['total']:,} tokens
({n_chars / tokens['total']:.2f} characters a token). The token stream is split
90/10: the first {tokens['train']:,} tokens train, the last {tokens['val']:,}
validate. {n_chat} of the {a['batch_size']} rows of each training batch come from a second stream in which
consecutive speeches of the training text are framed as one-exchange chats
(the first speech as the user's turn, the reply as the assistant's, closed by
`<|im_end|>`), so that the chat markers mean something to the model; the same
framing of the validation text gives the chat validation loss below.

## Training

Trained on one NVIDIA H100 in bf16 autocast, seed {log['seed']}. Windows of
{a['seq_len']} tokens at random offsets, batches of {a['batch_size']}, AdamW
(betas 0.9/0.95, weight decay {a['weight_decay']} on matrices), peak learning
rate {a['lr']:g} after {a['warmup_steps']} warm-up steps, gradient clipping at 1.0,
attention dropout {a['attn_dropout']} and dropout on the embeddings and on each
residual branch. The corpus is small enough that the model memorises it within
a minute, so training is driven by validation loss, evaluated on the whole
validation split every {a['eval_every']} steps: after {a['patience']} evaluations
without a new best the weights go back to the best point and the learning rate
is cut by {a['lr_cut']}; a run ends once the rate would fall below {a['min_lr_scale']:g} of the
peak. {len(log['runs'])} dropout rates were each trained this way from the same seed, and
the run with the lowest validation loss was kept:

| dropout | steps run | best step | best validation loss | minutes |
| --- | --- | --- | --- | --- |
{sweep}

The kept model (dropout {kept['dropout']}) is the checkpoint of step {best['step']}:
**validation loss {best['val_loss']:.4f} nats/token** (perplexity
{torch.exp(torch.tensor(best['val_loss'])).item():.1f}, about {nats_per_char:.2f} nats a character),
chat validation loss {best['val_chat_loss']:.4f}; the training loss (with dropout on) was
{best['train_loss']:.4f} then. The whole script, tokenizer training and all {len(log['runs'])} runs, took
{log['total_minutes']:.1f} minutes. `training_log.json` holds every evaluation.

## Samples

Generated by `tools/write_model_card.py` on CPU from the weights in this folder.

Greedy, from `ROMEO:` (60 tokens):

```text
{greedy}
```

Sampled (temperature {TEMPERATURE}, top-k {TOP_K}, seed {SAMPLE_SEED}), from `ROMEO:` (160 tokens):

```text
{sampled}
```

Chat (same sampling), user message `{question_shown}`, reply up to `<|im_end|>`:

```text
{reply}
```

## Files

`config.json`, `model.safetensors`, `generation_config.json`, `tokenizer.json`,
`tokenizer_config.json`, `training_log.json`, this card. `config.json` spells
both the transformers 4 and 5 forms of two keys: `torch_dtype` and `dtype`,
and `rope_theta` beside `rope_parameters`.

## Retraining

```sh
python3 tools/train_tiny_model.py --out models/tiny-shakespeare   # about 4 minutes on one H100
python3 tools/write_model_card.py                                  # this card, with fresh samples
python3 tools/reference_outputs.py                                 # the test fixtures in models/fixtures
```

GPU training is not bit-for-bit reproducible, so a retrained model differs from
this one and the fixtures must be regenerated with it. `tools/README.md` has the
details; `python3 tools/train_tiny_model.py --smoke --out /tmp/tiny-smoke` checks
the pipeline on a CPU in a few minutes.
"""
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write(card)
    print(card)


if __name__ == "__main__":
    main()
