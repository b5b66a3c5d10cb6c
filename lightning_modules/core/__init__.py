"""What every other part stands on, importing nothing else of the project.

- errors.py         UserError and ConfigError, and the entry points' one error path (one line, not a traceback)
- fragments.py      where conf/ is, and how repeated --config fragments compose
- precision.py      which numeric precision a run uses when the user does not say
- lightning_api.py  the few Lightning internals the project relies on, checked by tests/core/test_lightning_api.py
"""
