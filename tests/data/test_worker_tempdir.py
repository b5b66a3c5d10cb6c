"""data/worker_tempdir.py: a TMPDIR too long for the loader workers' sockets is refused, naming it, instead of
the fit hanging at its first batch; a short one, or no workers, passes."""

from __future__ import annotations

import multiprocessing
import tempfile
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from data import worker_tempdir
from data.data_errors import DataError


class _Batches(IterableDataset):
    def __iter__(self):  # noqa: ANN204
        yield from (torch.full((4, 33), i) for i in range(3))


def _use_tempdir(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """As if the process had started with TMPDIR=folder (multiprocessing makes its own folder there anew)."""
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setitem(multiprocessing.current_process()._config, "tempdir", None)


def test_a_long_tempdir_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    longest = worker_tempdir.MAX_SOCKET_PATH - worker_tempdir.SOCKET_SUFFIX
    folder = tmp_path / ("x" * max(1, longest + 1 - len(str(tmp_path)) - 1))
    assert len(str(folder)) == longest + 1
    _use_tempdir(monkeypatch, folder)
    with pytest.raises(
        DataError, match=rf"TMPDIR={folder} is too long .*\({longest + 1 + 32} bytes\).*num_workers=0"
    ):
        worker_tempdir.check(2)
    worker_tempdir.check(0)  # no workers, no sockets


def test_the_longest_allowed_tempdir_really_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the limit the check passes and a worker's batches arrive (one byte more and they would not)."""
    longest = worker_tempdir.MAX_SOCKET_PATH - worker_tempdir.SOCKET_SUFFIX
    if len(str(tmp_path)) + 2 > longest:
        pytest.skip(f"{tmp_path} is already longer than {longest} bytes")
    folder = tmp_path / ("x" * (longest - len(str(tmp_path)) - 1))
    assert len(str(folder)) == longest
    _use_tempdir(monkeypatch, folder)
    worker_tempdir.check(1)
    loader = DataLoader(_Batches(), batch_size=None, num_workers=1, timeout=60)
    assert [int(b[0, 0]) for b in loader] == [0, 1, 2]
