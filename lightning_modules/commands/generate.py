"""`python -m lightning_modules generate --ckpt PATH --prompt TEXT`: text from a trained checkpoint, streamed.

The checkpoint is the training module's Lightning checkpoint: "hyper_parameters" holds "arch" (ModelConfig
fields) and "attention" (AttentionConfig fields), "state_dict" the decoder's weights under "model.", and
"datamodule_hyper_parameters" the "data_dir" the run read. The tokenizer is the one that run used, found
through that directory's manifest.json ("tokenizer": file name relative to data_dir, "eot_id").
Documents in the shards are each preceded by the end-of-text token (data/manifest.py), so the prompt is too.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from lightning_modules.core import precision
from lightning_modules.core.errors import run_entry
from lightning_modules.generation.checkpoint import GenerateError, load_model
from lightning_modules.generation.loop import Sampling, check_lengths, generate
from lightning_modules.generation.text import TextStream, load_tokenizer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules generate",
        description="Generate text from a training checkpoint with a KV cache (every attention kind).",
    )
    parser.add_argument("--ckpt", required=True, help="Lightning checkpoint (.ckpt) written by training")
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument(
        "--max-new-tokens", type=int, default=200, help="stop after this many tokens (default 200)"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="softmax temperature (0: greedy)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--greedy", action="store_true", help="always take the most likely token")
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampler (default: random)")
    parser.add_argument(
        "--data-dir", default=None, help="data directory (default: the checkpoint's data_dir)"
    )
    parser.add_argument("--ignore-eot", action="store_true", help="do not stop at the end-of-text token")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    precision.add_flag(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_entry(lambda: _generate(args), "generate")


def _generate(args: argparse.Namespace) -> int:
    device = torch.device(
        args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    )
    try:
        sampling = Sampling(args.temperature, args.top_k, args.greedy)
        model, ckpt = load_model(args.ckpt, device)
        model = model.to(precision.weights_dtype(args.precision, device))
        data_dir = args.data_dir or (ckpt.get("datamodule_hyper_parameters") or {}).get("data_dir")
        if data_dir is None:
            raise GenerateError(f"{args.ckpt}: no datamodule_hyper_parameters.data_dir; pass --data-dir")
        tokenizer, eot_id = load_tokenizer(data_dir)
        if tokenizer.get_vocab_size() > model.config.vocab_size:
            raise GenerateError(
                f"tokenizer in {data_dir} has {tokenizer.get_vocab_size()} tokens, the model "
                f"{model.config.vocab_size}: not the tokenizer this checkpoint was trained with"
            )
        prompt_ids = [eot_id] + tokenizer.encode(args.prompt).ids
        check_lengths(model, len(prompt_ids), args.max_new_tokens, added=1)  # before any text is printed
        sys.stdout.write(args.prompt)
        stream = TextStream(tokenizer, prompt_ids, sys.stdout)
        start = time.perf_counter()
        new = generate(
            model,
            prompt_ids,
            args.max_new_tokens,
            sampling,
            eot_id=None if args.ignore_eot else eot_id,
            seed=args.seed,
            on_token=stream,
        )
        stream.close()
    except ValueError as exc:  # bad sampling options or lengths: reported like every anticipated failure
        raise GenerateError(str(exc)) from exc
    seconds = time.perf_counter() - start
    print(f"[{len(new)} new tokens in {seconds:.2f} s, {len(new) / seconds:.1f} tokens/s]", file=sys.stderr)
    return 0
