"""Serving a worker pool's Prometheus metrics while it runs.

``serving_metrics`` gives each forked worker a fresh multiprocess directory to record
into, starts ``metrics_exporter`` as a separate process to serve it over HTTP, and on exit
stops that process and removes the directory. The supervisor's process only sets an
environment variable and starts a process here: it imports no metrics library and runs
no thread, so nothing crosses the forks that follow.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs

from ..engine.logs import LogFormat
from ..errors import MetricsUnavailable
from ..pool import sidecar
from ..store.open import ENV_VAR
from ..worker.observer import CycleObserver

log = logging.getLogger("runifold_sync.ops.metrics_endpoint")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
READY = "listening"  # the exporter's one line on stdout once its port is bound
_READY_TIMEOUT_S = 30.0


@attrs.frozen
class MetricsEndpoint:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"


def prometheus_observer() -> CycleObserver:
    """A worker's observer, built in the worker process after the fork. The import is
    here, not at the top, because prometheus_client picks its multiprocess mode when it is
    first imported, which must come after ``serving_metrics`` set the directory."""
    from .metrics import PrometheusObserver

    return PrometheusObserver()


@contextmanager
def serving_metrics(
    endpoint: MetricsEndpoint, database_url: str, *, log_level: str, log_format: LogFormat
) -> Iterator[Callable[[], CycleObserver]]:
    """Serve metrics at ``endpoint`` until the block ends; yields the observer factory
    the pool's workers record with. Raises :class:`MetricsUnavailable` when the exporter
    does not start (the port is taken, the store cannot be opened)."""
    if "prometheus_client" in sys.modules and MULTIPROC_ENV not in os.environ:
        raise MetricsUnavailable(
            "prometheus_client was imported before the metrics directory was set, so workers "
            f"would record nowhere; set {MULTIPROC_ENV} before the application imports it"
        )
    directory = tempfile.mkdtemp(prefix="runifold-metrics-")
    previous = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = directory
    try:
        exporter = _start(endpoint, directory, database_url, log_level, log_format)
        try:
            log.info("serving metrics at %s", endpoint.url)
            yield prometheus_observer
        finally:
            sidecar.stop(exporter)
    finally:
        if previous is None:
            del os.environ[MULTIPROC_ENV]
        else:
            os.environ[MULTIPROC_ENV] = previous
        shutil.rmtree(directory, ignore_errors=True)


def _start(
    endpoint: MetricsEndpoint, directory: str, database_url: str, log_level: str, log_format: LogFormat
) -> subprocess.Popen[str]:
    """Start the exporter and wait until it listens, so a taken port fails ``run`` now."""
    command = [sys.executable, "-m", "runifold_sync.ops.metrics_exporter", "--directory", directory]
    command += ["--host", endpoint.host, "--port", str(endpoint.port)]
    command += ["--log-level", log_level, "--log-format", log_format]
    exporter = subprocess.Popen(
        command, stdout=subprocess.PIPE, env={**os.environ, ENV_VAR: database_url}, text=True
    )
    assert exporter.stdout is not None
    try:
        ready, _, _ = select.select([exporter.stdout], [], [], _READY_TIMEOUT_S)
        line = exporter.stdout.readline() if ready else ""
    finally:
        exporter.stdout.close()  # the pool's children must not inherit it
    if line.strip() != READY:
        sidecar.stop(exporter)
        raise MetricsUnavailable(
            f"the metrics exporter did not start serving {endpoint.url} "
            f"(exit code {exporter.returncode}; its error is above)"
        )
    return exporter
