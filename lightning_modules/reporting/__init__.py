"""Reporting a study: its results folder results/<protocol>/ (tables, figures, README.md) recomputed from
the tracking store and the committed ledger, and the study's row of the index results/README.md.

    python -m lightning_modules study conf/study/main.yaml --report

- ledger_tables.py  the ledger's tables as pandas frames, restricted to the protocol's current runs
- readme.py         results/<protocol>/README.md: the study's page, one section per table
- report.py         a protocol's tables and figures into results/<protocol>/, from the store and the ledger
- results_index.py  the index results/README.md: one row per study, rewritten by each report
- runs_section.py   the page's "Runs" section: one line per run, its machine, commit and time
"""
