"""The planner page (``/``) and the API documentation pages (``/docs``, ``/redoc``) in headless
Chromium, against a live ``pdplan serve`` on 127.0.0.1.

The browser resolves no host but 127.0.0.1, and every request it makes is read back from Chrome's
DevTools log: each must go to this server (or be a ``data:`` URL). The page's answers are checked
against the API's own (a face formats, it never recomputes).

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package; without them the
tests skip, unless ``PDPLAN_REQUIRE_BROWSER=1``, when they fail. ``docs/_scripts/screenshots.py``
reuses ``serve`` and ``chrome`` to take the documentation's screenshots.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from test_adversarial_api import _free_port

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
REQUIRE_ENV = "PDPLAN_REQUIRE_BROWSER"
WAIT_S = 90.0
"""Longest wait for the page (a plan, its sweeps and evaluations on a busy 2-core machine take a few s)."""
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--disable-default-apps", "--disable-extensions",
                  "--force-device-scale-factor=1", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
NETWORK_SCHEMES = ("http", "https", "ws", "wss", "ftp")
PLAN = {"model": "llama-3.1-70b", "gpus": ["h100-sxm", "h200-sxm"], "rate": "4", "isl": "4000", "osl": "500",
        "ttft_s": "2", "tpot_ms": "50"}
"""The form as the tests fill it (input id -> text; TPOT in ms as the page shows it)."""


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if importlib.util.find_spec("selenium") is None:
        return "the selenium package is not installed (pip install selenium)"
    if chromium() is None:
        return "no Chromium (apt-get install chromium)"
    if chromedriver() is None:
        return "no chromedriver (apt-get install chromium-driver)"
    return None


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromedriver() -> str | None:
    return shutil.which("chromedriver")


@contextmanager
def serve() -> Iterator[str]:
    """``pdplan serve`` on a free loopback port; yields its base URL and stops it afterwards."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "calculator.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError("pdplan serve did not start: " + proc.stderr.read().decode(errors="replace")[-2000:])
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        log = err.decode(errors="replace")
        assert "Traceback" not in log, log[-3000:]


@contextmanager
def chrome(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """Headless Chromium (a fresh profile, no host but 127.0.0.1) driven by chromedriver, with the
    DevTools network log and the console recorded."""
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not try to download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="pdplan-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium()
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver()))
        try:
            driver.set_window_size(width, height)
            yield driver
        finally:
            driver.quit()


class Browser:
    """The driver plus every request URL and console message it has logged so far."""

    def __init__(self, driver: Any, base: str) -> None:
        self.driver = driver
        self.base = base
        self.requests: dict[str, str] = {}  # DevTools request id -> URL
        self.refused: set[str] = set()  # ids the page's Content-Security-Policy stopped before they left
        self.console: list[str] = []

    def collect(self) -> None:
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            params = message.get("params", {})
            if message["method"] == "Network.requestWillBeSent":
                self.requests[params["requestId"]] = params["request"]["url"]
            elif message["method"] == "Network.loadingFailed" and params.get("blockedReason") == "csp":
                self.refused.add(params["requestId"])
        self.console += [m["message"] for m in self.driver.get_log("browser")]

    @property
    def paths(self) -> set[str]:
        self.collect()
        return {urlsplit(u).path for u in self.requests.values()}

    def foreign_requests(self) -> list[str]:
        """Network requests the browser sent anywhere but this server (``data:`` URLs and the
        browser's own ``chrome://`` pages stay inside it)."""
        self.collect()
        here = urlsplit(self.base).netloc
        return [u for i, u in self.requests.items() if i not in self.refused
                and urlsplit(u).scheme in NETWORK_SCHEMES and urlsplit(u).netloc != here]

    def page_faults(self) -> list[str]:
        """Console messages, since the last call, of a script error or a Content-Security-Policy refusal."""
        self.collect()
        faults = [m for m in self.console if "Content Security Policy" in m or "Uncaught" in m]
        self.console.clear()
        return faults


def wait(driver: Any, condition: Callable[[Any], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s, poll_frequency=0.1).until(condition, message=f"waiting for {what}")


def open_planner(driver: Any, url: str) -> None:
    """Load the page and wait for its model and GPU catalog."""
    driver.get(url)
    wait(driver, lambda d: d.execute_script("return document.body.dataset.catalog"), "the catalog")


def fill(driver: Any, form: dict[str, Any]) -> None:
    """Type each value into its input (``gpus``: the GPU boxes to tick, every other box unticked)."""
    from selenium.webdriver.common.by import By

    for key, value in form.items():
        if key == "gpus":
            for box in driver.find_elements(By.CSS_SELECTOR, "#gpu-list input"):
                if box.is_selected() != (box.get_attribute("value") in value):
                    driver.execute_script("arguments[0].scrollIntoView({block: 'nearest'})", box)
                    box.click()
            continue
        field = driver.find_element(By.ID, key)
        field.clear()
        field.send_keys(value)


def submit(driver: Any) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "submit").click()


def wait_result(driver: Any, status: str = "done") -> None:
    wait(driver, lambda d: d.execute_script("return document.getElementById('result').dataset.status") == status,
         f"the plan ({status})")


def plan_form(browser: Browser, status: str = "done", **changes: Any) -> Any:
    """Open the page, fill ``PLAN`` with ``changes``, submit, and wait for the plan's ``status``;
    returns the driver."""
    d = browser.driver
    open_planner(d, browser.base + "/")
    fill(d, {**PLAN, **changes})
    submit(d)
    wait_result(d, status)
    return d


def wait_figures(driver: Any, count: int = 4) -> list[str]:
    """Ids of the figures once ``count`` of them are drawn (none still loading)."""
    script = ("const f = [...document.querySelectorAll('figure.chart')];"
              "return f.some(x => x.dataset.status === 'loading') ? null"
              " : f.filter(x => x.dataset.status === 'ready').map(x => x.id);")
    return wait(driver, lambda d: (ids := d.execute_script(script)) is not None and len(ids) >= count and ids,
                f"{count} figures")


INK_SCRIPT = """
const c = document.querySelector('#' + arguments[0] + ' canvas');
const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let inked = 0;
for (let i = 3; i < data.length; i += 4) if (data[i] > 0) inked++;
return [inked, c.width * c.height];
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    reason = missing_browser()
    if reason:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    with serve() as base, chrome() as driver:
        b = Browser(driver, base)
        yield b
        assert b.foreign_requests() == []


@pytest.fixture
def http(browser: Browser) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=browser.base, timeout=60) as c:
        yield c


def field_error(driver: Any, path: str) -> str:
    """The error text shown inside the form element for the API path ``path`` ('' when none)."""
    return driver.execute_script(
        "const f = document.querySelector(`#plan-form [data-path='${arguments[0]}']`);"
        "return [...f.querySelectorAll(':scope > .field-error')].map(e => e.textContent).join(' | ');", path)


# ------------------------------------------------------------------------------------------ the page

def test_the_page_loads_only_from_this_host(browser, http):
    from selenium.webdriver.common.by import By

    open_planner(browser.driver, browser.base + "/")
    d = browser.driver
    assert d.title.startswith("pdplan")
    gpus = {g["id"] for g in http.get("/v1/gpus").json()}
    assert {b.get_attribute("value") for b in d.find_elements(By.CSS_SELECTOR, "#gpu-list input")} == gpus
    models = {m["spec"]["id"] for m in http.get("/v1/models").json()}
    assert {o.get_attribute("value") for o in d.find_elements(By.CSS_SELECTOR, "#model-list option")} == models
    assert d.execute_script("return typeof Chart") == "function"  # the vendored library, from /ui/vendor/
    assert browser.foreign_requests() == []
    assert {"/", "/ui/app.js", "/ui/style.css", "/ui/vendor/chart.umd.js", "/v1/models", "/v1/gpus"} <= browser.paths
    assert browser.page_faults() == []
    page = http.get("/")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert http.get("/ui/../app.py").status_code == 404


def test_a_plan_shows_the_deployment_the_explanation_the_candidates_and_the_plots(browser, http):
    from selenium.webdriver.common.by import By

    d = plan_form(browser)
    body = {"model": "llama-3.1-70b", "gpus": ["h100-sxm", "h200-sxm"],
            "workload": {"rate": 4, "isl": {"mean": 4000, "cv": 0}, "osl": {"mean": 500, "cv": 0}, "prefix_hit": 0},
            "slo": {"ttft_s": 2, "tpot_s": 0.05, "percentile": 90, "attainment": "per_metric"},
            "objective": "gpus", "scheduler": "hybrid", "weight_dtype": "bf16", "kv_dtype": "bf16",
            "modes": ["mixed", "chunked", "disaggregated"]}
    api = http.post("/v1/plan", json=body).json()
    best = api["plan"]["best"]
    card = d.find_element(By.ID, "recommendation").text
    assert best["mode"] in card and f"{best['num_gpus']}\nGPUs" in card
    pools = ("Prefill pool", "Decode pool") if best["mode"] == "disaggregated" else ("pool",)
    assert all(p in card for p in pools)
    for pool in best["deployment"]["prefill"], best["deployment"]["decode"]:
        if pool:
            assert f"{pool['instances']} × {pool['gpu']}" in card
    shown = [p.text for p in d.find_elements(By.CSS_SELECTOR, "#explanation p")]
    assert shown == [line for line in api["explanation"].split("\n") if line]
    rows = d.find_elements(By.CSS_SELECTOR, "#candidates tbody tr")
    assert len(rows) == len(api["plan"]["candidates"])
    heads = [th.text for th in d.find_elements(By.CSS_SELECTOR, "#candidates th")]
    assert {"p90 TTFT (s)", "p90 TPOT (ms)", "$/1M tokens", "tok/s/GPU", "tok/s/user"} <= set(heads)
    figures = wait_figures(d)
    assert set(figures) == {"fig-pareto", "fig-scaling", "fig-ttft", "fig-tpot"}
    for fig in figures:
        inked, area = d.execute_script(INK_SCRIPT, fig)
        assert inked > 0.01 * area, (fig, inked, area)
        assert int(d.find_element(By.ID, fig).get_attribute("data-points")) >= 2
    query = urlsplit(d.current_url).query
    for part in ("model=llama-3.1-70b", "gpus=h100-sxm%2Ch200-sxm", "rate=4", "ttft_s=2", "tpot_ms=50"):
        assert part in query


def test_a_shared_link_fills_the_form_and_runs_the_plan(browser):
    from selenium.webdriver.common.by import By

    d = browser.driver
    query = "model=llama-3.1-8b&gpus=h100-sxm&rate=2.5&isl=1500&isl_cv=0.5&osl=300&ttft_s=1&tpot_ms=40&percentile=95"
    open_planner(d, f"{browser.base}/?{query}")
    wait_result(d)
    values = {i: d.find_element(By.ID, i).get_attribute("value") for i in ("model", "rate", "isl", "isl_cv", "tpot_ms", "percentile")}
    assert values == {"model": "llama-3.1-8b", "rate": "2.5", "isl": "1500", "isl_cv": "0.5", "tpot_ms": "40", "percentile": "95"}
    ticked = [b.get_attribute("value") for b in d.find_elements(By.CSS_SELECTOR, "#gpu-list input:checked")]
    assert ticked == ["h100-sxm"]
    assert "p95 TTFT (s)" in d.find_element(By.ID, "candidates").text
    assert "llama-3.1-8b" in d.find_element(By.ID, "recommendation").text


def test_an_engine_profile_from_a_link_is_chosen_and_sent(browser, http):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d = browser.driver
    query = "model=llama-2-70b&gpus=h100-sxm&rate=2&isl=2000&osl=200&ttft_s=1&tpot_ms=20&engine=trtllm-0.9"
    open_planner(d, f"{browser.base}/?{query}")
    wait_result(d)
    select = Select(d.find_element(By.ID, "engine"))
    assert select.first_selected_option.get_attribute("value") == "trtllm-0.9"
    from hardware_db import list_engines

    # every bundled profile is offered, in the catalogue's order
    assert [o.get_attribute("value") for o in select.options] == list_engines()
    body = {"model": "llama-2-70b", "gpus": ["h100-sxm"], "workload": {"rate": 2, "isl": 2000, "osl": 200},
            "slo": {"ttft_s": 1, "tpot_s": 0.02}, "engine": "trtllm-0.9"}
    best = {e: http.post("/v1/plan", json={**body, "engine": e}).json()["plan"]["best"] for e in ("generic", "trtllm-0.9")}
    assert best["trtllm-0.9"]["num_gpus"] != best["generic"]["num_gpus"]  # the profile changes the answer here
    assert f"{best['trtllm-0.9']['num_gpus']}\nGPUs" in d.find_element(By.ID, "recommendation").text


def test_an_slo_no_deployment_meets_offers_the_nearest_that_one_does(browser):
    from selenium.webdriver.common.by import By

    d = plan_form(browser, ttft_s="0.05", tpot_ms="5")  # under any decode step of a 70B model
    card = d.find_element(By.ID, "recommendation")
    assert card.text.startswith("No deployment meets the SLO")
    wait(d, lambda d: d.execute_script(
        "return [...document.querySelectorAll('figure.chart')].every(f => f.dataset.status === 'empty')"),
        "every figure to say it has nothing to show")
    card.find_element(By.TAG_NAME, "button").click()  # plan with the nearest feasible SLO
    wait_result(d)
    assert d.find_element(By.ID, "recommendation").text.startswith("Recommended")
    assert float(d.find_element(By.ID, "tpot_ms").get_attribute("value")) > 5


def test_an_invalid_rate_is_shown_next_to_the_rate(browser):
    d = plan_form(browser, "error", rate="-1")
    assert "greater than or equal to" in field_error(d, "workload.rate")  # the API's 422, loc workload.rate
    assert field_error(d, "slo.ttft_s") == ""
    assert "invalid" in d.find_element("css selector", "[data-path='workload.rate']").get_attribute("class")


def test_a_tpot_error_names_the_unit_the_form_uses(browser):
    d = plan_form(browser, "error", tpot_ms="90000")  # 90 s: over the API's 60 s bound
    assert "90000 ms = 90 s" in field_error(d, "slo.tpot_s")


def test_an_unknown_model_offers_the_closest_ids_and_one_click_plans_it(browser):
    from selenium.webdriver.common.by import By

    d = plan_form(browser, "error", model="llama-3.1-70")
    text = field_error(d, "model")
    assert "unknown model id 'llama-3.1-70'" in text and "Did you mean" in text
    d.find_element(By.XPATH, "//*[@data-path='model']//button[text()='llama-3.1-70b']").click()
    wait_result(d)
    assert field_error(d, "model") == ""
    assert "model=llama-3.1-70b" in d.current_url


def test_an_ambiguous_model_name_lists_the_models_it_names(browser):
    d = plan_form(browser, "error", model="llama")
    text = field_error(d, "model")
    assert "llama" in text and "llama-3.1-70b" in text and "llama-2-7b" in text


def test_an_unknown_or_ambiguous_gpu_from_a_link_is_shown_at_the_gpus(browser):
    d = browser.driver
    open_planner(d, f"{browser.base}/?model=llama-3.1-8b&gpus=h100&rate=1&isl=1000&osl=200&ttft_s=2&tpot_ms=50")
    wait_result(d, "error")
    text = field_error(d, "gpus")  # h100 names the SXM and the PCIe card: both are offered
    assert "ambiguous GPU id 'h100'" in text and "h100-sxm" in text and "h100-pcie" in text
    open_planner(d, f"{browser.base}/?model=llama-3.1-8b&gpus=h999&rate=1&isl=1000&osl=200&ttft_s=2&tpot_ms=50")
    wait_result(d, "error")
    assert "unknown GPU id 'h999'" in field_error(d, "gpus")


def test_a_pasted_config_json_is_sent_inline(browser):
    from selenium.webdriver.common.by import By

    d = browser.driver
    open_planner(d, browser.base + "/")
    d.find_element(By.CSS_SELECTOR, "input[name=model-source][value=hf]").click()
    area = d.find_element(By.ID, "hf-config")
    area.send_keys("{not json")
    fill(d, {k: v for k, v in PLAN.items() if k != "model"})
    submit(d)
    assert "not valid JSON" in field_error(d, "model.hf_config")
    config = json.loads((FIXTURES / "hf_configs" / "meta-llama--Llama-3.1-8B.json").read_text())
    d.execute_script("arguments[0].value = arguments[1]", area, json.dumps({**config, "num_hidden_layers": -3}))
    submit(d)
    wait_result(d, "error")
    assert "num_hidden_layers" in field_error(d, "model.hf_config")  # the API's 422 under model.hf_config
    d.execute_script("arguments[0].value = arguments[1]", area, json.dumps(config, indent=2))
    submit(d)
    wait_result(d)
    assert "hf=" in d.current_url
    assert "Recommended" in d.find_element(By.ID, "recommendation").text


# ------------------------------------------------------------------------------------------ API docs

@pytest.mark.parametrize("path, selector", [("/docs", ".opblock-summary-path"), ("/redoc", "[data-section-id]")])
def test_the_api_docs_render_from_this_host(browser, path, selector):
    d = browser.driver
    d.get(browser.base + path)
    shown = wait(d, lambda d: (t := d.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent).join(' ')", selector))
        and "/v1/plan" in t and t, f"{path} to list the endpoints", timeout_s=30)
    for endpoint in ("/v1/plan", "/v1/evaluate", "/v1/sweep", "/v1/models", "/v1/gpus"):
        assert endpoint in shown, (path, endpoint)
    assert browser.foreign_requests() == []
