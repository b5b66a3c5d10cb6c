"""Cached decoding: equal to the full forward for every attention, with caches as small as the cost model
says, absorbed / exact paths equal to their plainer references, and FLOPs as lightning_modules/costs/counts.py counts them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lightning_modules.commands.generate import main
from lightning_modules.costs import counts as costs
from lightning_modules.generation.checkpoint import GenerateError, load_model
from lightning_modules.generation.loop import Sampling, generate
from lightning_modules.generation.text import load_tokenizer
from lightning_modules.model.attention import names, resolve
from lightning_modules.model.attention.cache import LayerCache, caches_nbytes
from lightning_modules.model.config import ModelConfig
from lightning_modules.model.transformer import Transformer
from tests.helpers import KINDS, attn, nano_model
from tests.model.helpers import build, decode_all, make_checkpoint, tokens

VARIANTS = [(k, {}) for k in KINDS] + [
    ("lrkv", {"lrkv_path": "materialized"}),
    ("mla", {"q_latent_dim": 24}),
    ("gqa", {"n_kv_heads": 1}),
]


@pytest.mark.parametrize("kind,knobs", VARIANTS)
@pytest.mark.parametrize("chunks", [[11], [7, 5], []], ids=["prefill", "chunked-prefill", "steps-only"])
def test_cached_decode_equals_full_forward(kind: str, knobs: dict, chunks: list[int]) -> None:
    net = build(kind, **knobs)
    toks = tokens()
    with torch.no_grad():
        full = net(toks)
    assert full.std() > 0.3  # logits of a size where a 1e-4 error would be a real error
    torch.testing.assert_close(decode_all(net, toks, chunks), full, atol=1e-4, rtol=0)


def test_last_only_gives_the_last_row() -> None:
    net = build("lrkv")
    toks = tokens(length=20)
    with torch.no_grad():
        full = net(toks)
        last = net.decode(toks, net.new_caches(2, 20), last_only=True)
    assert last.shape == (2, 1, full.shape[-1])
    torch.testing.assert_close(last, full[:, -1:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind,knobs", VARIANTS)
def test_measured_cache_bytes_equal_the_cost_model(kind: str, knobs: dict) -> None:
    """A bf16 generation's caches hold exactly kv_cache_bytes_per_token x tokens (cost model: bf16)."""
    net = build(kind, **knobs).to(torch.bfloat16)
    m, a = net.config, net.attention_config
    n_tokens, batch = 24, 2
    toks = tokens(batch, n_tokens)
    caches = net.new_caches(batch, n_tokens)
    with torch.no_grad():
        net.decode(toks[:, :8], caches)
        for t in range(8, n_tokens):
            net.decode(toks[:, t : t + 1], caches)
    assert all(b.dtype == torch.bfloat16 for c in caches for b in c.buffers.values())
    assert caches_nbytes(caches) == costs.kv_cache_bytes_per_token(m, a) * n_tokens * batch
    resolved = resolve(m, a)
    per_layer = resolved.variant.cache_elements_per_token(m, resolved.knobs)
    assert all(c.elements_per_token() == per_layer for c in caches)
    if kind != costs.BASELINE:  # no variant but mha holds full per-head K/V
        assert caches_nbytes(caches) < costs.mha_cache_bytes_per_token(m) * n_tokens * batch


def test_lrkv_materialized_reference_holds_mha_sized_cache() -> None:
    net = build("lrkv")
    caches = net.new_caches(1, 10, path="materialized")
    assert caches_nbytes(caches) == 10 * costs.mha_cache_bytes_per_token(net.config) * 4 // 2  # fp32: 4 bytes


@pytest.mark.parametrize("knobs", [{}, {"q_latent_dim": 24}])
def test_mla_absorbed_equals_rebuilt(knobs: dict) -> None:
    net = build("mla", **knobs)
    toks = tokens()
    absorbed = decode_all(net, toks, [9], path="absorbed")
    rebuilt = decode_all(net, toks, [9], path="rebuilt")
    torch.testing.assert_close(absorbed, rebuilt, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lrkv_path", ["factorized", "materialized"])
def test_lrkv_exact_equals_materialised_per_head_kv(lrkv_path: str) -> None:
    net = build("lrkv", lrkv_path=lrkv_path)
    toks = tokens()
    exact = decode_all(net, toks, [9], path="absorbed")
    materialised = decode_all(net, toks, [9], path="materialized")
    torch.testing.assert_close(exact, materialised, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind,knobs", VARIANTS)
def test_decode_flops_equal_torch_flop_counter(kind: str, knobs: dict) -> None:
    """One decode step at context S counted by torch equals costs.decode_flops_per_token(S).

    The counter sees nothing of the default CPU SDPA kernel (docs/costs.md), so the step runs under the
    math backend, which it counts in full. LRKV's exact path mixes values itself (explicit matmuls) and is
    visible either way. Norms, RoPE, softmax and the embedding lookup are not counted by either side.
    """
    m, a = nano_model(), attn(kind, **knobs)
    torch.manual_seed(0)
    net = Transformer(m, a).eval()
    context = 100
    toks = torch.randint(0, m.vocab_size, (1, context))
    counter = FlopCounterMode(display=False)
    with torch.no_grad():
        caches = net.new_caches(1, context)
        net.decode(toks[:, :-1], caches)
        with sdpa_kernel(SDPBackend.MATH), counter:
            net.decode(toks[:, -1:], caches)
    assert counter.get_total_flops() == pytest.approx(costs.decode_flops_per_token(m, a, context), rel=0.01)


def test_cache_rejects_overflow_and_unknown_path() -> None:
    net = build("gqa")
    caches = net.new_caches(1, 4)
    with torch.no_grad():
        net.decode(tokens(1, 4), caches)
        with pytest.raises(ValueError, match="cache full: 4 positions held \\+ 1 new > max_len 4"):
            net.decode(tokens(1, 1), caches)
    with pytest.raises(
        ValueError, match="decode path 'absorbed' not offered by attention 'gqa'; allowed: kv"
    ):
        net.new_caches(1, 4, path="absorbed")


def test_caches_are_not_stored_on_the_model() -> None:
    """Two generations with their own caches interleave without interfering."""
    net = build("mla")
    a, b = tokens(1, 12, seed=2), tokens(1, 12, seed=3)
    ca, cb = net.new_caches(1, 12), net.new_caches(1, 12)
    with torch.no_grad():
        out_a = [net.decode(a[:, :4], ca)]
        out_b = [net.decode(b[:, :4], cb)]
        for t in range(4, 12):
            out_a.append(net.decode(a[:, t : t + 1], ca))
            out_b.append(net.decode(b[:, t : t + 1], cb))
        torch.testing.assert_close(torch.cat(out_a, 1), net(a), atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.cat(out_b, 1), net(b), atol=1e-4, rtol=0)
    assert isinstance(ca[0], LayerCache) and not any(isinstance(v, LayerCache) for v in vars(net).values())


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generation_equals_argmax_over_full_forwards(kind: str) -> None:
    """The cached loop picks the same tokens as re-running the whole sequence each step."""
    net = build(kind)
    prompt = tokens(1, 5)[0].tolist()
    new = generate(net, prompt, 20, Sampling(greedy=True))
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(20):
            logits = net(torch.tensor([seq]))[0, -1, : net.config.vocab_size]
            seq.append(int(logits.argmax()))
    assert new == seq[len(prompt) :]


def test_sampling_is_seeded_and_top_k_one_is_greedy() -> None:
    net = build("mla")
    prompt = [3, 1, 4]
    a = generate(net, prompt, 15, Sampling(temperature=1.0), seed=7)
    assert a == generate(net, prompt, 15, Sampling(temperature=1.0), seed=7)
    assert generate(net, prompt, 15, Sampling(top_k=1), seed=1) == generate(
        net, prompt, 15, Sampling(greedy=True)
    )
    assert all(0 <= t < net.config.vocab_size for t in a)


def test_generation_stops_at_eot_and_at_the_context() -> None:
    net = build("gqa")
    first = generate(net, [5, 6], 10, Sampling(greedy=True))
    assert generate(net, [5, 6], 10, Sampling(greedy=True), eot_id=first[2]) == first[:3]
    with pytest.raises(
        ValueError, match=r"prompt \(2 tokens\) \+ max_new_tokens \(63\) exceeds .* seq_len=64"
    ):
        generate(net, [5, 6], 63)
    with pytest.raises(ValueError, match="top_k=0"):
        Sampling(top_k=0)


def test_cli_streams_text_and_respects_max_new_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, data_dir = make_checkpoint(tmp_path)
    args = [
        "--ckpt",
        str(ckpt),
        "--prompt",
        "To be, or",
        "--max-new-tokens",
        "12",
        "--greedy",
        "--ignore-eot",
        "--precision",
        "fp32",  # the reference below runs in fp32; bf16 rounding could pick other greedy tokens
    ]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out.startswith("To be, or") and len(out.strip()) > len("To be, or")
    assert re.search(r"\[12 new tokens in ", err), err
    model, _ = load_model(ckpt)
    tokenizer, eot = load_tokenizer(data_dir)
    prompt = [eot] + tokenizer.encode("To be, or").ids
    expected = tokenizer.decode(generate(model, prompt, 12, Sampling(greedy=True)))
    assert out == "To be, or" + expected + "\n"
    assert main(args) == 0  # greedy: the same text again
    assert capsys.readouterr().out == out


def test_cli_sampling_with_seed_repeats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt, _ = make_checkpoint(tmp_path, kind="mla")
    args = ["--ckpt", str(ckpt), "--prompt", "All the", "--max-new-tokens", "8", "--temperature", "0.8"]
    assert main([*args, "--top-k", "20", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert main([*args, "--top-k", "20", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first


def test_cli_errors_name_the_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt, data_dir = make_checkpoint(tmp_path)
    assert main(["--ckpt", str(tmp_path / "nope.ckpt"), "--prompt", "x"]) == 2
    assert "nope.ckpt: no such checkpoint file" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--ckpt", str(ckpt), "--prompt", "x", "--data-dir", str(empty)]) == 2
    assert f"{empty / 'manifest.json'}: no data manifest" in capsys.readouterr().err
    assert main(["--ckpt", str(ckpt), "--prompt", "x", "--max-new-tokens", "500"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "exceeds the model's context seq_len=32" in err
    (data_dir / "tokenizer.json").unlink()
    assert main(["--ckpt", str(ckpt), "--prompt", "x"]) == 2
    assert "tokenizer.json: tokenizer named by" in capsys.readouterr().err
    bad = tmp_path / "bad.ckpt"
    torch.save({"state_dict": {}}, bad)
    with pytest.raises(
        GenerateError, match="not a training checkpoint of this project \\(no 'hyper_parameters'\\)"
    ):
        load_model(bad)


def test_checkpoint_of_a_compiled_model_loads(tmp_path: Path) -> None:
    ckpt_path, _ = make_checkpoint(tmp_path)
    ckpt = torch.load(ckpt_path, weights_only=False)
    ckpt["state_dict"] = {
        k.replace("model.", "model._orig_mod.", 1): v for k, v in ckpt["state_dict"].items()
    }
    torch.save(ckpt, ckpt_path)
    model, _ = load_model(ckpt_path)
    assert isinstance(model.config, ModelConfig) and model.attention_config.kind == "lrkv"


@pytest.mark.slow
def test_decode_benchmark_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/decode.py at nano with tiny settings: every attention, the fields BENCHMARKS.md reads."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "decode.py"
    spec = importlib.util.spec_from_file_location("decode_benchmark", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tiny = ["--size", "nano", "--context", "16", "--steps", "2", "--repeats", "1", "--check-tokens", "24",
            "--precision", "fp32"]  # fmt: skip
    bench.main([*tiny, "--attention", "lrkv"])  # markdown, with its peak-memory child process
    bench.main([*tiny, "--json", "--no-memory"])
    out = capsys.readouterr().out
    assert "| lrkv-r8 |" in out
    rows = json.loads(out[out.index("\n[") + 1 :])
    assert [r["attention"] for r in rows] == list(names())
    for r in rows:
        assert r["measured_cache_bytes"] == r["formula_cache_bytes"] == r["cache_bytes_per_token"] * 24
        assert r["run_cache_bytes"] == 4 * r["cache_bytes_per_token"] * 16 // 2  # fp32 caches of 16 positions
        assert r["max_abs_logit_diff_vs_full"] < 1e-4 and r["tokens_per_s"] > 0 and r["context"] == 16
        assert r["step_bytes"] == r["run_cache_bytes"] + r["weights_bytes"]
        assert r["flop_per_byte"] == pytest.approx(r["step_flops"] / r["step_bytes"])
        # The default path's count is the cost model's (batch 1 here): counted and formula agree.
        assert r["step_flops"] == pytest.approx(r["decode_flops_per_token"], rel=0.01)
    bench.main([*tiny, "--json", "--no-memory", "--attention", "lrkv", "mla", "--all-paths"])
    out = capsys.readouterr().out
    rows = {r["arm"]: r for r in json.loads(out)}
    assert list(rows) == ["lrkv", "lrkv:rebuilt", "lrkv:materialized", "mla", "mla:rebuilt"]
    assert rows["lrkv:rebuilt"]["arm_label"] == "lrkv-r8 (rebuilt)"
    # Each arm reads its own path's cache: the rebuilt one holds no 1 / rms, the materialised one MHA's K/V.
    per_position = {arm: r["run_cache_bytes"] // (4 * 16) for arm, r in rows.items()}  # fp32, 16 positions
    m = nano_model()
    assert per_position["lrkv"] == per_position["lrkv:rebuilt"] + m.n_layer * m.n_head
    assert per_position["lrkv:materialized"] == m.n_layer * 2 * m.n_head * m.head_dim
