"""``run --tracing``: each pool child builds its provider from the ``OTEL_*`` variables
after the fork and flushes it when SIGTERM stops it (the SDK's console exporter here, on
the children's stdout, which the CLI shares); an exporter no installed package provides
is refused before any worker starts."""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from runifold_sync import Settings, WorkflowTask
from runifold_sync.errors import RunifoldError
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState
from tests.support import processes

APP = "tests.pool.pool_app:registry"


@pytest.mark.timeout(90)
def test_run_tracing_exports_each_childs_cycles_and_steps_through_the_otel_variables(
    sqlite_path: Path, tmp_path: Path
) -> None:
    store = SqliteWorkflowStore.open(sqlite_path)
    ids = [f"t{n}" for n in range(4)]
    for n, task_id in enumerate(ids):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    command = ["run", "--app", APP, "--database", f"sqlite:///{sqlite_path}", "--concurrency", "2"]
    env = os.environ | {
        "POOL_LEDGER": str(tmp_path / "ledger.txt"),
        "RUNIFOLD_TRACING": "1",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "pool-under-test",
    }
    proc = processes.spawn("runifold_sync", *command, "--json", env=env, own_session=True)
    try:
        processes.wait_until(
            lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in ids), 60, "the tasks to end"
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        processes.kill(proc)
        store.close()
    assert proc.returncode == 0
    assert json.loads(out.strip().splitlines()[-1])["outcomes"]["completed"] == 4
    assert out.count('"name": "runifold.cycle"') == 4
    assert out.count('"name": "runifold.step work"') == 4 * 5
    assert out.count('"service.name": "pool-under-test"') == 4 * 6


def test_tracing_setting_must_be_a_boolean() -> None:
    with pytest.raises(RunifoldError, match="RUNIFOLD_TRACING must be True or False, got 'yes'"):
        Settings.from_mapping({"RUNIFOLD_TRACING": "yes"})
    assert Settings.from_mapping({"RUNIFOLD_TRACING": True}).tracing is True


@pytest.mark.parametrize("once", [False, True], ids=["pool", "once"])
def test_run_tracing_refuses_an_exporter_not_installed_before_any_worker_starts(
    sqlite_path: Path, tmp_path: Path, once: bool
) -> None:
    assert not entry_points(group="opentelemetry_traces_exporter", name="zipkin")  # not installed here
    store = SqliteWorkflowStore.open(sqlite_path)
    store.enqueue(WorkflowTask.new("pool-flow", 1, 1, checkpoint_id="t1"))
    url = f"sqlite:///{sqlite_path}"
    command = ["run", "--app", APP, "--database", url, "--tracing", "--concurrency", "2"]
    env = os.environ | {"POOL_LEDGER": str(tmp_path / "ledger.txt"), "OTEL_TRACES_EXPORTER": "zipkin"}
    try:
        done = processes.run("runifold_sync", *command, *(["--once"] if once else []), env=env, timeout_s=60)
        assert done.returncode == 2
        assert done.stdout == ""
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert errors == [
            "Error: --tracing: OTEL_TRACES_EXPORTER names 'zipkin', but no installed package provides "
            "that exporter (OTLP over HTTP, otlp_proto_http, the default for otlp, comes with the "
            "otel extra; OTLP over gRPC, otlp_proto_grpc (otlp with OTEL_EXPORTER_OTLP_PROTOCOL=grpc): "
            "pip install opentelemetry-exporter-otlp-proto-grpc; console comes with the SDK)"
        ]
        assert "Traceback" not in done.stderr and "worker" not in done.stderr
        assert store.workers() == []  # no worker registered: none started
        assert store.get_task("t1").state is TaskState.QUEUED
    finally:
        store.close()


def _without_otel(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if not name.startswith("OTEL_")}


def test_run_tracing_works_with_no_otel_variable_set(sqlite_path: Path, tmp_path: Path) -> None:
    """What the otel extra installs is enough: no OTEL_* variable names an exporter, and
    the default (otlp over HTTP) is the one the extra brings."""
    SqliteWorkflowStore.open(sqlite_path).close()
    env = _without_otel(dict(os.environ)) | {"POOL_LEDGER": str(tmp_path / "ledger.txt")}
    command = ["run", "--app", APP, "--database", f"sqlite:///{sqlite_path}", "--tracing", "--once"]
    done = processes.run("runifold_sync", *command, "--json", env=env, timeout_s=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"outcome": "idle"}
    assert "OTEL" not in done.stderr and "exporter" not in done.stderr


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that keeps the path and content type of what it is sent."""

    received: list[tuple[str, str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.timeout(90)
def test_run_tracing_exports_over_otlp_http_by_default(sqlite_path: Path, tmp_path: Path) -> None:
    store = SqliteWorkflowStore.open(sqlite_path)
    store.enqueue(WorkflowTask.new("pool-flow", 1, 1, checkpoint_id="t1"))
    store.close()
    _Collector.received.clear()
    server = http.server.HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = _without_otel(dict(os.environ)) | {
        "POOL_LEDGER": str(tmp_path / "ledger.txt"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
    }
    command = ["run", "--app", APP, "--database", f"sqlite:///{sqlite_path}", "--tracing", "--once"]
    try:
        done = processes.run("runifold_sync", *command, "--json", env=env, timeout_s=60)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "completed"
    assert _Collector.received == [("/v1/traces", "application/x-protobuf")]
