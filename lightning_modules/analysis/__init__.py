"""Analysis of tracked runs: the functions the notebooks in notebooks/ import (they define nothing themselves).

- analysis_errors.py  errors the analysis raises instead of drawing an empty or wrong figure
- cost_tables.py      the cost model's numbers for the paper sizes beside the paper's
- curves.py           loss against tokens or cumulative training FLOPs, one panel per size
- documents.py        how far the evaluation documents, not only the seeds, move a paired difference
- equal_tokens.py     a run's validation loss at a given token count, read off its curve
- families.py         which pairs of arms a study compares, which way round, and the family each belongs to for Holm
- figures.py          saving PNGs and CSVs into the figures folder
- forest.py           a forest plot of paired differences
- formatting.py       how a study's numbers are written in markdown: a mean with its interval, signed
- frontier.py         KV-cache bytes per token against final loss, Pareto-optimal points marked
- locations.py        where the MLflow store, the experiment and the figures folder are
- multiplicity.py     paired t-tests and Holm's correction for testing many comparisons at once
- noise.py            how the paired noise changes with run length; how many seeds a precision needs
- notebooks.py        executing the notebooks headless against a store
- pairwise.py         every pair of arms of a size, paired by seed, in three views, with Holm per family
- paper.py            the paper's printed numbers (docs/paper-errata.md), as data
- pooled.py           the pooled arm + seed analysis
- stats.py            mean and t-interval over seeds
- styles.py           fixed colours and line styles per attention, display order of sizes and attentions
- sweep_curves.py     a sweep's validation curves: each column minus the reference at every evaluation
- sweep_gaps.py       whether a gap between two arms moves from the reference column to another
- sweep_table.py      a sweep across protocols: per arm, each column minus the reference, Holm-adjusted
- tables.py           run overview and final losses beside the paper's
- targets.py          tokens-to-target (or FLOPs-to-target): budget saved in reaching a baseline's final loss
- tidy.py             runs from MLflow as one tidy table: a row per evaluation
- units.py            readable axis units for token counts and FLOPs
"""
