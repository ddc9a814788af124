"""A Flask app whose ``POST /orders`` starts an order workflow.

cd examples/flask_app
flask --app app run                      # the web app
flask --app app runifold run             # the workers, in another terminal
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

from flask import Flask, abort, jsonify, request
from flask.typing import ResponseReturnValue

from runifold_sync.contrib.flask import Runifold
from runifold_sync.errors import TaskNotFound

runifold = Runifold()


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config["RUNIFOLD_DATABASE_URL"] = os.environ.get(
        "RUNIFOLD_DATABASE_URL", "sqlite:///orders-workflows.db"
    )
    app.config["RUNIFOLD_APP"] = "order_flow:registry"
    app.config["RUNIFOLD_CONCURRENCY"] = 2
    app.config.update(config or {})
    runifold.init_app(app)

    @app.post("/orders")
    def create_order() -> ResponseReturnValue:
        body = request.get_json(force=True)
        order_id = str(body.get("order_id") or uuid.uuid4().hex[:8])
        order = {"order_id": order_id, "sku": str(body["sku"]), "quantity": int(body.get("quantity", 1))}
        # One workflow per order id: a retried POST finds the same task.
        task_id = runifold.enqueue("order-intake", 1, order, checkpoint_id=f"order-{order_id}")
        return jsonify(order_id=order_id, task_id=task_id), 202

    @app.get("/orders/<order_id>")
    def show_order(order_id: str) -> ResponseReturnValue:
        try:
            record = runifold.store.get_task(f"order-{order_id}")
        except TaskNotFound:
            abort(404)
        return jsonify(state=record.state.value, result=record.result, reason=record.reason)

    return app
