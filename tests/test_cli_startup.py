"""``pdplan --help`` and ``--version`` start without the service, pydantic, numpy or the formulas;
the lazy ``calculator`` package still offers every public name; the exit statuses are documented."""

import importlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

import calculator as pc
from calculator import cli

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("calculator.service", "calculator.formulas", "calculator.estimate", "hardware_db", "pydantic", "numpy",
         "sympy", "yaml")
runner = CliRunner()


def _python(code: str) -> str:
    """stdout of ``code`` in a fresh interpreter that imports this checkout."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _loaded_after(statement: str) -> list[str]:
    out = _python(f"import sys, json\n{statement}\nprint(json.dumps(sorted(set(m.split('.')[0] "
                  f"if m.split('.')[0] != 'calculator' else m for m in sys.modules))))")
    return [m for m in json.loads(out.splitlines()[-1]) if m in HEAVY]


def test_importing_the_cli_loads_nothing_heavy():
    assert _loaded_after("import calculator.cli") == []


@pytest.mark.parametrize("args, allowed", [
    (["--help"], []),
    (["--version"], []),
    (["estimate", "--help"], ["pydantic"]),  # recent typer converts option values with pydantic itself
])
def test_help_and_version_load_nothing_heavy(args, allowed):
    statement = (f"from calculator.cli import main\nimport contextlib, io\n"
                 f"with contextlib.redirect_stdout(io.StringIO()):\n    assert main({args!r}) == 0")
    assert [m for m in _loaded_after(statement) if m not in allowed] == []


def test_a_command_does_load_the_service():
    assert "calculator.service" in _loaded_after("from calculator.cli import main\nmain(['gpus', '--json'])")


def test_version_is_the_installed_one():
    r = runner.invoke(cli.app, ["--version"])
    assert r.exit_code == 0 and r.stdout == f"pdplan {metadata.version('pdplan')}\n"


def test_version_without_package_metadata(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    r = runner.invoke(cli.app, ["--version"])
    assert r.exit_code == 0 and r.stdout == "pdplan 0+unknown\n"


def test_no_command_prints_the_help_and_exits_2():
    r = runner.invoke(cli.app, [])
    assert r.exit_code == 2 and "Usage:" in r.stdout and r.stderr == ""


# ------------------------------------------------------------------------------------- the package


def test_every_public_name_resolves_from_its_module():
    assert sorted(pc.__all__) == sorted(pc._SOURCES)
    for name in pc.__all__:
        source = importlib.import_module(pc._SOURCES[name], "calculator")
        assert getattr(pc, name) is getattr(source, name), name
    assert set(pc.__all__) <= set(dir(pc))
    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):
        pc.nonexistent  # noqa: B018


def test_the_estimate_function_survives_importing_its_module():
    # the import system binds a submodule on its package; calculator.estimate must stay the function
    out = _python("import calculator.service, calculator.estimate, calculator as pc\n"
                  "from calculator import estimate, plan\n"
                  "print(pc.estimate.__name__, callable(pc.estimate), estimate is pc.estimate, plan.__name__)\n"
                  "print(pc.InputError('isl', 'too long'), len(pc.FORMULAS) > 0)")
    assert out.splitlines() == ["estimate True True plan", "isl: too long True"]


def test_star_import_gives_the_public_names():
    out = _python("from calculator import *\nprint(estimate.__name__, Workload.__name__, InputError.__name__)")
    assert out.strip() == "estimate Workload InputError"


# ------------------------------------------------------------------------------------ documentation


def test_help_lists_every_exit_status():
    text = " ".join(runner.invoke(cli.app, ["--help"]).stdout.split())
    for code, short, _ in cli.EXIT_CODES:
        assert f"{code} {short}" in text
    assert [c for c, _, _ in cli.EXIT_CODES] == [0, 1, 2, 3, 4, 5, 6, 70, 130, 141]


def test_the_reference_page_has_the_exit_status_table():
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert cli.exit_codes_markdown() in page  # python -c "from calculator.cli import exit_codes_markdown as m; print(m())"
    assert "reference/cli.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
