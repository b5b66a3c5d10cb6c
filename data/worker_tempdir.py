"""Loader workers need a short TMPDIR: refuse a long one before it hangs the run.

With torch's default sharing strategy on Linux (file_descriptor), a worker hands each batch's shared memory
to the training process over a Unix socket that multiprocessing names <TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX.
The kernel caps a socket path at 107 bytes (103 on macOS). Past that the worker's send fails in a
background thread, the batch is dropped, and the training process waits for it forever with no error
(seen with a TMPDIR under a deep pytest folder: the fit sat at its first batch until killed).
"""

from __future__ import annotations

import os
import sys
from multiprocessing import util

import torch.multiprocessing as mp

from data.data_errors import DataError

SOCKET_NAME = len("/listener-XXXXXXXX")
SOCKET_SUFFIX = len("/pymp-XXXXXXXX") + SOCKET_NAME
MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107


def check(num_workers: int) -> None:
    """Raise DataError if loader workers would hand batches over sockets whose path is too long."""
    if num_workers == 0 or mp.get_sharing_strategy() != "file_descriptor":
        return
    # multiprocessing's folder for this process (made once, under TMPDIR); forked workers inherit it.
    folder = util.get_temp_dir()
    length = len(os.fsencode(folder)) + SOCKET_NAME
    if length > MAX_SOCKET_PATH:
        raise DataError(
            f"TMPDIR={os.path.dirname(folder)} is too long for data loader workers: they pass batches over "
            f"sockets named {folder}/listener-XXXXXXXX ({length} bytes), and one over {MAX_SOCKET_PATH} bytes "
            f"makes them hang; set TMPDIR to a folder of at most {MAX_SOCKET_PATH - SOCKET_SUFFIX} bytes "
            "(e.g. /tmp), or data.num_workers=0"
        )
