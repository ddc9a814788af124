"""The dashboard's actions: POST ``/tasks/<task id>/<action>`` for cancel, retry, pause,
resume (a paused or a cancelled task), resolve (an ambiguous effect), signal, approval and
fork (a new task from one of the run's steps: the answer goes to its page), and the login that lets a
browser take them. Each is refused first by :func:`.security.refusal` (read-only 403, no
token 401, a session's request without its CSRF token 403), then calls one store
operation, which records the actor and the reason in the task's history, and answers
with a redirect to the task's page."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable

import flask

from ..errors import InvalidArgument
from ..model import validate
from ..model.codec import MAX_NESTING_DEPTH, NestedTooDeep, NotJsonable, to_json
from ..model.values import TaskState
from ..store.base import WorkflowStore
from . import security
from .board import dashboard

posts = flask.Blueprint("actions", __name__)

MAX_FIELD = 2000  # characters of a reason, a name or an actor


def _field(name: str, *, required: bool = True) -> str:
    value = flask.request.form.get(name, "").strip()
    if required and not value:
        raise InvalidArgument(f"form field {name!r} is required")
    if len(value) > MAX_FIELD:
        raise InvalidArgument(f"form field {name!r} is longer than {MAX_FIELD} characters")
    return value


def _json_field(name: str, default: str) -> str:
    """The form field ``name`` (``default`` when empty) as canonical JSON text: strict JSON
    (no NaN or Infinity) nested at most :data:`~runifold_sync.model.codec.MAX_NESTING_DEPTH`
    deep, as the store takes it; anything else is refused naming the field (a 400)."""
    text = flask.request.form.get(name, "").strip() or default
    try:
        return to_json(json.loads(text, parse_constant=_not_json), max_depth=MAX_NESTING_DEPTH)
    except (RecursionError, NestedTooDeep):  # the decoder recurses once a level
        raise InvalidArgument(f"form field {name!r} nests deeper than {MAX_NESTING_DEPTH} levels") from None
    except (ValueError, NotJsonable) as exc:
        raise InvalidArgument(f"form field {name!r} must be JSON, got {text[:80]!r}: {exc}") from None


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON value")


def _cancel(store: WorkflowStore, task_id: str, actor: str, reason: str) -> str:
    return f"cancel: task is {store.cancel(task_id, actor, reason).value}"


def _retry(store: WorkflowStore, task_id: str, actor: str, reason: str) -> str:
    store.requeue(task_id, actor=actor, reason=reason)
    return "retry: task requeued"


def _pause(store: WorkflowStore, task_id: str, actor: str, reason: str) -> str:
    return f"pause: task is {store.pause(task_id, actor=actor, reason=reason).value}"


def _resume(store: WorkflowStore, task_id: str, actor: str, reason: str) -> str:
    if store.get_task(task_id).state is TaskState.CANCELLED:
        return f"resume: task is {store.resume_cancelled(task_id, actor=actor, reason=reason).value}"
    return f"resume: task is {store.resume(task_id, actor=actor, reason=reason).value}"


def _fork(store: WorkflowStore, task_id: str, actor: str, reason: str) -> str:
    from_step = _field("from_step")
    forked = store.fork(task_id, from_step=from_step, actor=actor, reason=reason)
    flask.g.show_task = forked  # the answer goes to the new task's page
    return f"fork: new task {forked} runs from {from_step} of {task_id}"


def _resolve(store: WorkflowStore, task_id: str, actor: str, reason: str) -> str:
    applied = _field("applied")
    if applied not in ("yes", "no"):
        validate.refuse("form field 'applied'", "yes or no", applied)
    effect = store.get_task(task_id).ambiguous_effect or _field("effect_key")
    result = _json_field("result", "null") if applied == "yes" else None
    store.resolve_effect(
        task_id, effect, applied=applied == "yes", result_json=result, actor=actor, reason=reason
    )
    return f"resolve: effect {effect} recorded as {'applied' if applied == 'yes' else 'not applied'}"


def _signal(store: WorkflowStore, task_id: str, actor: str, reason: str) -> str:
    return _deliver(store, task_id, actor, reason, json.loads(_json_field("payload", "null")))


def _approval(store: WorkflowStore, task_id: str, actor: str, reason: str) -> str:
    decision = _field("decision")
    if decision not in ("approve", "reject"):
        validate.refuse("form field 'decision'", "approve or reject", decision)
    return _deliver(store, task_id, actor, reason, {"approved": decision == "approve", "reason": reason})


def _deliver(store: WorkflowStore, task_id: str, actor: str, reason: str, payload: object) -> str:
    """Send the form's signal as ``actor``, in the task's tenant (the operator acts for
    it); the form's signal id (made when the page was drawn) makes a resubmitted form
    one delivery."""
    name = _field("name")
    tenant = store.get_task(task_id).tenant
    delivered = store.send_signal(
        task_id, name, payload, signal_id=_field("signal_id"), sender=actor, tenant=tenant, reason=reason
    )
    return f"signal {name}: {'delivered' if delivered.created else 'already delivered'}"


ACTIONS: dict[str, Callable[[WorkflowStore, str, str, str], str]] = {
    "cancel": _cancel,
    "retry": _retry,
    "pause": _pause,
    "resume": _resume,
    "resolve": _resolve,
    "signal": _signal,
    "approval": _approval,
    "fork": _fork,
}


@posts.post("/tasks/<task_id:task_id>/<action>")
def act(task_id: str, action: str) -> flask.typing.ResponseReturnValue:
    board = dashboard()
    refused = security.refusal(board.token)
    if refused is not None:
        return _refusal(*refused)
    run = ACTIONS.get(action)
    if run is None:
        validate.refuse("action", f"one of {', '.join(ACTIONS)}", action)
    done = run(board.store, task_id, security.actor_name(), _field("reason"))
    flask.flash(done)
    shown = flask.g.get("show_task", task_id)
    return flask.redirect(flask.url_for("pages.task", task_id=shown), 303)


def _refusal(status: int, message: str) -> tuple[str, int]:
    return flask.render_template("error.html", title="Refused", message=message, status=status), status


@posts.route("/login", methods=["GET", "POST"])
def login() -> flask.typing.ResponseReturnValue:
    board = dashboard()
    if flask.request.method == "GET":
        return flask.render_template("login.html", failed=False)
    if board.token is None:
        return _refusal(403, "this dashboard is read-only: it was started without a token")
    if not security.csrf_ok():
        return _refusal(403, "the form's CSRF token is missing or wrong: reload the page and try again")
    given = flask.request.form.get("token", "")
    if not hmac.compare_digest(given.encode(), board.token.encode()):
        return flask.render_template("login.html", failed=True), 401
    security.start_login(_field("actor", required=False)[:200] or "dashboard")
    return flask.redirect(flask.url_for("pages.overview"), 303)


@posts.post("/logout")
def logout() -> flask.typing.ResponseReturnValue:
    if not security.csrf_ok():
        return _refusal(403, "the form's CSRF token is missing or wrong: reload the page and try again")
    security.end_login()
    return flask.redirect(flask.url_for("pages.overview"), 303)
