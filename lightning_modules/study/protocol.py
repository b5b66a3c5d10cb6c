"""A study protocol (conf/study/<name>.yaml) and the runs it asks for.

A protocol names the sizes, the arms (an attention and its knobs), the seeds, one budget (FLOPs, so that
arms train on equal compute) and the data fragment. Every (size, arm, seed) is one run, and a run's identity
is (protocol, size, arm label, seed, budget, data manifest hash): two runs with the same identity are the
same experiment, so the runner never trains one twice. The arm label is the attention's own label
(AttentionConfig.label(), resolved against the size), so the names come from the attention registry.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lightning_modules.core.errors import ConfigError
from lightning_modules.core.fragments import fragment
from lightning_modules.costs.budget import Budget
from lightning_modules.model.attention import AttentionConfig, knob_specs, resolve_attention
from lightning_modules.model.config import ModelConfig, load_model_config
from lightning_modules.tracking import runs

ROOT = Path(__file__).resolve().parents[2]
# `question`: the study's question in a few words, for the index results/README.md (reporting/results_index.py)
FIELDS = {"description", "question", "experiment", "sizes", "arms", "seeds", "budget", "data", "fit",
          "checkpoint_every", "comparisons"}  # fmt: skip
DEFAULT_EXPERIMENT = "lrkv-study"
# Set by the runner for every run; a protocol's `fit` settings may not touch them.
RESERVED = ("seed_everything", "model.attention", "model.budget", "data.data_dir", "trainer.logger")
TAG = "study."  # prefix of the tags the runner adds to the training module's own (tracking/runs.py run_tags)
# UTC time a resumed or restarted run's last attempt began (runner.py); its wall time from there is that attempt's
RESUMED_UTC = TAG + "resumed_utc"
# How the study writes UTC times: RESUMED_UTC, and the ledger's start_utc and end_utc (report.py)
UTC_FORMAT = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True)
class RunSpec:
    """One run of a protocol: what to train and the identity it is recorded under."""

    protocol: str
    size: str
    model: ModelConfig
    attention: AttentionConfig  # resolved against the size: every knob set
    explicit: dict[str, Any]  # the knobs the protocol names (passed on the command line)
    seed: int
    budget: Budget
    data_fragment: Path
    data_dir: Path
    data_hash: str
    fit: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.attention.label()

    @property
    def name(self) -> str:
        return runs.run_name(self.model, self.attention, self.seed)

    def identity_fields(self) -> dict[str, str]:
        return {
            "protocol": self.protocol,
            "size": self.size,
            "arm": self.label,
            "seed": str(self.seed),
            "budget": self.budget.describe(),
            "data": self.data_hash,
        }

    @property
    def identity(self) -> str:
        text = json.dumps(self.identity_fields(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def settings(self) -> str:
        """What the protocol sets beyond the identity (the knobs it names, its `fit` settings), as canonical
        JSON. Not part of the identity, so that adding an option changes no earlier run; recorded with each
        run instead (tag and ledger column `settings`), so that a protocol edited after its runs is caught
        (settings.py) rather than silently counting runs trained another way as done."""
        knobs = {k: _cli_value(v) for k, v in self.explicit.items()}
        fit = {k: _cli_value(v) for k, v in self.fit.items()}
        return json.dumps({"fit": fit, "knobs": knobs}, sort_keys=True, separators=(",", ":"))

    def tags(self) -> dict[str, str]:
        """The training module's tags (size, attention, knobs, seed, budget, commit), the identity and the
        settings."""
        tags = runs.run_tags(self.model, self.attention, self.seed, self.budget.describe())
        tags.update({TAG + k: v for k, v in self.identity_fields().items()})
        tags[TAG + "identity"] = self.identity
        tags[TAG + "settings"] = self.settings
        return tags

    def cli_args(self) -> list[str]:
        """main.py's arguments for this run (without the subcommand): the fragments, then the knobs."""
        args = ["--config", str(ROOT / "conf/base.yaml"), "--config", str(fragment("model", self.size))]
        args += ["--config", str(fragment("attention", self.attention.kind))]
        args += ["--config", str(self.data_fragment), "--data.data_dir", str(self.data_dir)]
        for knob, value in self.explicit.items():
            args += [f"--model.attention.{knob}", str(value)]
        for key, value in (("tokens", self.budget.tokens), ("flops", self.budget.flops)):
            if value is not None:
                args += [f"--model.budget.{key}", repr(float(value))]
        args += ["--seed_everything", str(self.seed)]
        for key, value in self.fit.items():
            args += [f"--{key}", _cli_value(value)]
        return args


@dataclass(frozen=True)
class Protocol:
    name: str
    path: Path
    description: str
    experiment: str
    runs: tuple[RunSpec, ...]
    sizes: tuple[str, ...]
    labels: tuple[str, ...]  # arm labels in the protocol's order (of the first size)
    seeds: tuple[int, ...]
    checkpoint_every: int
    # The declared primary comparisons (a, b) for a - b, by arm label; every other pair of arms is secondary.
    # Holm's correction runs within each family (lightning_modules/analysis/families.py). Not part of any
    # run's identity: declaring what to test changes no experiment.
    primary: tuple[tuple[str, str], ...] = ()


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _resolve(path: str | Path, base: Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else (base / p)


def manifest_hash(data_dir: Path, seq_len: int = 256) -> str:
    """sha256 of the data's manifest.json (which holds every shard's sha256): same hash, same data.
    `seq_len` (the protocol's sizes') only goes into the message that says how to build missing shards."""
    manifest = data_dir / "manifest.json"
    if not manifest.is_file():
        raise ConfigError(
            f"data.data_dir={data_dir}: no manifest.json there; build the shards first (python -m lightning_modules prepare "
            f"--seq-len {seq_len} --out {data_dir} ...; `make data` builds conf/data/shakespeare.yaml's, "
            "`make data SEQ_LEN=1024` conf/data/shakespeare-1k.yaml's)"
        )
    return hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]


def _seq_lens(models: dict[str, ModelConfig], fit: dict[str, Any]) -> dict[str, int]:
    """The context each size trains at: its own, unless the protocol's `fit` sets model.arch.seq_len."""
    override = fit.get("model.arch.seq_len")
    return {size: int(override) if override is not None else m.seq_len for size, m in models.items()}


def _check_seq_len(seq_lens: dict[str, int], data_dir: Path, where: str) -> None:
    """Every size must train on samples of its own context: caught here, before a run is claimed, rather than
    by each run's training command."""
    manifest = data_dir / "manifest.json"
    try:
        shards = int(json.loads(manifest.read_text())["seq_len"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{manifest}: no readable seq_len ({type(e).__name__}: {e}); rebuild the shards (python -m "
            f"lightning_modules.commands.prepare ... --out {data_dir}) or check them with python -m lightning_modules verify {data_dir}"
        ) from e
    for size, seq_len in seq_lens.items():
        if seq_len != shards:
            raise ConfigError(
                f"{where}: size {size} reads {seq_len} tokens at a time but {data_dir} holds "
                f"{shards}-token samples; point `data` at a fragment of {seq_len}-token shards "
                f"(conf/data/shakespeare-1k.yaml holds 1,024) or pick a size of {shards} tokens"
            )


def _data_dir(fragment: Path) -> Path:
    """data.data_dir of a data fragment, relative paths taken from the current directory as main.py does."""
    tree = _yaml(fragment, "data fragment")
    section = tree.get("data") if isinstance(tree, dict) else None
    data_dir = section.get("data_dir") if isinstance(section, dict) else None
    if not data_dir:
        raise ConfigError(f"data fragment {fragment} sets no data.data_dir")
    return Path(data_dir).resolve()


def _arm(raw: Any, index: int, where: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(raw, dict) or "kind" not in raw:
        raise ConfigError(
            f"{where}: arms[{index}] must be a mapping with `kind` and knobs, e.g. {{kind: lrkv, rank: 16}}"
        )
    knobs = {k: v for k, v in raw.items() if k != "kind"}
    allowed = tuple(knob_specs())
    unknown = sorted(set(knobs) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{where}: arms[{index}] has unknown knobs {unknown}; allowed: {', '.join(allowed)}"
        )
    return str(raw["kind"]), knobs


def load(path: str | Path) -> Protocol:
    """Read and validate a protocol; every problem is a ConfigError naming the file and the field."""
    path = Path(path)
    tree = _read(path)
    where = str(path)
    seeds = _seeds(tree, where)
    budget = _budget(tree, where)
    fit = _fit(tree, where)
    every = _checkpoint_every(tree, where)
    if not tree["sizes"]:
        raise ConfigError(f"{where}: `sizes` is empty; name at least one, e.g. sizes: {LISTS['sizes']}")
    models = {str(size): load_model_config([fragment("model", str(size))])[0] for size in tree["sizes"]}
    seq_lens = _seq_lens(models, fit)
    data_fragment, data_dir, data_hash = _data(tree, where, next(iter(seq_lens.values())))
    _check_seq_len(seq_lens, data_dir, where)
    shared = dict(budget=budget, data_fragment=data_fragment, data_dir=data_dir, data_hash=data_hash, fit=fit)
    arms = [_arm(raw, i, where) for i, raw in enumerate(tree["arms"])]
    runs: list[RunSpec] = []
    labels_by_size: dict[Any, list[str]] = {}
    for size in tree["sizes"]:
        model = models[str(size)]
        resolved = _resolve_arms(model, arms, size, where)
        labels_by_size[size] = [attention.label() for attention, _ in resolved]
        # Seed-major order: a study stopped half-way already holds complete seed pairs across arms.
        runs += [
            RunSpec(path.stem, str(size), model, attention, knobs, seed, **shared)
            for seed in seeds
            for attention, knobs in resolved
        ]
    first = str(tree["sizes"][0])
    primary = _comparisons(tree, labels_by_size, where)
    return Protocol(
        name=path.stem,
        path=path.resolve(),
        description=str(tree.get("description", "")).strip(),
        experiment=str(tree.get("experiment", DEFAULT_EXPERIMENT)),
        runs=tuple(runs),
        sizes=tuple(str(s) for s in tree["sizes"]),
        labels=tuple(labels_by_size[first]),
        seeds=tuple(seeds),
        checkpoint_every=every,
        primary=primary,
    )


def _read(path: Path) -> dict[str, Any]:
    """The protocol's YAML, with only known fields and every required one."""
    if not path.is_file():
        known = sorted(p.stem for p in (ROOT / "conf/study").glob("*.yaml"))
        raise ConfigError(f"no study protocol {path}; protocols in conf/study/: {', '.join(known)}")
    where = str(path)
    tree = _yaml(path, "study protocol")
    if not isinstance(tree, dict):
        raise ConfigError(
            f"{where}: a protocol is a mapping of fields ({', '.join(sorted(FIELDS))}), not a "
            f"{type(tree).__name__}; see conf/study/cpu.yaml"
        )
    unknown = sorted(set(map(str, tree)) - FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown fields {unknown}; allowed: {', '.join(sorted(FIELDS))}")
    for key in ("sizes", "arms", "seeds", "budget", "data"):
        if not tree.get(key):
            raise ConfigError(f"{where}: `{key}` is required")
    for key, example in LISTS.items():
        if not isinstance(tree[key], list):
            raise ConfigError(f"{where}: `{key}` must be a list, e.g. {key}: {example}; got {tree[key]!r}")
    if not isinstance(tree.get("fit") or {}, dict):
        raise ConfigError(
            f"{where}: `fit` must be a mapping of main.py settings, e.g. fit: {{trainer.precision: 32-true}}"
        )
    if not isinstance(tree["data"], str):
        raise ConfigError(
            f"{where}: `data` must be the path of a data fragment, e.g. data: conf/data/shakespeare.yaml"
        )
    return tree


# The list fields, with the example a message shows.
LISTS = {"sizes": "[nano, 5m]", "arms": "[{kind: mha}, {kind: lrkv, rank: 16}]", "seeds": "[1, 2, 3]"}


def _yaml(path: Path, what: str) -> Any:
    """A YAML file read safely; a syntax error or a tag that would build an object is a ConfigError naming
    the file, the line and what to fix."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path}: cannot be read ({e}); give a readable UTF-8 YAML file") from e
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = str(getattr(e, "problem", None) or str(e).splitlines()[0])
        tag = re.search(r"for the tag '([^']+)'", problem)
        if isinstance(e, yaml.constructor.ConstructorError) and tag:
            name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
            raise ConfigError(
                f"{what} {path}{at}: the tag {name} is refused (the file is read as plain YAML, and a tag "
                "must not build objects); write a plain value there"
            ) from e
        raise ConfigError(f"{what} {path}: YAML syntax error{at}: {problem}; fix the file") from e


def _seeds(tree: dict[str, Any], where: str) -> list[int]:
    seeds = tree["seeds"]  # a list (_read)
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) or len(set(seeds)) != len(
        seeds
    ):
        raise ConfigError(f"{where}: seeds must be distinct integers, got {seeds}")
    return seeds


def _budget(tree: dict[str, Any], where: str) -> Budget:
    try:  # YAML reads 4.0e9 (no sign in the exponent) as a string
        budget = Budget(**{k: float(v) for k, v in dict(tree["budget"]).items()})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: budget: {e}; give {{flops: ...}} or {{tokens: ...}}") from e
    if budget.flops is None and budget.tokens is None:
        raise ConfigError(f"{where}: budget needs flops (equal compute) or tokens")
    return budget


def _fit(tree: dict[str, Any], where: str) -> dict[str, Any]:
    fit = dict(tree.get("fit") or {})
    for key in fit:
        if any(key == r or key.startswith(r + ".") for r in RESERVED):
            raise ConfigError(
                f"{where}: fit.{key} is set by the study runner (the arm, seed, budget or data)"
            )
    return fit


def _checkpoint_every(tree: dict[str, Any], where: str) -> int:
    every = tree.get("checkpoint_every", 50)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ConfigError(f"{where}: checkpoint_every={every}: must be an integer >= 1 (optimizer steps)")
    return every


def _comparisons(
    tree: dict[str, Any], labels_by_size: dict[Any, list[str]], where: str
) -> tuple[tuple[str, str], ...]:
    """`comparisons: {primary: [[a, b], ...]}`: pairs of two different arm labels of one size, each once."""
    raw = tree.get("comparisons")
    if raw is None:
        return ()
    example = "comparisons: {primary: [[lrkv-r16, mha], [lrkv-r16, gqa-g2]]}"
    if not isinstance(raw, dict) or set(map(str, raw)) != {"primary"} or not isinstance(raw["primary"], list):
        raise ConfigError(f"{where}: `comparisons` must be a mapping with one list `primary`, e.g. {example}")
    pairs: list[tuple[str, str]] = []
    for i, pair in enumerate(raw["primary"]):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ConfigError(
                f"{where}: comparisons.primary[{i}] must be two arm labels, e.g. [lrkv-r16, mha]"
            )
        a, b = pair
        if a == b or not any(a in labels and b in labels for labels in labels_by_size.values()):
            known = sorted({label for labels in labels_by_size.values() for label in labels})
            raise ConfigError(
                f"{where}: comparisons.primary[{i}] = [{a}, {b}]: needs two different arm labels of one size; "
                f"the arms are {', '.join(known)}"
            )
        if frozenset(pair) in {frozenset(p) for p in pairs}:
            raise ConfigError(f"{where}: comparisons.primary[{i}] = [{a}, {b}] is declared twice")
        pairs.append((a, b))
    return tuple(pairs)


def _data(tree: dict[str, Any], where: str, seq_len: int) -> tuple[Path, Path, str]:
    """The data fragment, the shards' folder it names and their manifest hash."""
    data_fragment = _resolve(tree["data"], ROOT)
    if not data_fragment.is_file():
        raise ConfigError(f"{where}: data fragment {data_fragment} does not exist")
    data_dir = _data_dir(data_fragment)
    return data_fragment, data_dir, manifest_hash(data_dir, seq_len)


def _resolve_arms(
    model: ModelConfig, arms: list[tuple[str, dict[str, Any]]], size: Any, where: str
) -> list[tuple[AttentionConfig, dict[str, Any]]]:
    """Every arm resolved against the size, with the knobs the protocol names; labels must differ."""
    labels: list[str] = []
    resolved = []
    for kind, knobs in arms:
        attention = resolve_attention(model, AttentionConfig(kind=kind, **knobs))
        if attention.label() in labels:
            raise ConfigError(f"{where}: two arms with the label {attention.label()!r} at size {size}")
        labels.append(attention.label())
        resolved.append((attention, knobs))
    return resolved
