"""``run --metrics-port`` as a real process: the forked workers' metrics and the store
gauges served over HTTP by the exporter process, through a worker stopped (SIGSTOP) past
its lease, and the exporter's life bound to the pool's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.cli.main import main
from runifold_sync.ops.metrics_endpoint import (
    MULTIPROC_ENV,
    MetricsEndpoint,
    MetricsUnavailable,
    serving_metrics,
)
from runifold_sync.store import TaskState
from tests.support import processes

APP = "tests.pool.pool_app:registry"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _serving(port: int) -> bool:
    try:
        return _value(_scrape(port), "runifold_store_up") == 1
    except OSError:  # not listening yet
        return False


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _over(samples: Samples, histogram: str, le: str) -> float:
    """Observations of ``histogram`` above its bucket bound ``le``."""
    return _value(samples, f"{histogram}_count") - _value(samples, f"{histogram}_bucket", le=le)


def _children(pid: int) -> dict[int, str]:
    """Live child processes of ``pid`` and their command lines, read from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if int(ppid) == pid and state not in ("Z", "X"):
            found[int(entry.name)] = cmdline
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _exporter(parent: int) -> tuple[int, Path]:
    """The exporter process of ``run`` and the multiprocess directory it reads."""
    [(pid, cmdline)] = [(p, c) for p, c in _children(parent).items() if "metrics_exporter" in c]
    args = cmdline.split()
    return pid, Path(args[args.index("--directory") + 1])


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'workflows.db'}"


@pytest.fixture
def store(url: str) -> Iterator[WorkflowStore]:
    store = open_store(url)  # migrated before the pool starts
    yield store
    store.close()


@pytest.fixture
def start(tmp_path: Path, url: str, store: WorkflowStore) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    with processes.reaped() as started:  # the whole session: workers outlive a killed parent

        def start_run(port: int, *options: str) -> subprocess.Popen[str]:
            env = {**os.environ, "POOL_LEDGER": str(tmp_path / "ledger.txt"), "POOL_STEP_SECONDS": "0.4"}
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            command = ["runifold_sync", "run", "--app", APP, "--database", url]
            command += ["--worker-id", "metrics", "--metrics-port", str(port), *options]
            with (tmp_path / "stderr.txt").open("w") as stderr:
                proc = processes.spawn(*command, stderr=stderr, env=env, own_session=True)
            started.append(proc)
            return proc

        yield start_run
    for proc in started:
        if proc.stdout is not None:
            proc.stdout.close()


def _leased_worker_pid(store: WorkflowStore) -> tuple[str, int]:
    """A task a worker is running, and that worker's pid."""
    pids = {w.worker_id: w.pid for w in store.workers() if w.stopped_at is None}
    for record in store.list_tasks(state=TaskState.LEASED):
        if record.worker_id in pids:
            return record.task_id, pids[record.worker_id]
    raise LookupError


def test_metrics_endpoint_shows_worker_metrics_and_store_gauges_through_a_stopped_worker(
    start: Callable[..., subprocess.Popen[str]], store: WorkflowStore, tmp_path: Path
) -> None:
    for n in range(4):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=f"t{n}"))
    store.enqueue(WorkflowTask.new("pool-flow", 7, None, checkpoint_id="nobody-serves"))
    port = _free_port()
    proc = start(port, "--concurrency", "2", "--lease", "1", "--heartbeat", "0.25", "--log-format", "json")

    found: list[tuple[str, int]] = []

    def a_task_is_running() -> bool:
        try:
            found.append(_leased_worker_pid(store))
        except LookupError:
            return False
        return True

    processes.wait_until(a_task_is_running, 20, "a worker to run a task", poll_s=0.1)
    exporter_pid, directory = _exporter(proc.pid)
    assert directory.is_dir()
    [(task_id, worker_pid)] = found
    os.kill(worker_pid, signal.SIGSTOP)
    time.sleep(2.5)  # well past the 1 s lease
    os.kill(worker_pid, signal.SIGCONT)

    scraped: list[Samples] = []

    def metrics_show_it_all() -> bool:
        samples = _scrape(port)
        scraped[:] = [samples]
        return (
            _value(samples, "runifold_lease_losses_total") >= 1
            and _over(samples, "runifold_runtime_stall_seconds", "1.0") >= 1
            and _value(samples, "runifold_queue_delay_seconds_sum") > 0
            # The loss is counted as the heartbeat finds it; the cycle's outcome when the
            # step thread, thawed, ends that cycle, which may come a scrape later.
            and _value(samples, "runifold_cycle_seconds_count", outcome="lease_lost") >= 1
        )

    processes.wait_until(metrics_show_it_all, 20, "lease loss and queue delay metrics")
    [samples] = scraped
    # The version no worker serves is never claimed (routing), so never handed back.
    assert _value(samples, "runifold_definition_unavailable_total", definition="pool-flow", version="7") == 0
    # The lease-loss diagnostics show the 2.5 s freeze: the heartbeat thread woke over a
    # second late (waited for above). Whether a late beat follows is a race with the step
    # thread, which may end the expired cycle first; test_lease_diagnostics.py has that.
    assert _value(samples, "runifold_heartbeat_lateness_seconds_count") >= 1
    assert _value(samples, "runifold_store_operation_seconds_count", operation="claim") >= 1
    assert _value(samples, "runifold_store_operation_seconds_count", operation="heartbeat") >= 1
    assert _value(samples, "runifold_store_pool_requests_total") > 0
    assert abs(_value(samples, "runifold_clock_skew_seconds")) < 1.0
    assert _value(samples, "runifold_store_up") == 1
    queued_or_leased = sum(
        _value(samples, "runifold_tasks", tenant="default", state=state, outcome="")
        for state in ("queued", "leased")
    )
    assert queued_or_leased >= 1
    assert _value(samples, "runifold_unserved_tasks", definition="pool-flow", version="7") == 1
    assert _value(samples, "runifold_unserved_tasks", definition="pool-flow", version="1") == 0
    unserved_ready = {"queue": "default", "definition": "pool-flow", "version": "7"}
    assert _value(samples, "runifold_unserved_ready_tasks", **unserved_ready) == 1

    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.startswith("stopped.")
    assert not _alive(exporter_pid) and not directory.exists()
    lines = [json.loads(line) for line in (tmp_path / "stderr.txt").read_text().splitlines()]
    lost = [e for e in lines if "no longer held" in e["message"] and e.get("task_id") == task_id]
    assert lost and all(e["worker_id"].startswith("metrics-") and e["fencing_token"] >= 1 for e in lost)


def test_the_exporter_exits_when_the_pool_dies_without_stopping_it(
    start: Callable[..., subprocess.Popen[str]],
) -> None:
    port = _free_port()
    proc = start(port, "--concurrency", "1")
    processes.wait_until(lambda: _serving(port), 20, "the metrics endpoint", poll_s=0.1)
    exporter_pid, directory = _exporter(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # no chance to stop the exporter itself
    processes.wait_until(lambda: not _alive(exporter_pid), 10, "the orphaned exporter to exit", poll_s=0.1)
    shutil.rmtree(directory)  # a killed pool cannot remove it


def test_run_once_refuses_a_metrics_port(url: str) -> None:
    result = CliRunner().invoke(
        main, ["run", "--app", APP, "--database", url, "--once", "--metrics-port", "9100"]
    )
    assert result.exit_code == 2 and "cannot be used with --once" in result.output


def test_an_exporter_that_cannot_listen_fails_at_once_and_leaves_nothing_behind(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))  # as a user who set it before importing
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the run's own directory goes
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = MetricsEndpoint("127.0.0.1", taken.getsockname()[1])
        with pytest.raises(MetricsUnavailable, match="did not start serving"):
            with serving_metrics(endpoint, url, log_level="INFO", log_format="text"):
                pytest.fail("the block must not run")
    assert os.environ[MULTIPROC_ENV] == str(tmp_path)
    assert not list(tmp_path.glob("runifold-metrics-*"))


def test_metrics_are_refused_when_prometheus_client_was_imported_without_the_directory(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    assert "prometheus_client" in sys.modules  # this module imported it
    with pytest.raises(MetricsUnavailable, match="imported before"):
        with serving_metrics(MetricsEndpoint("127.0.0.1", 9100), url, log_level="INFO", log_format="text"):
            pytest.fail("the block must not run")
