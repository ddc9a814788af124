"""Flask with SQLAlchemy as the data layer: the view writes its row through a SQLAlchemy
session and enqueues on that session's driver connection
(``session.connection().connection.driver_connection``), as the README says, on each
store: a request that rolls back leaves neither the row nor the task, one that commits
leaves both, once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy
from flask import Flask, jsonify, request
from sqlalchemy.orm import Session

from runifold_sync import WorkflowStore
from runifold_sync.contrib.flask import Runifold
from runifold_sync.errors import TaskNotFound
from runifold_sync.store import TaskState
from runifold_sync.store.open import sqlite_path
from tests.support.backends import Backend


def _engine(backend: Backend) -> sqlalchemy.Engine:
    if backend.kind == "sqlite":
        return sqlalchemy.create_engine(f"sqlite:///{sqlite_path(backend.url)}")
    return sqlalchemy.create_engine(backend.direct_url.replace("postgresql://", "postgresql+psycopg://", 1))


@pytest.fixture
def engine(backend: Backend, store: WorkflowStore) -> Iterator[sqlalchemy.Engine]:
    engine = _engine(backend)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)"))
    yield engine
    engine.dispose()


@pytest.fixture
def app(backend: Backend, engine: sqlalchemy.Engine) -> Iterator[Flask]:
    flask_app = Flask(__name__)
    flask_app.config.update(TESTING=True, RUNIFOLD_DATABASE_URL=backend.url)
    runifold = Runifold(flask_app)
    with flask_app.app_context():
        assert runifold.store  # opened (and migrated) at startup

    @flask_app.post("/orders")
    def create_order() -> Any:
        body = request.get_json()
        with Session(engine) as session:
            session.execute(
                sqlalchemy.text("INSERT INTO orders (id, sku) VALUES (:id, :sku)"),
                {"id": body["id"], "sku": body["sku"]},
            )
            task_id = runifold.enqueue(
                "order-intake",
                1,
                body,
                checkpoint_id=f"order-{body['id']}",
                connection=session.connection().connection.driver_connection,
            )
            if body["sku"] == "out-of-stock":
                session.rollback()
                return jsonify({"error": "refused"}), 409
            session.commit()
        return jsonify({"task_id": task_id}), 202

    yield flask_app
    with flask_app.app_context():
        runifold.close()


def _orders(engine: sqlalchemy.Engine) -> int:
    with engine.connect() as conn:
        count: int = conn.execute(sqlalchemy.text("SELECT count(*) FROM orders")).scalar_one()
    return count


def test_a_sqlalchemy_view_that_commits_leaves_its_row_and_its_task(
    app: Flask, store: WorkflowStore, engine: sqlalchemy.Engine
) -> None:
    response = app.test_client().post("/orders", json={"id": 7, "sku": "tea"})
    assert response.status_code == 202
    assert store.get_task("order-7").state is TaskState.QUEUED
    assert _orders(engine) == 1


def test_a_sqlalchemy_view_that_rolls_back_leaves_no_row_and_no_task(
    app: Flask, store: WorkflowStore, engine: sqlalchemy.Engine
) -> None:
    response = app.test_client().post("/orders", json={"id": 8, "sku": "out-of-stock"})
    assert response.status_code == 409
    with pytest.raises(TaskNotFound):
        store.get_task("order-8")
    assert _orders(engine) == 0
