"""``Formula``: one closed-form expression as the calculator evaluates it, without sympy.

The instances live in ``calculator/formulas.py``, generated from the sympy source
``calculator/formulas_sympy.py``. Each carries its numpy function and the LaTeX, unit and doc
printed from the sympy expression ahead of time; the expression itself is imported on demand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import sympy as sp


_QUIET: ContextVar[bool] = ContextVar("pdplan_formulas_quiet", default=False)


@contextmanager
def quiet() -> Iterator[None]:
    """A block in which numpy's divide-by-zero and invalid-value warnings are off once for all the
    formulas evaluated in it, instead of once per call (a plan evaluates thousands; entering
    ``np.errstate`` is half of a small formula's cost). Formulas called outside one quiet themselves."""
    token = _QUIET.set(True)
    try:
        with np.errstate(divide="ignore", invalid="ignore"):
            yield
    finally:
        _QUIET.reset(token)


def quieted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run inside ``quiet()`` (for the entry points that evaluate many formulas: ``plan``)."""

    @functools.wraps(fn)
    def inside(*args: Any, **kwargs: Any) -> Any:
        with quiet():
            return fn(*args, **kwargs)

    return inside


@dataclass(frozen=True)
class Formula:
    """A named closed-form expression: its numpy function, unit, doc and LaTeX.

    Call it with the symbol values by name, as a mapping, keywords or both; values may be numpy
    arrays, which broadcast, so one call evaluates a whole sweep.
    """

    name: str
    section: str
    """The ``# --- section ---`` of the sympy source it is defined under."""
    unit: str
    doc: str
    args: tuple[str, ...]
    latex: str
    """The expression in LaTeX, printed by ``sympy.latex`` when the module was generated."""
    fn: Callable[..., Any] = field(repr=False, compare=False)
    """The generated numpy function; takes ``args`` positionally."""
    symbol_table: Mapping[str, tuple[str, str, str]] = field(repr=False, compare=False)
    """(latex, meaning, unit) of every symbol, by argument name."""

    def __call__(self, values: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Any:
        try:
            if values is None:
                ordered = [kwargs[a] for a in self.args]
            elif not kwargs:
                ordered = [values[a] for a in self.args]
            else:
                ordered = [kwargs[a] if a in kwargs else values[a] for a in self.args]
        except KeyError as missing:
            raise TypeError(f"formula {self.name!r} needs {missing.args[0]!r}") from None
        if _QUIET.get():  # inside ``quiet()``: the warnings are already off
            return self.fn(*ordered)
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.fn(*ordered)

    @property
    def symbols(self) -> list[tuple[str, str, str]]:
        """(latex, meaning, unit) of every symbol the expression uses."""
        return [self.symbol_table[a] for a in self.args]

    @property
    def expr(self) -> sp.Expr:
        """The sympy expression this formula was generated from (imports sympy on first use)."""
        from .formulas_sympy import FORMULAS

        return FORMULAS[self.name].expr
