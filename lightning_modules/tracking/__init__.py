"""MLflow tracking (docs/tracking.md).

- buffer.py  outage-tolerant writes: failed calls kept in order and sent later
- logger.py  Lightning's MLFlowLogger, made to hold where runs meet a real tracking server
- replay.py  sending a run's pending calls after an outage
- runs.py    what a run is called and tagged
- store.py   where the store is, the experiment, the lock that opens an SQLite store safely, reachability
- ui.py      what the MLflow UI needs to show these runs as a person training models expects
"""
