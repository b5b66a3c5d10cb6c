"""Analysis of tracked runs: the functions the notebooks in notebooks/ import (they define nothing themselves).

One idea per module:
- store.py       where the MLflow store and the figures live (arguments, then environment, then defaults)
- runs.py        runs from MLflow, selected by tags, as one tidy pandas table
- stats.py       mean and t-interval over seeds
- curves.py      loss against tokens or cumulative training FLOPs, one panel per size
- targets.py     tokens-to-target (or FLOPs-to-target): budget saved in reaching a baseline's final loss
- frontier.py    KV-cache bytes per token against final loss, Pareto-optimal points marked
- tables.py      run overview and final losses beside the paper's
- cost_tables.py the cost model's numbers for the paper sizes beside the paper's
- paper.py       the paper's printed numbers (docs/paper-errata.md), as data
- styles.py      fixed colours and line styles per attention, display order of sizes and attentions
- units.py       readable axis units for token counts and FLOPs
- figures.py     saving PNGs and CSVs into the figures folder
- notebooks.py   executing the notebooks headless against a store
- run_notebooks.py  the command: `python -m lightning_modules.analysis.run_notebooks`
"""
