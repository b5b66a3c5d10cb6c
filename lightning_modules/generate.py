"""`python -m lightning_modules.generate --ckpt PATH --prompt TEXT`: text from a trained checkpoint, streamed.

The checkpoint is the training module's Lightning checkpoint: "hyper_parameters" holds "arch" (ModelConfig
fields) and "attention" (AttentionConfig fields), "state_dict" the decoder's weights under "model.", and
"datamodule_hyper_parameters" the "data_dir" the run read. The tokenizer is the one that run used, found
through that directory's manifest.json ("tokenizer": file name relative to data_dir, "eot_id").
Documents in the shards are each preceded by the end-of-text token (data/manifest.py), so the prompt is too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch
from tokenizers import Tokenizer

from lightning_modules import precision
from lightning_modules.attention import AttentionConfig
from lightning_modules.config import ConfigError, ModelConfig
from lightning_modules.generation import Sampling, check_lengths, generate
from lightning_modules.transformer import Transformer

STATE_PREFIX = "model."  # the LightningModule holds the decoder as self.model
COMPILED_PREFIX = "_orig_mod."  # torch.compile's wrapper, when the run compiled the model


class GenerateError(RuntimeError):
    """A checkpoint, manifest or tokenizer that cannot be used; the message names the file."""


def _config(cls: type, value: Any, where: str) -> Any:
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise GenerateError(f"{where}: expected a dict of {cls.__name__} fields, got {type(value).__name__}")
    return cls(**value)


def load_model(
    ckpt_path: str | Path, device: torch.device | str = "cpu"
) -> tuple[Transformer, dict[str, Any]]:
    """The decoder of a Lightning checkpoint, in eval mode on `device`, and the checkpoint dict."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise GenerateError(f"{path}: no such checkpoint file (--ckpt)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)  # our own file: configs are dicts
    except Exception as exc:  # torch raises several types for a corrupt or foreign file
        raise GenerateError(f"{path}: cannot read the checkpoint ({type(exc).__name__}: {exc})") from exc
    try:
        hp = ckpt["hyper_parameters"]
        model_cfg = _config(ModelConfig, hp["arch"], f"{path}: hyper_parameters.arch")
        attention_cfg = _config(AttentionConfig, hp["attention"], f"{path}: hyper_parameters.attention")
        state = ckpt["state_dict"]
    except KeyError as exc:
        raise GenerateError(
            f"{path}: not a training checkpoint of this project (no {exc.args[0]!r})"
        ) from exc
    except (TypeError, ConfigError) as exc:
        raise GenerateError(f"{path}: bad model config in hyper_parameters ({exc})") from exc
    model = Transformer(model_cfg, attention_cfg)
    weights = {
        k.removeprefix(STATE_PREFIX).replace(COMPILED_PREFIX, ""): v
        for k, v in state.items()
        if k.startswith(STATE_PREFIX)
    }
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise GenerateError(f"{path}: weights do not fit the config in the checkpoint ({exc})") from exc
    return model.to(device).eval(), ckpt


def load_tokenizer(data_dir: str | Path) -> tuple[Tokenizer, int]:
    """The run's tokenizer and end-of-text id, through <data_dir>/manifest.json."""
    manifest_path = Path(data_dir) / "manifest.json"
    if not manifest_path.is_file():
        raise GenerateError(
            f"{manifest_path}: no data manifest; pass --data-dir with the directory the run was trained on "
            "(it holds manifest.json and the tokenizer)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        tokenizer_path = Path(data_dir) / manifest["tokenizer"]
        eot_id = int(manifest["eot_id"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise GenerateError(f"{manifest_path}: malformed manifest ({type(exc).__name__}: {exc})") from exc
    if not tokenizer_path.is_file():
        raise GenerateError(f"{tokenizer_path}: tokenizer named by {manifest_path} is missing")
    try:
        return Tokenizer.from_file(str(tokenizer_path)), eot_id
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise GenerateError(f"{tokenizer_path}: cannot load tokenizer ({exc})") from exc


class TextStream:
    """Prints the text of the new tokens as they come. Decoding the whole sequence and printing the new suffix
    (rather than decoding tokens one by one) keeps multi-token characters and merges right; a suffix that ends
    inside a UTF-8 character (U+FFFD) waits for the next token."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], out: TextIO) -> None:
        self.tokenizer, self.prompt_ids, self.out = tokenizer, prompt_ids, out
        self.base = tokenizer.decode(prompt_ids)
        self.ids: list[int] = []
        self.emitted = ""

    def _continuation(self) -> str:
        full = self.tokenizer.decode(self.prompt_ids + self.ids)
        return full[len(self.base) :] if full.startswith(self.base) else self.tokenizer.decode(self.ids)

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self._continuation()
        if not text.endswith("\ufffd"):
            self._emit(text)

    def close(self) -> None:
        self._emit(self._continuation())
        self.out.write("\n")
        self.out.flush()

    def _emit(self, text: str) -> None:
        new = text[len(self.emitted) :] if text.startswith(self.emitted) else text
        if new:
            self.out.write(new)
            self.out.flush()
        self.emitted = text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_modules.generate",
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
        check_lengths(model, len(prompt_ids), args.max_new_tokens)  # before any text is printed
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
    except (GenerateError, ValueError) as exc:
        sys.stdout.flush()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    print(f"[{len(new)} new tokens in {seconds:.2f} s, {len(new) / seconds:.1f} tokens/s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
