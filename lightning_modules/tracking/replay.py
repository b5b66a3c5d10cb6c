"""Send the MLflow calls a run could not send (its tracking store was away at the end) into the run.

The calls go in their original order and the file (and its kept artifacts) is removed once all are in. A
call sent twice is stored once (lightning_modules/tracking/buffer.py), so a replay cut short can simply be
run again: it resumes from the first call not yet sent. The command: `python -m lightning_modules.tracking_replay`.
"""

from __future__ import annotations

from pathlib import Path

from lightning_modules.tracking import store as tracking
from lightning_modules.tracking.buffer import BufferedClient, PendingFileError, read_pending, write_pending


def replay(path: Path, tracking_uri: str | None = None, run_id: str | None = None) -> int:
    """Send every call in the pending file; the number sent. Raises PendingFileError or the store's error."""
    from mlflow.tracking import MlflowClient  # late: mlflow takes seconds to import; --help need not wait

    if not path.is_file():
        raise PendingFileError(f"{path}: no such pending MLflow file")
    header, ops = read_pending(path)
    uri = tracking_uri or header["tracking_uri"]
    if run_id is not None:  # redirect: rewrite the file so a cut-short replay keeps going to the same run
        write_pending(path, header, [{**op, "run_id": run_id} for op in ops], append=False)
    tracking.fail_fast_http()
    with tracking.store_lock(uri):
        client = MlflowClient(uri)
    buffered = BufferedClient(client, uri, path)
    if not buffered.flush():
        raise PendingFileError(
            f"{uri} did not take the calls in {path} ({buffered.last_error}); {buffered.pending} still "
            f"pending there: start the server (or fix that error) and run this command again"
        )
    return len(ops)
