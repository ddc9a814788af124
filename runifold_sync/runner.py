"""Running workers from an application's settings: one cycle in this process (the cron
mode) or a supervised pool of forked workers. The CLI and the framework integrations
share it, so every entry point checks settings and exit rules the same way."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Unpack

import attrs

from .app import load_registry
from .errors import InvalidArgument
from .model.cancellation import CancellationToken
from .model.outcomes import Completed, ContinuedAsNew, Idle, Retried, RunOutcome, Suspended, Yielded
from .model.redaction import redacted
from .model.values import (
    LeaseDuration,
    TaskOptions,
    WorkerId,
    WorkflowTask,
    check_count,
    check_int,
    check_name,
    seconds_duration,
)
from .ops.tracing_env import exporter_entry_points
from .pool.preflight import check_pool_can_start
from .pool.supervisor import SupervisorReport, WorkflowSupervisor, WorkflowSupervisorConfig
from .store.base import WorkflowStore
from .store.open import default_url, open_store
from .worker.idle_backoff import DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF
from .worker.observer import CycleObserver
from .worker.settings import MAX_CLAIM_BATCH, WorkerSettings
from .worker.worker import WorkflowWorker
from .workflow.registry import WorkflowRegistry

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

SETTING_NAMES = (
    "RUNIFOLD_DATABASE_URL",
    "RUNIFOLD_APP",
    "RUNIFOLD_CONCURRENCY",
    "RUNIFOLD_LEASE_SECONDS",
    "RUNIFOLD_HEARTBEAT_SECONDS",
    "RUNIFOLD_CLAIM_BATCH",
    "RUNIFOLD_RECYCLE_AFTER",
    "RUNIFOLD_SHUTDOWN_GRACE_SECONDS",
    "RUNIFOLD_TRACING",
    "RUNIFOLD_QUEUES",
    "RUNIFOLD_MAX_BACKOFF_SECONDS",
)
DEFAULT_SHUTDOWN_GRACE = timedelta(seconds=60)
_OK_ONCE = (Idle, Completed, Suspended, Retried, Yielded, ContinuedAsNew)

CycleHook = Callable[[], AbstractContextManager[object]]
StoreHook = Callable[[WorkflowStore], None]


MIN_LEASE_S = 0.1
MIN_HEARTBEAT_S = 0.05  # half the shortest lease


def _number(name: str, value: object, minimum: float) -> float:
    return seconds_duration(name, value, minimum_s=minimum).total_seconds()


def parse_queues(value: object) -> tuple[str, ...]:
    """``RUNIFOLD_QUEUES``: queue names, comma-separated or a sequence; unset: default.
    Public because ``run`` reads the environment variable with it: the CLI and the
    Flask/Django settings then split and check the same value the same way."""
    if value is None or value == "":
        return ("default",)
    if isinstance(value, str):
        names = [name.strip() for name in value.split(",")]
    elif isinstance(value, (list, tuple)):
        names = list(value)
    else:
        raise InvalidArgument(f"RUNIFOLD_QUEUES must be queue names, got {value!r}")
    return tuple(dict.fromkeys(check_name("RUNIFOLD_QUEUES queue", name) for name in names))


@attrs.frozen
class RunifoldSettings:
    """The ``RUNIFOLD_*`` settings of an application, checked when it starts."""

    database_url: str = attrs.field(repr=lambda url: repr(redacted(url)))  # printed without its password
    app: str | WorkflowRegistry | None
    concurrency: int
    lease: LeaseDuration
    heartbeat: timedelta
    claim_batch: int = 1
    recycle_after: int | None = None  # tasks after which a pool worker is replaced
    # How long a stopping pool waits for a child to finish its cycle before killing it.
    shutdown_grace: timedelta = DEFAULT_SHUTDOWN_GRACE
    # Each worker traces its cycles with a provider of its own, built in the process that
    # runs it (a pool child: after the fork) from the OTEL_* variables (tracing.py).
    tracing: bool = False
    # The named queues each worker claims from.
    queues: tuple[str, ...] = ("default",)
    # The longest an idle worker waits between looks for work (PostgreSQL wakes it on
    # NOTIFY sooner), and how long it waits after a cycle failed on the store.
    max_backoff: timedelta = DEFAULT_MAX_BACKOFF

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunifoldSettings:
        """Read the settings from ``values`` (Flask's ``app.config``, or Django's settings
        gathered into a dict). A missing store URL means ``$RUNIFOLD_DATABASE_URL``, else
        a local SQLite file; every number is checked here, not later in a worker."""
        url = values.get("RUNIFOLD_DATABASE_URL") or default_url()
        if not isinstance(url, str):
            raise InvalidArgument(f"RUNIFOLD_DATABASE_URL must be a string, got {url!r}")
        app = values.get("RUNIFOLD_APP")
        if app is not None and not isinstance(app, (str, WorkflowRegistry)):
            raise InvalidArgument(
                f"RUNIFOLD_APP must be a 'module:attribute' string or a WorkflowRegistry, got {app!r}"
            )
        concurrency = check_count("RUNIFOLD_CONCURRENCY", values.get("RUNIFOLD_CONCURRENCY", 1))
        lease_s = _number("RUNIFOLD_LEASE_SECONDS", values.get("RUNIFOLD_LEASE_SECONDS", 30), MIN_LEASE_S)
        heartbeat_s = values.get("RUNIFOLD_HEARTBEAT_SECONDS")
        if heartbeat_s is None:  # a third of the lease, so a lease given alone is never refused
            heartbeat_s = max(lease_s / 3, MIN_HEARTBEAT_S)
        heartbeat_s = _number("RUNIFOLD_HEARTBEAT_SECONDS", heartbeat_s, MIN_HEARTBEAT_S)
        lease = LeaseDuration(timedelta(seconds=lease_s))
        heartbeat = timedelta(seconds=heartbeat_s)
        claim_batch = check_int(
            "RUNIFOLD_CLAIM_BATCH", values.get("RUNIFOLD_CLAIM_BATCH", 1), minimum=1, maximum=MAX_CLAIM_BATCH
        )
        recycle_after = values.get("RUNIFOLD_RECYCLE_AFTER")
        if recycle_after is not None:
            recycle_after = check_count("RUNIFOLD_RECYCLE_AFTER", recycle_after)
        grace_s = _number(
            "RUNIFOLD_SHUTDOWN_GRACE_SECONDS",
            values.get("RUNIFOLD_SHUTDOWN_GRACE_SECONDS", DEFAULT_SHUTDOWN_GRACE.total_seconds()),
            0.1,
        )
        max_backoff_s = _number(
            "RUNIFOLD_MAX_BACKOFF_SECONDS",
            values.get("RUNIFOLD_MAX_BACKOFF_SECONDS", DEFAULT_MAX_BACKOFF.total_seconds()),
            DEFAULT_MIN_BACKOFF.total_seconds(),
        )
        tracing = values.get("RUNIFOLD_TRACING", False)
        if not isinstance(tracing, bool):
            raise InvalidArgument(f"RUNIFOLD_TRACING must be True or False, got {tracing!r}")
        settings = cls(
            url,
            app,
            concurrency,
            lease,
            heartbeat,
            claim_batch,
            recycle_after,
            timedelta(seconds=grace_s),
            tracing,
            parse_queues(values.get("RUNIFOLD_QUEUES")),
            timedelta(seconds=max_backoff_s),
        )
        settings.worker_settings()  # checks the heartbeat against the lease
        return settings

    def worker_settings(self) -> WorkerSettings:
        """The settings of each worker these settings run."""
        return WorkerSettings(self.lease, self.heartbeat, claim_batch=self.claim_batch, queues=self.queues)

    def task(self, name: str, version: int, input: Any, **options: Unpack[TaskOptions]) -> WorkflowTask:
        """A task for an application's own enqueue (Flask, Django): checked by the
        registry (``WorkflowRegistry.task``: known name and version, input that fits)
        when ``RUNIFOLD_APP`` names one, as ``WorkflowTask.new`` builds it otherwise.
        ``options`` are theirs (:class:`TaskOptions`)."""
        if self.app is None:
            return WorkflowTask.new(name, version, input, **options)
        return self.registry().task(name, version, input, **options)

    def registry(self) -> WorkflowRegistry:
        """The application's registry (imported from ``RUNIFOLD_APP`` on each call)."""
        if self.app is None:
            raise InvalidArgument(
                "RUNIFOLD_APP is not set: name the WorkflowRegistry workers run, as 'package.module:registry'"
            )
        if isinstance(self.app, WorkflowRegistry):
            return self.app
        return load_registry(self.app)


def once_succeeded(outcome: RunOutcome) -> bool:
    """The ``--once`` exit rule (cron): success for idle, completed, suspended and
    retried, as the seed says, and for yielded, this design's addition, which like
    retried means progress was committed and the task requeued. Failed, lease lost,
    definition unavailable and cancelled fail, so cron reports them: a cycle that ended
    in any of those left work to look at."""
    return isinstance(outcome, _OK_ONCE)


def default_worker_id() -> str:
    return socket.gethostname().split(".")[0]


class EmbeddedWorker(WorkflowWorker):
    """A worker that runs each cycle inside the framework's context (an app context, fresh
    database connections) and owns its store."""

    def __init__(
        self,
        store: WorkflowStore,
        registry: WorkflowRegistry,
        worker_id: WorkerId,
        settings: RunifoldSettings,
        cycle: CycleHook,
        observer: CycleObserver | None = None,
    ) -> None:
        try:
            super().__init__(
                store,
                registry,
                worker_id,
                settings=settings.worker_settings(),
                observer=observer,
                tracer_provider=_tracer_provider() if settings.tracing else None,
            )
        except BaseException:
            store.close()
            raise
        self._cycle_hook = cycle

    def _cycle(self, *, claim_next: bool, stopping: CancellationToken | None, hold: bool) -> list[RunOutcome]:
        with self._cycle_hook():
            return super()._cycle(claim_next=claim_next, stopping=stopping, hold=hold)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.store.close()


def _tracer_provider() -> TracerProvider:
    """A provider from the ``OTEL_*`` variables, built where the worker runs (never before
    a fork): tracing's import, and OpenTelemetry's, only when tracing is on."""
    from .ops.tracing import provider_from_env

    return provider_from_env()


def _opened(settings: RunifoldSettings, prepare: StoreHook | None) -> WorkflowStore:
    """A worker's own store, set up by the framework's ``prepare`` (Django: transaction
    steps on its connection)."""
    store = open_store(settings.database_url)
    if prepare is not None:
        try:
            prepare(store)
        except BaseException:
            store.close()
            raise
    return store


def run_one_cycle(
    settings: RunifoldSettings,
    worker_id: str,
    cycle: CycleHook = nullcontext,
    prepare: StoreHook | None = None,
) -> RunOutcome:
    """Claim and run one task in this process (the cron mode), with a store of its own."""
    registry = settings.registry()
    base = WorkerId.parse(worker_id)
    worker = EmbeddedWorker(_opened(settings, prepare), registry, base, settings, cycle)
    try:
        return worker.run_once()
    finally:
        worker.close()


def run_pool(
    settings: RunifoldSettings,
    concurrency: int,
    worker_id: str,
    cycle: CycleHook = nullcontext,
    token: CancellationToken | None = None,
    observer: Callable[[], CycleObserver] | None = None,
    tend: Callable[[], None] | None = None,
    prepare: StoreHook | None = None,
) -> SupervisorReport:
    """Run a supervised pool of ``concurrency`` forked workers until SIGINT, SIGTERM or
    ``token``. The registry is imported and the store checked here, before the fork, so a
    broken ``RUNIFOLD_APP``, an unreachable store, a worker id live elsewhere or (with
    tracing) an exporter not installed fails now (``pool_preflight``, ``tracing_env``);
    each child opens its own store and builds its own ``observer``. ``tend`` is the
    supervisor's (``WorkflowSupervisor.run``): what watches the processes started beside
    the pool; ``prepare`` sets up each child's store as it opens."""
    registry = settings.registry()
    base = WorkerId.parse(worker_id)
    config = (
        WorkflowSupervisorConfig(concurrency)
        .with_shutdown_grace(settings.shutdown_grace)
        .with_backoff(DEFAULT_MIN_BACKOFF, settings.max_backoff)
    )
    if settings.tracing:  # each child would fail on start (tracing_env): one error now instead
        exporter_entry_points()
    check_pool_can_start(
        settings.database_url, (f"{base.value}-{slot}" for slot in range(concurrency)), settings.heartbeat
    )
    if settings.recycle_after is not None:
        config = config.with_recycling(settings.recycle_after)

    def factory(child_id: WorkerId) -> WorkflowWorker:
        recorder = None if observer is None else observer()
        return EmbeddedWorker(_opened(settings, prepare), registry, child_id, settings, cycle, recorder)

    supervisor = WorkflowSupervisor(factory, config, base_id=base.value)
    return supervisor.run(token or CancellationToken(), tend=tend)


def describe_report(report: SupervisorReport) -> str:
    text = f"stopped. outcomes: {report.outcomes}; restarts: {report.restarts}; recycled: {report.recycled}"
    if report.timed_out:
        text += f" ({report.timed_out} of the restarts killed past a step's timeout)"
    return text
