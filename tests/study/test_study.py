"""The study runner: protocols and identities, the claim rule, and the must-show behaviour on a micro protocol
(first invocation runs every run, the second none, a deleted run runs again alone, a killed run resumes)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lightning_modules.commands.run_study import main as study_main
from lightning_modules.core import precision
from lightning_modules.core.errors import ConfigError
from lightning_modules.reporting.report import last_attempt_s
from lightning_modules.study import protocol as protocols
from lightning_modules.study.claims import CHECKPOINT_DIR, HEARTBEAT, Store
from tests.conftest import TINY_SEQ_LEN
from tests.study.helpers import MICRO_FLOPS, micro_protocol, started_runs

ROOT = Path(__file__).resolve().parents[2]


# ----- protocols and identities (no training) ------------------------------------------------------------
def test_protocol_runs_labels_and_identities(tiny_shards: Path, tmp_path: Path) -> None:
    p = protocols.load(micro_protocol(tmp_path, tiny_shards))
    assert p.name == "micro" and p.labels == ("mha", "lrkv-r4") and p.seeds == (1, 2)
    assert [(r.label, r.seed) for r in p.runs] == [("mha", 1), ("lrkv-r4", 1), ("mha", 2), ("lrkv-r4", 2)]
    assert len({r.identity for r in p.runs}) == 4
    run = p.runs[1]
    fields = run.identity_fields()
    assert fields == {"protocol": "micro", "size": "nano", "arm": "lrkv-r4", "seed": "1",
                      "budget": "flops=3e+10", "data": protocols.manifest_hash(tiny_shards)}  # fmt: skip
    tags = run.tags()
    assert tags["study.identity"] == run.identity and tags["attention_label"] == "lrkv-r4"
    assert tags["knob.rank"] == "4" and tags["seed"] == "1"
    args = run.cli_args()
    assert args[args.index("--model.attention.rank") + 1] == "4"
    assert args[args.index("--seed_everything") + 1] == "1"
    assert args[args.index("--model.budget.flops") + 1] == "30000000000.0"
    # The budget is part of the identity: a protocol with another budget names other runs.
    other = protocols.load(micro_protocol(tmp_path, tiny_shards, budget=2 * MICRO_FLOPS))
    assert {r.identity for r in other.runs}.isdisjoint({r.identity for r in p.runs})


def test_shipped_protocols_load_with_the_sizes_labels() -> None:
    if not (ROOT / "artifacts/shakespeare/manifest.json").exists():
        pytest.skip("needs the Shakespeare shards (make data)")
    cwd = os.getcwd()
    os.chdir(ROOT)  # the data fragments name data_dir relative to the repository, as main.py reads them
    try:
        cpu = protocols.load(ROOT / "conf/study/cpu.yaml")
        cache = protocols.load(ROOT / "conf/study/cpu-cache.yaml")
        gpu = protocols.load(ROOT / "conf/study/gpu-small.yaml")
    finally:
        os.chdir(cwd)
    assert len(cpu.runs) == 25 and len(cpu.seeds) >= 5 and len(cache.seeds) >= 3 and len(gpu.seeds) >= 3
    from lightning_modules.costs import counts as costs

    by_label = {r.label: costs.kv_cache_bytes_per_token(r.model, r.attention) for r in cache.runs}
    assert by_label["gqa-g2"] == by_label["mla-c224"]  # cache-matched exactly
    # lrkv's absorbed decode also caches each head's QK-norm key scale: one bf16 value per head, layer and token
    arch = cache.runs[0].model
    assert by_label["lrkv-r16"] == by_label["gqa-g2"] + 2 * arch.n_head * arch.n_layer
    assert (
        by_label["mqa"] < by_label["lrkv-r4"] < by_label["lrkv-r8"] < by_label["lrkv-r32"] < by_label["mha"]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("seeds: [1, 1]", "seeds must be distinct"),
        ("budget: {}", "`budget` is required"),
        ("bogus: 1", "unknown fields ['bogus']"),
        ("arms: [{kind: mha}, {kind: mha}]", "two arms with the label 'mha'"),
        ("arms: [{kind: nope}]", "unknown attention 'nope'"),
        ("arms: [{kind: gqa, rank: 4}]", "attention.rank is not used by attention kind 'gqa'"),
    ],
)
def test_bad_protocols_fail_naming_the_field(
    tiny_shards: Path, tmp_path: Path, change: str, message: str
) -> None:
    path = micro_protocol(tmp_path, tiny_shards)
    key = change.split(":")[0]
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(key + ":")]
    path.write_text("\n".join([*lines, change]) + "\n")
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
    ):
        protocols.load(path)


def test_fit_settings_may_not_override_what_the_runner_sets(tiny_shards: Path, tmp_path: Path) -> None:
    path = micro_protocol(tmp_path, tiny_shards, extra="  seed_everything: 3\n")
    with pytest.raises(ConfigError, match="fit.seed_everything is set by the study runner"):
        protocols.load(path)


# ----- the claim rule ------------------------------------------------------------------------------------
def test_one_claim_wins_when_two_runners_create_at_once(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str
) -> None:
    spec = protocols.load(micro_protocol(tmp_path, tiny_shards)).runs[0]
    a, b = Store(mlflow_uri, "micro", settle_s=1.0), Store(mlflow_uri, "micro", settle_s=1.0)
    won: dict[str, object] = {}
    threads = [threading.Thread(target=lambda s=s, k=k: won.__setitem__(k, s._claim_new(spec))) for k, s in
               (("a", a), ("b", b))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(v is not None for v in won.values()) == 1
    assert len(a.runs_of(spec.identity)) == 1  # the loser deleted its run


def test_live_claims_are_left_alone_and_stale_ones_taken_over(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str
) -> None:
    spec = protocols.load(micro_protocol(tmp_path, tiny_shards)).runs[0]
    a, b = Store(mlflow_uri, "micro", settle_s=0), Store(mlflow_uri, "micro", settle_s=0, stale_after_s=60)
    run = a.claim(spec, a.classify(a.runs_of(spec.identity)))
    assert run is not None
    found = b.classify(b.runs_of(spec.identity))
    assert found.state == "claimed" and b.claim(spec, found) is None
    a.client.set_tag(run.info.run_id, HEARTBEAT, str(time.time() - 61))  # its runner stopped beating
    found = b.classify(b.runs_of(spec.identity))
    assert found.state == "free" and found.run_id == run.info.run_id
    taken = b.claim(spec, found)
    assert taken is not None and taken.info.run_id == run.info.run_id  # same run, resumed: never a second one
    assert a.classify(a.runs_of(spec.identity)).state == "claimed"


@pytest.mark.slow
def test_micro_study_skips_done_runs_reruns_deleted_ones_and_resumes_killed_ones(
    tiny_shards: Path, tmp_path: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = micro_protocol(tmp_path, tiny_shards)
    args = [str(path), "--settle-s", "0"]
    assert study_main([*args, "--workers", "2"]) == 0
    first = capsys.readouterr().out
    assert sorted(started_runs(first)) == sorted(["nano mha seed 1", "nano lrkv-r4 seed 1", "nano mha seed 2",
                                             "nano lrkv-r4 seed 2"])  # fmt: skip
    assert first.count("[done") == 4

    assert study_main(args) == 0
    assert started_runs(capsys.readouterr().out) == []

    store = Store(mlflow_uri, "micro")
    by_identity = store.protocol_runs("micro")
    spec = protocols.load(path).runs[3]  # lrkv-r4 seed 2
    (deleted,) = by_identity[spec.identity]
    store.client.delete_run(deleted.info.run_id)
    assert study_main(args) == 0
    assert started_runs(capsys.readouterr().out) == ["nano lrkv-r4 seed 2"]
    (again,) = store.runs_of(spec.identity)
    assert again.info.run_id != deleted.info.run_id and again.info.status == "FINISHED"
    assert again.data.tags["hardware"] == precision.detect("cpu").capability  # the CLI's tags reach the run
    assert again.data.tags["precision"] == "32-true" and again.data.tags["precision_source"] == "user"

    # Interrupted: delete another run, start the study in its own process group, SIGKILL the whole group
    # (runner and worker) once the run has written a checkpoint, then run the same command again.
    victim = protocols.load(path).runs[0]  # mha seed 1
    store.client.delete_run(store.runs_of(victim.identity)[0].info.run_id)
    cmd = [sys.executable, "-m", "lightning_modules", "study", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            runs = store.runs_of(victim.identity)
            folder = runs[0].data.tags.get(CHECKPOINT_DIR) if runs else None
            if folder and (Path(folder) / "last.ckpt").exists():
                break
            assert proc.poll() is None, "the study exited before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    (killed,) = store.runs_of(victim.identity)
    assert killed.info.status == "RUNNING" and "test/loss" not in killed.data.metrics
    step_at_kill = torch.load(Path(folder) / "last.ckpt", map_location="cpu", weights_only=True)[
        "global_step"
    ]
    rerun_at = time.time()
    assert study_main(args) == 0
    out = capsys.readouterr().out
    assert started_runs(out) == ["nano mha seed 1"] and "resuming from its last checkpoint" in out
    (resumed,) = store.runs_of(victim.identity)
    assert resumed.info.run_id == killed.info.run_id and resumed.info.status == "FINISHED"
    assert int(resumed.data.tags["study.resumed_from_step"]) >= step_at_kill >= 1
    final = torch.load(Path(folder) / "last.ckpt", map_location="cpu", weights_only=True)
    assert final["compute"]["tokens_seen"] == final["global_step"] * 4 * TINY_SEQ_LEN  # counters carried over
    twin = store.runs_of(protocols.load(path).runs[2].identity)[
        0
    ]  # mha seed 2: same budget, never interrupted
    assert (
        resumed.data.metrics["test/tokens"]
        == twin.data.metrics["test/tokens"]
        == final["compute"]["tokens_seen"]
    )
    # The rerun records when its attempt began (whole seconds, UTC), so the report gives that attempt's time apart
    # from the run's wall time, which counts from the first claim; a run never stopped has no such tag.
    began = dt.datetime.strptime(resumed.data.tags["study.resumed_utc"], "%Y-%m-%d %H:%M:%S")
    began_s = began.replace(tzinfo=dt.UTC).timestamp()
    assert rerun_at - 1 <= began_s <= resumed.info.end_time / 1000
    assert last_attempt_s(resumed) == resumed.info.end_time / 1000 - began_s
    assert last_attempt_s(resumed) < (resumed.info.end_time - resumed.info.start_time) / 1000
    assert "study.resumed_utc" not in twin.data.tags
    assert last_attempt_s(twin) == (twin.info.end_time - twin.info.start_time) / 1000
