"""Scoring documents under a trained checkpoint: every document's loss, and how far other documents would
move a study's paired gaps (docs/statistics.md, "Seeds and documents").

    python -m lightning_modules score-documents results/main --checkpoints checkpoints/study/main

- document_scores.py   the loss of every document of a split under one decoder
- documents_report.py  how far other evaluation documents would move a study's gaps: the table
"""
