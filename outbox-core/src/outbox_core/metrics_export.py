"""``outbox run --metrics-port``: the OpenTelemetry metrics as a Prometheus endpoint."""

from __future__ import annotations

from .errors import ConfigurationError


def serve_prometheus(port: int, host: str = "0.0.0.0") -> None:
    """Install an SDK meter provider whose reader serves /metrics on ``port``."""
    try:
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import start_http_server
    except ImportError:
        raise ConfigurationError(
            "--metrics-port needs the Prometheus exporter: pip install 'outbox-core[prometheus]'"
        ) from None
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        raise ConfigurationError(f"--metrics-port {port}: {exc.strerror}") from None
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
