"""Errors the analysis raises instead of drawing an empty or wrong figure; each message says what to do."""

from __future__ import annotations


class AnalysisError(RuntimeError):
    """Base class: the runs cannot be analysed as asked."""


class StoreError(AnalysisError):
    """The tracking store cannot be used as given (missing SQLite file, file store)."""


class NoRunsError(AnalysisError):
    """The store, the experiment or the selection holds no usable runs."""


class MissingTagsError(AnalysisError):
    """Runs lack the tags the analysis selects and groups by (the MLflow contract of the training module)."""


class MissingMetricsError(AnalysisError):
    """Runs lack metrics or cost parameters that a table or figure needs."""
