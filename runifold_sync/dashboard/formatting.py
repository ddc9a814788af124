"""The template filters: times, ages and JSON as the pages show them. Each returns
plain text; the templates escape it like every other value."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import flask


def when(moment: datetime | None) -> str:
    """A store time in UTC to the second, or a dash."""
    if moment is None:
        return "-"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def age(seconds: float | None) -> str:
    """``3m 12s``: a duration in seconds as an operator reads it, or a dash."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        amount, whole = divmod(whole, size)
        if amount:
            parts.append(f"{amount}{unit}")
    if whole:
        parts.append(f"{whole}s")
    return " ".join(parts[:2])


# The most characters of one stored value a page shows: a page stays readable (and small)
# when an input or a step's output is megabytes long; the rest is for `show --json`.
MAX_SHOWN = 20_000


def shortened(text: str) -> str:
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[:MAX_SHOWN]}\n... ({len(text):,} characters; the first {MAX_SHOWN:,} shown)"


def pretty_json(text: str | None) -> str:
    """Stored JSON text indented for reading (text that is not JSON as it is), cut to
    :data:`MAX_SHOWN` characters. A long text is not parsed: it is shown as stored."""
    if text is None:
        return "null"
    if len(text) > MAX_SHOWN:
        return shortened(text)
    try:
        return shortened(json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True))
    except ValueError:
        return text


def as_json(value: Any) -> str:
    """A decoded value (a history event's detail, a journal entry) as indented JSON, cut
    to :data:`MAX_SHOWN` characters."""
    return shortened(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str))


def without(detail: dict[str, Any], key: str) -> dict[str, Any]:
    """``detail`` without ``key`` (a traceback shown apart, with its lines)."""
    return {k: v for k, v in detail.items() if k != key}


def install(app: flask.Flask) -> None:
    app.add_template_filter(without)
    app.add_template_filter(shortened, "truncate_text")
    app.add_template_filter(when)
    app.add_template_filter(age)
    app.add_template_filter(pretty_json)
    app.add_template_filter(as_json)
