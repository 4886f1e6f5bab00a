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
