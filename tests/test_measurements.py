"""The bundled defaults against published TensorRT-LLM measurements (fit: bench/fit_defaults.py).

Bounds are the errors measured when the defaults were fitted, rounded up; a change to the model
that makes any GPU's fit worse fails here. Figures are also in the README.
"""

import statistics

import pytest

from calculator.measurements import load_measurements, predict

# gpu: (records, median |predicted/measured - 1| bound, max bound)
BOUNDS = {
    "h100-sxm": (21, 0.08, 0.55),
    "h200-sxm": (22, 0.08, 0.35),
    "b200": (5, 0.12, 0.16),
    "gb200": (1, 0.10, 0.10),
    "a100-sxm-80gb": (2, 0.25, 0.40),
}


@pytest.fixture(scope="module")
def errors():
    out: dict[str, list[float]] = {}
    for m in load_measurements():
        if m.id.startswith("trtllm-v0.6"):  # 2023 static-batching engine, reported in the README, not fitted
            continue
        out.setdefault(m.gpu, []).append(abs(predict(m) / m.value - 1))
    return out


@pytest.mark.parametrize("gpu", sorted(BOUNDS))
def test_error_per_gpu_within_the_fitted_bounds(errors, gpu):
    n, median_bound, max_bound = BOUNDS[gpu]
    assert len(errors[gpu]) == n
    assert statistics.median(errors[gpu]) <= median_bound
    assert max(errors[gpu]) <= max_bound


def test_saturated_8b_on_h200_by_the_numbers():
    """Llama-3.1-8B fp8 on one H200, 128/128: measured 27,911 output tok/s; we are within 15%."""
    m = next(x for x in load_measurements() if x.id == "trtllm-v1.0-llama3.1-8b-fp8-h200-tp1-128-128")
    assert predict(m) == pytest.approx(27_911, rel=0.15)
