"""The generated numeric formulas (calculator/formulas.py) are exactly what the sympy source generates,
evaluate like lambdify of the same expressions, and keep sympy out of the calculator's imports."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

from calculator import formulas as f
from calculator import formulas_codegen as codegen
from calculator import formulas_sympy as source

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def test_committed_module_is_what_the_source_generates():
    committed = codegen.TARGET.read_text(encoding="utf-8")
    assert codegen.render() == committed, (
        "calculator/formulas.py differs from what calculator/formulas_sympy.py generates with the installed "
        f"sympy {sp.__version__}: run `python -m calculator.formulas_codegen` and commit both files"
    )


def test_generation_does_not_depend_on_the_hash_seed():
    # a fresh process with another str hash: set iteration order must not reach the output
    done = subprocess.run([sys.executable, "-m", "calculator.formulas_codegen", "--check"], check=False, cwd=ROOT,
                          env=_env(PYTHONHASHSEED="12345"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_metadata_matches_the_source():
    assert list(f.FORMULAS) == list(source.FORMULAS)
    for name, d in source.FORMULAS.items():
        g = f.FORMULAS[name]
        assert getattr(f, name) is g
        assert (g.args, g.unit, g.doc) == (d.args, d.unit, d.doc)
        assert g.latex == sp.latex(d.expr)
        assert g.expr is d.expr
        assert g.symbols == [(sp.latex(source.SYMBOLS[a][0]), *source.SYMBOLS[a][1:]) for a in g.args]
    assert f.SYMBOLS is source.SYMBOLS


def _inputs(args: tuple[str, ...], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per argument an array mixing zeros, ones, small integers, fractions and large values; every
    other argument is a column, so the call also broadcasts (n,) against (n, 1)."""
    n = 24
    values = {}
    for i, a in enumerate(args):
        v = np.concatenate([[0.0, 0.0, 1.0, 1.0], rng.integers(0, 9, 8).astype(float),
                            rng.uniform(0, 1, 8), rng.uniform(1, 1e6, n - 20)])
        rng.shuffle(v)
        values[a] = v.reshape(-1, 1) if i % 2 else v
    return values


@pytest.mark.parametrize("name", list(source.FORMULAS))
def test_generated_function_equals_lambdify(name):
    d = source.FORMULAS[name]
    reference = sp.lambdify([source.SYMBOLS[a][0] for a in d.args], d.expr, modules="numpy")
    rng = np.random.default_rng(sum(map(ord, name)))
    for _ in range(3):
        values = _inputs(d.args, rng)
        with np.errstate(all="ignore"):
            got = f.FORMULAS[name](values)
            want = reference(*(values[a] for a in d.args))
        assert np.shape(got) == np.shape(want)
        # same expression, same numpy calls; only the order of commutative terms may differ
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, equal_nan=True)
    # scalars: numpy zeros (0/0 is nan, x/0 inf), and Python ints, whose type must survive too
    for scalars in ({a: np.float64(0) for a in d.args}, {a: int(rng.integers(0, 4)) for a in d.args}):
        with np.errstate(all="ignore"):
            try:
                want = reference(*(scalars[a] for a in d.args))
            except ZeroDivisionError:
                with pytest.raises(ZeroDivisionError):
                    f.FORMULAS[name](scalars)
                continue
            got = f.FORMULAS[name](scalars)
        assert type(got) is type(want)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, equal_nan=True)


def test_the_keyword_symbol_gets_a_legal_parameter():
    assert codegen.parameter_name("lambda") == "lambda_"
    assert codegen.parameter_name("numpy") == "numpy_"  # would shadow the module the code calls
    assert codegen.parameter_name("E[S]") == "E_S__"
    assert f.littles_law_batch(TPOT=0.05, n_out=100, **{"lambda": 2.0}) == pytest.approx(10.0)


def test_calculator_runs_without_importing_sympy():
    code = (
        "import sys, calculator, calculator.service\n"
        "e = calculator.estimate(calculator.load_model('llama-3.1-70b'), calculator.load_gpu('h200-sxm'), tp=4)\n"
        "assert e.max_batch > 0\n"
        "assert calculator.FORMULAS['mixed_tpot'].latex\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'sympy' or m.startswith('numpy.f2py'))\n"
        "print(bad)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_repeated_atoms_are_computed_once_and_only_whole():
    """``hoist`` names a call or parenthesised group that the printed code repeats, computes it first (after the
    names it uses) and leaves the rest of the expression as printed; a call's argument list is not a group."""
    shared, code = codegen.hoist("numpy.log(a + b)*(a + b) + numpy.log(a + b)", {"a", "b"})
    assert shared == [("_s0", "numpy.log(a + b)")] and code == "_s0*(a + b) + _s0"
    shared, code = codegen.hoist("numpy.exp((x + 1)) + (x + 1)*numpy.exp((x + 1))", {"x"})
    assert shared == [("_s1", "(x + 1)"), ("_s0", "numpy.exp(_s1)")] and code == "_s0 + _s1*_s0"
    # the sliding-window attention FLOPs take max(0, min(W, P + S) - P) once, not four times
    source_text = Path(codegen.TARGET).read_text(encoding="utf-8")
    body = source_text.split("def _attention_flops(")[1].split("\n\n")[0]
    assert body.count("functools.reduce(numpy.maximum") == 1
