"""The security suites' fixtures: every installed plugin plus the suites' own application (an
email notice), telemetry kept in memory, and :class:`~.world.World`."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox_core.plugins import PluginHost, build_host
from outbox_core.testing import OutboxTestDatabase
from outbox_email.testing import SmtpTestServer
from outbox_issues.testing import GitHubTestServer
from outbox_slack.testing import SlackTestServer

from . import app
from .world import World

METRICS = InMemoryMetricReader()
SPANS = InMemorySpanExporter()
metrics.set_meter_provider(MeterProvider(metric_readers=[METRICS]))
_tracing = TracerProvider()
_tracing.add_span_processor(SimpleSpanProcessor(SPANS))
trace.set_tracer_provider(_tracing)


@pytest.fixture(scope="session")
def outbox_plugin_host() -> PluginHost:
    return build_host(extra_plugins=[("security-app", app)])


@pytest.fixture
def world(
    outbox_db: OutboxTestDatabase,
    smtp_server: SmtpTestServer,
    slack_server: SlackTestServer,
    tracker_server: GitHubTestServer,
) -> World:
    return World(outbox_db, smtp_server, slack_server, tracker_server)


def telemetry() -> list[tuple[str, Any]]:
    """(where, value) for every metric name, label and value, and every span name, attribute
    and event recorded in this process so far."""
    found: list[tuple[str, Any]] = []
    data = METRICS.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.append(("metric", metric.name))
                for point in metric.data.data_points:
                    for key, value in (point.attributes or {}).items():
                        found.append((f"metric {metric.name} label", f"{key}={value}"))
    for span in SPANS.get_finished_spans():
        found.append(("span", span.name))
        found.extend(("span attribute", f"{k}={v}") for k, v in (span.attributes or {}).items())
        for span_event in span.events:
            found.append(("span event", span_event.name))
            found.extend(
                ("span event attribute", f"{k}={v}")
                for k, v in (span_event.attributes or {}).items()
            )
    return found
