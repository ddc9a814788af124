"""``list --where KEY=VALUE``: tasks by their search attributes (``ctx.set_attributes``),
the value's kind read from its form, several conditions all holding, and a malformed
condition refused as a usage error naming it (with ``--json`` too)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from runifold_sync.cli.main import main
from runifold_sync.outcomes import Suspended
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.engine.test_attributes import enqueue, run_once


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _stored(sqlite_path: Path) -> str:
    store = SqliteWorkflowStore.open(sqlite_path)
    try:
        enqueue(store, "o1", "c-42", 120)
        enqueue(store, "o2", "c-42", 80, vip=True)
        enqueue(store, "o3", "120", 120)
        for _ in range(3):
            assert isinstance(run_once(store), Suspended)
    finally:
        store.close()
    return f"sqlite:///{sqlite_path}"


def test_list_where_finds_tasks_by_typed_attributes(sqlite_path: Path) -> None:
    url = _stored(sqlite_path)

    def ids(*where: str) -> list[str]:
        args = [arg for condition in where for arg in ("--where", condition)]
        code, out = _invoke("list", *args, "--database", url, "--json")
        assert code == 0, out
        return [t["task_id"] for t in json.loads(out)]

    assert ids("customer=c-42") == ["o1", "o2"]
    assert ids("customer=c-42", "amount=120") == ["o1"]
    assert ids("amount=120") == ["o1", "o3"]  # an integer
    assert ids("amount=120.0") == []  # a number: not the integer attribute
    assert ids('customer="120"') == ["o3"]  # quoted: the text 120
    assert ids("customer=120") == []  # unquoted: the integer 120
    assert ids("vip=true") == ["o2"]
    assert ids("rate=0.25") == ["o1", "o2", "o3"]
    assert ids("due=2026-12-24T07:30:00+00:00") == ["o1", "o2", "o3"]
    code, out = _invoke("list", "--where", "customer=c-42", "--database", url)
    assert code == 0 and "o1" in out and "o2" in out and "o3" not in out
    code, out = _invoke("list", "--where", "customer=nobody", "--database", url)
    assert code == 0 and out.strip() == "no tasks match these filters"


def test_a_malformed_where_is_a_usage_error_naming_it(sqlite_path: Path) -> None:
    url = _stored(sqlite_path)
    for condition, says in (
        ("customer", "where must be key=value, got 'customer'"),
        ("=c-42", "where key must be non-empty"),
        ("due=2026-12-24T07:30:00", None),  # no offset: text, not a time, so no match
    ):
        code, out = _invoke("list", "--where", condition, "--database", url, "--json")
        if says is None:
            assert code == 0 and json.loads(out) == []
        else:
            assert code != 0 and says in out, out
    code, out = _invoke("list", "--where", "a=1", "--where", "a=2", "--database", url)
    assert code != 0 and "attribute 'a' is given twice" in out


def test_show_lists_the_attributes_as_list_where_takes_them(sqlite_path: Path) -> None:
    url = _stored(sqlite_path)
    code, out = _invoke("show", "o3", "--database", url, "--json")
    assert code == 0, out
    attributes = json.loads(out)["attributes"]
    assert attributes == {
        "amount": "120",
        "customer": '"120"',
        "due": "2026-12-24T07:30:00+00:00",
        "rate": "0.25",
        "stage": '"received"',
        "vip": "false",
    }
    for key, text in attributes.items():  # each one, given back to list --where, finds o3
        code, out = _invoke("list", "--where", f"{key}={text}", "--database", url, "--json")
        assert "o3" in [t["task_id"] for t in json.loads(out)], (key, text)
    code, out = _invoke("show", "o3", "--database", url)
    assert code == 0 and 'attributes: amount=120, customer="120", due=2026-12-24T07:30:00+00:00' in out
