"""Lightning's MLFlowLogger, made to hold where runs meet a real tracking server.

- Tags are sent as strings: the CLI's tags come back from the config parser with YAML types (the seed as
  int 7), which an MLflow server refuses in create_run (an SQLite store would quietly convert them).
- Writes go through lightning_modules/tracking/buffer.py: an outage never stops training; held calls are
  sent when the store answers again, and what is still held at the end is saved beside the checkpoints with
  the one command that sends it.
- The run always ends FINISHED or FAILED (Lightning finalizes with "failed" on any exception), or KILLED
  when a signal stopped it (`mark_stopped`, from lightning_modules/training/signals.py), with the tags
  `stopped_by` and `stopped_at_step`; even when the store is away at the end: then the final status is among
  the saved calls. A run continued from its checkpoint moves those two tags into `stop_history`, so a run that
  finishes later does not say it was stopped, and the stops stay on record.
- Opening a run is safe when several processes start together on one store: an SQLite store is opened
  under a lock (tracking.store_lock), and an experiment another process created first is found, not
  created twice.
- A run to continue (a checkpoint's) that the store does not hold is an error naming the run and the store,
  or, with `missing_run: new_run`, a new run tagged `resumed_from_run`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from lightning_modules.core.errors import UserError
from lightning_modules.tracking import store as tracking
from lightning_modules.tracking.buffer import BufferedClient

log = logging.getLogger(__name__)

_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}
# The tags of a run a signal stopped (docs/tracking.md, "Run status").
STOPPED_BY, STOPPED_AT_STEP, STOP_HISTORY = "stopped_by", "stopped_at_step", "stop_history"
REPLAY_COMMAND = "python -m lightning_modules replay"


class TrackingError(UserError):
    """The tracking store cannot hold this run as configured; the message says what to change (the entry
    points print it as one line, lightning_modules/core/errors.py)."""


class TrackingRunNotFoundError(TrackingError):
    """The run to continue is not in this tracking store."""


class BufferedMLFlowLogger(MLFlowLogger):
    """MLFlowLogger plus the module docstring's guarantees.

    pending_dir: where calls still held at the end are saved (the CLI sets the checkpoint folder).
    flush_timeout: seconds the end of the run keeps retrying held calls before saving them.
    max_pending: held calls kept in memory; older ones go to the pending file.
    max_retry_interval: the longest wait, in seconds, between two tries while the store is away.
    missing_run: what to do when `run_id` is not in the store: "error", or "new_run" (tagged
      resumed_from_run=<run_id>).
    """

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str | None = "./mlruns",
        log_model: Literal[True, False, "all"] = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool | None = None,
        pending_dir: str | None = None,
        flush_timeout: float = 30.0,
        max_pending: int = 10_000,
        max_retry_interval: float = 60.0,
        missing_run: Literal["error", "new_run"] = "error",
    ) -> None:
        uri = tracking_uri or tracking.tracking_uri()
        tracking.fail_fast_http()  # before the first request: the store is opened right here
        with tracking.store_lock(uri):  # MlflowClient opens (and on first use migrates) the store
            super().__init__(
                experiment_name=experiment_name,
                run_name=run_name,
                tracking_uri=uri,
                tags={str(k): str(v) for k, v in (tags or {}).items()},
                save_dir=save_dir,
                log_model=log_model,
                prefix=prefix,
                artifact_location=artifact_location,
                run_id=run_id,
                synchronous=synchronous,
            )
        self.pending_dir = pending_dir
        self._flush_timeout = flush_timeout
        self._max_pending = max_pending
        self._max_retry_interval = max_retry_interval
        self._missing_run = missing_run
        self._stopped_by: str | None = None

    @property
    def tracking_uri(self) -> str:
        """The store this logger writes to (lightning_modules/training/system_metrics.py monitors into it)."""
        return str(self._tracking_uri)

    @property
    @rank_zero_experiment
    def experiment(self) -> MlflowClient:
        if not self._initialized:
            with tracking.store_lock(self._tracking_uri):
                self._prepare_run()
                MLFlowLogger.experiment.fget(self)  # type: ignore[attr-defined]  # opens or creates the run
            pending = Path(self.pending_dir or "mlflow-pending") / f"mlflow-pending-{self._run_id}.jsonl"
            self._mlflow_client = BufferedClient(  # type: ignore[assignment]
                self._mlflow_client, self._tracking_uri, pending, self._max_pending, self._max_retry_interval
            )
        return self._mlflow_client

    def _prepare_run(self) -> None:
        """Check a run to continue and mark it RUNNING again, or find/create the experiment race-free."""
        client = self._mlflow_client
        if self._run_id is not None:
            try:
                run = client.get_run(self._run_id)
            except MlflowException as e:
                if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                if self._missing_run == "error":
                    raise TrackingRunNotFoundError(
                        f"MLflow run {self._run_id}, which this run continues, is not in the tracking store "
                        f"{self._tracking_uri}; set MLFLOW_TRACKING_URI to the store that holds it, or add "
                        f"--trainer.logger.init_args.missing_run new_run to log to a new run tagged "
                        f"resumed_from_run={self._run_id}"
                    ) from None
                self.tags = {**(self.tags or {}), "resumed_from_run": self._run_id}
                self._run_id = None
            else:
                if run.info.status != "RUNNING":
                    client.update_run(self._run_id, status="RUNNING")
                self._record_earlier_stop(client, run.data.tags)
                return
        if self._experiment_id is None:
            self._experiment_id = self._find_or_create_experiment(client)

    def _record_earlier_stop(self, client: MlflowClient, tags: dict[str, str]) -> None:
        """A continued run that a signal stopped: its stop goes into stop_history ("SIGTERM at step 5; ...")."""
        if STOPPED_BY not in tags:
            return
        entry = f"{tags[STOPPED_BY]} at step {tags.get(STOPPED_AT_STEP, '?')}"
        history = tags.get(STOP_HISTORY)
        client.set_tag(self._run_id, STOP_HISTORY, f"{history}; {entry}" if history else entry)
        for key in (STOPPED_BY, STOPPED_AT_STEP):
            if key in tags:
                client.delete_tag(self._run_id, key)

    @rank_zero_only
    def mark_stopped(self, reason: str, step: int) -> None:
        """A signal stopped the fit (lightning_modules/training/signals.py): tag why and where now, and end
        the run KILLED rather than FAILED."""
        self._stopped_by = reason
        if self._initialized:
            self.experiment.set_tag(self._run_id, STOPPED_BY, reason)
            self.experiment.set_tag(self._run_id, STOPPED_AT_STEP, str(step))

    def _find_or_create_experiment(self, client: MlflowClient) -> str:
        found = client.get_experiment_by_name(self._experiment_name)
        if found is None:
            try:
                return client.create_experiment(
                    self._experiment_name, artifact_location=self._artifact_location
                )
            except MlflowException as e:  # created by another process between the two calls
                found = client.get_experiment_by_name(self._experiment_name)
                if e.error_code != "RESOURCE_ALREADY_EXISTS" or found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            raise TrackingError(
                f"MLflow experiment {self._experiment_name!r} is deleted in the tracking store "
                f"{self._tracking_uri}; restore it (mlflow experiments restore --experiment-id "
                f"{found.experiment_id}) or set --trainer.logger.init_args.experiment_name"
            )
        return found.experiment_id

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if not self._initialized:
            return
        if self._checkpoint_callback:
            self._scan_and_log_checkpoints(self._checkpoint_callback)
        client: BufferedClient = self._mlflow_client  # type: ignore[assignment]
        final = "KILLED" if self._stopped_by is not None else _STATUS.get(status, status)
        client.set_terminated(self._run_id, final)
        if client.drain(self._flush_timeout):
            return
        path = client.save()
        log.warning(
            "MLflow store %s still not answering at the end: %d log calls of run %s (its final status among "
            "them) saved to %s; send them with: %s %s",
            self._tracking_uri,
            client.pending,
            self._run_id,
            path,
            REPLAY_COMMAND,
            path,
        )
