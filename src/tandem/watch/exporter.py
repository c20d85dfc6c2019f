"""``tandem watch --serve-metrics PORT``: the latest sample as Prometheus metrics.

Headless vLLM workers export no ``/metrics`` (kubernetes-sigs/lws #387), so Prometheus cannot
tell that a worker rank died; the leader keeps answering ``/health``. The watcher already reads
every rank's liveness and every node's memory, GPUs and RDMA counters, so it serves them on a
small endpoint of its own (prometheus_client's HTTP server, one thread), and the rendered alert
rules (``tandem render --target prometheus``) read them. Every value is the latest sample's;
nothing is exported before the first sample, and ``tandem_watch_sample_timestamp_seconds``
lets a rule see a watcher that stopped sampling.

Metric names follow Prometheus' conventions: base units (bytes, seconds, hertz, celsius,
watts), ``_total`` for counters; labels ``deployment``, ``node``, ``rank``, ``role``, ``gpu``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from tandem import wire
from tandem.errors import SpecError
from tandem.spec.addresses import port_fault
from tandem.watch.sample import Sample, Verdict


class SampleCollector:
    """A prometheus_client collector over the latest sample (``update`` from the loop)."""

    def __init__(self, deployment: str) -> None:
        self.deployment = deployment
        self._sample: Sample | None = None
        self._lock = threading.Lock()

    def update(self, sample: Sample) -> None:
        with self._lock:
            self._sample = sample

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            sample = self._sample
        if sample is None:
            return
        d = self.deployment
        stamp = GaugeMetricFamily(
            wire.TANDEM_SAMPLE_TIMESTAMP,
            "Unix time of the latest sample.",
            labels=["deployment"],
        )
        stamp.add_metric([d], sample.unix)
        yield stamp
        verdict = GaugeMetricFamily(
            wire.TANDEM_VERDICT,
            "1 for the deployment's current verdict, 0 for the others.",
            labels=["deployment", "verdict"],
        )
        for value in Verdict:
            verdict.add_metric([d, value.value], float(sample.verdict == value))
        yield verdict
        restarts = CounterMetricFamily(
            wire.TANDEM_RESTARTS, "Group restarts in events.log.", labels=["deployment"]
        )
        restarts.add_metric([d], sample.restarts)
        yield restarts
        yield from self._ranks(sample)
        yield from self._nodes(sample)

    def _ranks(self, sample: Sample) -> Iterator[Metric]:
        labels = ["deployment", "rank", "node", "role"]
        up = GaugeMetricFamily(
            wire.TANDEM_RANK_UP, "1 while the rank's process (or pod) is alive.", labels=labels
        )
        processes = GaugeMetricFamily(
            wire.TANDEM_RANK_PROCESSES, "Live processes of the rank.", labels=labels
        )
        rss = GaugeMetricFamily(
            wire.TANDEM_RANK_RSS, "Summed RSS of the rank's processes.", labels=labels
        )
        cpu = CounterMetricFamily(
            wire.TANDEM_RANK_CPU, "CPU time of the rank's live processes.", labels=labels
        )
        for node in sample.nodes:
            for r in node.ranks:
                values = [self.deployment, str(r.rank), node.node, r.role]
                up.add_metric(values, float(r.up))
                processes.add_metric(values, r.processes)
                _add(rss, values, r.rss_bytes)
                _add(cpu, values, r.cpu_s)
        yield from (up, processes, rss, cpu)

    def _nodes(self, sample: Sample) -> Iterator[Metric]:
        node_labels = ["deployment", "node"]
        total = GaugeMetricFamily(wire.TANDEM_NODE_MEMORY_TOTAL, "MemTotal.", labels=node_labels)
        available = GaugeMetricFamily(
            wire.TANDEM_NODE_MEMORY_AVAILABLE, "MemAvailable.", labels=node_labels
        )
        oom = CounterMetricFamily(
            wire.TANDEM_NODE_OOM_KILLS,
            "OOM kills since boot (/proc/vmstat oom_kill).",
            labels=node_labels,
        )
        gpu_labels = ["deployment", "node", "gpu"]
        temperature = GaugeMetricFamily(
            wire.TANDEM_GPU_TEMPERATURE, "GPU temperature.", labels=gpu_labels
        )
        clock = GaugeMetricFamily(wire.TANDEM_GPU_SM_CLOCK, "SM clock.", labels=gpu_labels)
        power = GaugeMetricFamily(wire.TANDEM_GPU_POWER, "Board power draw.", labels=gpu_labels)
        throttled = GaugeMetricFamily(
            wire.TANDEM_GPU_THROTTLED,
            "1 while a thermal or hardware slowdown holds the clocks down.",
            labels=gpu_labels,
        )
        port_labels = ["deployment", "node", "device", "port"]
        xmit = CounterMetricFamily(
            wire.TANDEM_RDMA_TRANSMIT, "RDMA port data sent.", labels=port_labels
        )
        rcv = CounterMetricFamily(
            wire.TANDEM_RDMA_RECEIVE, "RDMA port data received.", labels=port_labels
        )
        for node in sample.nodes:
            base = [self.deployment, node.node]
            _add(total, base, node.mem_total_bytes)
            _add(available, base, node.mem_available_bytes)
            _add(oom, base, node.oom_kills)
            for g in node.gpus:
                labels = [*base, str(g.index)]
                _add(temperature, labels, g.temperature_c)
                _add(power, labels, g.power_w)
                _add(clock, labels, g.sm_clock_mhz * 1e6 if g.sm_clock_mhz else None)
                throttled.add_metric(labels, float(g.throttled))
            for p in node.rdma:
                labels = [*base, p.device, str(p.port)]
                _add(xmit, labels, p.xmit_bytes)
                _add(rcv, labels, p.rcv_bytes)
        yield from (total, available, oom, temperature, clock, power, throttled, xmit, rcv)


def _add(
    family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None
) -> None:
    """A series where the sample holds a value; where it does not, none (never a 0)."""
    if value is not None:
        family.add_metric(labels, value)


def serve(collector: SampleCollector, port: int, address: str = "0.0.0.0"):
    """Serve the collector on ``http://ADDRESS:PORT/metrics``; returns (server, thread).

    Raises:
        SpecError: the port is in use (or privileged), or the address is not one of this
            machine's (``--serve-address``).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        return start_http_server(port, addr=address, registry=registry)
    except (OSError, UnicodeError) as exc:  # a name the resolver refuses is a UnicodeError
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        fix = port_fault(exc, port)
        raise SpecError(
            f"cannot serve metrics on {address}:{port}: {reason}",
            field="--serve-metrics" if fix else "--serve-address",
            hint=fix or "bind an address of this machine, e.g. 0.0.0.0 (all) or 127.0.0.1",
        ) from exc
