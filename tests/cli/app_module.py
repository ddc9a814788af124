"""An application declared on an ``App`` whose store is named by ``APP_MODULE_DB``, for
``run --app tests.cli.app_module:app`` (and ``:make_app``, a function returning it)."""

from __future__ import annotations

import os
from typing import Any

from runifold_sync import App

app = App(os.environ.get("APP_MODULE_DB", "sqlite:///app-module.db"))
greeting = app.workflow("greeting")


@greeting.step()
def greet(ctx: Any, name: str) -> str:
    return f"hello, {name}"


@greeting.main
def main(ctx: Any, name: str) -> str:
    return greet(ctx, name)


def make_app() -> App:
    return app
