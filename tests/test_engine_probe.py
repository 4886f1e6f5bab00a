"""``bench/engine_probe.py``'s reading of engine steps from a token stream (the engine itself is exercised
by tests/test_engine_serving.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from engine_probe import role, steps_of

from calculator.enginebench.client import RequestRecord


def test_steps_are_read_from_tokens_that_arrive_together():
    """Two decodes step every 10 ms; a prompt's 200 ms step ends at 0.23 s with its first token, the
    decodes' tokens of that step arrive up to 1 ms apart (the API server streams them one by one). A
    last prompt arrives at 0.50 s to an idle engine and gets its first token at 0.52 s: a 20 ms step
    after 260 ms of idling, not a 280 ms step."""
    a = RequestRecord(0, 512, 5, 0.0, token_s=[0.010, 0.020, 0.030, 0.2305, 0.240])
    b = RequestRecord(1, 512, 5, 0.0, token_s=[0.0102, 0.0201, 0.0304, 0.2300, 0.2402])
    c = RequestRecord(2, 512, 2, 0.025, token_s=[0.2310, 0.2401])  # its prompt ran in the long step
    d = RequestRecord(3, 512, 1, 0.50, token_s=[0.52])
    s = steps_of([a, b, c, d])
    assert s["end"] == pytest.approx([0.0201, 0.0304, 0.2310, 0.2402, 0.52])
    assert s["duration"] == pytest.approx([0.0099, 0.0103, 0.2006, 0.0092, 0.02])
    assert s["idle"] == pytest.approx([0, 0, 0, 0, 0.2598])
    assert list(s["tokens"]) == [2, 2, 3, 3, 1]
    assert list(s["prompts"]) == [0, 0, 1, 0, 1]


def test_processes_are_named_by_role_without_their_paths():
    import os

    assert role(str(os.getpid()), "/some/where/python bench/engine_probe.py") == "client (this probe)"
    assert role("1", "VLLM::EngineCore") == "engine core"
    assert role("2", "/venv/bin/python -m vllm.entrypoints.openai.api_server --model /x") == "API server"
    assert role("3", "/usr/bin/top -b") == "other (top)"


RECORDS = Path(__file__).resolve().parents[1] / "docs" / "validation" / "engine-probe-bf16-2026-12-05"


def test_loaded_steps_scale_each_kind_of_step():
    """The simulation at the load point's step costs: steps with prompts by one factor, decode-only steps by
    another; everything else is the fitted pool model's."""
    from engine_probe import LoadedSteps

    from calculator import load_gpu
    from calculator.enginebench.model import ENGINE_MODEL
    from calculator.serving import Pool, Workload
    from calculator.serving.base import PoolModel

    gpu = load_gpu("h100-sxm")
    pm = PoolModel.build(ENGINE_MODEL, Pool(gpu="h100-sxm"), Workload(rate=1.0, isl=512, osl=64), gpu)
    ls = LoadedSteps(pm, 0.9, 1.5)
    assert float(ls.decode_s(8, 600.0)) == pytest.approx(1.5 * float(pm.decode_s(8, 600.0)), rel=1e-12)
    assert float(ls.step_s(8, 600.0, 512, 0.0, 1)) == pytest.approx(0.9 * float(pm.step_s(8, 600.0, 512, 0.0, 1)),
                                                                     rel=1e-12)
    assert float(ls.prefill_s(512, 0.0, 1)) == pytest.approx(0.9 * float(pm.prefill_s(512, 0.0, 1)), rel=1e-12)
    assert ls.batch_cap == pm.batch_cap and ls.kv_budget_bytes == pm.kv_budget_bytes


@pytest.mark.parametrize("name", ["rate5.0.json", "rate6.5-start1.json", "rate6.5-start2.json"])
def test_committed_probe_records_are_this_versions_prediction(name, tmp_path):
    """Each bf16 probe record (vLLM 0.32 CPU, chunking off, 200 requests) predicted again from its recorded
    ceilings and fit equals what it holds, and what it found holds: the requests arrived 15% faster than
    offered (the probe's seeded draws), and with the steps at the cost the engine ran them under load the
    simulation's TPOT p50 is within 10% of the measured one, where the unloaded fit's closed form is off by up to
    half (start 1's decode-only steps ran at 1.76x their calibration)."""
    import json
    import shutil

    from engine_probe import reanalyse

    shutil.copy(RECORDS / name, tmp_path / name)
    reanalyse(tmp_path / name)
    stored, again = (json.loads(p.read_text()) for p in (RECORDS / name, tmp_path / name))
    for key in ("closed_form", "simulation", "simulation_at_loaded_steps"):
        for k, v in stored[key].items():
            assert again[key][k] == (pytest.approx(v, rel=1e-9) if isinstance(v, float) else v), (key, k)
    assert stored["arrival_rate_rps"] / stored["rate_rps"] == pytest.approx(1.152, abs=0.002)
    measured, loaded = stored["measured"]["tpot_p50_ms"], stored["simulation_at_loaded_steps"]["tpot_p50_ms"]
    assert abs(loaded / measured - 1) < 0.10
    if name == "rate6.5-start1.json":
        assert stored["simulation_at_loaded_steps"]["decode_step_scale"] == pytest.approx(1.76, abs=0.01)
        assert stored["closed_form"]["tpot_p50_ms"] / measured - 1 == pytest.approx(-0.52, abs=0.01)
