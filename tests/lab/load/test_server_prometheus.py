"""The server signals a Prometheus server holds (load/server/prometheus.py), asked of a real
`prometheus` (Debian's) that scrapes a tiny node_exporter- and DCGM-shaped target on 127.0.0.1
every second: busy cores, cores, memory in use, GPU utilisation and memory."""

import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from promtool_bin import prometheus
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.load.server.prometheus import instant, read_window

T0 = time.time()
USER_CORES = 0.5  # the target's two CPUs spend half a second per second in user mode together


class Target(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        user = USER_CORES * (time.time() - T0)
        body = (
            "# TYPE node_cpu_seconds_total counter\n"
            f'node_cpu_seconds_total{{cpu="0",mode="idle"}} {100 + time.time() - T0}\n'
            f'node_cpu_seconds_total{{cpu="1",mode="idle"}} {100 + time.time() - T0}\n'
            f'node_cpu_seconds_total{{cpu="0",mode="user"}} {user}\n'
            '# TYPE node_memory_MemTotal_bytes gauge\nnode_memory_MemTotal_bytes 8e9\n'
            '# TYPE node_memory_MemAvailable_bytes gauge\nnode_memory_MemAvailable_bytes 6e9\n'
            '# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0"} 80\n'
            '# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{gpu="0"} 1024\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = prometheus()
    target = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    d = tmp_path_factory.mktemp("prom")
    (d / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs: [{job_name: node, static_configs: "
        f"[{{targets: ['127.0.0.1:{target.server_port}']}}]}}]\n")
    port = _free_port()
    proc = subprocess.Popen([binary, f"--config.file={d / 'prometheus.yml'}",
                             f"--storage.tsdb.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        # Ready once it has scraped the target three times (a rate needs two samples).
        while time.monotonic() < deadline:
            try:
                n = instant(base, 'count_over_time(up{job="node"}[1m])', time.time())
            except BadInputError:
                n = None
            if n is not None and n >= 3:
                break
            assert proc.poll() is None, "prometheus exited"
            time.sleep(0.2)
        else:
            pytest.fail("prometheus did not scrape the target three times in 60 s")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        target.shutdown()


def test_the_window_reads_node_exporter_and_dcgm_series(prom: str) -> None:
    end = time.time()
    got, sources = read_window(prom, start=end - 3, end=end)
    assert got["cores"] == 2
    assert got["busy_cores"] == pytest.approx(USER_CORES, rel=0.05)
    assert got["rss_bytes"] == 2_000_000_000
    assert got["gpu_util"] == pytest.approx(0.8)
    assert got["gpu_memory_bytes"] == 1024 * 2**20
    assert sources["busy_cores"].startswith(f"prometheus {prom}: node_exporter ")
    assert sources["gpu_util"].startswith(f"prometheus {prom}: DCGM ")


def test_a_label_matcher_that_matches_nothing_reads_nothing(prom: str) -> None:
    got, _ = read_window(prom, start=time.time() - 3, end=time.time(), match='instance="nowhere"')
    assert got == {}


def test_a_prometheus_that_does_not_answer_is_named(prom: str) -> None:
    with pytest.raises(BadInputError, match="did not answer"):
        instant(f"http://127.0.0.1:{_free_port()}", "up", time.time(), timeout_s=2)
    with pytest.raises(BadInputError, match=r"prometheus .*: 400 for"):
        instant(prom, "sum(", time.time())
    assert urllib.request.urlopen(prom + "/-/ready", timeout=5).status == 200
