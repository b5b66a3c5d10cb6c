"""The cost model's numbers for the paper's sizes, beside what the paper prints (notebooks/costs.ipynb).

Costs come from lightning_modules.costs (docs/costs.md: our one convention); the paper's numbers from
paper.py. Where the paper gives no formula (its FLOPs), the table shows what its figure totals imply per
token and says so, rather than pretending the two are the same quantity.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lightning_modules.analysis import paper
from lightning_modules.analysis.styles import attention_order, attention_style, size_sort_key
from lightning_modules.analysis.units import human
from lightning_modules.costs import counts as costs
from lightning_modules.model.attention import AttentionConfig

COST_COLUMNS = [
    "size",
    "paper_name",
    "attention",
    "label",
    "params",
    "non_embedding_params",
    "attention_params",
    "train_flops_per_token",
    "decode_flops_per_token",
    "kv_cache_bytes_per_token",
    "kv_cache_vs_mha",
    "kv_cache_vs_mha_paper_convention",
    "paper_kv_cache_vs_mha",
    "paper_test_loss",
]


def paper_size_rows(context: int | None = None) -> list[dict[str, Any]]:
    """costs.default_rows() for the paper sizes, plus the long-context size (which the default table,
    being about the four main sizes and nano, leaves out)."""
    rows = [r for r in costs.default_rows(context) if r["size"] in paper.SIZE_NAMES]
    for kind in attention_order():
        model = costs.load_configs([costs.fragment("model", "long-8k")])[0]
        rows.append(costs.cost_row(model, AttentionConfig(kind=kind), context))
    return rows


def costs_beside_paper(rows: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per paper size x attention: our costs and, where the paper prints them, its cache fraction
    (paper.printed_cache_vs_mha: LRKV's main run per size, a sweep point's, MLA's counting the latent only)
    and its test loss. Columns COST_COLUMNS."""
    table = pd.DataFrame(rows if rows is not None else paper_size_rows())
    if "kv_cache_vs_mha_paper_convention" not in table:
        table["kv_cache_vs_mha_paper_convention"] = math.nan
    table["paper_name"] = table["size"].map(paper.SIZE_NAMES)
    table["paper_kv_cache_vs_mha"] = [
        _or_nan(paper.printed_cache_vs_mha(r.size, r.attention, r.label)) for r in table.itertuples()
    ]
    table["paper_test_loss"] = [
        paper.TEST_LOSS.get(r.size, {}).get(r.attention, math.nan) for r in table.itertuples()
    ]
    table["_order"] = [
        (size_sort_key(r.size), attention_order().index(r.attention)) for r in table.itertuples()
    ]
    return table.sort_values("_order", kind="stable")[COST_COLUMNS].reset_index(drop=True)


def format_costs(table: pd.DataFrame) -> pd.DataFrame:
    """costs_beside_paper() for reading: counts in K/M/G, fractions in %, missing paper numbers blank."""
    out = pd.DataFrame({"size": table["size"], "paper": table["paper_name"], "label": table["label"]})
    for column in (
        "params",
        "non_embedding_params",
        "attention_params",
        "train_flops_per_token",
        "decode_flops_per_token",
    ):
        out[column] = table[column].map(human)
    out["kv_cache_bytes_per_token"] = table["kv_cache_bytes_per_token"].map("{:,.0f}".format)
    out["kv_cache_vs_mha"] = table["kv_cache_vs_mha"].map(_percent)
    out["same, paper convention"] = table["kv_cache_vs_mha_paper_convention"].map(_percent)
    out["paper: kv_cache_vs_mha"] = table["paper_kv_cache_vs_mha"].map(_percent)
    out["paper: test loss"] = table["paper_test_loss"].map(lambda v: "" if math.isnan(v) else f"{v:.3f}")
    return out


def flops_beside_paper(table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per paper size: training FLOPs per token that the paper's figure totals imply (total EF / tokens
    trained; 'about', read off figures) beside ours (MHA, and the range over attentions), and our total
    for the paper's token budget."""
    table = costs_beside_paper() if table is None else table
    rows = []
    for size, total_ef in paper.TOTAL_EXAFLOPS.items():
        part = table[table["size"] == size]
        tokens = paper.TOKENS_TRAINED[size]
        ours_mha = float(part.loc[part["attention"] == costs.BASELINE, "train_flops_per_token"].iloc[0])
        rows.append(
            {
                "size": size,
                "paper_name": paper.SIZE_NAMES[size],
                "tokens_trained": tokens,
                "paper_total_exaflops": total_ef,
                "paper_implied_flops_per_token": total_ef * 1e18 / tokens,
                "our_mha_flops_per_token": ours_mha,
                "our_min_flops_per_token": float(part["train_flops_per_token"].min()),
                "our_max_flops_per_token": float(part["train_flops_per_token"].max()),
                "our_mha_total_exaflops": ours_mha * tokens / 1e18,
                "ours_vs_paper": ours_mha * tokens / 1e18 / total_ef,
            }
        )
    return pd.DataFrame(rows)


def sweeps_beside_paper() -> pd.DataFrame:
    """The paper's 128M rank and latent sweeps: its printed cache fraction and loss beside our cache fraction
    (what we cache: for MLA the latent plus the decoupled RoPE key) and ours in the paper's convention."""
    rows = []
    for size in paper.SWEEPS:
        model = costs.load_configs([costs.fragment("model", size)])[0]
        for config, printed, loss in paper.sweep_points(size):
            rows.append(_sweep_row(costs.cost_row(model, config), printed, loss))
    return pd.DataFrame(rows)


def _sweep_row(row: dict[str, Any], printed: float, loss: float) -> dict[str, Any]:
    return {
        "size": row["size"],
        "attention": row["attention"],
        "label": row["label"],
        "kv_cache_bytes_per_token": row["kv_cache_bytes_per_token"],
        "kv_cache_vs_mha": row["kv_cache_vs_mha"],
        "kv_cache_vs_mha_paper_convention": row.get(
            "kv_cache_vs_mha_paper_convention", row["kv_cache_vs_mha"]
        ),
        "paper_kv_cache_vs_mha": printed,
        "paper_test_loss": loss,
    }


def plot_costs(table: pd.DataFrame) -> Figure:
    """Three panels over the sizes of `table` (costs_beside_paper()), bars per attention in the fixed
    colours: KV cache, training FLOPs per token and decode FLOPs per token at the full context, each as a
    multiple of MHA's at that size. Black crosses: the paper's printed cache fractions."""
    sizes = sorted(table["size"].unique(), key=size_sort_key)
    kinds = [k for k in attention_order() if k in set(table["attention"])]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    width = 0.8 / len(kinds)
    x = np.arange(len(sizes))
    panels = (
        ("kv_cache_bytes_per_token", "KV cache per token (% of MHA's)"),
        ("train_flops_per_token", "training FLOPs per token (% of MHA's)"),
        ("decode_flops_per_token", "decode FLOPs per token at full context (% of MHA's)"),
    )
    for ax, (column, title) in zip(axes, panels, strict=True):
        mha = table[table["attention"] == costs.BASELINE].set_index("size")[column]
        for i, kind in enumerate(kinds):
            part = table[table["attention"] == kind].set_index("size").reindex(sizes)
            ratio = 100 * part[column] / mha.reindex(sizes)
            style = attention_style(kind)
            ax.bar(x + (i - (len(kinds) - 1) / 2) * width, ratio, width, color=style["color"], label=kind)
            if column == "kv_cache_bytes_per_token":
                printed = 100 * part["paper_kv_cache_vs_mha"]
                ax.plot(x + (i - (len(kinds) - 1) / 2) * width, printed, "kx", markersize=7)
        ax.axhline(100, color="0.4", lw=0.8)
        ax.set_xticks(x, [paper.SIZE_NAMES.get(s, s).replace(" long-context", "\nlong-ctx") for s in sizes])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].plot([], [], "kx", label="paper (printed; MLA: latent only)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncols=len(kinds) + 1, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the shared legend below the panels
    return fig


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _percent(value: float) -> str:
    return "" if value is None or math.isnan(value) else f"{100 * value:.1f} %"
