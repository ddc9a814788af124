"""Flask: a view that writes its own row and enqueues on its own connection, in one
transaction (``runifold.enqueue(..., connection=conn)``), on each store: a request that
fails leaves neither the row nor the task, one that succeeds leaves both, once."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask, jsonify, request

from runifold_sync import WorkflowStore
from runifold_sync.contrib.flask import Runifold
from runifold_sync.errors import TaskNotFound
from runifold_sync.store import TaskState
from runifold_sync.store.open import sqlite_path
from tests.support.backends import Backend


def _connect(backend: Backend) -> Any:
    if backend.kind == "sqlite":
        return sqlite3.connect(sqlite_path(backend.url))
    return psycopg.connect(backend.direct_url)


@pytest.fixture
def app(backend: Backend, store: WorkflowStore) -> Iterator[Flask]:
    with _connect(backend) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)")
        conn.commit()
    flask_app = Flask(__name__)
    flask_app.config.update(TESTING=True, RUNIFOLD_DATABASE_URL=backend.url)
    runifold = Runifold(flask_app)
    with flask_app.app_context():
        assert runifold.store  # opened (and migrated) at startup, before a request's own write lock

    @flask_app.post("/orders")
    def create_order() -> Any:
        body = request.get_json()
        conn = _connect(backend)  # the app's own connection, as its data layer holds one
        try:
            marker = "?" if backend.kind == "sqlite" else "%s"
            conn.execute(
                f"INSERT INTO orders (id, sku) VALUES ({marker}, {marker})", (body["id"], body["sku"])
            )
            task_id = runifold.enqueue(
                "order-intake", 1, body, checkpoint_id=f"order-{body['id']}", connection=conn
            )
            if body["sku"] == "out-of-stock":
                raise RuntimeError("refused after the enqueue")
            conn.commit()
        except RuntimeError:
            conn.rollback()
            return jsonify({"error": "refused"}), 409
        finally:
            conn.close()
        return jsonify({"task_id": task_id}), 202

    yield flask_app
    with flask_app.app_context():
        runifold.close()


def test_a_view_that_commits_leaves_its_row_and_its_task(app: Flask, store: WorkflowStore) -> None:
    response = app.test_client().post("/orders", json={"id": 7, "sku": "tea"})
    assert response.status_code == 202
    assert store.get_task("order-7").state is TaskState.QUEUED


def test_a_view_that_rolls_back_leaves_no_task(app: Flask, store: WorkflowStore, backend: Backend) -> None:
    response = app.test_client().post("/orders", json={"id": 8, "sku": "out-of-stock"})
    assert response.status_code == 409
    with pytest.raises(TaskNotFound):
        store.get_task("order-8")
    with _connect(backend) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
