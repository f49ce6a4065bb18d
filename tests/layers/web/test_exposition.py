"""Prometheus text read by prometheus-client's parser: counters and histograms with labels, the
label values a regex got wrong, and a malformed exposition's error; the two scrapers on it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from scalelab.lab.diagnose.stages.serve_meter import served_responses
from scalelab.lab.load.scrape import Sampler, parse_metrics
from scalelab.layers.web.exposition import ExpositionError, metric_families, sample_sums


def _exposition() -> str:
    reg = CollectorRegistry()
    c = Counter("scalelab_responses", "r", ["model", "code"], registry=reg)
    c.labels("flights", "200").inc(3)
    c.labels("flights", "429").inc(2)
    # a label value with a brace, a comma and an escaped quote: `\{[^}]*\}` split it wrongly
    c.labels('odd}, "m"', "200").inc(5)
    h = Histogram("lat_seconds", "l", ["route"], buckets=(0.5, 1.0), registry=reg)
    for v in (0.25, 0.75, 2.0):
        h.labels("a").observe(v)
    h.labels("b").observe(0.25)
    Gauge("vllm:num_requests_running", "g", registry=reg).set(4)
    Gauge("nan_gauge", "g", registry=reg).set(float("nan"))
    return generate_latest(reg).decode()


def test_counters_and_histograms_with_labels_sum_over_label_sets() -> None:
    sums = sample_sums(_exposition(), "test")
    assert sums["scalelab_responses_total"] == 10.0
    assert sums["lat_seconds_count"] == 4.0 and sums["lat_seconds_sum"] == 3.25
    # buckets are cumulative per label set: a (1, 2, 3) + b (1, 1, 1)
    assert sums["lat_seconds_bucket"] == 9.0
    assert sums["vllm:num_requests_running"] == 4.0
    assert "nan_gauge" not in sums  # NaN is no value to sum (as before)
    fams = {f.name: f for f in metric_families(_exposition(), "test")}
    assert fams["lat_seconds"].type == "histogram"
    odd = [s for s in fams["scalelab_responses"].samples
           if s.name == "scalelab_responses_total" and s.labels["model"] == 'odd}, "m"']
    assert [s.value for s in odd] == [5.0]


@pytest.mark.parametrize(("text", "line"), [
    ("ok_total 1\nbad line\n", "line 2: 'bad line'"),
    ('# TYPE x counter\nx_total{a="1" 3\n', "line 2: 'x_total{a=\"1\" 3'"),
    ("<html>503 Service Unavailable</html>\n", "line 1: '<html>503"),
])
def test_malformed_exposition_names_the_source_and_line(text: str, line: str) -> None:
    with pytest.raises(ExpositionError) as e:
        sample_sums(text, "http://127.0.0.1:1/metrics")
    msg = str(e.value)
    assert msg.startswith("http://127.0.0.1:1/metrics is not Prometheus text exposition format")
    assert line in msg, msg
    with pytest.raises(ExpositionError):
        parse_metrics(text)


class _Metrics(BaseHTTPRequestHandler):
    body: ClassVar[bytes] = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(_Metrics.body)))
        self.end_headers()
        self.wfile.write(_Metrics.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def metrics_url() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_served_responses_reads_the_labelled_counter(metrics_url: str) -> None:
    _Metrics.body = _exposition().encode()
    assert served_responses(metrics_url) == 10.0
    _Metrics.body = b"# HELP nothing yet\n"
    assert served_responses(metrics_url) == 0.0  # the counter appears after its first response
    _Metrics.body = b"scalelab_responses_total{code=200} 3\n"  # unquoted label value
    with pytest.raises(ExpositionError, match="line 1"):
        served_responses(metrics_url)


def test_sampler_warns_once_about_a_malformed_endpoint(
        metrics_url: str, caplog: pytest.LogCaptureFixture) -> None:
    _Metrics.body = b"vllm:num_requests_running 2\nnot a metric line\n"
    with caplog.at_level(logging.WARNING, logger="scalelab.lab.load"):
        s = Sampler(metrics_url + "/metrics", period_s=0.01)
        with s:
            while s.malformed < 3:
                threading.Event().wait(0.01)
    assert s.scrapes == [] and s.malformed >= 3
    warned = [r.getMessage() for r in caplog.records if "engine signals" in r.getMessage()]
    assert len(warned) == 1 and "line 2: 'not a metric line'" in warned[0]
    _Metrics.body = _exposition().encode()
    good = Sampler(metrics_url + "/metrics", period_s=10)
    with good:
        pass
    assert good.scrapes[-1]["vllm:num_requests_running"] == 4.0
