"""The SR stage behind one interface, and the card's §3 metrics: R² clipped at 0, the SymPy solution check,
screening TPR/FPR/FNR and the variables of the final expression.

``SRBackend`` is what PAN+SR needs of any SR method: ``fit(X, y, names)``, ``predict(X)`` and ``expression()`` (a
SymPy expression over the names). ``GplearnSR`` is the embedded default (gplearn is pure Python); ``PySRSR`` wraps
PySR where Julia exists.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = [
    "GplearnSR",
    "PySRSR",
    "SRBackend",
    "expression_variables",
    "gplearn_to_sympy",
    "is_solution",
    "r2_zero",
    "screen_rates",
    "symbols_for",
]


class SRBackend(Protocol):
    def fit(self, X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> SRBackend: ...

    def predict(self, X: np.ndarray) -> np.ndarray: ...

    def expression(self) -> Any: ...


def symbols_for(names: Iterable[str]) -> dict[str, Any]:
    """Positive real SymPy symbols for column names (Feynman variables are positive: ``sqrt(x**2)`` is ``x``)."""
    import sympy

    return {n: sympy.Symbol(n, positive=True) for n in names}


def gplearn_to_sympy(program: str, names: Sequence[str]) -> Any:
    """A gplearn program string (``add(mul(m, g), 0.5)``) as a SymPy expression over ``names``.

    gplearn's protected operators are read as their mathematical forms on the positive domain where the Feynman
    data lives (``sqrt(|x|)``, ``log(|x|)``; ``div`` without its guard), since the solution check compares
    formulas, not guard branches.

    Example:
        >>> gplearn_to_sympy("add(mul(m, g), div(z, 2.0))", ["m", "g", "z"])
        g*m + 0.5*z
    """
    import sympy

    ops = {
        "add": lambda a, b: a + b,
        "sub": lambda a, b: a - b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "sqrt": lambda a: sympy.sqrt(sympy.Abs(a)),
        "log": lambda a: sympy.log(sympy.Abs(a)),
        "sin": sympy.sin,
        "cos": sympy.cos,
        "neg": lambda a: -a,
        "inv": lambda a: 1 / a,
        "abs": sympy.Abs,
        "max": sympy.Max,
        "min": sympy.Min,
        "tan": sympy.tan,
    }
    return sympy.sympify(program, locals={**ops, **symbols_for(names)})


class GplearnSR:
    """gplearn's ``SymbolicRegressor`` with the card's settings (tournament 20, MAE, parsimony 0.001,
    p_crossover 0.9, the 8-function set); population and generations as given (SRBench's tuned 1000 / 500).

    Example:
        >>> X = np.random.default_rng(0).uniform(1, 5, (200, 2))
        >>> sr = GplearnSR(population=200, generations=5).fit(X, X[:, 0] * X[:, 1], ["a", "b"])
        >>> sr.expression()
        a*b
    """

    FUNCTIONS = ("add", "sub", "mul", "div", "sqrt", "log", "sin", "cos")

    def __init__(self, population: int = 1000, generations: int = 500, tournament: int = 20,
                 parsimony: float = 0.001, p_crossover: float = 0.9, functions: Sequence[str] = FUNCTIONS,
                 seed: int = 0) -> None:  # fmt: skip
        self.kwargs = {
            "population_size": population,
            "generations": generations,
            "tournament_size": tournament,
            "parsimony_coefficient": parsimony,
            "p_crossover": p_crossover,
            "function_set": tuple(functions),
            "metric": "mean absolute error",
            "random_state": seed,
        }
        self.names: list[str] = []
        self.model: Any = None

    def fit(self, X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> GplearnSR:
        from gplearn.genetic import SymbolicRegressor

        # gplearn's other operators (p_subtree 0.01, hoist 0.01, point 0.01) keep its defaults, as SRBench does;
        # its default stopping_criteria=0 ends the search once the MAE is exactly 0.
        self.names = list(names)
        self.model = SymbolicRegressor(feature_names=self.names, **self.kwargs).fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.model.predict(X)

    def program(self) -> str:
        return str(self.model._program)

    def expression(self) -> Any:
        return gplearn_to_sympy(self.program(), self.names)


class PySRSR:
    """PySR behind the same interface (``pysr.PySRRegressor`` keyword arguments pass through); needs Julia."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.model: Any = None

    def fit(self, X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> PySRSR:
        try:
            from pysr import PySRRegressor
        except ImportError as err:
            raise ImportError("the PySR backend needs `pip install pysr` and a Julia installation (PySR installs its "
                              "Julia packages on first use); use sr='gplearn' where Julia is unavailable") from err  # fmt: skip
        self.model = PySRRegressor(**self.kwargs).fit(X, y, variable_names=list(names))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.model.predict(X)

    def expression(self) -> Any:
        return self.model.sympy()


def r2_zero(y: np.ndarray, prediction: np.ndarray) -> float:
    """Test R² clipped at 0 (SRBench's ``r2_zero_test``); a non-finite prediction scores 0."""
    from sklearn.metrics import r2_score

    prediction = np.asarray(prediction, dtype=np.float64)
    if not np.isfinite(prediction).all():
        return 0.0
    return max(float(r2_score(y, prediction)), 0.0)


def _with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()``, raising ``TimeoutError`` after ``seconds`` (SIGALRM; off the main thread it runs without limit)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        return fn()

    def _alarm(signum: int, frame: Any) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def is_solution(model: Any, truth: Any, timeout: float = 300.0) -> bool | None:
    """SRBench's symbolic solution check: after ``simplify``, ``f̂ - f_0`` is a constant or ``f̂ / f_0`` is a
    nonzero constant. ``None`` when simplification ran past ``timeout`` seconds (the card's 300 s).

    Example:
        >>> import sympy
        >>> a, b = sympy.symbols("a b", positive=True)
        >>> is_solution(a * b + 3, a * b), is_solution(2 * a * b, a * b), is_solution(a + b, a * b)
        (True, True, False)
    """
    import sympy

    def check() -> bool:
        diff = sympy.simplify(model - truth)
        if not diff.free_symbols and diff.is_finite is not False:
            return True
        ratio = sympy.simplify(model / truth)
        return not ratio.free_symbols and ratio != 0 and ratio.is_finite is not False

    try:
        return bool(_with_timeout(check, timeout))
    except TimeoutError:
        return None


def expression_variables(expression: Any) -> set[str]:
    """The names of the variables an expression uses."""
    return {str(s) for s in getattr(expression, "free_symbols", set())}


def screen_rates(selected: Iterable[str], true: Iterable[str], all_names: Sequence[str]) -> dict[str, float]:
    """TPR, FPR and FNR of a selection against the true variables (card §3), and the selection's size."""
    selected, true = set(selected), set(true)
    negatives = len(all_names) - len(true)
    tp, fp = len(selected & true), len(selected - true)
    tpr = tp / len(true) if true else math.nan
    return {"tpr": tpr, "fnr": 1 - tpr if true else math.nan, "fpr": fp / negatives if negatives else 0.0,
            "num_selected": float(len(selected))}  # fmt: skip
