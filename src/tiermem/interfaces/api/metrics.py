"""Prometheus metrics of one API app (its own registry, so several apps never clash).

* ``tiermem_request_duration_seconds{operation,status}``: latency histogram per route
  template (bounded label values) and status code;
* ``tiermem_hot_hits_total``, ``tiermem_reloads_total``, ``tiermem_hot_bypasses_total``,
  ``tiermem_flushed_turns_total``, ``tiermem_lost_turns_total``: the tiers' counters, read
  from the service at scrape time;
* ``tiermem_summarization_passes_total``, ``tiermem_summarization_failures_total``,
  ``tiermem_summary_fact_preservation``: from ``service.summaries.stats`` when the service
  summarizes (0 and absent until then);
* ``tiermem_index_failures_total``, ``tiermem_auto_detect_failures_total``: background work;
* ``tiermem_breaker_state{tool,state}``: 1 for each tool's current breaker state;
* ``tiermem_cacheable_prefix_changes_total{cache_point}``: a session's context whose
  static or slow prefix fingerprint differs from its previous context (cache misses the
  provider will see);
* ``tiermem_rate_limited_total``, ``tiermem_auth_failures_total``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiermem.tools.breaker import BreakerStatus

if TYPE_CHECKING:
    from tiermem.context import ContextWindow
    from tiermem.service import MemoryService
    from tiermem.tools import ToolStatus

__all__ = ["ApiMetrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_MAX_TRACKED_SESSIONS = 10_000


def _summary_snapshot(service: MemoryService) -> dict[str, object]:
    """The summarization counters, when the service runs summaries: ``service.summaries``
    with ``stats.snapshot()`` (:class:`tiermem.summaries.jobs.SummaryJobStats`); empty
    otherwise, so the metrics read 0 until summaries are wired in."""
    stats = getattr(getattr(service, "summaries", None), "stats", None)
    snapshot = getattr(stats, "snapshot", None)
    if not callable(snapshot):
        return {}
    values = snapshot()
    return dict(values) if isinstance(values, dict) else {}


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


class _ServiceCollector(Collector):
    """Reads the service's own counters when Prometheus scrapes (no double bookkeeping)."""

    def __init__(self, service: MemoryService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        tiers = self._service.metrics
        service = self._service
        values: dict[str, tuple[float, str]] = {
            "hot_hits": (tiers.hot_hits, "Sessions served from the hot tier."),
            "reloads": (tiers.reloads, "Hot misses rebuilt from the durable tier."),
            "hot_bypasses": (tiers.bypasses, "Operations served without the hot tier."),
            "flushed_turns": (tiers.flushed_turns, "Write-behind turns flushed."),
            "lost_turns": (tiers.lost_turns, "Write-behind turns lost with the hot tier."),
            "index_failures": (service.index_failures, "Turn-indexing writes that failed."),
            "auto_detect_failures": (
                service.auto_detect_failures,
                "Memory auto-detection writes that failed.",
            ),
        }
        summaries = _summary_snapshot(service)
        values["summarization_passes"] = (
            _number(summaries.get("committed")),
            "Summarization passes committed (0 while the service does not summarize).",
        )
        values["summarization_failures"] = (
            _number(summaries.get("failures")),
            "Summarization jobs that failed (retried later).",
        )
        for name, (value, doc) in values.items():
            family = CounterMetricFamily(f"tiermem_{name}", doc)
            family.add_metric([], float(value))
            yield family
        preservation = summaries.get("mean_fact_preservation_first")
        if isinstance(preservation, int | float):
            gauge = GaugeMetricFamily(
                "tiermem_summary_fact_preservation",
                "Mean share of facts a summarization pass kept on its first try.",
            )
            gauge.add_metric([], float(preservation))
            yield gauge

    def describe(self) -> Iterable[Metric]:
        return ()


class ApiMetrics:
    """The metrics of one app; ``render`` produces the Prometheus text format."""

    def __init__(self, service: MemoryService) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "tiermem_request_duration_seconds",
            "Request latency per operation (route template) and status.",
            ["operation", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.breaker_state = Gauge(
            "tiermem_breaker_state",
            "1 for the current breaker state of each tool.",
            ["tool", "state"],
            registry=self.registry,
        )
        self.prefix_changes = Counter(
            "tiermem_cacheable_prefix_changes",
            "Contexts whose cacheable prefix changed since the session's previous context.",
            ["cache_point"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "tiermem_rate_limited", "Requests refused with 429.", registry=self.registry
        )
        self.auth_failures = Counter(
            "tiermem_auth_failures", "Requests refused with 401.", registry=self.registry
        )
        self.registry.register(_ServiceCollector(service))
        self._fingerprints: OrderedDict[tuple[str, str], str] = OrderedDict()

    def observe_context(self, session_key: str, window: ContextWindow) -> None:
        """Count a cache point whose fingerprint changed since the session's last context.

        ``session_key`` is the scoped session id; the map is bounded (least recently used
        sessions forgotten first; a forgotten session's next context counts as unchanged).
        """
        for point in window.cache_points:
            key = (session_key, point.name)
            before = self._fingerprints.get(key)
            self._fingerprints[key] = point.fingerprint
            self._fingerprints.move_to_end(key)
            if before is not None and before != point.fingerprint:
                self.prefix_changes.labels(cache_point=point.name).inc()
        while len(self._fingerprints) > 2 * _MAX_TRACKED_SESSIONS:
            self._fingerprints.popitem(last=False)

    def set_breakers(self, statuses: Iterable[ToolStatus]) -> None:
        for status in statuses:
            for state in BreakerStatus:
                value = 1.0 if status.breaker is state else 0.0
                self.breaker_state.labels(tool=status.name, state=state.value).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
