"""PyTorch side of the training-throughput benchmark (issue 4 §7).

A GPT-2-style model (Hugging Face GPT2LMHeadModel: d=384, 6 layers, 6 heads,
vocabulary 256, 256 positions, no dropout) trained on random byte batches of
B=8, T=256 with AdamW: one step = forward + loss + backward + optimizer step.
Warm-up steps are excluded from the timing. Prints one JSON line.

With --dtype bf16 the forward and the loss run under torch.autocast("cpu",
dtype=torch.bfloat16): PyTorch's mixed precision, the matrix products (and so their
backward) in bf16, with f32 master weights and AdamW in f32, as qkv's --dtype bf16.

Usage: python train_tokens_per_sec_torch.py [--threads 2] [--warmup 2] [--steps 5]
       [--dtype f32|bf16]
"""

import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = p.parse_args()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq,
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(0)
    total = args.warmup + args.steps
    data = torch.randint(0, args.vocab, (total, args.batch, args.seq + 1), generator=gen)

    def step(s: int) -> float:
        ids, targets = data[s, :, :-1], data[s, :, 1:]
        with autocast:
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, args.vocab), targets.reshape(-1)
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    for s in range(args.warmup):
        step(s)
    t0 = time.perf_counter()
    for s in range(args.warmup, total):
        loss = step(s)
    elapsed = time.perf_counter() - t0
    tokens = args.steps * args.batch * args.seq
    print(
        json.dumps(
            {
                "impl": "pytorch",
                "torch": torch.__version__,
                "attn_implementation": model.config._attn_implementation,
                "threads": args.threads,
                "dtype": args.dtype,
                "timed_steps": args.steps,
                "seconds": elapsed,
                "tokens_per_sec": tokens / elapsed,
                "last_loss": loss,
            }
        )
    )


if __name__ == "__main__":
    main()
