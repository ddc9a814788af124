"""The Flask app tested with the testing kit, as docs/howto/flask.md shows, on the example app
(``examples/flask_app``): an order posted through the test client, run to its end by
``run_until_idle`` on the extension's own store."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from runifold_sync.testing import result, run_until_idle

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flask_app"
EXAMPLE_MODULES = ("app", "order_flow")


def test_an_order_posted_to_the_example_app_runs_to_its_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    for name in EXAMPLE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    example = importlib.import_module("app")
    registry = importlib.import_module("order_flow").registry
    app = example.create_app({"TESTING": True, "RUNIFOLD_DATABASE_URL": f"sqlite:///{tmp_path / 'w.db'}"})

    response = app.test_client().post("/orders", json={"order_id": "a1", "sku": "tea", "quantity": 2})
    assert response.status_code == 202
    with app.app_context():
        try:
            run_until_idle(example.runifold.store, registry)
            assert result(example.runifold.store, "order-a1") == {
                "reservation": "reservation-tea-2",
                "confirmation": "confirmation-a1",
            }
        finally:
            example.runifold.close()
    for name in EXAMPLE_MODULES:
        sys.modules.pop(name, None)
