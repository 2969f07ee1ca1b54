"""``PanSR``: PAN+SR as a LightningModule whose one training step screens with BART and then runs SR.

Nothing is gradient-trained (card §7): the step fits ``PanScreen`` on the training split, falls back to every
column when the screen keeps none (as the official code does), and fits the SR backend on the kept columns. The
fitted state (column names, the selection, the SR expression as a SymPy string, the backend's own program, the
timings) is JSON in a ``uint8`` buffer, so it travels in ``model.safetensors`` like weights do and a hub entry
predicts with the fitted expression offline.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from zoo.models.pan_sr.screen import PanScreen
from zoo.models.pan_sr.sr import (
    GplearnSR,
    PySRSR,
    SRBackend,
    expression_variables,
    is_solution,
    r2_zero,
    screen_rates,
    symbols_for,
)
from zoo.module import ZooModule

__all__ = ["PanSR"]


def _batch_arrays(batch: Any) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(batch, (tuple, list)):
        return batch[0].detach().cpu().double().numpy(), batch[1].detach().cpu().double().numpy()
    return batch.detach().cpu().double().numpy(), None


class PanSR(ZooModule):
    """PAN+SR: the PAN screen (``screen=True``) or all columns (SR alone), then symbolic regression.

    ``forward`` returns the fitted expression's predictions ``[n]`` (an unfitted model is the constant 0, SR's
    empty program). ``test`` logs ``test/r2`` (clipped at 0), ``test/solution`` (the SymPy check, 0 when R² ≤ 0.5
    as in SRBench), the screen's ``test/tpr``, ``test/fpr``, ``test/num_selected`` and the number of irrelevant
    variables in the final expression ``test/bad_vars``. Column names, f_0's variables and formula come from
    the DataModule's ``ground_truth()`` (``SymbolicDataModule`` has it); without them columns are ``x0, x1, ...``
    and only R² is measured.

    Args:
        screen: run the PAN screen first (PAN+SR) or not (SR alone).
        rule / replicates / num_trees / burnin / draws / permutations / alpha / max_features: ``PanScreen``'s.
        sr: ``"gplearn"`` (embedded default) or ``"pysr"`` (needs Julia).
        population / generations / tournament / parsimony / p_crossover / functions: gplearn's settings.
        seed: seeds the screen's chains and the SR search.
        solution_timeout: seconds allowed for the SymPy simplification of the solution check.

    Example:
        >>> from lightning import Trainer
        >>> from datamodules.symbolic import SymbolicDataModule
        >>> dm = SymbolicDataModule("I.12.1", copies=5, n=400)
        >>> model = PanSR(replicates=3, burnin=100, draws=100, population=200, generations=5)
        >>> Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        ...         enable_model_summary=False).fit(model, dm)
        >>> model.fitted["selected"], str(model.expression)
        (['Nn', 'mu'], 'Nn*mu')
    """

    def __init__(self, screen: bool = True, rule: Literal["vip_rank_hclust", "local", "gmax", "gse"] = "vip_rank_hclust",
                 replicates: int = 20, num_trees: int = 20, burnin: int = 1000, draws: int = 1000,
                 permutations: int = 10, alpha: float = 0.05, max_features: int | None = None,
                 sr: Literal["gplearn", "pysr"] = "gplearn", population: int = 1000, generations: int = 500,
                 tournament: int = 20, parsimony: float = 0.001, p_crossover: float = 0.9,
                 functions: list[str] | None = None, seed: int = 0, solution_timeout: float = 300.0) -> None:  # fmt: skip
        super().__init__()
        if sr not in ("gplearn", "pysr"):
            raise ValueError(f"sr must be 'gplearn' or 'pysr', got {sr!r}")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.register_buffer("fitted_json", torch.zeros(0, dtype=torch.uint8))
        self._fitted: dict[str, Any] | None = None
        self._predict: Any = None

    # -- the fitted state, kept as JSON bytes in a buffer ------------------------------------------------------------
    @property
    def fitted(self) -> dict[str, Any]:
        """The fitted state: ``feature_names``, ``selected``, ``expression``, ``program``, timings (empty before fit)."""
        if self._fitted is None:
            raw = bytes(self.fitted_json.cpu().numpy().tobytes())
            self._fitted = json.loads(raw.decode()) if raw else {}
        return self._fitted

    def _set_fitted(self, state: dict[str, Any]) -> None:
        data = torch.frombuffer(bytearray(json.dumps(state).encode()), dtype=torch.uint8).clone()
        self.fitted_json = data.to(self.fitted_json.device)
        self._fitted, self._predict = state, None

    def _load_from_state_dict(self, state_dict: dict[str, Tensor], prefix: str, *args: Any, **kwargs: Any) -> None:
        # The buffer's length is the JSON's: resize it to the incoming one so that a strict load fits.
        key = prefix + "fitted_json"
        if key in state_dict:
            self.fitted_json = torch.zeros_like(state_dict[key])
            self._fitted, self._predict = None, None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def expression(self) -> Any:
        """The fitted SymPy expression over the column names (``0`` before fit)."""
        import sympy

        state = self.fitted
        if not state:
            return sympy.Integer(0)
        return sympy.sympify(state["expression"], locals=symbols_for(state["feature_names"]))

    # -- fit ----------------------------------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        return None  # MCMC and genetic programming: no optimiser

    def _sr_backend(self) -> SRBackend:
        h = self.hparams
        if h.sr == "pysr":
            return PySRSR(random_state=h.seed)
        functions = h.functions or GplearnSR.FUNCTIONS
        return GplearnSR(h.population, h.generations, h.tournament, h.parsimony, h.p_crossover, functions, h.seed)

    def _ground_truth(self, p: int) -> dict[str, Any]:
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        info = dm.ground_truth() if hasattr(dm, "ground_truth") else {}
        names = info.get("feature_names") or [f"x{i}" for i in range(p)]
        if len(names) != p:
            raise ValueError(f"the DataModule names {len(names)} columns, the batch has {p}")
        return {"feature_names": list(names), "true_variables": list(info.get("true_variables") or []),
                "formula": info.get("formula")}  # fmt: skip

    def fit_arrays(self, X: np.ndarray, y: np.ndarray, feature_names: list[str] | None = None,
                   true_variables: list[str] | None = None, formula: str | None = None) -> dict[str, Any]:  # fmt: skip
        """Screen (if on) and SR on arrays; returns and stores the fitted state. Usable without a Trainer."""
        h = self.hparams
        names = list(feature_names or [f"x{i}" for i in range(X.shape[1])])
        if len(names) != X.shape[1]:
            raise ValueError(f"got {len(names)} feature names for {X.shape[1]} columns")
        if not np.isfinite(X).all() or not np.isfinite(y).all():
            raise ValueError("X or y holds NaN or infinite values: impute or drop them before fitting")
        start = time.perf_counter()
        selected = list(range(X.shape[1]))
        fallback = False
        if h.screen:
            scr = PanScreen(h.rule, h.replicates, h.num_trees, h.burnin, h.draws, h.permutations, h.alpha,
                            h.max_features, random_state=h.seed).fit(X, y)  # fmt: skip
            selected = scr.selected_.tolist()
            if not selected:  # the official fallback: SR on every column
                selected, fallback = list(range(X.shape[1])), True
        screen_seconds = time.perf_counter() - start
        start = time.perf_counter()
        kept = [names[i] for i in selected]
        sr = self._sr_backend().fit(X[:, selected], y, kept)
        state = {
            "feature_names": names,
            "selected": kept if h.screen and not fallback else [],
            "screen_fallback": fallback,
            "expression": str(sr.expression()),
            "program": sr.program() if hasattr(sr, "program") else None,
            "true_variables": list(true_variables or []),
            "formula": formula,
            "screen_seconds": screen_seconds,
            "sr_seconds": time.perf_counter() - start,
        }
        self._set_fitted(state)
        return state

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        X, y = _batch_arrays(batch)
        info = self._ground_truth(X.shape[1])
        state = self.fit_arrays(X, y, **info)
        metrics = {"train/r2": r2_zero(y, self.predict_arrays(X)), "train/screen_seconds": state["screen_seconds"],
                   "train/sr_seconds": state["sr_seconds"]}  # fmt: skip
        self.log_dict(metrics, prog_bar=True, batch_size=len(y))
        self.trainer.should_stop = True  # one fit is the whole training

    def card_notes(self) -> str:
        return (
            "The weights are the fitted state: the kept columns and the SR expression (JSON in a uint8 buffer); "
            "`forward` evaluates that expression, so the entry predicts only on data with the same columns in the "
            "same order. Shorter runs than the paper's: BART chains of `burnin` + `draws` (official 10k + 10k) on "
            "stochtree, whose sampler proposes grow and prune moves only (bartMachine also change moves), and "
            "gplearn for `generations` (SRBench: 500). One equation, noiseless: the paper's 100-equation Feynman "
            "and PMLB results are not reproduced. SR alone on the same data and budget (`screen: false`): test R² "
            "0.619, not solved."
        )

    # -- predict and evaluate -----------------------------------------------------------------------------------------
    def predict_arrays(self, X: np.ndarray) -> np.ndarray:
        """The fitted expression on the rows of ``X`` (all original columns, in the fitted order)."""
        import sympy

        state = self.fitted
        if not state:
            return np.zeros(len(X))
        names = state["feature_names"]
        if X.ndim != 2 or X.shape[1] != len(names):
            raise ValueError(f"expected X of shape (n, {len(names)}) (the columns the model was fitted on), got "
                             f"{tuple(X.shape)}")  # fmt: skip
        if self._predict is None:
            symbols = symbols_for(names)
            self._predict = sympy.lambdify(list(symbols.values()), self.expression, "numpy")
        with np.errstate(all="ignore"):
            out = self._predict(*X.T)
        return np.broadcast_to(np.asarray(out, dtype=np.float64), (len(X),)).copy()

    def forward(self, batch: Tensor | tuple[Tensor, ...]) -> Tensor:
        """Predictions ``[n]`` (float64) of an ``X [n, p]`` tensor or an ``(X, y)`` batch."""
        X, _ = _batch_arrays(batch)
        return torch.from_numpy(self.predict_arrays(X))

    def evaluate_arrays(self, X: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """The card's §3 metrics of the fitted model on ``(X, y)``."""
        state = self.fitted
        r2 = r2_zero(y, self.predict_arrays(X))
        out = {"r2": r2, "expr_size": float(_size(self.expression))}
        true = state.get("true_variables") or []
        if true:
            used = expression_variables(self.expression)
            kept = state["selected"] if self.hparams.screen and not state["screen_fallback"] else state["feature_names"]
            out |= screen_rates(kept, true, state["feature_names"])
            out["bad_vars"] = float(len(used - set(true)))
        if state.get("formula"):
            import sympy

            truth = sympy.sympify(state["formula"], locals=symbols_for(true))
            solved = r2 > 0.5 and is_solution(self.expression, truth, self.hparams.solution_timeout)
            out["solution"] = float(bool(solved))
        return out

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        X, y = _batch_arrays(batch)
        self.log_dict({f"test/{k}": v for k, v in self.evaluate_arrays(X, y).items()}, batch_size=len(y))

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        X, y = _batch_arrays(batch)
        self.log("val/r2", r2_zero(y, self.predict_arrays(X)), batch_size=len(y), prog_bar=True)

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self(batch)


def _size(expression: Any) -> int:
    """Model size: the number of SymPy preorder-traversal nodes (card §3)."""
    import sympy

    return sum(1 for _ in sympy.preorder_traversal(expression))
