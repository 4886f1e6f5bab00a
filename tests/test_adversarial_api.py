"""The REST API under hostile and careless use, against a live ``pdplan`` server on 127.0.0.1.

Every reproduction from the hardening review is kept here: each gets a fast 4xx (or the documented
413/503/504), ``/healthz`` keeps answering within 100 ms while the worst allowed request runs, work
stops at its deadline and when the client disconnects, and the server's memory stays bounded.
All traffic goes to a server this module starts on loopback; every loop is bounded."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

import calculator as pc

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 2.0
READ_TIMEOUT_S = 1.0
ESTIMATE = {"model": "llama-3.1-70b", "gpu": "h200-sxm", "tp": 4, "isl": 4000, "osl": 500, "batch": 8}
PLAN = {"model": "llama-3.1-70b", "workload": {"rate": 12.0, "isl": 4000, "osl": 500},
        "slo": {"ttft_s": 2.0, "tpot_s": 0.05}, "gpus": ["h100-sxm", "h200-sxm", "h20"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _user_gpu(gpu_id: str) -> dict:
    return pc.load_gpu("h100-sxm").model_dump(mode="json") | {"id": gpu_id, "name": gpu_id}


class Server:
    """``api.server.serve`` in a subprocess, with a user hardware file it may corrupt and restore."""

    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.db = tmp / "site-gpus.yaml"
        self.write_db([_user_gpu("site-h100")])
        env = {**os.environ, "PDPLAN_HARDWARE_DB": str(self.db), "PDPLAN_READ_TIMEOUT_S": str(READ_TIMEOUT_S)}
        code = f"from api.server import serve; serve(port={self.port}, deadline_s={DEADLINE_S})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("pdplan server did not start")

    def write_db(self, gpus: list[dict]) -> None:
        self.db.write_text(yaml.safe_dump({"schema_version": 1, "gpus": gpus}), encoding="utf-8")
        time.sleep(0.01)  # a new mtime even on coarse clocks

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> str:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err.decode(errors="replace")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("server"))
    yield s
    log = s.stop()
    assert "Traceback" not in log, log[-3000:]  # no request, however hostile, reached an unhandled error


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base, timeout=30) as c:
        yield c


def _locs(r: httpx.Response) -> list[list]:
    return [d["loc"] for d in r.json()["detail"]]


PROBE = r"""
import json, select, socket, sys, time
port = int(sys.argv[1])
latencies = []
conn = socket.create_connection(("127.0.0.1", port))
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0.02)[0]:  # every 20 ms until the parent says stop
    t = time.perf_counter()
    conn.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    reply = b""
    while not reply.endswith(b'{"status":"ok"}'):
        chunk = conn.recv(4096)
        assert chunk, "connection closed"
        reply += chunk
    latencies.append(time.perf_counter() - t)
print(json.dumps(latencies), flush=True)
"""


class HealthProbe:
    """Polls /healthz every 20 ms from a process of its own (so that this process's garbage collector
    and GIL are not in its figures) until stopped; keeps each latency in seconds."""

    def __init__(self, base: str) -> None:
        self.port = int(base.rsplit(":", 1)[1])
        self.latencies_s: list[float] = []

    def __enter__(self) -> HealthProbe:
        self.proc = subprocess.Popen([sys.executable, "-c", PROBE, str(self.port)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self.proc.communicate("stop\n", timeout=30)
        self.latencies_s = json.loads(out)


# --------------------------------------------------------------------------------- event-loop stalls

HUGE_GEMMA = {"model_type": "gemma3_text", "num_hidden_layers": 100_000_000, "hidden_size": 4096,
              "num_attention_heads": 32, "intermediate_size": 14336, "vocab_size": 128256, "sliding_window": 1024}
HUGE_QWEN_MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 30_000_000, "hidden_size": 2048,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936}


@pytest.mark.parametrize("config", [HUGE_GEMMA, HUGE_QWEN_MOE], ids=["gemma3-1e8-layers", "qwen3moe-3e7-layers"])
@pytest.mark.parametrize("path", ["/v1/estimate", "/v1/kv-cache"])
def test_a_huge_layer_count_is_a_fast_422_and_health_keeps_answering(server, http, config, path):
    # was: 6.7 s (gemma) / 7.4 s and 1.28 GB (qwen3_moe) of a blocked event loop before the 422
    body = {"model": {"hf_config": config}} | ({"gpu": "h100-sxm"} if path == "/v1/estimate" else {})
    with HealthProbe(server.base) as probe:
        t = time.perf_counter()
        r = http.post(path, json=body)
        elapsed = time.perf_counter() - t
    assert r.status_code == 422 and elapsed < 0.5, (r.status_code, elapsed)
    assert _locs(r)[0][:4] == ["body", "model", "hf_config", "num_hidden_layers"], r.text
    assert max(probe.latencies_s, default=0) < 0.1


# --------------------------------------------------------------------------------- deadline, cancel

WORST_GPUS = [_user_gpu(f"gpu-{i}") for i in range(16)]
WORST_PLAN = {"model": "llama-3.1-70b",
              "workload": {"rate": 9.0, "isl": {"samples": [200 + (37 * i) % 7800 for i in range(10_000)]},
                           "osl": {"samples": [20 + (53 * i) % 2000 for i in range(10_000)]}},
              "slo": {"ttft_s": 2.0, "tpot_s": 0.05}, "gpus": WORST_GPUS, "tps": [1, 2, 4, 8, 16],
              "chunk_sizes": [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]}
WORST_SWEEP = {"target": "plan", "vary": "rate", "values": [1.0 + i for i in range(12)], "plan": WORST_PLAN}


def test_the_worst_allowed_request_stops_at_its_deadline_while_health_answers(server, http):
    # was: 138 s wall and 58 CPU-s, with /healthz waiting behind it
    body = json.dumps(WORST_SWEEP).encode()  # encoded before the probe starts: it shares this process's GIL
    assert len(body) < 1_000_000
    with HealthProbe(server.base) as probe:
        t = time.perf_counter()
        r = http.post("/v1/sweep", content=body, headers={"content-type": "application/json"})
        elapsed = time.perf_counter() - t
    assert r.status_code == 504 and "deadline" in r.json()["detail"], r.text[:300]
    assert elapsed < DEADLINE_S + 1.0
    # the loop answers between the search's GIL-held stretches: nearly every probe within milliseconds, and the
    # worst within a quarter second (a 2-core AVX2 VM showed one 50-170 ms stretch a run; the defect was 138 s,
    # and a load balancer's health probe waits 1 s by default)
    ms = sorted(round(x * 1e3) for x in probe.latencies_s)
    assert len(ms) > 10 and ms[len(ms) // 2] < 20 and ms[-1] < 250, ms


def test_work_stops_when_the_client_disconnects(server):
    # was: the computation ran on after the client left
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        body = json.dumps(WORST_SWEEP).encode()
        s.sendall(b"POST /v1/sweep HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)  # parsing done, the search running
    time.sleep(0.4)  # the disconnect is polled every 50 ms; the search checks its budget between configurations
    before = server.cpu_s()
    time.sleep(1.0)
    assert server.cpu_s() - before < 0.3  # idle again, well before the 2 s deadline would have stopped it


# --------------------------------------------------------------------------------- bounds and bodies

def test_plan_gpu_bound_is_the_documented_sixteen(http):
    r = http.post("/v1/plan", json={**PLAN, "gpus": WORST_GPUS + [_user_gpu("gpu-16")]})
    assert r.status_code == 422 and _locs(r) == [["body", "gpus"]], r.text


def test_a_chunked_body_over_the_limit_is_413(server):
    def chunks():
        yield b'{"model": "'
        for _ in range(20):
            yield b"x" * 60_000
        yield b'"}'

    with httpx.Client(base_url=server.base) as c:  # a generator body goes out chunked, no content-length
        r = c.post("/v1/estimate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than 1000000 bytes" in r.json()["detail"]


def test_length_samples_beyond_the_context_window_are_422(http):
    # was: 200, feasible, p99.9 TTFT 593 s on a 131k-window model
    body = {**PLAN, "workload": {"rate": 2.0, "isl": [1000] * 60 + [1_000_000], "osl": 500}}
    r = http.post("/v1/plan", json=body)
    assert r.status_code == 422 and _locs(r)[0][:3] == ["body", "workload", "isl"], r.text


def test_two_samples_are_samples_not_a_mean_and_cv(http):
    # was: [a, b] read as (mean, cv); samples with cv > 10 failed on workload.isl.cv, a field never sent
    r = http.post("/v1/evaluate", json={"model": "llama-3.1-8b", "workload": {"rate": 1.0, "isl": [100, 3000],
                                                                               "osl": 100},
                                         "deployment": {"mode": "mixed", "pool": {"gpu": "h100-sxm", "instances": 1}}})
    assert r.status_code == 200, r.text
    spread = [1] * 400 + [100_000]  # cv ~ 20
    r = http.post("/v1/evaluate", json={"model": "llama-3.1-8b", "workload": {"rate": 0.05, "isl": spread, "osl": 10},
                                         "deployment": {"mode": "mixed", "pool": {"gpu": "h100-sxm", "instances": 1}}})
    assert r.status_code == 200 or all(loc[-1] != "cv" for loc in _locs(r)), r.text


@pytest.mark.parametrize("body, loc", [
    ({**ESTIMATE, "isl": True}, ["body", "isl"]),
    ({**ESTIMATE, "batch": "8"}, ["body", "batch"]),
    ({**ESTIMATE, "tp": 4.0}, ["body", "tp"]),
    ({**ESTIMATE, "prefix_hit": False}, ["body", "prefix_hit"]),
])
def test_types_are_strict(http, body, loc):
    # was: isl: true read as 1
    r = http.post("/v1/estimate", json=body)
    assert r.status_code == 422 and _locs(r) == [loc], r.text


def test_hf_config_floats_are_not_truncated(http):
    # was: hidden_size 4096.7 silently read as 4096
    cfg = json.loads((REPO / "tests/fixtures/hf_configs/meta-llama--Llama-3.1-8B.json").read_text())
    r = http.post("/v1/kv-cache", json={"model": {"hf_config": {**cfg, "hidden_size": 4096.7}}})
    assert r.status_code == 422 and _locs(r)[0] == ["body", "model", "hf_config", "hidden_size"], r.text


def test_an_invalid_inline_spec_gets_one_item_per_problem_in_the_users_terms(http):
    # was: 3-15 items tagged with pydantic internals such as function-after[_consistent(), ModelSpec]
    spec = pc.load_model("llama-3.1-8b").model_dump(mode="json") | {"num_kv_heads": 7}
    r = http.post("/v1/estimate", json={**ESTIMATE, "model": spec, "tp": 1})
    assert r.status_code == 422, r.text
    items = r.json()["detail"]
    assert len(items) == 1 and items[0]["loc"][:2] == ["body", "model"], items
    assert not any("[" in str(p) or str(p).startswith("~") for it in items for p in it["loc"])
    r = http.post("/v1/estimate", json={**ESTIMATE, "model": 42})
    assert r.json()["detail"] == [{"loc": ["body", "model"], "type": "model_ref",
                                   "msg": 'a model is an id string, an inline ModelSpec object or {"hf_config": {...}}'}]


# --------------------------------------------------------------------------------- server-side faults

def test_a_broken_database_is_503_without_the_servers_paths_and_readiness_says_so(server, http):
    good = server.db.read_text()
    try:
        assert http.get("/readyz").status_code == 200
        server.db.unlink()
        for method, path, body in (("GET", "/v1/gpus", None), ("POST", "/v1/estimate", ESTIMATE),
                                   ("GET", "/readyz", None)):
            r = http.request(method, path, json=body)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert str(server.db.parent) not in r.text and "/" not in r.json()["detail"].replace("n/a", "")
        server.db.write_text("gpus: [oops", encoding="utf-8")
        assert http.post("/v1/estimate", json=ESTIMATE).status_code == 503
        assert http.get("/healthz").json() == {"status": "ok"}  # liveness: the process itself is fine
    finally:
        server.db.write_text(good, encoding="utf-8")
    assert http.get("/readyz").status_code == 200


def test_version_follows_the_database(server, http):
    # was: after a GPU was added, /v1/version reported the old count and sha256
    before = http.get("/v1/version").json()
    good = server.db.read_text()
    try:
        server.write_db([_user_gpu("site-h100"), _user_gpu("site-h100b")])
        after = http.get("/v1/version").json()
        assert after["gpus"] == before["gpus"] + 1 and after["database_sha256"] != before["database_sha256"]
    finally:
        server.db.write_text(good, encoding="utf-8")


# --------------------------------------------------------------------------------- connections

def test_head_on_health_and_readiness(http):
    assert http.head("/healthz").status_code == 200  # was 405
    assert http.head("/readyz").status_code == 200


@pytest.mark.parametrize("sent", [b"", b"POST /v1/estimate HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"],
                         ids=["silent", "half-a-request"])
def test_stalled_connections_are_closed(server, sent):
    # was: 300 idle or stalled connections held for 70 s
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(READ_TIMEOUT_S + 3)
        s.sendall(sent)
        t = time.perf_counter()
        assert s.recv(1024) == b""  # the server closed it
        assert time.perf_counter() - t < READ_TIMEOUT_S + 1.5


def test_memory_stays_bounded(server, http):
    for config in (HUGE_GEMMA, HUGE_QWEN_MOE):
        http.post("/v1/estimate", json={"model": {"hf_config": config}, "gpu": "h100-sxm"})
    assert server.rss_bytes() < 500 * 2**20, server.rss_bytes()

