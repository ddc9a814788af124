"""``App``: the front door. One object holds an application's settings, its store and
its registry; workflows are declared on it, started through it, and run by it (one cycle
here, until idle here, or a supervised pool of forked workers).

.. code-block:: python

    from runifold_sync import App

    app = App("sqlite:///hello.db")
    hello = app.workflow("hello")

    @hello.step()
    def greet(ctx, name: str) -> str:
        return f"hello, {name}"

    @hello.main
    def main(ctx, name: str) -> str:
        return greet(ctx, name)

    task = app.start("hello", "world")
    app.run_once()
    print(task.result())

Everything ``App`` does is done by the explicit API beneath it (``WorkflowRegistry``,
``WorkflowDefinition``, ``WorkflowWorker``, ``WorkflowSupervisor``, a store), which stays
for those who want every knob. ``load_registry`` and ``load_app`` find an application's
``App`` or registry from a ``module:attribute`` reference, as ``run --app``, ``versions``
and the framework integrations do.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import sysconfig
import threading
import traceback
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Unpack

import attrs

from .engine.spans import CycleTracer
from .errors import AppNotLoaded, InvalidArgument, TaskFailed
from .model import validate
from .model.cancellation import CancellationToken
from .model.codec import structure
from .model.outcomes import Completed, ContinuedAsNew, Idle, Retried, RunOutcome, Suspended, Yielded
from .model.redaction import redacted
from .model.values import Budget, CapabilitySet, FlowOptions, TaskOutcome, TaskState, WorkerId
from .pool.preflight import check_ids_free
from .pool.supervisor import SupervisorReport, WorkflowSupervisor, check_base_id
from .settings import Settings
from .store.base import WorkflowStore
from .store.open import open_store
from .store.records import SignalDelivery, TaskRecord
from .worker.observer import CycleObserver
from .worker.until_idle import DEFAULT_MAX_CYCLES, run_until_idle
from .worker.worker import WorkflowWorker
from .workflow.declaration import Workflow
from .workflow.registry import WorkflowDefinition, WorkflowRegistry
from .workflow.specs import return_type

CycleHook = Callable[[], AbstractContextManager[object]]
StoreHook = Callable[[WorkflowStore], None]
TracerFactory = Callable[[], CycleTracer]

_OK_ONCE = (Idle, Completed, Suspended, Retried, Yielded, ContinuedAsNew)

# The locks of every App, for opening its store and for registering what it declared,
# replaced in a forked child: a thread of the parent may have held one at the moment of
# the fork, and that thread is not in the child. Registering may import the application
# (``settings.app``), whose import may use an App: that lock is reentrant.
_open_lock = threading.Lock()
_registry_lock = threading.RLock()


def _new_lock_after_fork() -> None:
    global _open_lock, _registry_lock
    _open_lock = threading.Lock()
    _registry_lock = threading.RLock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


class App:
    """An application's settings, store and registry, in one object.

    ``App()`` uses ``$RUNIFOLD_DATABASE_URL``, else the local SQLite file
    ``runifold-workflows.db``; ``App("postgresql://...")`` names the store;
    ``App(settings)`` takes a whole :class:`~runifold_sync.Settings`; keyword arguments
    override single settings by their field names (``App(url, concurrency=4,
    claim_batch=8)``, see :meth:`Settings.replace`). Bad settings are
    :class:`~runifold_sync.errors.InvalidArgument` here, naming the setting and the value.

    The registry is ``registry`` when given; else the one ``settings.app`` names (a
    ``module:attribute`` reference to an App or a registry, imported when first needed);
    else a new, empty one. :meth:`workflow` declares workflows into it.

    The store is opened when first used, once per process: a process forked after it
    was opened (a web server's workers) opens its own, and never uses or closes its
    parent's. The process's threads share it. :meth:`close` closes it (the App works on
    afterwards, opening it again when needed); ``with App(...) as app:`` closes it at the
    end of the block.

    ``tracer`` is a function returning a tracer
    (:class:`~runifold_sync.engine.spans.CycleTracer`: ``runifold_sync.ops.tracing_env.tracer_from_env``
    builds one from the ``OTEL_*`` variables, ``lambda: Tracing(provider)`` over a
    provider of your own); it is called in each process that runs a worker, after any
    fork, so nothing of the tracer crosses one. ``cycle`` and ``prepare`` are for
    framework integrations: each worker cycle runs inside ``cycle()`` (Flask's app
    context), and each store this App opens is handed to ``prepare`` first (Django's
    transaction steps).

    Attributes:
        settings: the :class:`~runifold_sync.Settings` this App runs with.
        tracer: the tracer factory given, or None."""

    def __init__(
        self,
        url_or_settings: str | Settings | None = None,
        *,
        registry: WorkflowRegistry | None = None,
        tracer: TracerFactory | None = None,
        cycle: CycleHook | None = None,
        prepare: StoreHook | None = None,
        **overrides: Any,
    ) -> None:
        if isinstance(url_or_settings, Settings):
            settings = url_or_settings
        elif isinstance(url_or_settings, str):
            settings = Settings(database_url=url_or_settings)
        elif url_or_settings is None:
            settings = Settings()
        else:
            raise InvalidArgument(
                f"App takes a store URL or a Settings, got a {type(url_or_settings).__name__}"
            )
        validate.optional(validate.is_a(WorkflowRegistry))("registry", registry)
        for name, hook in (("tracer", tracer), ("cycle", cycle), ("prepare", prepare)):
            if hook is not None and not callable(hook):
                validate.refuse(name, "a function or None", hook)
        self.settings: Settings = settings.replace(**overrides)
        self.tracer: TracerFactory | None = tracer
        self._registry = registry
        self._declared: list[tuple[Workflow, dict[str, Any]]] = []  # registered when next needed
        self._cycle = cycle
        self._prepare = prepare
        # (pid, store) in one attribute, so a reader never sees a store with another's pid.
        self._opened: tuple[int, WorkflowStore] | None = None

    def __repr__(self) -> str:
        return f"App({redacted(self.settings.database_url)!r})"

    # -- what it holds ------------------------------------------------------------------

    @property
    def registry(self) -> WorkflowRegistry:
        """The definitions this App's workers run, the workflows declared with
        :meth:`workflow` registered in it (each needs its ``@main`` by then)."""
        registry = self._registry
        if registry is not None and not self._declared:
            return registry
        with _registry_lock:
            if self._registry is None:
                reference = self.settings.app
                if isinstance(reference, WorkflowRegistry):
                    self._registry = reference
                else:
                    self._registry = WorkflowRegistry() if reference is None else load_registry(reference)
            while self._declared:
                workflow, options = self._declared[0]
                self._registry.register(WorkflowDefinition(workflow, **options))
                del self._declared[0]
            return self._registry

    @property
    def store(self) -> WorkflowStore:
        """This process's store, opened on first use."""
        opened = self._opened
        pid = os.getpid()
        if opened is not None and opened[0] == pid:
            return opened[1]
        with _open_lock:
            opened = self._opened
            if opened is not None and opened[0] == pid:
                return opened[1]
            store = self._open()
            self._opened = (pid, store)  # a parent's store is dropped, never closed here
        return store

    def _open(self) -> WorkflowStore:
        store = open_store(self.settings.database_url)
        if self._prepare is not None:
            try:
                self._prepare(store)
            except BaseException:
                store.close()
                raise
        return store

    def close(self) -> None:
        """Close the store if this process opened it (a parent's is forgotten, not
        closed). Idempotent; the App opens the store again when next used."""
        with _open_lock:
            opened, self._opened = self._opened, None
        if opened is not None and opened[0] == os.getpid():
            opened[1].close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- declaring and starting ---------------------------------------------------------

    def workflow(
        self,
        name: str,
        version: int = 1,
        *,
        signals: Iterable[str] = (),
        budget: Budget | None = None,
        capabilities: CapabilitySet | Iterable[str] = (),
        sender_policy: Callable[[str, str, Any], bool] | None = None,
        coerce_input: bool = False,
        concurrency_key: Callable[[Any], str] | None = None,
    ) -> Workflow:
        """Declare workflow ``name`` at ``version`` and register it in this App: declare
        its steps and main function on what this returns (``@wf.step()``,
        ``@wf.effect(...)``, ``@wf.main``), as for a :class:`Workflow`. ``budget``,
        ``capabilities`` (granted to its steps: a ``CapabilitySet`` or names),
        ``sender_policy``, ``coerce_input`` and ``concurrency_key`` (a function of the
        input giving the concurrency key of a task started without one) are its
        :class:`WorkflowDefinition`'s.
        It is registered when the registry is next needed (a start, a worker), so its
        steps may be declared after this call; a name and version declared twice is
        :class:`InvalidArgument`."""
        workflow = Workflow(name, version, signals=signals)
        taken = {(w.name, w.version) for w, _ in list(self._declared)}
        if self._registry is not None:
            taken |= {(d.identity.name, d.identity.version) for d in self._registry}
        if (workflow.name, workflow.version) in taken:
            raise InvalidArgument(f"{workflow!r} is already declared in this App")
        granted = capabilities if isinstance(capabilities, CapabilitySet) else CapabilitySet(capabilities)
        options = {
            "budget": Budget() if budget is None else budget,
            "capabilities": granted,
            "sender_policy": sender_policy,
            "coerce_input": coerce_input,
            "concurrency_key": concurrency_key,
        }
        for field in attrs.fields(WorkflowDefinition):  # its checks now: refused where given
            if field.name in options and field.validator is not None:
                field.validator(WorkflowDefinition, field, options[field.name])
        self._declared.append((workflow, options))
        return workflow

    def start(
        self,
        name: str,
        input: Any,
        *,
        version: int | None = None,
        task_id: str | None = None,
        tenant: str = "default",
        priority: int = 0,
        queue: str = "default",
        not_before: datetime | None = None,
        connection: object = None,
        **flow: Unpack[FlowOptions],
    ) -> TaskHandle:
        """Start workflow ``name`` on ``input`` and return its :class:`TaskHandle`.

        ``version`` defaults to the highest registered. The task is checked against the
        registry before anything is stored: an unknown name or version is
        :class:`UnknownDefinition`, input that does not fit the main function's
        annotation :class:`InputMismatch`, both naming what is wrong. ``task_id`` makes
        the start idempotent: the same id and content give the same task back (derive it
        from your data, ``f"order-{order.id}"``); other content under it is
        :class:`EnqueueConflict`. Without one the task gets a fresh id. ``tenant``,
        ``priority`` (higher is claimed first), ``queue`` (only workers claiming from it
        take it) and ``not_before`` (an aware datetime: not claimed before it) are the
        task's. With ``connection`` (the application's own sqlite3 or psycopg connection
        to the store's database) the task is written in that connection's open
        transaction, and exists only if it commits. The flow options (``concurrency_key``,
        ``dedup_key`` with ``dedup_window`` or ``singleton``/``replace``, ``debounce`` with
        ``debounce_key`` and ``debounce_max``) are described in the flow-control how-to;
        a dedup, singleton or debounce may return the handle of an existing task."""
        registry = self.registry
        if version is None:
            versions = [d.identity.version for d in registry if d.identity.name == name]
            version = max(versions, default=1)  # an unknown name is refused by the registry
        task = registry.task(
            name,
            version,
            input,
            tenant=tenant,
            checkpoint_id=task_id,
            priority=priority,
            queue=queue,
            not_before=not_before,
            **flow,
        )
        return TaskHandle(self, self.store.enqueue(task, connection=connection).task_id)

    def handle(self, task_id: str) -> TaskHandle:
        """The handle of a task started earlier (by any process), by its id."""
        validate.instance("task_id", task_id, str)
        return TaskHandle(self, task_id)

    # -- running ------------------------------------------------------------------------

    def worker(self, worker_id: str | None = None, **overrides: Any) -> WorkflowWorker:
        """A :class:`WorkflowWorker` on this App's store and registry, with its worker
        settings (``overrides`` by field name: ``claim_batch=4``) and its tracer, as
        ``worker_id`` (default: the host name). Close it when done; the store stays the
        App's."""
        return self._worker(self.store, _worker_id(worker_id), owns_store=False, **overrides)

    def _serving(self) -> WorkflowRegistry:
        """The registry, refused when it holds nothing a worker could run."""
        registry = self.registry
        if not len(registry):
            raise InvalidArgument(
                "this App has no workflows to run: declare them with app.workflow(...), or name an App "
                "or WorkflowRegistry as 'module:attribute' in its settings' app (RUNIFOLD_APP)"
            )
        return registry

    def _worker(
        self,
        store: WorkflowStore,
        worker_id: WorkerId,
        *,
        owns_store: bool,
        observer: CycleObserver | None = None,
        **overrides: Any,
    ) -> WorkflowWorker:
        try:
            return _AppWorker(
                store,
                self._serving(),
                worker_id,
                settings=self.settings.worker.replace(**overrides),
                observer=observer,
                tracer=None if self.tracer is None else self.tracer(),
                cycle=self._cycle,
                owns_store=owns_store,
            )
        except BaseException:
            if owns_store:
                store.close()
            raise

    def run_once(self, *, worker_id: str | None = None) -> RunOutcome:
        """Claim one ready task and run it in this process until it completes, waits,
        fails or yields; returns how (``Idle`` when nothing was ready). The cron mode:
        :func:`once_succeeded` is its exit rule."""
        worker = self.worker(worker_id)
        try:
            return worker.run_once()
        finally:
            worker.close()

    def run_until_idle(
        self,
        *,
        skip_time: bool = False,
        max_cycles: int = DEFAULT_MAX_CYCLES,
        queues: Iterable[str] | None = None,
    ) -> list[RunOutcome]:
        """Run the tasks of every queue (or of ``queues``) in this process until none is
        ready, and return each cycle's outcome, in order. A task waiting for a timer, a
        signal or a child stays waiting. With ``skip_time`` the store's clock is moved
        forward to each timer instead (for tests and demos: store time stays moved, for
        every process using that database; ``runifold_sync.testing.run_until_idle`` does
        this by default). :class:`~runifold_sync.testing.NotIdle` after ``max_cycles``
        claims, or at once for a ready task this registry cannot run."""
        return run_until_idle(
            self.store, self._serving(), skip_time=skip_time, max_cycles=max_cycles, queues=queues
        )

    def run_pool(
        self,
        concurrency: int | None = None,
        *,
        worker_id: str | None = None,
        shutdown: CancellationToken | None = None,
        observer: Callable[[], CycleObserver] | None = None,
        tend: Callable[[], None] | None = None,
    ) -> SupervisorReport:
        """Run a supervised pool of ``concurrency`` (default: the pool settings') forked
        worker processes until ``shutdown`` is cancelled, or SIGINT or SIGTERM arrives,
        then return what they reported. Workers are ``<worker_id>-<slot>`` (default: the
        host name).

        Before any fork the registry is loaded, the store is checked to answer and no
        worker of these ids to be live elsewhere (:class:`WorkerIdInUse`), and this App's
        store is closed: no connection crosses a fork, each child opens its own (and
        builds its own tracer, and ``observer()`` when given). ``tend`` is called ten
        times a second in this process while the pool runs (``WorkflowSupervisor.run``).
        A store opened by another part of this process must be closed first
        (:class:`ForkUnsafe`)."""
        config = self.settings.pool
        if concurrency is not None:
            config = self.settings.replace(concurrency=concurrency).pool
        base = check_base_id(worker_id or default_worker_id(), config.concurrency, "worker_id")
        self._serving()  # loaded here, before the fork, for every child
        check_ids_free(
            self.store,
            (f"{base}-{slot}" for slot in range(config.concurrency)),
            self.settings.worker.heartbeat_interval,
        )
        self.close()

        def factory(child_id: WorkerId) -> WorkflowWorker:
            recorder = None if observer is None else observer()
            return self._worker(self._open(), child_id, owns_store=True, observer=recorder)

        supervisor = WorkflowSupervisor(factory, config, base_id=base)
        return supervisor.run(shutdown or CancellationToken(), tend=tend)


@attrs.frozen
class TaskHandle:
    """One task of an :class:`App` (``app.start``, ``app.handle``): its ``task_id``, and
    what can be asked of the task or done to it. Equal handles name one task of one App."""

    app: App = attrs.field(repr=False)
    task_id: str

    def status(self) -> TaskRecord:
        """The task as the store has it now (``.state``, ``.outcome``, ``.reason``,
        ``.status_note``...); :class:`TaskNotFound` for an unknown id."""
        return self.app.store.get_task(self.task_id)

    def result(self, timeout: timedelta | None = None) -> Any:
        """The task's result once it has finished, waiting up to ``timeout`` (default: as
        long as it takes) for it: the main function's return value, structured as its
        return annotation says (an attrs class comes back as one). :class:`TaskFailed`
        when it failed or was cancelled (``.outcome``, ``.reason``), :class:`WaitTimedOut`
        when it has not finished within ``timeout``. Another process runs it, or this one
        (``app.run_once()``) before the call."""
        record = self.app.store.wait_for_task(
            self.task_id, validate.MAX_DURATION if timeout is None else timeout
        )
        if record.state is TaskState.CANCELLED:
            raise TaskFailed(self.task_id, "cancelled", record.reason)
        if record.outcome is not TaskOutcome.COMPLETED:
            raise TaskFailed(self.task_id, "failed", record.reason)
        definition = self.app.registry.get(record.definition_name, record.definition_version)
        if definition is None or definition.workflow.main_fn is None:
            return record.result  # a definition this App lacks: its JSON value
        return structure(record.result, return_type(definition.workflow.main_fn), record.result_json)

    def event(self, key: str, timeout: timedelta | None = None) -> Any:
        """The value the task last published as event ``key`` (``ctx.set_event``).
        Without ``timeout`` it is read once (:class:`EventNotFound` when not published
        yet); with one, waited for up to ``timeout`` (then :class:`WaitTimedOut`)."""
        return self.app.store.get_event(self.task_id, key, timeout)

    def signal(
        self,
        name: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        sender: str = "app",
        reason: str | None = None,
    ) -> SignalDelivery:
        """Send signal ``name`` with ``payload`` (a JSON value) to the task, in its own
        tenant, as ``sender``; it wakes the task if it waits for ``name``. Pass a
        ``signal_id`` of your own to make a retried send deliver once (default: a fresh
        one). Refusals are the store's: ``SignalNotAccepted`` (a name the workflow does
        not declare, a sender who is no approver), ``SignalRefused`` (a finished task)."""
        tenant = self.status().tenant
        return self.app.store.send_signal(
            self.task_id,
            name,
            payload,
            signal_id=uuid.uuid4().hex if signal_id is None else signal_id,
            sender=sender,
            tenant=tenant,
            reason=reason,
        )

    def cancel(self, reason: str, *, actor: str = "app") -> TaskState:
        """Cancel the task, recording ``actor`` and ``reason``; returns the state it is
        in now (``cancelled``, or ``queued``/``leased`` while its compensations or its
        running step finish: see ``WorkflowStore.cancel``)."""
        return self.app.store.cancel(self.task_id, actor, reason)


class _AppWorker(WorkflowWorker):
    """A worker an :class:`App` built: each cycle inside the App's ``cycle`` hook, and
    its store closed with it when it owns one (a pool child's)."""

    def __init__(self, *args: Any, cycle: CycleHook | None, owns_store: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cycle_hook = cycle
        self._owns_store = owns_store

    def _cycle(self, *, claim_next: bool, stopping: CancellationToken | None, hold: bool) -> list[RunOutcome]:
        if self._cycle_hook is None:
            return super()._cycle(claim_next=claim_next, stopping=stopping, hold=hold)
        with self._cycle_hook():
            return super()._cycle(claim_next=claim_next, stopping=stopping, hold=hold)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._owns_store:
                self.store.close()


def once_succeeded(outcome: RunOutcome) -> bool:
    """The exit rule of one cycle run from cron (``run --once``): success for idle,
    completed, suspended, retried and yielded (progress committed, the task requeued);
    failed, lease lost, definition unavailable and cancelled fail, so cron reports a
    cycle that left work to look at."""
    return isinstance(outcome, _OK_ONCE)


def default_worker_id() -> str:
    """The host name, up to its first dot: the default base of a worker's id."""
    return socket.gethostname().split(".")[0]


def _worker_id(worker_id: str | None) -> WorkerId:
    return WorkerId.parse(default_worker_id() if worker_id is None else worker_id)


# -- finding the application -----------------------------------------------------------


def load_app(reference: str) -> App | WorkflowRegistry:
    """Import ``module:attribute``: an :class:`App`, a registry, or a function returning
    either (a function lets the application build it in the process that uses it). Any
    failure is :class:`AppNotLoaded`, one line (the exception the import raised is its
    ``__cause__``, traceback and all)."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidArgument(
            f"app reference must look like 'package.module:app', got {validate.shown(reference)}"
        )
    searched = str(Path.cwd())
    if searched not in sys.path:
        sys.path.insert(0, searched)  # like `python -m`, find the app in the cwd
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise AppNotLoaded(_not_found(reference, exc.name, searched)) from exc
        raise AppNotLoaded(_raised(reference, f"importing {module_name!r}", exc)) from exc
    except Exception as exc:  # whatever the application's module raised, said in one line
        raise AppNotLoaded(_raised(reference, f"importing {module_name!r}", exc)) from exc
    try:
        target = getattr(module, attribute)
    except AttributeError as exc:
        raise AppNotLoaded(f"module {module_name!r} has no attribute {attribute!r}") from exc
    if callable(target) and not isinstance(target, (App, WorkflowRegistry)):
        try:
            target = target()
        except Exception as exc:
            raise AppNotLoaded(_raised(reference, f"calling {attribute!r} of {module_name!r}", exc)) from exc
    if not isinstance(target, (App, WorkflowRegistry)):
        raise AppNotLoaded(f"{reference!r} is not an App or a WorkflowRegistry (got {type(target).__name__})")
    return target


def load_registry(reference: str) -> WorkflowRegistry:
    """The registry of what ``module:attribute`` names (:func:`load_app`): a registry,
    or an App's."""
    target = load_app(reference)
    if isinstance(target, App):
        try:
            return target.registry
        except InvalidArgument as exc:  # a declared workflow without its @main
            raise AppNotLoaded(f"the App {reference!r} cannot register its workflows: {exc}") from exc
    return target


def _not_found(reference: str, missing: str, searched: str) -> str:
    """The app's own module (or a package on its way) is not on the import path."""
    if "." not in missing:
        return (
            f"cannot import {missing!r} from app reference {reference!r}: no module {missing!r} in "
            f"{searched} (the directory this runs from) or elsewhere on the import path; run from "
            "the project's root, or add the directory that holds it to PYTHONPATH"
        )
    package, _, name = missing.rpartition(".")
    where = getattr(sys.modules.get(package), "__path__", None)
    inside = f" ({', '.join(where)})" if where else ""
    return (
        f"cannot import {missing!r} from app reference {reference!r}: "
        f"package {package!r}{inside} has no module {name!r}"
    )


def _raised(reference: str, doing: str, exc: Exception) -> str:
    """``doing`` (importing the app's module, calling its factory) raised ``exc``: where
    (file:line) and what, in one line."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}:{exc.lineno}"
        what = f"{type(exc).__name__}: {exc.msg}"
    else:
        where = _where(exc)
        what = " ".join(traceback.format_exception_only(exc)[-1].split())
    return f"{doing} (app reference {reference!r}) raised at {where}: {what}"


def _where(exc: BaseException) -> str:
    """The file and line ``exc`` was raised at, in the application's code: the innermost
    frame outside the standard library, installed packages and runifold_sync itself (a
    KeyError raised by ``os.environ[...]`` is placed at the line that read it), else the
    innermost frame of all."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    library = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    library.add(str(Path(__file__).resolve().parent))
    prefixes = tuple(os.path.join(path, "") for path in library if path)
    for frame in reversed(frames):
        name = frame.filename
        if not name.startswith("<") and not os.path.abspath(name).startswith(prefixes):
            return f"{name}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}"
