"""Per-document losses and the documents' part of a pair's uncertainty (lightning_modules/analysis/documents.py),
on streams and tables built so that the answers are known."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from lightning_modules.analysis.documents import COLUMNS, document_ids, pair_row, per_document

EOT = 0


def samples_of(stream: list[int], seq_len: int) -> np.ndarray:
    """Consecutive samples of seq_len + 1 tokens overlapping by one, the trailing partial one dropped."""
    n = (len(stream) - 1) // seq_len
    return np.stack([np.asarray(stream[i * seq_len : i * seq_len + seq_len + 1]) for i in range(n)])


def test_each_target_belongs_to_the_document_it_continues_or_closes() -> None:
    # documents: [5 6 7] [8] [9 9 4 4]; each starts with EOT; the stream is cut into samples of 3 targets
    stream = [EOT, 5, 6, 7, EOT, 8, EOT, 9, 9, 4, 4, EOT, 3]
    ids = document_ids(samples_of(stream, 3), EOT)
    # targets are stream positions 1..12: 5 6 7 | EOT(closes 0) 8 | EOT(closes 1) 9 9 4 4 | EOT(closes 2) 3
    assert ids.tolist() == [[0, 0, 0], [0, 1, 1], [2, 2, 2], [2, 2, 3]]


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        (np.array([[EOT, 1, 2], [3, 4, 5]]), "do not overlap by one token"),
        (np.array([[7, 1, 2], [2, 4, 5]]), "starts with token 7"),
        (np.array([1, 2, 3]), "must be \\(n, T \\+ 1\\)"),
    ],
    ids=["gap", "no-eot-first", "one-dimensional"],
)
def test_a_stream_that_is_not_one_split_in_order_is_refused(samples: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        document_ids(samples, EOT)


def test_per_document_sums_add_up_to_the_split() -> None:
    rng = np.random.default_rng(0)
    documents = np.array([[0, 0, 1, 1], [1, 3, 3, 3]])  # document 2 has no target: left out, not a zero row
    losses = rng.random(documents.shape)
    table = per_document(losses, documents)
    assert table["document"].tolist() == [0, 1, 3] and table["tokens"].tolist() == [2, 3, 3]
    assert table["loss_sum"].tolist() == pytest.approx(
        [losses[0, :2].sum(), losses[0, 2:].sum() + losses[1, 0], losses[1, 1:].sum()]
    )
    assert table["loss_sum"].sum() == pytest.approx(losses.sum())


# ----- the pair's figures ----------------------------------------------------------------------------------
TOKENS = np.array([100, 300, 200, 400])  # four documents of different length: weights 0.1, 0.3, 0.2, 0.4
W = TOKENS / TOKENS.sum()


def runs(per_token: dict[tuple[str, int], np.ndarray], split: str = "test") -> pd.DataFrame:
    """(label, seed) -> mean nats per token of each document."""
    rows = [
        {
            "label": label,
            "seed": seed,
            "split": split,
            "document": j,
            "tokens": int(n),
            "loss_sum": float(v * n),
        }
        for (label, seed), values in per_token.items()
        for j, (n, v) in enumerate(zip(TOKENS, values, strict=True))
    ]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_a_document_preference_shared_by_every_seed_is_the_document_part() -> None:
    alpha = np.array([0.05, -0.02, 0.01, -0.01])  # a - b on each document, the same for every seed
    base = np.array([3.0, 3.5, 3.2, 3.1])
    shift = {1: 0.0, 2: 0.01, 3: -0.02}  # each seed moves both arms' documents alike except a's shift
    table = runs({("b", s): base for s in shift} | {("a", s): base + alpha + shift[s] for s in shift})
    row = pair_row(table, "a", "b", "test")
    mean = float(alpha @ W)
    assert (row["n_seeds"], row["seeds"], row["n_documents"]) == (3, "1 2 3", 4)
    assert row["diff_mean"] == pytest.approx(mean + np.mean(list(shift.values())))
    assert row["seed_se"] == pytest.approx(np.std(list(shift.values()), ddof=1) / np.sqrt(3))
    # the weighted variance of alpha, made unbiased for a weighted mean, times sum(w^2)
    var = float((W * (alpha - mean) ** 2).sum()) / (1 - (W**2).sum())
    assert row["doc_se"] == pytest.approx(np.sqrt(var * (W**2).sum()))
    assert row["doc_se_with_noise"] == pytest.approx(row["doc_se"])  # nothing else differs by document


def test_seed_noise_by_document_is_not_counted_as_the_documents_part() -> None:
    rng = np.random.default_rng(1)
    base = np.array([3.0, 3.5, 3.2, 3.1])
    noise = {s: rng.normal(0, 0.03, size=4) for s in range(1, 3)}
    # one seed's per-document noise is uncorrelated with the other's: cross-seed covariance near 0
    noise[2] = noise[2] - (W * (noise[1] - noise[1] @ W) * (noise[2] - noise[2] @ W)).sum() / (
        W * (noise[1] - noise[1] @ W) ** 2
    ).sum() * (noise[1] - noise[1] @ W)
    table = runs({("b", s): base for s in noise} | {("a", s): base + noise[s] for s in noise})
    row = pair_row(table, "a", "b", "test")
    assert row["doc_se"] == pytest.approx(0.0, abs=1e-9)  # the two seeds share no document preference
    assert row["doc_se_with_noise"] > 0.005  # one seed's spread would have counted its noise
    one = pair_row(runs({("b", 1): base, ("a", 1): base + noise[1]}), "a", "b", "test")
    assert np.isnan(one["doc_se"]) and np.isnan(one["seed_se"]) and one["doc_se_with_noise"] > 0


def test_the_cross_seed_estimate_averages_every_pair_of_seeds() -> None:
    rng = np.random.default_rng(2)
    base = np.array([3.0, 3.5, 3.2, 3.1])
    d = {s: rng.normal(0, 0.02, size=4) for s in (1, 2, 3)}
    row = pair_row(runs({("b", s): base for s in d} | {("a", s): base + d[s] for s in d}), "a", "b", "test")
    centred = {s: v - v @ W for s, v in d.items()}
    cov = np.mean([(W * centred[i] * centred[k]).sum() for i, k in itertools.combinations(d, 2)])
    assert row["doc_se"] == pytest.approx(np.sqrt(max(cov, 0) / (1 - (W**2).sum()) * (W**2).sum()))


def test_runs_scored_on_other_documents_are_refused() -> None:
    base = np.array([3.0, 3.5, 3.2, 3.1])
    table = runs({("a", 1): base, ("b", 1): base})
    table.loc[(table["label"] == "b") & (table["document"] == 0), "tokens"] = 99
    with pytest.raises(ValueError, match="b seed 1 was scored on other test documents"):
        pair_row(table, "a", "b", "test")
    assert (
        pair_row(runs({("a", 1): base}), "a", "b", "test")["n_seeds"] == 0
    )  # no common seed: nothing to say
