"""The PostgreSQL store's statements, the claim, and how values are stored.

Store time is ``clock_timestamp()`` plus the test clock offset, never ``now()``, which is
frozen at transaction start. Statements that are variants of a named query (a transition
with its history event and NOTIFY, the claim with its limit written in) are built on
first use and kept beside the named ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
from psycopg.rows import DictRow

from ...errors import InvalidArgument
from ...model import validate
from ...model.checkpoint import JournalRow
from ...model.codec import from_json, storable_text, to_json
from .. import checks, row_records
from ..dialect import ENDING_TRANSITIONS, Event, FencedTransition, Values
from ..queries import load_queries
from ..records import ClaimedTask, ClaimRequest, Routes
from .pool import Connection

NOW = "(clock_timestamp() + make_interval(secs => (SELECT offset_s FROM runifold_clock WHERE id = 1)))"
Q = load_queries("postgres", NOW)
# The payload of a notification of one task made claimable (query notify_work, pgwait).
_ONE_TASK_WAKE = "txid_current()::text || ':1'"
# A JSON text PostgreSQL refuses as JSONB: a raw NUL, or a \u0000 escape that is not
# itself an escaped backslash followed by "u0000".
_NUL = re.compile(r"\x00|(?<!\\)(?:\\\\)*\\u0000")


def utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def fenced_statement(name: str, *, event: bool, notify: bool = False, journal: bool = False) -> str:
    """The key in ``Q`` of fenced query ``name`` extended, as CTEs of one statement, with
    its history event, NOTIFY, and the journal rows of ``journal_params`` (written or
    deleted only when the fenced query matched its row), built on first use."""
    key = name + ("+event" if event else "") + ("+notify" if notify else "") + ("+journal" if journal else "")
    if key not in Q:
        parts = [f"WITH fenced AS ({Q[name]})"]
        if event:
            parts.append(
                "event AS (INSERT INTO runifold_events "
                "(task_id, at, kind, worker_id, fencing_token, detail) "
                "SELECT %(task_id)s, at, %(event_kind)s, %(event_worker)s, %(token)s, "
                "%(event_detail)s::jsonb FROM fenced)"
            )
        if journal:
            rows = "jsonb_to_recordset(%(journal)s::jsonb) AS r (journal text, position int, entry text)"
            parts.append(
                "journal_written AS (INSERT INTO runifold_journal (task_id, journal, position, entry) "
                f"SELECT %(task_id)s, r.journal, r.position, r.entry FROM fenced, {rows} "
                "WHERE r.entry IS NOT NULL "
                "ON CONFLICT (task_id, journal, position) DO UPDATE SET entry = excluded.entry)"
            )
            parts.append(
                f"journal_dropped AS (DELETE FROM runifold_journal j USING fenced, {rows} "
                "WHERE r.entry IS NULL AND j.task_id = %(task_id)s AND j.journal = r.journal "
                "AND j.position = r.position)"
            )
        # As query wake_parent, joined to the ended row; the parent found by primary key
        # (= ANY of an array), since joined only, a plan that believed the task table
        # small scanned it whole for every task that ended.
        if name in ENDING_TRANSITIONS:
            parts.append(
                "parent_woken AS (UPDATE runifold_tasks p SET ready_at = CASE "
                "WHEN p.state = 'waiting' "
                "AND fenced.task_id = ANY(string_to_array(p.waiting_for_child, E'\\n')) "
                "AND (p.ready_at IS NULL OR p.ready_at > fenced.at) THEN fenced.at ELSE p.ready_at END "
                "FROM fenced WHERE p.task_id = ANY(ARRAY(SELECT parent_id FROM fenced)) "
                "AND p.task_id = fenced.parent_id "
                "RETURNING CASE WHEN p.ready_at = fenced.at "
                f"THEN pg_notify('runifold_tasks', {_ONE_TASK_WAKE}) END)"
            )
        notified = f", pg_notify('runifold_tasks', {_ONE_TASK_WAKE}) AS notified" if notify else ""
        Q[key] = ", ".join(parts) + f" SELECT fenced.*{notified} FROM fenced"
    return key


def journal_params(journal: Sequence[JournalRow]) -> dict[str, str]:
    """The journal rows as the JSON array of records ``fenced_statement`` reads. (As three
    ``text[]`` parameters, psycopg escaped every quote of every entry with a Python-level
    regex replacement: a fifth of a PostgreSQL worker's CPU where entries were sent.)"""
    return {"journal": json.dumps(journal_records(journal))}


def journal_records(journal: Sequence[JournalRow]) -> list[dict[str, Any]]:
    return [{"journal": row.journal, "position": row.position, "entry": row.entry_json} for row in journal]


def claim_with_limit(limit: int, *, routed: bool = False, flowed: bool = True) -> str:
    """The key in ``Q`` of the claim statement (``routed``: for a worker's routes, still
    with their placeholders; ``flowed``: with flow control, else its ``@unflowed`` text)
    with ``limit`` (checked) in its text, built on first use."""
    name = ("claim_routed_tasks" if routed else "claim_tasks") + ("" if flowed else "@unflowed")
    key = f"{name}+limit{limit}"
    if key not in Q:
        Q[key] = Q[name].replace("%(limit)s", str(limit))
    return key


# The routed claim's text per (limit, routes, flowed): a worker's routes change only when
# its registry does, so each worker sends one statement, prepared once (two, if flow limits
# come and go).
_ROUTED_CLAIMS: dict[tuple[int, Routes, bool], str] = {}


def _literal(text: str) -> str:
    """``text`` as an escape-string literal, right whatever standard_conforming_strings is,
    with ``%`` doubled for psycopg's placeholder syntax."""
    return "E'" + text.replace("\\", "\\\\").replace("'", "''").replace("%", "%%") + "'"


def claim_statement(limit: int, routes: Routes | None, *, flowed: bool = True) -> str:
    """The text of the claim (``limit`` checked), with ``routes`` written in as array
    literals: as parameters the statement ran about a fifth slower (its generic plan
    could not know there is one route, or which), and written in it is planned for them.
    ``flowed``: with its flow-control parts (else only right while no flow limit is set)."""
    if routes is None:
        return Q[claim_with_limit(limit, flowed=flowed)]
    key = (limit, routes, flowed)
    text = _ROUTED_CLAIMS.get(key)
    if text is None:
        each = routes.routes
        arrays = {
            "route_queues": "ARRAY[" + ", ".join(_literal(r.queue) for r in each) + "]",
            "route_names": "ARRAY[" + ", ".join(_literal(r.name) for r in each) + "]",
            "route_versions": "ARRAY[" + ", ".join(str(int(r.version)) for r in each) + "]::int[]",
            "route_fingerprints": "ARRAY[" + ", ".join(_literal(r.fingerprint) for r in each) + "]",
        }
        text = Q[claim_with_limit(limit, routed=True, flowed=flowed)]
        for name, value in arrays.items():
            text = text.replace(f"%({name})s", value)
        _ROUTED_CLAIMS[key] = text
    return text


def route_params(routes: Routes) -> dict[str, list[Any]]:
    """``routes`` as the four arrays the routed idle wait unnests."""
    each = routes.routes
    return {
        "route_queues": [r.queue for r in each],
        "route_names": [r.name for r in each],
        "route_versions": [r.version for r in each],
        "route_fingerprints": [r.fingerprint for r in each],
    }


def _claim_order(row: DictRow) -> tuple[Any, ...]:
    """The claim statement's ORDER BY (turn, least recently served tenant first, then
    priority, an expired lease first, and due time), which its UPDATE ... RETURNING does
    not keep."""
    served = row["served_at"]
    expired = row["from_state"] == "leased"
    return (
        row["turn"],
        served is not None,
        served or row["at"],
        -row["priority"],
        not expired,
        row["due_at"],
    )


class FlowLimitsAppeared(Exception):
    """A claim sent without its flow-control parts found a flow limit set: its transaction
    must roll back and the claim be made again with them."""


@attrs.define
class FlowSight:
    """Whether the last claim on a store saw a flow limit set. A claim is pipelined (its
    statement sent before the answer of the one that locks the limits), so it is sent as
    the last claim found things: without the flow-control parts while no limit is set
    (which halved claims/s where none was), and made again with them, by the caller, when
    its own lock statement finds one after all."""

    limits_set: bool = True  # until a claim has looked


def claim_in(conn: Connection, request: ClaimRequest, values: Values, sight: FlowSight) -> list[ClaimedTask]:
    """The claim, inside the caller's pipelined transaction (a bad limit rolls it back).
    Raises :class:`FlowLimitsAppeared` for a claim sent without flow control that found a
    limit set (the transaction must roll back; ``sight`` now says to claim with it)."""
    limit = validate.integer("claim limit", request.limit, minimum=1, maximum=checks.MAX_CLAIM_LIMIT)
    claimed = []
    params = {"worker_id": request.worker_id.value, "lease": request.lease.seconds}
    # The claim statement takes about 1 ms to plan, more than it takes to run. With
    # plan_cache_mode=auto the server plans it for each of a connection's first five
    # calls, and on every call for as long as its generic plan is estimated dearer than
    # the custom ones (which is what happened while the limit was a parameter). Forced,
    # the prepared statement's generic plan serves from the first call, with the limit
    # (checked to be an integer) written into the text: as a parameter the planner
    # guessed thousands of rows and leased them through a scan of the whole table.
    # lock_limited_tenants sets it (transaction-local) as it takes the tenant locks.
    locks = conn.execute(Q["lock_limited_tenants"])
    flowed = sight.limits_set
    leased = conn.execute(claim_statement(limit, request.routes, flowed=flowed), params).fetchall()
    lock_row = locks.fetchone()
    assert lock_row is not None
    sight.limits_set = bool(lock_row["flow_locked"])
    if sight.limits_set and not flowed:
        raise FlowLimitsAppeared()
    # UPDATE ... RETURNING has no order: hand tasks out in claim order.
    leased.sort(key=_claim_order)
    for row in leased:
        resolutions = {}
        if row["resolved"]:  # rare: only tasks an operator resolved have any
            found = conn.execute(Q["resolutions_for_task"], {"task_id": row["task_id"]}).fetchall()
            resolutions = row_records.effect_resolutions(found, values)
        claimed.append(row_records.claimed_task(row, request.worker_id.value, values, resolutions))
    return claimed


def transition_params(change: FencedTransition) -> dict[str, Any]:
    """The parameters of ``change``'s one-statement form (``fenced_statement``)."""
    extra = journal_params(change.journal) if change.journal else {}
    lease = change.lease
    return (
        change.params
        | extra
        | {
            "task_id": lease.task_id,
            "token": lease.fencing_token,
            "event_kind": change.event,
            "event_worker": lease.worker_id,
            "event_detail": to_json(change.detail),
        }
    )


def batch_params(completions: Sequence[FencedTransition]) -> dict[str, Any]:
    """The parameters of query ``complete_batch``, as JSON arrays of records (see
    ``journal_params``): each completion's lease, revision, head, result and event
    detail, and all their journal rows."""
    records = [
        {
            "task_id": c.lease.task_id,
            "token": c.lease.fencing_token,
            "revision": c.params["revision"],
            "head": c.params["head"],
            "result": c.params["result"],
            "worker_id": c.lease.worker_id,
            "detail": to_json(c.detail),
        }
        for c in completions
    ]
    rows = [
        record | {"task_id": c.lease.task_id} for c in completions for record in journal_records(c.journal)
    ]
    return {
        "completions": json.dumps(records),
        "journal": json.dumps(rows),
    }


def canonical(text: str | None) -> str | None:
    """JSONB text (keys reordered, ``", "`` separators) back to the canonical encoding
    the rest of runifold_sync writes; JSON null stays ``"null"``."""
    return None if text is None else to_json(from_json(text))


def jsonb(kind: str, text: str | None) -> str | None:
    # Substring tests first: the regex costs tens of microseconds on every checkpoint
    # commit, and it can only match where one of these substrings occurs.
    if text is not None and ("\x00" in text or "\\u0000" in text) and _NUL.search(text):
        raise InvalidArgument(
            f"{kind} contains the character U+0000, which PostgreSQL cannot store in JSONB; "
            "remove NUL characters from strings before storing them"
        )
    return text


def free_text(text: str) -> str:
    """Reasons are free text from exception messages; PostgreSQL text cannot hold NUL."""
    return storable_text(text).replace("\x00", "\ufffd")


def store_now(conn: Connection) -> datetime:
    row = conn.execute(Q["now"]).fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


def insert_event(conn: Connection, event: Event) -> None:
    conn.execute(
        Q["insert_event"],
        {
            "task_id": event.task_id,
            "now": event.at,
            "kind": event.kind,
            "worker_id": event.worker_id,
            "token": event.token,
            "detail": to_json(event.detail),
        },
    )
