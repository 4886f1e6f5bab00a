"""model_from_hf_config on verbatim config.json files (tests/fixtures/hf_configs/SOURCES.md)."""

import json

import pytest

import calculator as pc
from conftest import FIXTURES
from calculator.params import active_param_count, param_count

CONFIGS = FIXTURES / "hf_configs"
ROUND_TRIP = {
    "meta-llama--Llama-3.1-8B": "llama-3.1-8b", "meta-llama--Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "mistralai--Mistral-7B-v0.1": "mistral-7b", "mistralai--Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "Qwen--Qwen2.5-7B": "qwen2.5-7b", "Qwen--Qwen3-8B": "qwen3-8b", "Qwen--Qwen3-32B": "qwen3-32b",
    "Qwen--Qwen3-30B-A3B": "qwen3-30b-a3b", "deepseek-ai--DeepSeek-R1": "deepseek-v3",
    "openai--gpt-oss-120b": "gpt-oss-120b", "google--gemma-3-27b-it": "gemma-3-27b",
}
SHAPE = ["num_layers", "hidden_size", "vocab_size", "tie_word_embeddings", "num_attention_heads", "num_kv_heads",
         "head_dim", "mla", "moe", "qkv_bias", "o_bias", "qk_norm", "attention_sinks", "sliding_window",
         "num_sliding_layers", "norms_per_layer", "gated_mlp"]


@pytest.mark.parametrize("stem, model_id", sorted(ROUND_TRIP.items()))
def test_config_gives_the_catalog_architecture(stem, model_id):
    ours = pc.model_from_hf_config(CONFIGS / f"{stem}.json")
    ref = pc.load_model(model_id)
    assert {k: getattr(ours, k) for k in SHAPE} == {k: getattr(ref, k) for k in SHAPE}
    assert param_count(ours) == param_count(ref)
    assert active_param_count(ours) == active_param_count(ref)


def test_dict_input_and_custom_id():
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B.json").read_text())
    m = pc.model_from_hf_config(cfg, model_id="My Llama")
    assert m.id == "my-llama" and param_count(m) == 8_030_261_248


def test_unsupported_family_names_the_supported_ones():
    with pytest.raises(ValueError, match="model_type 'phi' is not supported; supported: llama, mistral"):
        pc.model_from_hf_config(CONFIGS / "unsupported--microsoft--phi-1.json")


@pytest.mark.parametrize("cfg, field", [
    ({"model_type": "llama"}, "num_hidden_layers"),
    ({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": -4, "num_attention_heads": 2,
      "intermediate_size": 8, "vocab_size": 10}, "hidden_size"),
    ({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 6,
      "num_key_value_heads": 4, "intermediate_size": 8, "vocab_size": 10},
     "num_attention_heads: must be a multiple of num_key_value_heads"),
])
def test_bad_configs_name_the_field(cfg, field):
    with pytest.raises(ValueError, match=field):
        pc.model_from_hf_config(cfg)


def test_not_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        pc.model_from_hf_config(tmp_path)


def test_block_scaled_fp8_checkpoints_carry_their_block_size():
    """DeepSeek-R1's config.json quantises its weights to fp8 in 128 x 128 blocks; the catalog says the same,
    and a dense bf16 config has no block scales."""
    ds = pc.model_from_hf_config(CONFIGS / "deepseek-ai--DeepSeek-R1.json")
    assert ds.checkpoint_dtype == "fp8" and ds.weight_block_size == (128, 128)
    assert pc.load_model("deepseek-v3").weight_block_size == (128, 128)
    assert pc.model_from_hf_config(CONFIGS / "meta-llama--Llama-3.1-8B.json").weight_block_size is None
    # only fp8 block scales are read; a block size must be two positive integers
    cfg = json.loads((CONFIGS / "deepseek-ai--DeepSeek-R1.json").read_text())
    awq = {**cfg, "quantization_config": {**cfg["quantization_config"], "quant_method": "awq"}}
    assert pc.model_from_hf_config(awq).weight_block_size is None
    for bad in ([True, True], [0, 128], ["128", "128"]):
        with pytest.raises(ValueError, match="weight_block_size"):
            type(ds).model_validate({**ds.model_dump(), "weight_block_size": bad})


def test_multi_token_prediction_layers_are_read_from_the_config():
    """DeepSeek-R1's config.json carries one multi-token-prediction layer (num_nextn_predict_layers 1), as the
    catalog's DeepSeek-V3 does; Kimi-K2 (same architecture) and dense models carry none, and speculative decoding
    of kind mtp on them is refused, naming spec.kind (vLLM would find no MTP weights to load)."""
    assert pc.model_from_hf_config(CONFIGS / "deepseek-ai--DeepSeek-R1.json").mtp_layers == 1
    assert pc.load_model("deepseek-v3").mtp_layers == 1 and pc.load_model("kimi-k2").mtp_layers == 0
    assert pc.model_from_hf_config(CONFIGS / "meta-llama--Llama-3.1-8B.json").mtp_layers == 0
    cfg = json.loads((CONFIGS / "deepseek-ai--DeepSeek-R1.json").read_text())
    with pytest.raises(pc.InputError, match="num_nextn_predict_layers"):
        pc.model_from_hf_config({**cfg, "num_nextn_predict_layers": -1})
    mtp = {"kind": "mtp", "tokens": 1, "acceptance": 0.85}
    with pytest.raises(pc.InputError, match=r"spec\.kind: llama-3\.1-70b has no multi-token-prediction layer"):
        pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, spec=mtp)
    with pytest.raises(pc.InputError, match=r"spec\.kind"):
        pc.plan("kimi-k2", {"rate": 4, "isl": 1000, "osl": 200}, {"ttft_s": 2, "tpot_s": 0.05}, gpus=["b200"],
                weight_dtype="fp8", spec=mtp)
    assert pc.estimate("deepseek-v3", "h200-sxm", tp=8, weight_dtype="fp8", spec=mtp).spec_tokens_per_step > 1
