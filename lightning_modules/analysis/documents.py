"""How much the evaluation documents, not only the seeds, move a paired difference between two arms.

A study's intervals (analysis/pairwise.py) are over seeds: every seed is scored on the same test documents, so
they say how far another seed would move a gap on these documents, not how far other documents would. With the
loss of every document of a split for every run, the difference of a pair of runs (same seed) on document j,
d[s, j] (arm a minus arm b, mean nats per token of the document), splits as

    d[s, j] = mu + beta[s] + alpha[j] + e[s, j]

beta the seed's shift over all documents (what the seed intervals measure), alpha the document's own preference
for one arm (the same for every seed: what another set of documents would change) and e the rest. The split's
difference is the token-weighted mean over documents, so the documents add alpha's variance times sum(w_j^2)
(w_j: the document's share of the split's tokens). Two seeds of the same pair estimate alpha's variance without
e's: their per-document differences share alpha and nothing else, so their weighted covariance over documents is
alpha's variance (`doc_se`). One seed cannot separate them: the spread of the (seed-averaged) per-document
differences holds alpha and e / S together (`doc_se_with_noise`: in expectation at least `doc_se`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

COLUMNS = ("label", "seed", "split", "document", "tokens", "loss_sum")
PER_DOCUMENT, TABLE, PAGE = "per_document.csv", "documents.csv", "documents.md"  # beside a study's ledger


def document_ids(samples: np.ndarray, eot_id: int) -> np.ndarray:
    """The document of every target token of a split's samples, in order.

    samples: (n, T + 1), consecutive samples of the split's token stream overlapping by one token (data/packing.py:
    each document starts with the end-of-text token). Target t of sample i is stream position i * T + 1 + t; its
    document is the number of end-of-text tokens before that position, minus one: a document's own closing
    end-of-text token (the start of the next one) is predicted within the document it closes.
    """
    if samples.ndim != 2 or samples.shape[1] < 2:
        raise ValueError(f"samples must be (n, T + 1) with T >= 1, got shape {samples.shape}")
    if len(samples) > 1 and not (samples[1:, 0] == samples[:-1, -1]).all():
        raise ValueError("samples do not overlap by one token: not consecutive samples of one stream")
    stream = np.concatenate([samples[0], samples[1:, 1:].reshape(-1)])
    if stream[0] != eot_id:
        raise ValueError(f"the stream starts with token {stream[0]}, not the end-of-text token {eot_id}")
    before = np.cumsum(stream == eot_id)[:-1]  # end-of-text tokens at positions < p, for p = 1 .. len - 1
    return (before - 1).reshape(len(samples), -1)


def per_document(token_losses: np.ndarray, documents: np.ndarray) -> pd.DataFrame:
    """Sum of nats and number of target tokens per document (token_losses and documents of the same shape)."""
    if token_losses.shape != documents.shape:
        raise ValueError(f"losses {token_losses.shape} and documents {documents.shape} differ in shape")
    ids = documents.reshape(-1)
    sums = np.bincount(ids, weights=token_losses.reshape(-1).astype(np.float64))
    tokens = np.bincount(ids)
    keep = tokens > 0
    return pd.DataFrame({"document": np.nonzero(keep)[0], "tokens": tokens[keep], "loss_sum": sums[keep]})


def pair_row(table: pd.DataFrame, a: str, b: str, split: str) -> dict:
    """a - b on `split` over the seeds both arms have in `table` (COLUMNS, one row per run and document): the
    split-level difference per seed, its mean, the seed standard error and the two document standard errors."""
    part = table[table["split"] == split]
    wide = {
        label: part[part["label"] == label].pivot_table(
            index="document", columns="seed", values=["loss_sum", "tokens"], aggfunc="sum"
        )
        for label in (a, b)
    }
    scored = [set(wide[label]["tokens"].columns) if len(wide[label]) else set() for label in (a, b)]
    seeds = sorted(scored[0] & scored[1])
    row: dict = {"a": a, "b": b, "split": split, "n_seeds": len(seeds), "seeds": " ".join(map(str, seeds))}
    if not seeds:
        return row | {"n_documents": 0, "diff_mean": math.nan, "seed_se": math.nan, "doc_se": math.nan,
                      "doc_se_with_noise": math.nan}  # fmt: skip
    tokens = wide[a]["tokens"][seeds[0]]
    for label in (a, b):
        for s in seeds:  # the same documents with the same token counts in every run: one split, one stream
            if not wide[label]["tokens"][s].equals(tokens):
                raise ValueError(
                    f"{label} seed {s} was scored on other {split} documents than {a} seed {seeds[0]}"
                )
    w = (tokens / tokens.sum()).to_numpy()
    d = np.stack(
        [(wide[a]["loss_sum"][s] - wide[b]["loss_sum"][s]).to_numpy() / tokens.to_numpy() for s in seeds]
    )
    per_seed = d @ w  # the split-level difference of each seed: token-weighted over documents
    row |= {
        "n_documents": len(w),
        "diff_mean": float(per_seed.mean()),
        "seed_se": float(per_seed.std(ddof=1) / math.sqrt(len(seeds))) if len(seeds) > 1 else math.nan,
        "doc_se": math.nan,
        "doc_se_with_noise": math.nan,
    }
    if len(w) < 2:  # one document has no spread to measure
        return row
    concentration = float((w**2).sum())  # sum of w_j^2: 1 / (effective number of documents)
    centred = d - per_seed[:, None]
    shared = [
        float((w * centred[i] * centred[k]).sum()) for i, k in itertools.combinations(range(len(seeds)), 2)
    ]
    if shared:  # alpha's variance from the seed pairs' covariance (a negative estimate is a zero variance)
        row["doc_se"] = math.sqrt(max(float(np.mean(shared)), 0.0) / (1 - concentration) * concentration)
    mean_d = d.mean(axis=0)
    noisy_var = float((w * (mean_d - mean_d @ w) ** 2).sum()) / (1 - concentration)
    row["doc_se_with_noise"] = math.sqrt(noisy_var * concentration)
    return row
