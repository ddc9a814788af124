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

from ..errors import InvalidArgument

EXPORTER_VARIABLE = "OTEL_TRACES_EXPORTER"
_GROUP = "opentelemetry_traces_exporter"


_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
# OTLP over HTTP when no protocol variable is set: the exporter the ``otel`` extra
# installs, and the default the OpenTelemetry specification gives SDKs (the Python SDK's
# own ``otlp`` is gRPC, whose exporter the extra does not install).
DEFAULT_PROTOCOL = "http/protobuf"


def exporter_names() -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, comma separated (default ``otlp``;
    ``none`` names none). ``otlp`` is the exporter of the protocol the OTLP protocol
    variables give, OTLP over HTTP (the ``otel`` extra's) when they are unset, so
    ``run --tracing`` works with nothing set; ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` takes
    the gRPC one (``opentelemetry-exporter-otlp-proto-grpc``)."""
    return [name for _, name in _named_exporters()]


def _named_exporters() -> list[tuple[str, str]]:
    """Each exporter as the variable names it (``otlp``) and as its entry point does
    (``otlp_proto_http``)."""
    names = [n.strip() for n in os.environ.get(EXPORTER_VARIABLE, "otlp").split(",") if n.strip()]
    return [(name, _otlp_by_protocol() if name == "otlp" else name) for name in names if name != "none"]


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
    return _OTLP_BY_PROTOCOL[DEFAULT_PROTOCOL]


def exporter_entry_points() -> list[EntryPoint]:
    """The installed entry point of each exporter :func:`exporter_names` gives, found but
    not loaded; :class:`InvalidArgument` when the SDK is missing or no installed package
    provides one of them, naming the variable, the exporter and what to install."""
    if find_spec("opentelemetry") is None or find_spec("opentelemetry.sdk") is None:
        raise InvalidArgument(
            "tracing needs the OpenTelemetry SDK, which is not installed: pip install 'runifold_sync[otel]'"
        )
    found = []
    for given, name in _named_exporters():
        matches = entry_points(group=_GROUP, name=name)
        if not matches:
            named = f"{given!r}" if given == name else f"{given!r} ({name}, by the OTLP protocol variables)"
            raise InvalidArgument(
                f"{EXPORTER_VARIABLE} names {named}, but no installed package provides that exporter "
                "(OTLP over HTTP, otlp_proto_http, the default for otlp, comes with the otel extra; "
                "OTLP over gRPC, otlp_proto_grpc (otlp with OTEL_EXPORTER_OTLP_PROTOCOL=grpc): "
                "pip install opentelemetry-exporter-otlp-proto-grpc; console comes with the SDK)"
            )
        found.append(next(iter(matches)))
    return found
