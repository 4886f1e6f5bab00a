from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_REFERENCE = REPO.parent / "shared" / "reference"
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def reference_catalog():
    """The project's reference model catalog (shared/ beside the checkout), when present."""
    import yaml

    path = SHARED_REFERENCE / "model_catalog.yaml"
    if not path.is_file():
        pytest.skip("shared/reference/model_catalog.yaml is not beside this checkout")
    return {r["name"]: r for r in yaml.safe_load(path.read_text())["models"]}


def engine_python(variable: str = "PDPLAN_ENGINE_PYTHON", venv: str = ".engine-venv") -> str | None:
    """The Python that has vLLM's CPU build: ``$PDPLAN_ENGINE_PYTHON``, else the checkout's ``.engine-venv``
    (SGLang's: ``engine_python("PDPLAN_SGLANG_PYTHON", ".sglang-venv")``)."""
    import os

    given = os.environ.get(variable)
    if given:
        return given
    local = Path(__file__).resolve().parents[1] / venv / "bin" / "python"
    return str(local) if local.exists() else None
