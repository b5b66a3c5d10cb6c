"""Are a training step's loss and gradients bitwise repeatable on this CPU, per precision and thread count?

    python benchmarks/determinism.py --threads 1 2 --repeats 3 --batch 16 --seq-len 256

One nano lrkv model, one fixed batch: forward + backward `repeats` times for each thread count, under fp32
and under bf16 autocast (bf16-mixed's kernels). Prints the loss and a hash of all gradients per repeat, and
whether each precision gave one result across every repeat and thread count.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json

import torch

from lightning_modules.core.fragments import fragment
from lightning_modules.model.attention import AttentionConfig, resolve_attention
from lightning_modules.model.config import load_model_config
from lightning_modules.model.transformer import Transformer


def step_digest(model: Transformer, batch: torch.Tensor, bf16: bool) -> tuple[float, str]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(
            batch[:, :-1], targets=batch[:, 1:]
        )  # the training loss (lightning_modules/model/loss.py)
    loss.backward()
    grads = b"".join(p.grad.float().numpy().tobytes() for p in model.parameters() if p.grad is not None)
    return float(loss), hashlib.sha256(grads).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    a = p.parse_args(argv)
    nano = load_model_config([fragment("model", "nano")])[0]  # its attention_defaults: conf/model/nano.yaml
    arch = dataclasses.replace(nano, vocab_size=a.vocab, seq_len=a.seq_len)
    attention = resolve_attention(arch, AttentionConfig(kind="lrkv"))
    torch.manual_seed(0)
    model = Transformer(arch, attention)
    batch = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=torch.Generator().manual_seed(1))
    rows = []
    for precision in ("fp32", "bf16"):
        for threads in a.threads:
            torch.set_num_threads(threads)
            for repeat in range(a.repeats):
                loss, digest = step_digest(model, batch, precision == "bf16")
                rows.append(
                    {
                        "precision": precision,
                        "threads": threads,
                        "repeat": repeat,
                        "loss": loss,
                        "grads": digest,
                    }
                )
                print(json.dumps(rows[-1]))
    for precision in ("fp32", "bf16"):
        results = {(r["loss"], r["grads"]) for r in rows if r["precision"] == precision}
        print(
            f"{precision}: {'bitwise repeatable' if len(results) == 1 else f'{len(results)} different results'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
