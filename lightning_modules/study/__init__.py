"""The study: a protocol's runs (sizes x arms x seeds on one budget), run resumably from the tracking store,
and its report (per-arm losses with intervals, paired differences, tokens- and FLOPs-to-target, figures).

    python -m lightning_modules.study conf/study/cpu.yaml --workers 2   # run what is not done yet
    python -m lightning_modules.study conf/study/cpu.yaml --report      # results/cpu/ from the store

- protocol.py  the protocol file and the runs it asks for, with their identities
- store.py     done / claimed / free, from the MLflow store; the claim rule for several runners
- runner.py    N worker processes at a time, resume, progress
- worker.py    one run: fit (or resume) and test through main.py's CLI
- lock.py      one worker per run: the run's lock, and the worker dying with its runner
- report.py    tables and figures from the store into results/<protocol>/
"""
