"""Id resolution: the exact id, then any case, then the database's aliases, then a prefix that ends a
component of one entry's name; an ambiguous name lists its candidates; suggestions put shared
prefixes first. Python, the CLI and REST all go through ``hardware_db.loader``."""

import pytest
from fastapi.testclient import TestClient

import calculator as pc
from hardware_db.errors import AmbiguousIdError, HardwareDBError, UnknownIdError, closest_ids
from hardware_db.loader import database, validate_file

USER_GPU = """\
  - id: {id}
    aliases: {aliases}
    name: test GPU
    vendor: test
    architecture: test
    peak_tflops: {{bf16: 100}}
    hbm_gb: 80
    hbm_bandwidth_tb_s: 2
    scaleup_bandwidth_gb_s: 100
    scaleout_bandwidth_gb_s: 10
    tdp_w: 300
    price_usd_per_hour: 1.0
    sources: [test]
"""


def _user_file(tmp_path, *gpus: tuple[str, list[str]]):
    p = tmp_path / "hw.yaml"
    p.write_text("schema_version: 1\ngpus:\n" + "".join(USER_GPU.format(id=i, aliases=a) for i, a in gpus))
    return p


@pytest.mark.parametrize("wanted, model_id", [
    ("llama-3.1-70b", "llama-3.1-70b"),                       # the id
    ("Llama-3.1-70B", "llama-3.1-70b"),                       # the id in another case
    ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),   # a Hugging Face repo id (alias)
    ("meta-llama/Llama-3.1-70B", "llama-3.1-70b"),
    ("Llama-3.1-70B-Instruct", "llama-3.1-70b"),              # a common name (alias)
    ("META-LLAMA/LLAMA-3.1-70B-INSTRUCT", "llama-3.1-70b"),   # an alias in another case
    ("qwen3-30b", "qwen3-30b-a3b"),                           # a prefix ending at '-' of one id
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
])
def test_model_names_resolve_to_the_id(wanted, model_id):
    assert pc.load_model(wanted).id == model_id


@pytest.mark.parametrize("wanted, gpu_id", [
    ("h200-sxm", "h200-sxm"), ("H200-SXM", "h200-sxm"),
    ("h200", "h200-sxm"), ("H200", "h200-sxm"),              # the component prefix of one id
    ("h100-sxm5", "h100-sxm"), ("A100-SXM4-80GB", "a100-sxm-80gb"), ("4090", "rtx-4090"),
])
def test_gpu_names_resolve_to_the_id(wanted, gpu_id):
    assert pc.load_gpu(wanted).id == gpu_id


@pytest.mark.parametrize("wanted, candidates", [
    ("h100", ["h100-pcie", "h100-sxm"]),        # an alias both H100s carry: SXM and PCIe differ (3.35 vs 2 TB/s)
    ("H100-80GB", ["h100-pcie", "h100-sxm"]),
])
def test_an_ambiguous_gpu_name_lists_the_candidates(wanted, candidates):
    with pytest.raises(AmbiguousIdError) as info:
        pc.load_gpu(wanted)
    assert info.value.closest == candidates and isinstance(info.value, UnknownIdError)
    assert str(info.value) == f"ambiguous GPU id {wanted!r}: it names {', '.join(candidates)}; give one of these ids"


def test_an_ambiguous_prefix_lists_the_candidates():
    with pytest.raises(AmbiguousIdError) as info:
        pc.load_model("llama-3.1")
    assert info.value.closest == ["llama-3.1-405b", "llama-3.1-70b", "llama-3.1-8b"]


@pytest.mark.parametrize("wanted", ["llama-3.1-70", "h1", "h", "x"])
def test_a_prefix_inside_a_component_or_too_short_is_unknown(wanted):
    # 'llama-3.1-70' stops inside '70b', 'h1' inside 'h100': a typo, not a name; shorter than 3 never completes
    with pytest.raises(UnknownIdError) as info:
        pc.load_model(wanted) if wanted.startswith("l") else pc.load_gpu(wanted)
    assert not isinstance(info.value, AmbiguousIdError)


@pytest.mark.parametrize("wanted, first", [
    ("h200x", ["h200-sxm", "h20"]),           # the longest shared prefix first (difflib alone: h20, h800, b200)
    ("llama-3.1-70", ["llama-3.1-70b"]),
    ("h2O", ["h20", "h200-sxm"]),             # a letter O for a zero: similarity decides among equal prefixes
    ("x100-sxm", ["h100-sxm"]),               # no shared prefix: similarity alone
])
def test_suggestions_rank_shared_prefixes_first(wanted, first):
    known = sorted(database()[0]) + sorted(database()[1])
    assert closest_ids(wanted, known)[:len(first)] == first


def test_every_bundled_alias_resolves_to_its_entry():
    gpus, models = database()
    for load, entries in ((pc.load_gpu, gpus), (pc.load_model, models)):
        for entry in entries.values():
            for alias in entry.aliases:
                try:
                    assert load(alias).id == entry.id
                except AmbiguousIdError as e:  # an alias two entries share names both
                    assert entry.id in e.closest and len(e.closest) > 1


def test_every_hugging_face_repo_is_an_alias():
    for m in database()[1].values():
        if m.hf_repo is not None:
            assert pc.load_model(m.hf_repo).id == m.id, m.hf_repo


def test_an_alias_equal_to_another_id_is_refused(tmp_path):
    p = _user_file(tmp_path, ("my-gpu", ["h20"]))
    with pytest.raises(HardwareDBError, match=r"gpus \(id 'my-gpu'\) field aliases: 'h20' is the id of another entry"):
        pc.load_gpu("my-gpu", path=p)
    with pytest.raises(HardwareDBError, match=str(p)):
        validate_file(_user_file(tmp_path, ("my-gpu", ["other"]), ("other", [])))


def test_an_alias_given_twice_is_refused(tmp_path):
    p = _user_file(tmp_path, ("my-gpu", ["Mine", "mine"]))
    with pytest.raises(HardwareDBError, match=r"field aliases: 'mine' is given twice"):
        validate_file(p)


def test_a_bad_alias_is_a_schema_error(tmp_path):
    with pytest.raises(HardwareDBError, match=r"gpus\[0\] \(id 'my-gpu'\) field aliases.0: String should match"):
        validate_file(_user_file(tmp_path, ("my-gpu", ["my gpu"])))


def test_a_users_alias_shared_with_a_bundled_one_is_ambiguous_and_a_users_id_wins(tmp_path):
    p = _user_file(tmp_path, ("site-h200", ["h200-141gb"]), ("h100", []))
    with pytest.raises(AmbiguousIdError, match="it names h200-sxm, site-h200"):
        pc.load_gpu("h200-141gb", path=p)
    assert pc.load_gpu("h100", path=p).id == "h100"   # a user's id beats the bundled alias 'h100'
    assert pc.load_gpu("h100-sxm5", path=p).id == "h100-sxm"


def test_python_and_rest_take_aliases():
    e = pc.estimate("meta-llama/Llama-3.1-70B-Instruct", "H200", tp=4, isl=4000, osl=500)
    assert (e.model, e.gpu) == ("llama-3.1-70b", "h200-sxm")
    p = pc.plan("Llama-3.1-8B-Instruct", workload=pc.Workload(rate=1, isl=500, osl=100),
                slo=pc.SLO(ttft_s=2, tpot_s=0.05), gpus=["h200"], modes="mixed")
    assert p.model == "llama-3.1-8b" and p.best.deployment.pool.gpu == "h200-sxm"
    from api import app

    client = TestClient(app)
    assert client.get("/v1/gpus/H200").json()["id"] == "h200-sxm"
    r = client.post("/v1/estimate", json={"model": "meta-llama/Llama-3.1-70B-Instruct", "gpu": "h200", "tp": 4})
    assert r.status_code == 200 and r.json()["estimate"]["model"] == "llama-3.1-70b"
    r = client.get("/v1/gpus/h100")
    assert r.status_code == 404 and r.json()["closest"] == ["h100-pcie", "h100-sxm"]
