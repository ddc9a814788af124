"""Which span exporters the ``OTEL_*`` variables name, and whether they are installed.

Each traced worker reads this as it builds its tracer provider after the fork
(``tracing.provider_from_env``), and ``run --tracing`` reads it in the parent before any
worker is forked (or the ``--once`` cycle starts): a missing exporter package used to be
found by every child on start, which died, was restarted five times and took the pool
down after a hundred lines of tracebacks; now it is one error before anything runs.

Nothing here imports OpenTelemetry or creates an exporter, a thread or a connection: the
exporters are looked up as entry points, not loaded, so what the parent checks leaves
nothing behind to cross the fork.
"""

from __future__ import annotations

import os
from importlib.metadata import EntryPoint, entry_points
from importlib.util import find_spec

from .errors import InvalidArgument

EXPORTER_VARIABLE = "OTEL_TRACES_EXPORTER"
_GROUP = "opentelemetry_traces_exporter"


_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def exporter_names() -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, comma separated (default ``otlp``;
    ``none`` names none). ``otlp`` is the exporter of the protocol the OTLP protocol
    variables give, gRPC when they are unset, as the OpenTelemetry SDK reads them: so
    ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`` takes the ``otel`` extra's HTTP one."""
    names = [n.strip() for n in os.environ.get(EXPORTER_VARIABLE, "otlp").split(",") if n.strip()]
    return [_otlp_by_protocol() if name == "otlp" else name for name in names if name != "none"]


def _otlp_by_protocol() -> str:
    for variable in _PROTOCOL_VARIABLES:
        protocol = os.environ.get(variable, "").strip()
        if protocol:
            if protocol not in _OTLP_BY_PROTOCOL:
                raise InvalidArgument(
                    f"{variable} is {protocol!r}; runifold_sync exports spans over "
                    f"{' or '.join(sorted(_OTLP_BY_PROTOCOL))}"
                )
            return _OTLP_BY_PROTOCOL[protocol]
    return _OTLP_BY_PROTOCOL["grpc"]


def exporter_entry_points() -> list[EntryPoint]:
    """The installed entry point of each exporter :func:`exporter_names` gives, found but
    not loaded; :class:`InvalidArgument` when the SDK is missing or no installed package
    provides one of them, naming the variable, the exporter and what to install."""
    if find_spec("opentelemetry") is None or find_spec("opentelemetry.sdk") is None:
        raise InvalidArgument(
            "tracing needs the OpenTelemetry SDK, which is not installed: pip install 'runifold_sync[otel]'"
        )
    found = []
    for name in exporter_names():
        matches = entry_points(group=_GROUP, name=name)
        if not matches:
            raise InvalidArgument(
                f"{EXPORTER_VARIABLE} names {name!r}, but no installed package provides that exporter "
                "(OTLP over gRPC, otlp_proto_grpc: pip install opentelemetry-exporter-otlp-proto-grpc; "
                "OTLP over HTTP, otlp_proto_http, comes with the otel extra (otlp names it with "
                "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf); console comes with the SDK)"
            )
        found.append(next(iter(matches)))
    return found
