"""The YAML database: coverage, sources, user overrides and errors that name file, entry and field."""

import textwrap

import pytest

import calculator as pc
from hardware_db import ENV_VAR, HardwareDBError, validate_file

REQUIRED_GPUS = {"a100-sxm-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "h20", "h800", "l40s", "l4", "b200", "gb200",
                 "mi300x", "mi325x", "gaudi3", "ascend-910b", "rtx-4090"}


def test_required_gpus_with_sources_and_prices():
    assert REQUIRED_GPUS <= set(pc.list_gpus())
    for gpu_id in pc.list_gpus():
        g = pc.load_gpu(gpu_id)
        assert g.sources and g.price_usd_per_hour > 0
        assert g.price_is_assumption or g.price_note
        assert 0 < g.efficiency.compute <= 1 and 0 < g.efficiency.memory <= 1


def test_dense_not_sparse_peaks():
    # H100 SXM: 989.4 dense bf16 (1979 is the 2:4-sparse datasheet headline); H20 is compute-starved
    assert pc.load_gpu("h100-sxm").peak_flops_per_s("bf16") == pytest.approx(989.4e12)
    assert pc.load_gpu("h20").peak_flops_per_s("bf16") < 0.2 * pc.load_gpu("h100-sxm").peak_flops_per_s("bf16")
    # A100 has no fp8: fp8 GEMMs fall back to the bf16 rate
    assert pc.load_gpu("a100-sxm-80gb").peak_flops_per_s("fp8") == pytest.approx(312e12)


def test_every_model_has_sources():
    for model_id in pc.list_models():
        assert pc.load_model(model_id).sources


def _write(tmp_path, text):
    p = tmp_path / "mine.yaml"
    p.write_text(textwrap.dedent(text))
    return p


CUSTOM = """
schema_version: 1
gpus:
- id: my-gpu
  name: My accelerator
  vendor: Me
  architecture: X
  peak_tflops: {bf16: 500}
  hbm_gb: 100
  hbm_bandwidth_tb_s: 2.0
  scaleup_bandwidth_gb_s: 100
  scaleout_bandwidth_gb_s: 25
  tdp_w: 500
  price_usd_per_hour: 1.0
  price_is_assumption: true
  sources: [my lab]
- id: h100-sxm
  name: overridden H100
  vendor: NVIDIA
  architecture: Hopper
  peak_tflops: {bf16: 1.0}
  hbm_gb: 80
  hbm_bandwidth_tb_s: 3.35
  scaleup_bandwidth_gb_s: 450
  scaleout_bandwidth_gb_s: 50
  tdp_w: 700
  price_usd_per_hour: 3.0
  sources: [test]
"""


def test_user_file_adds_and_overrides_by_argument_and_env(tmp_path, monkeypatch):
    p = _write(tmp_path, CUSTOM)
    assert pc.load_gpu("my-gpu", path=p).hbm_gb == 100
    assert pc.load_gpu("h100-sxm", path=p).name == "overridden H100"
    assert pc.load_gpu("h100-sxm").name != "overridden H100"
    monkeypatch.setenv(ENV_VAR, str(p))
    assert "my-gpu" in pc.list_gpus()
    e = pc.estimate("llama-3.1-8b", "my-gpu", isl=100, osl=10)
    assert e.fits and e.gpu == "my-gpu"


@pytest.mark.parametrize("mutation, expected", [
    (("hbm_gb: 100", "hbm_gb: -5"), r"gpus\[0\] \(id 'my-gpu'\) field hbm_gb: Input should be greater than or equal to 0.01"),
    (("peak_tflops: {bf16: 500}", "peak_tflops: {bf16: fast}"), r"gpus\[0\] \(id 'my-gpu'\) field peak_tflops.bf16"),
    (("  tdp_w: 500\n", "  tdp_w: 500\n  colour: red\n"), r"field colour: Extra inputs are not permitted"),
    (("- id: my-gpu", "- id: My GPU!"), r"field id: String should match pattern"),
    (("schema_version: 1", "schema_version: 7"), r"field schema_version"),
])
def test_bad_yaml_errors_name_file_entry_and_field(tmp_path, mutation, expected):
    p = _write(tmp_path, CUSTOM.replace(*mutation))
    with pytest.raises(HardwareDBError, match=expected) as info:
        validate_file(p)
    assert str(p) in str(info.value)


def test_unparseable_and_missing_files(tmp_path, monkeypatch):
    p = _write(tmp_path, "gpus: [unclosed")
    with pytest.raises(HardwareDBError, match="not valid YAML"):
        validate_file(p)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nope.yaml"))
    with pytest.raises(HardwareDBError, match="does not exist"):
        pc.list_gpus()
