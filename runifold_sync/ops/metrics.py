"""Prometheus metrics: what worker processes record about their cycles, and the gauges
the exporter computes from the store when it is scraped.

In a forked pool each worker records into prometheus_client's multiprocess files, and
prometheus_client chooses that mode when it is first imported: a recording process must
import this module only after ``PROMETHEUS_MULTIPROC_DIR`` is set (``metrics_endpoint``
does that before it forks anything). Only counters and histograms are recorded, so a
worker that exits leaves nothing stale behind (no live gauges to mark dead).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..model.flow import FlowGroup
from ..model.outcomes import DefinitionUnavailable, Failed, LeaseLost, Retried, RunOutcome
from ..store.base import WorkflowStore
from ..store.records import ClaimedTask
from ..store.serving import ReadyRoute, ready_routes, served_versions
from ..worker.observer import CycleObserver

log = logging.getLogger("runifold_sync.ops.metrics")

_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0
# Definition names come from stored tasks, which whoever enqueues can make up, and each
# distinct label value is a time series: past this many (per process, per metric) the
# rest are counted together under OTHER.
MAX_DEFINITION_LABELS = 50
OTHER = "(other)"
_QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, _MINUTE, 5 * _MINUTE, 15 * _MINUTE, _HOUR)
_CYCLE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, _MINUTE, 5 * _MINUTE, 15 * _MINUTE)
_WAIT_BUCKETS = (1, 10, _MINUTE, 10 * _MINUTE, _HOUR, 6 * _HOUR, _DAY, 7 * _DAY, 30 * _DAY)
_OPERATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_LATE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, _MINUTE)
_LEFT_BUCKETS = (0.5, 1, 2.5, 5, 10, 15, 20, 30, _MINUTE, 2 * _MINUTE, 5 * _MINUTE)


class BoundedLabels:
    """(definition, version) label values, at most ``limit`` distinct ones: a pair first
    seen after that is reported as (OTHER, OTHER)."""

    def __init__(self, limit: int = MAX_DEFINITION_LABELS) -> None:
        self._limit = limit
        self._seen: set[tuple[str, str]] = set()

    def __call__(self, name: str, version: int) -> tuple[str, str]:
        pair = (name, str(version))
        if pair in self._seen:
            return pair
        if len(self._seen) < self._limit:
            self._seen.add(pair)
            return pair
        return OTHER, OTHER


class PrometheusObserver(CycleObserver):
    """Records cycles into prometheus_client metrics. Without ``registry`` the metrics are
    registered nowhere in this process: in multiprocess mode the exporter reads them from
    the files; tests pass a registry of their own and read it."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        counter = functools.partial(Counter, registry=registry)
        histogram = functools.partial(Histogram, registry=registry)
        self.queue_delay = histogram(
            "runifold_queue_delay_seconds",
            "Store time from a task becoming claimable to its claim.",
            buckets=_QUEUE_BUCKETS,
        )
        self.wait = histogram(
            "runifold_wait_seconds",
            "Store time a task spent waiting, observed when it is resumed, by wait kind.",
            ["kind"],
            buckets=_WAIT_BUCKETS,
        )
        self.cycle = histogram(
            "runifold_cycle_seconds",
            "Execution time of a claim-and-execute cycle, from the claim to its store transition.",
            ["outcome"],
            buckets=_CYCLE_BUCKETS,
        )
        self.lease_losses = counter(
            "runifold_lease_losses", "Cycles that ended because another worker owns the task."
        )
        self.failures = counter(
            "runifold_failures", "Tasks that failed, by a fixed classification of why.", ["reason"]
        )
        self.retries = counter("runifold_retries", "Step failures requeued with backoff.")
        self.unavailable = counter(
            "runifold_definition_unavailable",
            "Claims released because this worker lacks the definition version.",
            ["definition", "version"],
        )
        self._definition_labels = BoundedLabels()
        self._diagnostics(counter, histogram)

    def _diagnostics(self, counter: Callable[..., Counter], histogram: Callable[..., Histogram]) -> None:
        """The readings a rise in lease losses calls for: transaction latency, pool
        waits, heartbeat timing and runtime stalls."""
        self.operations = histogram(
            "runifold_store_operation_seconds",
            "Duration of each store operation of a worker (claim, heartbeat, commit_checkpoint, ...).",
            ["operation"],
            buckets=_OPERATION_BUCKETS,
        )
        self.pool_requests = counter(
            "runifold_store_pool_requests",
            "Requests for a store connection (PostgreSQL's pool) or the database lock (SQLite).",
        )
        self.pool_waits = counter(
            "runifold_store_pool_waits", "Of those requests, the ones that had to wait."
        )
        self.pool_wait_seconds = counter(
            "runifold_store_pool_wait_seconds",
            "Time requests spent waiting for a connection or the database lock.",
        )
        self.heartbeat_lateness = histogram(
            "runifold_heartbeat_lateness_seconds",
            "How long after its schedule (an interval after the last extension) a heartbeat was sent.",
            buckets=_LATE_BUCKETS,
        )
        self.heartbeat_lease_left = histogram(
            "runifold_heartbeat_lease_left_seconds",
            "Lease time left, as the worker counts it, when a heartbeat's extension landed.",
            buckets=_LEFT_BUCKETS,
        )
        self.stalls = histogram(
            "runifold_runtime_stall_seconds",
            "How late the heartbeat thread woke up: a frozen process, or one starved of the GIL.",
            buckets=_LATE_BUCKETS,
        )

    def claimed(self, claimed: ClaimedTask) -> None:
        self.queue_delay.observe(claimed.queue_delay.total_seconds())
        if claimed.wait_kind is not None and claimed.wait_started_at is not None:
            waited = claimed.claimed_at - claimed.wait_started_at
            self.wait.labels(claimed.wait_kind).observe(max(waited.total_seconds(), 0.0))

    def finished(self, claimed: ClaimedTask, outcome: RunOutcome, duration_s: float) -> None:
        self.cycle.labels(outcome.kind).observe(duration_s)
        if isinstance(outcome, LeaseLost):
            self.lease_losses.inc()
        elif isinstance(outcome, Failed):
            self.failures.labels(outcome.cause).inc()
        elif isinstance(outcome, Retried):
            self.retries.inc()
        elif isinstance(outcome, DefinitionUnavailable):
            self.unavailable.labels(*self._definition_labels(outcome.name, outcome.version)).inc()

    def store_operation(self, operation: str, duration_s: float) -> None:
        self.operations.labels(operation).observe(duration_s)

    def pool_wait(self, requests: int, waited: int, wait_s: float) -> None:
        self.pool_requests.inc(requests)
        self.pool_waits.inc(waited)
        self.pool_wait_seconds.inc(wait_s)

    def heartbeat(self, lateness_s: float, lease_left_s: float) -> None:
        self.heartbeat_lateness.observe(lateness_s)
        self.heartbeat_lease_left.observe(lease_left_s)

    def runtime_stall(self, drift_s: float) -> None:
        self.stalls.observe(drift_s)


class StoreCollector(Collector):
    """Gauges read from the store at each scrape, so they are as fresh as the scrape:
    task counts and the oldest ready age per tenant and state, tasks whose definition
    version no live worker serves, ready tasks no live worker can claim per queue and
    version, ready tasks deferred by tenant admission, and how far this host's clock is
    from store time. A store that cannot answer gives ``runifold_store_up 0`` instead of
    a failed scrape."""

    def __init__(self, store: WorkflowStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "runifold_store_up", "1 when the exporter could read the store at this scrape."
        )
        try:
            skew_s = time.time() - self._store.now().timestamp()
            rows = self._store.queue_stats()
            served = served_versions(self._store)
            routes = ready_routes(self._store)
            admissions = self._store.tenant_admission()
            groups = self._store.flow_groups()
        except Exception as exc:  # a scrape must not fail with the store: the workers' metrics still count
            self._store.outage.report(log, "store gauges unavailable", exc, {})
            up.add_metric([], 0)
            yield up
            return
        self._store.outage.answered()
        up.add_metric([], 1)
        yield up
        clock = GaugeMetricFamily(
            "runifold_clock_skew_seconds",
            "This host's clock minus store time, read at the scrape (leases and timers follow store time).",
        )
        clock.add_metric([], skew_s)
        yield clock
        tasks = GaugeMetricFamily(
            "runifold_tasks", "Tasks per tenant, state and outcome.", labels=["tenant", "state", "outcome"]
        )
        oldest = GaugeMetricFamily(
            "runifold_oldest_ready_age_seconds",
            "How long the longest-ready task has waited for a claim, per tenant and state.",
            labels=["tenant", "state"],
        )
        for row in rows:
            outcome = "" if row.outcome is None else row.outcome.value
            tasks.add_metric([row.tenant, row.state.value, outcome], row.count)
            if row.oldest_ready_age_s is not None:
                oldest.add_metric([row.tenant, row.state.value], row.oldest_ready_age_s)
        unserved = GaugeMetricFamily(
            "runifold_unserved_tasks",
            "Tasks referencing a definition version that no live worker serves (0 when one does).",
            labels=["definition", "version"],
        )
        counts = [
            ((v.reference.name, str(v.reference.version)), 0 if v.live_workers else v.reference.total)
            for v in served
        ]
        counts.sort(key=lambda item: -item[1])  # the largest keep their own series
        for labels, count in counts[:MAX_DEFINITION_LABELS]:
            unserved.add_metric(list(labels), count)
        if len(counts) > MAX_DEFINITION_LABELS:
            unserved.add_metric([OTHER, OTHER], sum(count for _, count in counts[MAX_DEFINITION_LABELS:]))
        unserved_ready = _unserved_ready(routes)
        held = GaugeMetricFamily(
            "runifold_admission_deferred_tasks",
            "Ready tasks a claim skips now because their tenant is at its lease limit "
            "(admission=tenant_limit) or over its budget (admission=budget).",
            labels=["tenant", "admission"],
        )
        for admission in admissions:
            tenant = admission.policy.tenant
            over_budget = admission.over_budget
            held.add_metric([tenant, "budget"], admission.ready if over_budget else 0)
            held.add_metric([tenant, "tenant_limit"], admission.held if not over_budget else 0)
        yield from (tasks, oldest, unserved, unserved_ready, held)
        yield from _flow_gauges(groups)


def _flow_gauges(groups: list[FlowGroup]) -> Iterator[GaugeMetricFamily]:
    """Per flow-limited group (scope and group: a key, a definition, a queue): its
    running tasks, its max_running, its claims in the rate's window, and its ready tasks
    waiting. The groups with the most waiting keep their own series; the rest are summed
    under "other" (a limit by key prefix may make thousands of groups)."""
    labels = ["scope", "group"]
    running = GaugeMetricFamily("runifold_flow_running_tasks", "Leased tasks of a flow group.", labels=labels)
    limit = GaugeMetricFamily(
        "runifold_flow_max_running", "The max_running of a flow group (absent: no such limit).", labels=labels
    )
    claimed = GaugeMetricFamily(
        "runifold_flow_window_claims", "Claims of a rate-limited flow group in its window.", labels=labels
    )
    waiting = GaugeMetricFamily(
        "runifold_flow_waiting_tasks", "Ready tasks of a flow group waiting for a claim.", labels=labels
    )
    ranked = sorted(groups, key=lambda g: -g.waiting)
    for group in ranked[:MAX_DEFINITION_LABELS]:
        names = [group.limit.scope, group.name]
        running.add_metric(names, group.running)
        waiting.add_metric(names, group.waiting)
        if group.limit.max_running is not None:
            limit.add_metric(names, group.limit.max_running)
        if group.limit.rate is not None:
            claimed.add_metric(names, group.claimed_in_window)
    rest = ranked[MAX_DEFINITION_LABELS:]
    if rest:
        running.add_metric([OTHER, OTHER], sum(g.running for g in rest))
        waiting.add_metric([OTHER, OTHER], sum(g.waiting for g in rest))
    yield from (running, limit, claimed, waiting)


def _unserved_ready(routes: list[ReadyRoute]) -> GaugeMetricFamily:
    """One series per queue and definition version with ready tasks: how many of them no
    live worker can claim (0 once one can). The largest keep their own series."""
    gauge = GaugeMetricFamily(
        "runifold_unserved_ready_tasks",
        "Ready tasks (queued, due, not paused) that no live worker can claim, by queue and "
        "definition version (0 when one can): its queue, version or steps are served by none.",
        labels=["queue", "definition", "version"],
    )
    ranked = sorted(routes, key=lambda r: -r.unserved)
    for r in ranked[:MAX_DEFINITION_LABELS]:
        gauge.add_metric([r.queue, r.name, str(r.version)], r.unserved)
    if len(ranked) > MAX_DEFINITION_LABELS:
        gauge.add_metric([OTHER, OTHER, OTHER], sum(r.unserved for r in ranked[MAX_DEFINITION_LABELS:]))
    return gauge
