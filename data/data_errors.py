"""One exception family for the data pipeline, so callers and CLIs can tell bad data from bugs.

DataError is a UserError: the entry points' one error path (lightning_modules/core/errors.py) reports it in one line.
"""

from lightning_modules.core.errors import UserError


class DataError(UserError):
    """Bad input or bad shards: the message names the file and what is wrong with it."""


class PrepareError(DataError):
    """The corpus or the prepare options cannot produce shards (missing, empty, undecodable input...)."""


class ManifestError(DataError):
    """manifest.json is missing, malformed, or disagrees with the options or the shards."""


class ShardError(DataError):
    """A shard is missing, truncated, corrupt, or its contents disagree with the manifest."""
