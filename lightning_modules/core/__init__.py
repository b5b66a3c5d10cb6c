"""What every other part stands on, importing nothing else of the project.

- errors.py         UserError and ConfigError, and the entry points' one error path (one line, not a traceback)
- files.py          writing a file so that a crash leaves the old one or the new one, never half of one
- fragments.py      where conf/ is, and how repeated --config fragments compose
- lightning_api.py  the few Lightning internals the project relies on, checked by tests/core/test_lightning_api.py
- precision.py      which numeric precision a run uses when the user does not say
- private_api.py    every private (underscore) or version-sensitive torch and Lightning API the project uses, in one list
"""
