"""Tracing from the ``OTEL_*`` variables: which span exporters they name, whether those
are installed, and the tracer built from them.

``run --tracing`` and the framework integrations check the exporters in the parent
before any worker is forked (or the ``--once`` cycle starts), :func:`env_tracer`, so a
missing exporter package is one error before anything runs rather than every child
dying on start; each worker process then builds its own tracer after the fork
(:func:`tracer_from_env`).

Importing this module imports nothing of OpenTelemetry, and the check creates no
exporter, thread or connection: the exporters are looked up as entry points, not loaded,
so what the parent checks leaves nothing behind to cross the fork.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from importlib.util import find_spec
from typing import TYPE_CHECKING

from ..engine.spans import CycleTracer
from ..errors import InvalidArgument

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

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


def env_tracer() -> Callable[[], CycleTracer]:
    """What ``tracing`` on means to the CLI and the framework integrations: the
    exporters are checked now (:func:`exporter_entry_points`, before any fork), and
    :func:`tracer_from_env` is returned, for each worker process to call after its fork
    (``App(..., tracer=...)``)."""
    exporter_entry_points()
    return tracer_from_env


def tracer_from_env() -> CycleTracer:
    """A ``tracing.Tracing`` over :func:`provider_from_env`."""
    from .tracing import Tracing

    return Tracing(provider_from_env())


def provider_from_env() -> TracerProvider:
    """An SDK tracer provider set up from the standard variables, for a pool child to
    build after the fork: the resource from ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES``, the sampler from ``OTEL_TRACES_SAMPLER``, and one batch
    processor (``OTEL_BSP_*``) per exporter named in ``OTEL_TRACES_EXPORTER`` (comma
    separated; default ``otlp``: OTLP over HTTP (the ``otel`` extra's), or over gRPC with
    ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``, reading ``OTEL_EXPORTER_OTLP_*``;
    ``console`` comes with the SDK; ``none`` exports nothing).
    An exporter no installed package provides is :class:`InvalidArgument`."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = exporter_entry_points()  # checked before anything is built
    provider = SdkTracerProvider(resource=Resource.create())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter.load()()))
    return provider
