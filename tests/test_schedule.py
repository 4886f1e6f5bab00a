"""A day of traffic windows planned on fixed GPU types: disaggregated pools scaled independently, colocated
autoscaling, and the static peak deployment."""

from __future__ import annotations

import pytest

import calculator as pc
from calculator.errors import InputError
from calculator.schedule import Window, plan_schedule

SLO = pc.SLO(ttft_s=2.0, tpot_s=0.05)
DAY = [  # long documents in the morning, long answers in the afternoon, a quiet night
    Window(label="morning: documents", duration_s=6 * 3600, workload=pc.Workload(rate=6, isl=12000, osl=200)),
    Window(label="midday: mixed", duration_s=6 * 3600, workload=pc.Workload(rate=8, isl=3000, osl=600)),
    Window(label="afternoon: answers", duration_s=6 * 3600, workload=pc.Workload(rate=8, isl=800, osl=1500)),
    Window(label="night: quiet", duration_s=6 * 3600, workload=pc.Workload(rate=0.3, isl=2000, osl=300)),
]


@pytest.fixture(scope="module")
def day() -> pc.Schedule:
    return plan_schedule("llama-3.1-70b", DAY, SLO, gpus=["h100-sxm"], weight_dtype="fp8")


def test_disaggregated_pools_scale_independently(day) -> None:
    dis = day.strategy("disaggregated")
    by = {w.label: w for w in dis.windows}
    morning, afternoon = by["morning: documents"], by["afternoon: answers"]
    # more prefill for long documents; the decode pool does not follow (it holds the KV of long documents too):
    # prefill per decode instance changes severalfold over the day, one layout all day
    assert morning.prefill_instances > afternoon.prefill_instances
    assert afternoon.decode_instances >= morning.decode_instances
    assert (morning.prefill_instances / morning.decode_instances) > 3 * (afternoon.prefill_instances
                                                                         / afternoon.decode_instances)
    assert dis.scale_events >= 2 and len({w.deployment.model_copy(update={
        "prefill": w.deployment.prefill.model_copy(update={"instances": 1, "max_batch": 1}),
        "decode": w.deployment.decode.model_copy(update={"instances": 1, "max_batch": 1})}).model_dump_json()
        for w in dis.windows}) == 1


def test_autoscaling_saves_against_the_static_peak(day) -> None:
    static = day.strategy("static")
    assert len({w.num_gpus for w in static.windows}) == 1 and static.scale_events == 0
    for name in ("disaggregated", "colocated"):
        s = day.strategy(name)
        assert s.gpu_hours < static.gpu_hours
        assert day.savings_vs_static[name] == pytest.approx(1 - s.gpu_hours / static.gpu_hours)
        # a strategy never beats the best deployment of each window alone
        assert all(w.num_gpus >= w.best_possible_gpus for w in s.windows)
    assert sum(w.gpu_hours for w in static.windows) == pytest.approx(static.gpu_hours)


def test_disaggregation_loses_at_low_load(day) -> None:
    dis = day.strategy("disaggregated")
    night = next(w for w in dis.windows if w.label == "night: quiet")
    # two pools of whole instances against the one instance colocation needs at 0.3 req/s
    assert night.num_gpus > night.best_possible_gpus
    assert day.low_load_loss["night: quiet"] == pytest.approx(night.num_gpus / night.best_possible_gpus - 1)
    assert "morning: documents" not in day.low_load_loss


def test_the_static_deployment_meets_every_window(day) -> None:
    static = day.strategy("static").windows[0].deployment
    for w in DAY:
        assert pc.evaluate("llama-3.1-70b", static, w.workload, SLO).goodput_rps >= w.workload.rate * 0.999


def test_bad_profiles_are_clear() -> None:
    with pytest.raises(InputError, match="profile"):
        plan_schedule("llama-3.1-8b", [], SLO, gpus=["h100-sxm"])
    with pytest.raises(InputError) as e:
        plan_schedule("llama-3.1-8b", [{"duration_s": -1, "workload": {"rate": 1, "isl": 100, "osl": 10}}], SLO,
                      gpus=["h100-sxm"])
    assert "profile.0" in str(e.value)
    with pytest.raises(InputError, match="compares the modes itself"):
        plan_schedule("llama-3.1-8b", DAY[:1], SLO, gpus=["h100-sxm"], modes=["mixed"])


def test_cli_and_rest(tmp_path) -> None:
    import json

    import yaml
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from api.app import app as api
    from calculator.cli import app

    profile = [{"label": w.label, "duration_s": w.duration_s, "workload": w.workload.model_dump()} for w in DAY]
    f = tmp_path / "day.yaml"
    f.write_text(yaml.safe_dump(profile))
    r = CliRunner().invoke(app, ["schedule", str(f), "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--ttft", "2s",
                                 "--tpot", "50ms", "--weight-dtype", "fp8", "--json"])
    assert r.exit_code == 0, r.output
    cli = json.loads(r.output)
    body = TestClient(api).post("/v1/schedule", json={"model": "llama-3.1-70b", "profile": profile, "gpus": ["h100-sxm"],
                                                      "slo": {"ttft_s": 2, "tpot_s": 0.05}, "weight_dtype": "fp8"})
    assert body.status_code == 200, body.text
    assert body.json()["savings_vs_static"] == pytest.approx(cli["savings_vs_static"])
    table = CliRunner().invoke(app, ["schedule", str(f), "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--ttft", "2s",
                                     "--tpot", "50ms", "--weight-dtype", "fp8"])
    assert table.exit_code == 0 and "saved vs static" in table.output and "more GPUs" in table.output
    bad = TestClient(api).post("/v1/schedule", json={"model": "llama-3.1-8b", "profile": [], "gpus": ["h100-sxm"],
                                                     "slo": {"ttft_s": 2, "tpot_s": 0.05}})
    assert bad.status_code == 422
