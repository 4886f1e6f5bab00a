"""The hardware database is parsed with libyaml's C loader when PyYAML has it, to the same data."""

import pytest
import yaml

from hardware_db import loader


def test_the_c_loader_is_used_when_built():
    assert loader._YAML_LOADER is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")
@pytest.mark.parametrize("path", [loader.GPU_FILE, loader.MODEL_FILE], ids=lambda p: p.name)
def test_c_and_python_loaders_read_the_bundled_files_alike(path):
    text = path.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.load(text, Loader=yaml.SafeLoader)


def test_unsafe_tags_are_refused(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("schema_version: !!python/object/apply:os.system ['true']\n", encoding="utf-8")
    with pytest.raises(loader.HardwareDBError, match="not valid YAML"):
        loader._read(p)
