"""Symbolic-regression data with large p: Feynman equations padded with irrelevant copies, and SRBench/PMLB files.

The embedded default follows PAN+SR's extended Feynman benchmark (``generate_feynman_dataset.py`` of the official
code, card §2): each true variable is drawn from its own ``U[low, high]``, and for **each** true variable 50
irrelevant columns are drawn from the *same* uniform, so a screen cannot tell them apart by their range
(p = 51·p_0). Noise ``N(0, sd(y)/√SNR)`` (a standard deviation) is added to every label *before* the 75/25 split,
so test R² is measured on noisy targets; ``snr=0`` means noiseless, as in the code. Unlike the official generator,
which keeps the true variables first, every column is permuted (card §5 and its review: that rules out any
index-order tie-breaking in a screen); the column names say which is which.

The real path reads the SRBench/PMLB layout: ``<data_dir>/<dataset>/<dataset>.tsv.gz`` (PMLB) or
``<data_dir>/<dataset>/feynman_<dataset>.tsv.gz`` (the extended Feynman set), tab-separated with a ``target``
column; Feynman files name their irrelevant columns ``x_bad_*``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoo.datamodules.base import FullBatchDataModule, TensorBatches

__all__ = ["FEYNMAN", "Equation", "SymbolicDataModule", "feynman_dataset", "read_tsv", "split_with_noise"]


@dataclass(frozen=True)
class Equation:
    """One Feynman equation: its SymPy formula and each variable's sampling range (``FeynmanEquations.csv``)."""

    name: str
    formula: str
    ranges: dict[str, tuple[float, float]]

    @property
    def variables(self) -> list[str]:
        return list(self.ranges)


def _eq(name: str, formula: str, **ranges: tuple[float, float]) -> Equation:
    return Equation(name, formula, dict(ranges))


# A subset of the 100 Feynman equations with the ranges of FeynmanEquations.csv: the card's E1-E4 (I.12.1, I.14.3,
# I.25.13, I.6.2) first, then equations with p_0 from 1 to 4 for the user's own runs.
FEYNMAN: dict[str, Equation] = {
    e.name: e
    for e in (
        _eq("I.12.1", "mu*Nn", mu=(1, 5), Nn=(1, 5)),
        _eq("I.14.3", "m*g*z", m=(1, 5), g=(1, 5), z=(1, 5)),
        _eq("I.25.13", "q/C", q=(1, 5), C=(1, 5)),
        _eq("I.6.2", "exp(-(theta/sigma)**2/2)/(sqrt(2*pi)*sigma)", sigma=(1, 3), theta=(1, 3)),
        _eq("I.6.2a", "exp(-theta**2/2)/sqrt(2*pi)", theta=(1, 3)),
        _eq("I.12.5", "q2*Ef", q2=(1, 5), Ef=(1, 5)),
        _eq("I.14.4", "k_spring*x**2/2", k_spring=(1, 5), x=(1, 5)),
        _eq("I.29.4", "omega/c", omega=(1, 10), c=(1, 10)),
        _eq("I.39.1", "3*pr*V/2", pr=(1, 5), V=(1, 5)),
        _eq("II.3.24", "Pwr/(4*pi*r**2)", Pwr=(1, 5), r=(1, 5)),
        _eq("I.10.7", "m_0/sqrt(1 - v**2/c**2)", m_0=(1, 5), v=(1, 2), c=(3, 10)),
        _eq("I.50.26", "x1*(cos(omega*t) + alpha*cos(omega*t)**2)", x1=(1, 3), omega=(1, 3), t=(1, 3), alpha=(1, 3)),
        _eq("I.18.4", "(m1*r1 + m2*r2)/(m1 + m2)", m1=(1, 5), m2=(1, 5), r1=(1, 5), r2=(1, 5)),
    )
}


def get_equation(name: str) -> Equation:
    """The Feynman equation ``name``; a clear error with close matches otherwise."""
    if name not in FEYNMAN:
        close = difflib.get_close_matches(name, FEYNMAN, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown Feynman equation {name!r}.{hint} Known: {', '.join(FEYNMAN)}")
    return FEYNMAN[name]


def evaluate_formula(equation: Equation, columns: dict[str, np.ndarray]) -> np.ndarray:
    """``f_0`` of ``equation`` on named columns, through SymPy's numpy printer (one vectorised call)."""
    import sympy

    symbols = {v: sympy.Symbol(v, positive=True) for v in equation.variables}
    f = sympy.lambdify(list(symbols.values()), sympy.sympify(equation.formula, locals=symbols), "numpy")
    return np.broadcast_to(np.asarray(f(*(columns[v] for v in equation.variables)), dtype=np.float64),
                           len(next(iter(columns.values())))).copy()  # fmt: skip


def feynman_dataset(
    equation: str = "I.14.3", n: int = 1334, copies: int = 50, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(X [n, p], y [n], names)`` for a Feynman equation with ``copies`` same-distribution irrelevant columns per
    true variable (p = (copies + 1)·p_0), all columns randomly permuted; irrelevant columns are named ``x_bad_<i>``.

    Example:
        >>> X, y, names = feynman_dataset("I.12.1", n=10, copies=50)
        >>> X.shape, sorted(n for n in names if not n.startswith("x_bad"))
        ((10, 102), ['Nn', 'mu'])
    """
    eq = get_equation(equation)
    rng = np.random.default_rng(seed)
    columns, bad = {}, []
    for v, (low, high) in eq.ranges.items():
        columns[v] = rng.uniform(low, high, n)
        bad += [rng.uniform(low, high, n) for _ in range(copies)]
    y = evaluate_formula(eq, columns)
    names = list(columns) + [f"x_bad_{i}" for i in range(len(bad))]
    X = np.column_stack(list(columns.values()) + bad)
    order = rng.permutation(X.shape[1])
    return X[:, order], y, [names[i] for i in order]


def split_with_noise(
    X: np.ndarray, y: np.ndarray, snr: float = 0.0, n_train: int | None = None, train_frac: float = 0.75, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The official order (``BART_selection.py``): noise ``N(0, sd(y)/√snr)`` on every label (``snr=0``:
    noiseless), then a seeded ``train_frac`` split, then (with ``n_train``) subsampling to ``n_train`` training
    rows and ``ceil(n_train/3)`` test rows. Returns ``X_train, X_test, y_train, y_test``."""
    if snr < 0:
        raise ValueError(f"snr must be >= 0 (0 means noiseless), got {snr}")
    rng = np.random.default_rng(seed)
    if snr > 0:
        y = y + rng.normal(0.0, np.std(y) / math.sqrt(snr), len(y))
    order = rng.permutation(len(y))
    cut = int(round(train_frac * len(y)))
    train, test = order[:cut], order[cut:]
    if n_train is not None:
        n_test = math.ceil(n_train / 3)
        if n_train > len(train) or n_test > len(test):
            raise ValueError(f"n_train={n_train} needs {n_train} training and {n_test} test rows; the split has "
                             f"{len(train)} and {len(test)}")  # fmt: skip
        train, test = train[:n_train], test[:n_test]
    return X[train], X[test], y[train], y[test]


def read_tsv(path: str | Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(X, y, names)`` from an SRBench/PMLB ``.tsv.gz`` (tab-separated, a ``target`` column)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file {path}: PMLB files are <data_dir>/<name>/<name>.tsv.gz (a pmlb clone "
                                "with its LFS content), Feynman files <data_dir>/<name>/feynman_<name>.tsv.gz")  # fmt: skip
    frame = pd.read_csv(path, sep="\t")
    if "target" not in frame.columns:
        raise ValueError(f"{path} has no 'target' column; columns: {list(frame.columns)[:10]}")
    X = frame.drop(columns="target")
    return X.to_numpy(np.float64), frame["target"].to_numpy(np.float64), [str(c) for c in X.columns]


def _find_file(data_dir: Path, dataset: str) -> Path:
    for name in (f"{dataset}.tsv.gz", f"feynman_{dataset}.tsv.gz"):
        if (data_dir / dataset / name).is_file():
            return data_dir / dataset / name
    found = sorted(p.name for p in data_dir.iterdir()) if data_dir.is_dir() else []
    close = difflib.get_close_matches(dataset, found, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise FileNotFoundError(f"no {data_dir}/{dataset}/{dataset}.tsv.gz or feynman_{dataset}.tsv.gz.{hint}")


def _standardize(X_tr: np.ndarray, X_te: np.ndarray, y_tr: np.ndarray, y_te: np.ndarray) -> tuple[np.ndarray, ...]:
    """Both splits scaled with the training split's means and standard deviations (scikit-learn's StandardScaler)."""
    from sklearn.preprocessing import StandardScaler

    x_scaler = StandardScaler().fit(X_tr)
    y_scaler = StandardScaler().fit(y_tr[:, None])
    return (x_scaler.transform(X_tr), x_scaler.transform(X_te), y_scaler.transform(y_tr[:, None])[:, 0],
            y_scaler.transform(y_te[:, None])[:, 0])  # fmt: skip


class SymbolicDataModule(FullBatchDataModule):
    """Regression data for screening + symbolic regression, served as one full batch ``(X [n, p], y [n])`` in
    float64 (a screen and an SR search see all rows at once). Train is the training split; val and test are the
    test split.

    Attributes after ``setup``: ``feature_names`` (one per column), ``true_variables`` (the names f_0 uses, empty
    for black-box data) and ``formula`` (f_0 as a SymPy string, ``None`` for black-box data).

    Args:
        equation: a Feynman equation (``FEYNMAN``) for the embedded default.
        copies: irrelevant copies per true variable (50 in the paper).
        n: rows generated before the split (1,334 gives 1,000 training rows).
        snr: signal-to-noise ratio Var(y)/Var(ε) of the label noise; 0 is noiseless.
        n_train: subsample the training split to this many rows (and the test split to ceil(n_train/3)).
        data_dir / dataset: the real path, ``<data_dir>/<dataset>/<dataset>.tsv.gz`` or ``feynman_<dataset>.tsv.gz``.
        standardize: scale X and y to zero mean and unit variance with the training split's statistics (SRBench's
            black-box protocol); ``None`` (default) does so for data without known true variables (PMLB) and not
            for Feynman data (SRBench's ``-sym_data``). The official code fits BART on the raw data; the screen is the
            same either way, as trees split on order and the BART backend rescales y to [-0.5, 0.5].
        seed: the seed of data, noise and split.

    Example:
        >>> dm = SymbolicDataModule("I.12.1", n=40)
        >>> dm.setup()
        >>> X, y = next(iter(dm.train_dataloader()))
        >>> X.shape, y.dtype, dm.formula
        (torch.Size([30, 102]), torch.float64, 'mu*Nn')
    """

    def __init__(self, equation: str = "I.14.3", copies: int = 50, n: int = 1334, snr: float = 0.0,
                 n_train: int | None = None, data_dir: str | None = None, dataset: str | None = None,
                 standardize: bool | None = None, seed: int = 0, num_workers: int = 0) -> None:  # fmt: skip
        super().__init__()
        if dataset is None:
            get_equation(equation)
        elif data_dir is None:
            raise ValueError("dataset needs data_dir, the folder holding <dataset>/<dataset>.tsv.gz")
        if snr < 0:
            raise ValueError(f"snr must be >= 0 (0 means noiseless), got {snr}")
        self.save_hyperparameters()
        self.feature_names: list[str] = []
        self.true_variables: list[str] = []
        self.formula: str | None = None

    def load(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """The whole table ``(X, y, names)`` before noise and split; sets ``true_variables`` and ``formula``."""
        h = self.hparams
        if h.dataset is None:
            eq = get_equation(h.equation)
            self.true_variables, self.formula = eq.variables, eq.formula
            return feynman_dataset(h.equation, h.n, h.copies, h.seed)
        X, y, names = read_tsv(_find_file(Path(h.data_dir), h.dataset))
        if any(c.startswith("x_bad") for c in names):  # the extended Feynman layout: its equation is known
            self.true_variables = [c for c in names if not c.startswith("x_bad")]
            eq = FEYNMAN.get(h.dataset.removeprefix("feynman_").replace("_", "."))
            if eq is not None and set(eq.variables) == set(self.true_variables):
                self.formula = eq.formula
        return X, y, names

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        h = self.hparams
        X, y, self.feature_names = self.load()
        X_tr, X_te, y_tr, y_te = split_with_noise(X, y, h.snr, h.n_train, seed=h.seed)
        black_box = not self.true_variables
        if black_box if h.standardize is None else h.standardize:
            X_tr, X_te, y_tr, y_te = _standardize(X_tr, X_te, y_tr, y_te)
        self.train_set = TensorBatches(torch.from_numpy(X_tr), torch.from_numpy(y_tr))
        self.val_set = self.test_set = TensorBatches(torch.from_numpy(X_te), torch.from_numpy(y_te))

    def ground_truth(self) -> dict[str, Any]:
        """What a model needs beside the numbers: column names, f_0's variables and formula (empty for black-box)."""
        return {"feature_names": list(self.feature_names), "true_variables": list(self.true_variables),
                "formula": self.formula}  # fmt: skip

    def describe(self) -> str:
        """One line for model cards."""
        h = self.hparams
        if h.dataset is not None:
            source = f"{h.dataset} from {h.data_dir}"
        else:
            source = (f"Feynman {h.equation} (f = {get_equation(h.equation).formula}) with {h.copies} same-distribution "
                      f"irrelevant copies per true variable, all columns permuted, {h.n} rows (seed {h.seed})")  # fmt: skip
        noise = f"SNR {h.snr:g}" if h.snr else "noiseless"
        rows = f"{len(self.train_set)} training and {len(self.test_set)} test rows" if self.train_set else ""
        return f"{source}; {len(self.feature_names)} columns, {noise}, split 75/25; {rows}".rstrip("; ")
