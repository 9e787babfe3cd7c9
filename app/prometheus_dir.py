"""The folder prometheus-client's multiprocess mode shares between ``serve``'s worker processes
(app.metrics). Apart from app.metrics, because the variable must be set, and the folder emptied,
before prometheus_client is imported: it picks its mode on import, and a process writes its
files as soon as it creates its metrics."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import psutil

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
PREFIX = "memory-service-metrics-"


def prepare(workers: int) -> Path | None:
    """For ``serve``, before the workers start: with PROMETHEUS_MULTIPROC_DIR set, empty it (the
    files of an earlier run would be counted again); else, with several workers, make a fresh
    temporary folder named after this process and set the variable, so that the workers share
    one set of metrics. The folder is removed when serve exits, and the folders of serve
    processes that died without removing theirs at the next start. Returns the folder made, or
    None."""
    given = os.environ.get(MULTIPROC_DIR)
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for file in folder.glob("*.db"):
            file.unlink(missing_ok=True)
        return None
    if workers <= 1:
        return None
    for stale in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        pid = stale.name.removeprefix(PREFIX).split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    made = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    os.environ[MULTIPROC_DIR] = str(made)
    atexit.register(shutil.rmtree, made, ignore_errors=True)
    return made
