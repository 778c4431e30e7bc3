#!/usr/bin/env python3
"""Train nano-serving's embedded default model on the tiny Shakespeare corpus.

The result is an ordinary Hugging Face model folder (Qwen3 architecture, bf16
safetensors, a byte-level BPE tokenizer with a chat template) that the Rust
engine loads as its default model and that `transformers` loads unchanged.

Typical use (one GPU, about five minutes):

    python3 tools/train_tiny_model.py --out models/tiny-shakespeare

and a quick CPU check that the whole pipeline works end to end:

    python3 tools/train_tiny_model.py --smoke --out /tmp/tiny-smoke
"""

import argparse
import copy
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Listed in this order the trainer gives them ids 0, 1 and 2.
SPECIAL_TOKENS = [EOS, IM_START, IM_END]

# The Jinja chat template stored in tokenizer_config.json. It is deliberately the
# plainest ChatML form (no system-prompt default, no tool calls) so that a small
# template engine on the Rust side renders it exactly as `transformers` does.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    default_data = os.path.normpath(os.path.join(here, "..", "..", "shared", "data", "tinyshakespeare.txt"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=default_data, help="the tiny Shakespeare text file")
    p.add_argument("--out", default=os.path.join(here, "..", "models", "tiny-shakespeare"))
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--max-minutes", type=float, default=4.5, help="wall-clock budget, whole script")
    p.add_argument("--smoke", action="store_true", help="a few tiny steps on CPU to test the pipeline")
    p.add_argument("--seed", type=int, default=1234)
    # Tokenizer and model shape.
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=768)
    # Optimisation. The corpus is tiny (~390k tokens), so regularisation and
    # stopping on validation loss matter far more than raw step count.
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr-scale", type=float, default=0.01, help="stop once the LR has decayed below lr*this")
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", default="0.1,0.2,0.3",
                   help="embedding and residual-branch dropout; a comma list trains one model per rate")
    p.add_argument("--attn-dropout", type=float, default=0.1)
    p.add_argument("--chat-fraction", type=float, default=0.15,
                   help="share of training windows drawn from chat-formatted speech pairs")
    p.add_argument("--max-steps", type=int, default=20000)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--patience", type=int, default=4,
                   help="evaluations without a new best before the LR is cut")
    p.add_argument("--lr-cut", type=float, default=0.3, help="factor applied to the LR on a plateau")
    p.add_argument("--val-windows", type=int, default=0, help="limit validation to this many windows (0: all)")
    args = p.parse_args()
    if args.smoke:
        # Same architecture and tokenizer as the real run; only the amount of work shrinks.
        args.device = args.device or "cpu"
        args.seq_len = 64
        args.batch_size = 4
        args.max_steps = 6
        args.eval_every = 3
        args.warmup_steps = 2
        args.val_windows = 4
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def train_tokenizer(text, vocab_size):
    """Byte-level BPE in the GPT-2/Qwen mould: every byte is in the base alphabet,
    so any input encodes, and decoding ids gives the exact original bytes."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps character offsets untouched; the post-processor adds no tokens.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer=trainer, length=1)
    return tok


def tokenizer_config(tok):
    """The tokenizer_config.json that `transformers` and the Rust engine read for
    the special tokens and the chat template. Written by hand so that its content
    does not depend on which `transformers` version saves it."""
    added = {}
    for t in SPECIAL_TOKENS:
        added[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False, "special": True,
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "additional_special_tokens": [IM_START, IM_END],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }


def speeches(text):
    """The corpus is a run of speeches "NAME:\\nlines" separated by blank lines."""
    return [s.strip() for s in text.split("\n\n") if s.strip()]


def chat_stream(tok, text):
    """Turn consecutive speeches into one-exchange chats (a speech as the user's
    turn, the reply as the assistant's). A share of training windows comes from
    this stream so that the chat markers mean something to the model and it
    learns to close its turn with <|im_end|>."""
    sp = speeches(text)
    convs = [
        f"{IM_START}user\n{sp[i]}{IM_END}\n{IM_START}assistant\n{sp[i + 1]}{IM_END}\n{EOS}"
        for i in range(len(sp) - 1)
    ]
    ids = []
    for enc in tok.encode_batch(convs):
        ids.extend(enc.ids)
    return np.array(ids, dtype=np.int64)


def build_model(args, vocab_size):
    from transformers import AutoModelForCausalLM, Qwen3Config

    kw = dict(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        attention_dropout=args.attn_dropout,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=0,
    )
    # transformers 5 keeps RoPE settings in `rope_parameters`; 4.x takes `rope_theta`.
    try:
        config = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **kw)
    except TypeError:
        config = Qwen3Config(rope_theta=10000.0, **kw)
    attn = "sdpa"
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    except (TypeError, ValueError):
        config._attn_implementation = attn
        model = AutoModelForCausalLM.from_config(config)
    return model


def add_dropout_hooks(model, p):
    """Qwen3 has no residual or embedding dropout of its own (only attention
    dropout), and a few-million-parameter model memorises a 390k-token corpus in
    seconds. Forward hooks add nanoGPT-style dropout on the embeddings and on each
    residual branch during training only; they leave the saved architecture and
    the inference-time computation unchanged."""
    if p <= 0:
        return []

    def drop_tensor(module, inputs, output):
        return F.dropout(output, p, module.training)

    def drop_first(module, inputs, output):
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, module.training),) + tuple(output[1:])
        return F.dropout(output, p, module.training)

    inner = model.model
    handles = [inner.embed_tokens.register_forward_hook(drop_tensor)]
    for layer in inner.layers:
        handles.append(layer.self_attn.register_forward_hook(drop_first))
        handles.append(layer.mlp.register_forward_hook(drop_tensor))
    return handles


def lm_loss(model, batch):
    """Next-token cross-entropy over a (B, T+1) batch of token windows."""
    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, windows, device, amp, batch_size):
    """Mean loss over fixed, non-overlapping windows: every evaluation sees the
    same tokens, so successive numbers are directly comparable."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        b = windows[i:i + batch_size].to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp):
            loss = lm_loss(model, b)
        total += loss.item() * b.shape[0]
        count += b.shape[0]
    model.train()
    return total / max(count, 1)


def fixed_windows(ids, seq_len, limit=0):
    n = (len(ids) - 1) // seq_len
    w = torch.stack([torch.from_numpy(ids[i * seq_len:i * seq_len + seq_len + 1]) for i in range(n)])
    return w[:limit] if limit else w


def save_folder(model, tok, out, meta):
    os.makedirs(out, exist_ok=True)
    model.config.attention_dropout = 0.0  # dropout is a training-time setting only
    model = model.to(torch.bfloat16)
    try:
        model.config.dtype = torch.bfloat16
    except Exception:
        model.config.torch_dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    normalise_config(os.path.join(out, "config.json"))
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tok), f, indent=2)
        f.write("\n")
    eos, im_end = tok.token_to_id(EOS), tok.token_to_id(IM_END)
    gen = {
        "bos_token_id": None,
        # <|im_end|> closes a chat turn, <|endoftext|> closes a document.
        "eos_token_id": [eos, im_end],
        "pad_token_id": eos,
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 50,
        "max_new_tokens": 256,
    }
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "training_log.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


def normalise_config(path):
    """Write both spellings of the two keys that changed between transformers 4
    and 5 (`torch_dtype`/`dtype`, top-level `rope_theta`/`rope_parameters`), so
    that readers written against either convention find what they expect."""
    with open(path) as f:
        cfg = json.load(f)
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    rp = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rp.get("rope_theta", 10000.0))
    cfg["rope_theta"] = theta
    cfg["rope_parameters"] = {"rope_type": rp.get("rope_type", "default"), "rope_theta": theta}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def main():
    args = parse_args()
    t_start = time.time()
    deadline = t_start + args.max_minutes * 60
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    amp = device.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    print(f"device={device} amp_bf16={amp} torch={torch.__version__}", flush=True)

    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    tok = train_tokenizer(text, args.vocab_size)
    vocab = tok.get_vocab_size()
    ids = np.array(tok.encode(text).ids, dtype=np.int64)
    assert tok.decode(ids.tolist()) == text, "byte-level BPE must round-trip the corpus"
    split = int(0.9 * len(ids))
    train_ids, val_ids = ids[:split], ids[split:]
    # Chats are built from each side's own text, so no validation speech leaks into training.
    train_chat = chat_stream(tok, tok.decode(train_ids.tolist()))
    val_chat = chat_stream(tok, tok.decode(val_ids.tolist()))
    print(f"vocab={vocab} tokens={len(ids)} train={len(train_ids)} val={len(val_ids)} "
          f"chat_train={len(train_chat)} chat_val={len(val_chat)} "
          f"chars/token={len(text) / len(ids):.2f}", flush=True)

    data = {
        "train": torch.from_numpy(train_ids),
        "chat": torch.from_numpy(train_chat),
        "val": fixed_windows(val_ids, args.seq_len, args.val_windows),
        "val_chat": fixed_windows(val_chat, args.seq_len, args.val_windows),
    }
    # A short list of dropout rates is tried one after the other (each a fresh
    # model from the same seed, each with an equal share of the time left) and
    # the lowest validation loss wins. How much regularisation a corpus this
    # small needs is hard to guess, and one pass costs only about a minute.
    rates = [float(r) for r in str(args.dropout).split(",")]
    runs = []
    winner = None
    for i, rate in enumerate(rates):
        share = (deadline - time.time() - 20) / (len(rates) - i)
        print(f"run {i + 1}/{len(rates)}: dropout {rate}, up to {share / 60:.2f} min", flush=True)
        result = train_one(args, vocab, data, device, amp, rate, time.time() + share)
        state = result.pop("state")
        runs.append(result)
        if state is not None and (winner is None or result["best"]["val_loss"] < winner[0]["best"]["val_loss"]):
            winner = (result, state)
    result, state = winner
    print(f"kept dropout {result['dropout']}: best val {result['best']['val_loss']:.4f} "
          f"at step {result['best']['step']}", flush=True)

    model = build_model(args, vocab)
    model.load_state_dict(state)
    n_params = sum(p.numel() for p in model.parameters())
    device_name = torch.cuda.get_device_name(0) if amp else "cpu"
    meta = {
        "seed": args.seed,
        "device": device_name,
        "args": {k: v for k, v in vars(args).items() if k not in ("data", "out")},
        "parameters": n_params,
        "tokens": {"total": int(len(ids)), "train": int(len(train_ids)), "val": int(len(val_ids)),
                   "chat_train": int(len(train_chat)), "chat_val": int(len(val_chat))},
        "kept": {k: v for k, v in result.items() if k != "history"},
        "total_minutes": round((time.time() - t_start) / 60, 2),
        "runs": runs,
    }
    save_folder(model, tok, args.out, meta)
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(f"saved {args.out} ({size / 1e6:.2f} MB) in {(time.time() - t_start) / 60:.2f} min total", flush=True)


def train_one(args, vocab, data, device, amp, dropout, deadline):
    """Train one model from the fixed seed; return its best weights and its log."""
    torch.manual_seed(args.seed)
    model = build_model(args, vocab).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters={n_params} ({n_params / 1e6:.2f} M, embeddings tied)", flush=True)
    add_dropout_hooks(model, dropout)
    model.train()

    # Decay matrices only; norm weights are scales that should stay near 1.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kw = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), **opt_kw,
    )

    train_t, chat_t = data["train"], data["chat"]
    gen = torch.Generator().manual_seed(args.seed)
    n_chat = round(args.batch_size * args.chat_fraction)
    offsets = torch.arange(args.seq_len + 1)

    def sample_batch():
        # Random windows of the training stream (fresh offsets every step: cheap
        # data augmentation), with a fixed number of rows from the chat stream.
        a = torch.randint(0, len(train_t) - args.seq_len - 1, (args.batch_size - n_chat, 1), generator=gen)
        rows = [train_t[a + offsets]]
        if n_chat:
            c = torch.randint(0, len(chat_t) - args.seq_len - 1, (n_chat, 1), generator=gen)
            rows.append(chat_t[c + offsets])
        return torch.cat(rows).to(device, non_blocking=True)

    # Plateau schedule: after warm-up the LR stays flat while validation loss
    # improves; after `patience` evaluations without a new best the weights and
    # optimiser go back to the best point and the LR is cut. Training stops when
    # the LR has been cut below lr*min_lr_scale, at max_steps, or at the budget.
    # This needs no guess of how many steps the corpus can take before overfitting.
    lr_scale = 1.0
    best = {"val_loss": math.inf, "step": 0}
    best_state = None
    since_best = 0
    history = []
    step = 0
    stop_reason = "max_steps"
    recent = []
    t_train = time.time()
    while step < args.max_steps:
        if time.time() > deadline:
            stop_reason = "time budget"
            break
        warm = min(1.0, (step + 1) / max(args.warmup_steps, 1))
        lr = args.lr * lr_scale * warm
        for g in opt.param_groups:
            g["lr"] = lr
        batch = sample_batch()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp):
            loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        recent.append(loss.detach())
        if step % args.eval_every == 0 or step == args.max_steps:
            train_loss = torch.stack(recent).mean().item()
            recent = []
            val = evaluate(model, data["val"], device, amp, 64)
            val_chat = evaluate(model, data["val_chat"], device, amp, 64)
            elapsed = time.time() - t_train
            history.append({"step": step, "train_loss": round(train_loss, 4), "val_loss": round(val, 4),
                            "val_chat_loss": round(val_chat, 4), "lr": float(f"{lr:.3g}"),
                            "seconds": round(elapsed, 1)})
            mark = ""
            if val < best["val_loss"] - 1e-4:
                best = {"val_loss": round(val, 4), "step": step, "val_chat_loss": round(val_chat, 4),
                        "train_loss": round(train_loss, 4)}
                best_state = ({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                              copy.deepcopy(opt.state_dict()))
                since_best = 0
                mark = " *best*"
            else:
                since_best += 1
            print(f"step {step:5d}  train {train_loss:.4f}  val {val:.4f}  val_chat {val_chat:.4f}  "
                  f"lr {lr:.2e}  {elapsed:6.1f}s{mark}", flush=True)
            if since_best >= args.patience:
                lr_scale *= args.lr_cut
                if lr_scale < args.min_lr_scale:
                    stop_reason = "validation loss stopped improving"
                    break
                model.load_state_dict(best_state[0])
                opt.load_state_dict(best_state[1])
                since_best = 0
                print(f"  plateau: back to step {best['step']}, lr scale now {lr_scale:.3g}", flush=True)
    seconds = time.time() - t_train
    print(f"stopped after {step} steps ({stop_reason}), {seconds / 60:.2f} min; "
          f"best val {best['val_loss']:.4f} at step {best['step']}", flush=True)
    return {
        "dropout": dropout,
        "steps_run": step,
        "stop_reason": stop_reason,
        "train_minutes": round(seconds / 60, 2),
        "best": best,
        "history": history,
        "state": best_state[0] if best_state is not None else None,
    }


if __name__ == "__main__":
    main()
