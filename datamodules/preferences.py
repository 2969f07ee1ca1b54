"""Pairwise human preferences between LLM responses, for control-variates win-rate evaluation (cv-winrate card).

Sources of :class:`PreferenceDataModule`:

* ``"arena"`` (default, the embedded data): the card's §5 Part B "tiny arena", made in code by
  :func:`make_tiny_arena`: feature vectors for prompts and responses, a known human utility, labels z.
* ``"jsonl"`` / ``"parquet"``: a Chatbot-Arena / MT-Bench style file, one comparison per row, with text fields
  ``prompt``, ``response_a``, ``response_b``, ``model_a``, ``model_b`` and ``winner`` (or ``z``). Parquet needs
  ``pyarrow``.

Label convention everywhere: ``z = 1`` when A wins, ``0`` when B wins, ``0.5`` for a tie.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from zoo.arguments import check_choice, check_range
from zoo.datamodules.base import BatchedDataModule

__all__ = ["PairwisePreferences", "PreferenceDataModule", "make_tiny_arena", "read_preference_rows"]

# Constants of the tiny arena (the card leaves them open; see make_tiny_arena's docstring).
_RESPONSE_NOISE = 0.3  # std of the response noise
_L1_WEIGHT = 0.3  # weight of the ‖y‖₁ term of the utility
_TEMPERATURE = 3.0  # P(A wins) = σ(3 (U_A − U_B))
_TIE_MARGIN = 0.05  # tie when |U_A − U_B| < 0.05
_SHIFTED_C = 0.0  # c of the shifted population: it ignores the ‖y‖₁ preference (see make_tiny_arena)
_HUMAN_SEED = 1234  # seed of w and of the shift of w: the same humans for every `seed`
_SWAPPED = {"a": "b", "b": "a", "llm_a": "llm_b", "llm_b": "llm_a"}
_EXAMPLE_LINE = (
    '{"prompt": "Name a prime.", "response_a": "7", "response_b": "8", "model_a": "gpt-4", '
    '"model_b": "vicuna-13b", "winner": "model_a"}'
)


def _sample_seed(seed: int) -> int:
    """A seed for the comparisons' draws that is independent of the LLMs' generator seeded by ``seed``."""
    return int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])


def make_tiny_arena(
    num_llms: int = 6,
    comparisons_per_pair: int = 400,
    dim: int = 8,
    population: Literal["arena", "shifted"] = "arena",
    seed: int = 0,
    *,
    sample_seed: int | None = None,
) -> dict[str, Tensor]:
    """The cv-winrate card's "tiny arena" (§5 Part B): K synthetic LLMs compared pairwise by a simulated human.

    The card leaves the scales open (Review notes); this function fixes them:

    * LLM k has quality ``q_k ~ Uniform(0.5, 1.5)^dim``, drawn from a generator seeded by ``seed`` only.
    * Every unordered pair ``i < j`` gets ``comparisons_per_pair`` comparisons. A prompt is ``x ~ N(0, I_dim)``,
      LLM k's response ``y = q_k ⊙ x + 0.3·N(0, I_dim)``. Which LLM is "A" is a fair coin per comparison.
    * Human utility ``U(y) = wᵀy + 0.3·c·‖y‖₁`` with ``w ~ N(0, I)/√dim`` from the fixed seed 1234.
      ``"arena"``: ``c = 1``. ``"shifted"`` (the off-the-shelf reward model's population): ``w' = w + 0.5·N(0,
      I)/√dim`` (a second draw of that generator) and ``c = 0``, and the last feature of every returned response
      is set to 0 (the reward model misses one feature); the utility still uses the full response.
    * The human picks A (``z = 1``) with probability ``σ(3(U_A − U_B))``, else B (``z = 0``), and records a tie
      (``z = 0.5``) when ``|U_A − U_B| < 0.05``.

    Since ``x`` is symmetric, ``wᵀy`` favours no LLM on average: it drives the per-prompt variation, while the
    ``‖y‖₁`` term makes LLMs with larger ``q`` win in the arena; the shifted human ignores it. Measured with the
    defaults over seeds 0-9 (arena / shifted, with c = −1 for the shifted human): tie rate 7.0-8.6 % / 6.0-7.6 %,
    mean ``|z − 0.5|`` 0.46 / 0.47, and a non-tie label agrees with ``sign(U_A − U_B)`` 75-78 % / 77-79 % of the
    time, so the labels are neither mostly ties nor deterministic. ``c = 0`` was chosen for the shifted human
    because ``c = −1`` made it anti-correlated with the arena one (utility gaps correlating at −0.14 to −0.34, a
    reward model equal to the shifted utility scoring ρ ≈ −0.08 against arena labels, so the off-the-shelf arm
    would fail the card's ρ > 0 orientation check); with ``c = 0`` that reward model scores per-pair ρ ≈ +0.2
    (ρ² 0.04-0.07), the weak, biased off-the-shelf evaluator the card asks for. The arena utility itself gives
    ρ² ≈ 0.28-0.31.

    For one ``seed`` the two populations are a paired sample: the same LLMs, prompts, responses, A/B order and
    label noise, so only the human and the masked feature differ (row r of one is row r of the other). Pass
    ``sample_seed`` for other prompts, responses and label noise with the same LLMs.

    Args:
        num_llms: number of LLMs K (>= 2).
        comparisons_per_pair: comparisons per unordered pair of LLMs (>= 1).
        dim: feature width of prompts and responses (>= 2).
        population: ``"arena"`` (the humans being evaluated) or ``"shifted"`` (see above).
        seed: seed of the LLMs, and of the comparisons unless ``sample_seed`` is given.
        sample_seed: seed of the prompts, responses, A/B order and label noise (default: derived from ``seed``).

    Returns:
        ``M = K(K−1)/2 · comparisons_per_pair`` rows, grouped by pair: ``"x"``, ``"a"``, ``"b"`` ``(M, dim)``
        float32 (prompt, response A, response B), ``"llm_a"``, ``"llm_b"`` ``(M,)`` long, ``"z"`` ``(M,)`` float32
        and ``"utility_gap"`` ``(M,)`` float32 ``= U_A − U_B`` (of this population's human).

    Raises:
        ValueError: for a population other than "arena" or "shifted", or sizes out of range.

    Example:
        >>> d = make_tiny_arena(num_llms=4, comparisons_per_pair=100, seed=0)
        >>> d["a"].shape, d["z"].shape, sorted(d)
        (torch.Size([600, 8]), torch.Size([600]), ['a', 'b', 'llm_a', 'llm_b', 'utility_gap', 'x', 'z'])
        >>> shifted = make_tiny_arena(num_llms=4, comparisons_per_pair=100, population="shifted", seed=0)
        >>> bool((shifted["a"][:, -1] == 0).all()), torch.equal(shifted["x"], d["x"])
        (True, True)
    """
    if population not in ("arena", "shifted"):
        raise ValueError(f"Expected population to be 'arena' or 'shifted', got {population!r}.")
    if num_llms < 2 or comparisons_per_pair < 1 or dim < 2:
        raise ValueError(
            f"Expected num_llms >= 2, comparisons_per_pair >= 1 and dim >= 2, got {num_llms}, "
            f"{comparisons_per_pair} and {dim}."
        )
    q = 0.5 + torch.rand(num_llms, dim, generator=torch.Generator().manual_seed(seed))
    g_human = torch.Generator().manual_seed(_HUMAN_SEED)
    w = torch.randn(dim, generator=g_human) / math.sqrt(dim)
    w_shift = torch.randn(dim, generator=g_human) / math.sqrt(dim)  # always drawn, so w is the same for both
    if population == "shifted":
        w, c = w + 0.5 * w_shift, _SHIFTED_C
    else:
        c = 1.0

    g = torch.Generator().manual_seed(_sample_seed(seed if sample_seed is None else sample_seed))
    pairs = torch.combinations(torch.arange(num_llms), r=2).repeat_interleave(comparisons_per_pair, dim=0)
    M = len(pairs)
    x = torch.randn(M, dim, generator=g)
    y = q[pairs] * x[:, None, :] + _RESPONSE_NOISE * torch.randn(M, 2, dim, generator=g)  # (M, 2, dim): i, j
    swap = torch.rand(M, generator=g) < 0.5  # fair coin: which of the pair is "A"
    u = torch.rand(M, generator=g)  # label noise, shared by both populations (paired sample)
    order = torch.stack([swap.long(), 1 - swap.long()], dim=1)  # (M, 2): column of A, column of B
    llm = pairs.gather(1, order)
    y = y.gather(1, order[:, :, None].expand(M, 2, dim))

    U = y @ w + _L1_WEIGHT * c * y.abs().sum(-1)  # (M, 2): utilities of A and B, on the full responses
    gap = U[:, 0] - U[:, 1]
    z = (u < torch.sigmoid(_TEMPERATURE * gap)).float()
    z[gap.abs() < _TIE_MARGIN] = 0.5
    if population == "shifted":
        y[..., -1] = 0.0  # the off-the-shelf population never sees the last feature
    return {"x": x, "a": y[:, 0], "b": y[:, 1], "llm_a": llm[:, 0], "llm_b": llm[:, 1], "z": z, "utility_gap": gap}


class PairwisePreferences(Dataset):
    """Rows of pairwise comparisons, served one batch (a dict) per indexing call.

    Args:
        columns: equal-length columns: tensors with rows on dim 0 (``"x"``, ``"a"``, ``"b"``, ``"llm_a"``,
            ``"llm_b"``, ``"z"``, ``"utility_gap"``) or lists of str (the text path's ``"prompt"``, ``"a"``,
            ``"b"``). ``"llm_a"``, ``"llm_b"`` and ``"z"`` are required.
        rows: which rows to keep, in this order (default: all).

    Raises:
        ValueError: when a required column is missing or the columns differ in length.

    Example:
        >>> ds = PairwisePreferences({"llm_a": torch.tensor([0, 2]), "llm_b": torch.tensor([1, 0]),
        ...                           "z": torch.tensor([1.0, 0.0]), "a": ["hi", "yo"], "b": ["hey", "hello"]})
        >>> ds.__getitems__([1])["a"], ds.oriented(0)["z"].tolist(), ds.oriented(0)["a"]
        (['yo'], [1.0, 1.0], ['hi', 'hello'])
    """

    def __init__(self, columns: dict[str, Tensor | list[str]], rows: Sequence[int] | Tensor | None = None) -> None:
        missing = [k for k in ("llm_a", "llm_b", "z") if k not in columns]
        if missing:
            raise ValueError(f"PairwisePreferences needs columns llm_a, llm_b and z; missing {missing}.")
        lengths = {k: len(v) for k, v in columns.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"Expected columns of one length, got {lengths}.")
        if rows is not None:
            columns = _take(columns, torch.as_tensor(rows, dtype=torch.long))
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["z"])

    def __getitems__(self, indices: Sequence[int] | Tensor) -> dict[str, Tensor | list[str]]:
        return _take(self.columns, torch.as_tensor(indices, dtype=torch.long))

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    def all(self) -> dict[str, Tensor | list[str]]:
        """Every row, as one batch."""
        return self.__getitems__(torch.arange(len(self)))

    def oriented(self, llm: int) -> dict[str, Tensor | list[str]]:
        """Every row that involves ``llm``, with ``llm`` always as "A" (card §8, orientation).

        Rows where ``llm`` was "B" swap ``a``/``b`` and ``llm_a``/``llm_b``, and flip ``z → 1 − z`` and
        ``utility_gap → −utility_gap``, so ``z`` stays "the probability that A wins".
        """
        llm_a, llm_b = self.columns["llm_a"], self.columns["llm_b"]
        rows = torch.nonzero((llm_a == llm) | (llm_b == llm)).flatten()
        batch = self.__getitems__(rows)
        flip = batch["llm_b"] == llm  # llm == llm_b only for self-comparisons, which are left as they are
        flip &= batch["llm_a"] != llm
        out: dict[str, Tensor | list[str]] = {}
        for key, value in batch.items():
            other = batch.get(_SWAPPED.get(key, key))
            if key in _SWAPPED and isinstance(value, Tensor):
                out[key] = torch.where(flip.view(-1, *([1] * (value.ndim - 1))), other, value)
            elif key in _SWAPPED:
                out[key] = [o if f else v for v, o, f in zip(value, other, flip.tolist(), strict=True)]
            elif key == "z":
                out[key] = torch.where(flip, 1 - value, value)
            elif key == "utility_gap":
                out[key] = torch.where(flip, -value, value)
            else:
                out[key] = value
        return out

    def pairs(self) -> dict[tuple[int, int], Tensor]:
        """Row indices of each ordered pair ``(llm_a, llm_b)`` present, sorted by pair."""
        return _group_pairs(self.columns["llm_a"], self.columns["llm_b"])


def _take(columns: dict[str, Tensor | list[str]], index: Tensor) -> dict[str, Tensor | list[str]]:
    """Rows ``index`` of every column: one fancy-index per tensor, a list comprehension per text column."""
    return {k: v[index] if isinstance(v, Tensor) else [v[i] for i in index.tolist()] for k, v in columns.items()}


def _group_pairs(llm_a: Tensor, llm_b: Tensor) -> dict[tuple[int, int], Tensor]:
    """Row indices of each ordered pair ``(llm_a, llm_b)``, keys sorted, rows in their stored order."""
    if len(llm_a) == 0:
        return {}
    width = int(torch.maximum(llm_a.max(), llm_b.max())) + 1
    cell = llm_a * width + llm_b
    order = torch.argsort(cell, stable=True)
    keys, counts = torch.unique_consecutive(cell[order], return_counts=True)
    groups = torch.split(order, counts.tolist())
    return {(int(k) // width, int(k) % width): rows for k, rows in zip(keys.tolist(), groups, strict=True)}


def _label(row: dict[str, Any], where: str) -> float:
    """z of one row: its ``z`` (0, 0.5 or 1) or its ``winner`` (model_a → 1, model_b → 0, tie* → 0.5)."""
    if "z" in row and row["z"] is not None:
        z = row["z"]
        if isinstance(z, bool) or not isinstance(z, (int, float)) or z not in (0, 0.5, 1):
            raise ValueError(f"{where}: expected z to be 0, 0.5 or 1 (B wins, tie, A wins), got {z!r}.")
        return float(z)
    winner = row.get("winner")
    if winner == "model_a":
        return 1.0
    if winner == "model_b":
        return 0.0
    if isinstance(winner, str) and winner.startswith("tie"):
        return 0.5
    raise ValueError(
        f"{where}: unknown winner {winner!r}. Expected 'model_a', 'model_b' or a value starting with 'tie' "
        "(e.g. 'tie (bothbad)'), or give z as 1, 0.5 or 0."
    )


def read_preference_rows(path: str | Path) -> tuple[dict[str, Tensor | list[str]], list[str]]:
    """Read a JSONL or parquet file of comparisons into columns, mapping model names to sorted integer ids.

    Each row needs ``prompt``, ``response_a``, ``response_b`` (str), ``model_a``, ``model_b`` and either ``winner``
    (``"model_a"`` → 1, ``"model_b"`` → 0, ``"tie…"`` → 0.5) or ``z`` (1, 0.5, 0); other fields are ignored.

    Returns:
        ``(columns, names)``: ``"prompt"``, ``"a"``, ``"b"`` lists of str, ``"llm_a"``, ``"llm_b"`` long and
        ``"z"`` float32 tensors; ``names[i]`` is the model of id ``i``.

    Raises:
        FileNotFoundError: when ``path`` is not a file (the message shows an example line).
        ImportError: for parquet without ``pyarrow``.
        ValueError: for a malformed row, naming its line (JSONL) or row (parquet) number.
    """
    path = Path(path).expanduser()
    parquet = path.suffix == ".parquet"
    if not path.is_file():
        raise FileNotFoundError(
            f"No preference file at {path}. PreferenceDataModule(source={'parquet' if parquet else 'jsonl'!r}) "
            "expects path to be a file with one comparison per row (JSON Lines: one object per line), e.g.\n"
            f"{_EXAMPLE_LINE}\nwinner is 'model_a', 'model_b' or 'tie…' (or give z as 1, 0.5 or 0). Or leave "
            "source at 'arena' for the synthetic tiny arena."
        )
    if parquet:
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError(
                f"Reading {path} needs pyarrow: `pip install pyarrow`, or convert the file to JSON Lines."
            ) from err
        records = enumerate(pq.read_table(path).to_pylist(), start=1)
        unit = "row"
    else:
        lines = path.read_text(encoding="utf-8").splitlines()
        records = ((n, line) for n, line in enumerate(lines, start=1) if line.strip())
        unit = "line"
    fields = ("prompt", "response_a", "response_b", "model_a", "model_b")
    out: dict[str, list[Any]] = {k: [] for k in (*fields, "z")}
    for n, record in records:
        where = f"{path}, {unit} {n}"
        if isinstance(record, str):
            try:
                record = json.loads(record)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg}). Expected one JSON object per line.") from err
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}.")
        for key in fields:
            if not isinstance(record.get(key), str):
                raise ValueError(
                    f"{where}: field {key!r} must be a string, got {type(record.get(key)).__name__}. Each row "
                    f"needs {', '.join(fields)} as text (flatten multi-turn conversations first)."
                )
            out[key].append(record[key])
        out["z"].append(_label(record, where))
    if not out["z"]:
        raise ValueError(f"{path} holds no comparisons. Expected rows like {_EXAMPLE_LINE}")
    names = sorted(set(out["model_a"]) | set(out["model_b"]))
    ids = {name: i for i, name in enumerate(names)}
    columns: dict[str, Tensor | list[str]] = {
        "prompt": out["prompt"],
        "a": out["response_a"],
        "b": out["response_b"],
        "llm_a": torch.tensor([ids[m] for m in out["model_a"]], dtype=torch.long),
        "llm_b": torch.tensor([ids[m] for m in out["model_b"]], dtype=torch.long),
        "z": torch.tensor(out["z"], dtype=torch.float32),
    }
    return columns, names


class PreferenceDataModule(BatchedDataModule):
    """Pairwise human preferences with leave-one-LLM-out splits (cv-winrate card §1, fine-tuning protocol; §7).

    With ``holdout_llm=k``, training and validation hold every comparison that does **not** involve LLM k (a seeded
    ``val_fraction`` goes to validation), and the test split is every comparison involving k, oriented with k as
    "A" (``z → 1 − z`` where k was "B"). So a reward model fine-tuned here never sees the evaluated LLM. With
    ``holdout_llm=None`` the comparisons are split at random (seeded) into train/val/test. Ties are dropped from
    the training split when ``drop_ties_in_train`` (the Bradley–Terry fine-tuning drops them); validation and
    test keep them as 0.5, as the evaluation does.

    Batches are dicts: ``"x"``, ``"a"``, ``"b"`` ``(B, dim)`` tensors for the arena, or ``"prompt"``, ``"a"``,
    ``"b"`` lists of str for files; plus ``"llm_a"``, ``"llm_b"`` (long) and ``"z"`` (float32) ``(B,)``, and for the
    arena ``"utility_gap"`` ``(B,)``.

    Args:
        source: ``"arena"`` (:func:`make_tiny_arena`), ``"jsonl"`` or ``"parquet"`` (see the module docstring).
        path: the JSONL or parquet file; required unless ``source="arena"``.
        population: the arena's human, ``"arena"`` or ``"shifted"`` (the off-the-shelf reward model's data).
        num_llms: arena LLMs K.
        comparisons_per_pair: arena comparisons per unordered pair of LLMs.
        dim: arena feature width.
        holdout_llm: the evaluated LLM k (an id in ``[0, K)``; file ids follow ``llm_names``), or None.
        drop_ties_in_train: drop ``z = 0.5`` rows from the training split.
        val_fraction: validation fraction of the (non-held-out) comparisons.
        test_fraction: test fraction when ``holdout_llm`` is None.
        batch_size: rows per batch.
        num_workers: DataLoader workers.
        seed: seed of the arena and of the splits.

    Attributes:
        llm_names: names of the LLM ids (``"llm0"``... for the arena), set by ``setup``.

    Raises:
        ValueError: for a bad argument (in ``__init__``) or a holdout id outside the LLMs found (in ``setup``).
        FileNotFoundError: in ``setup``, when ``path`` is not a file.

    Example:
        >>> dm = PreferenceDataModule(num_llms=4, comparisons_per_pair=50, holdout_llm=2, batch_size=32)
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch["a"].shape, bool((batch["llm_a"] != 2).all()), bool((dm.test_comparisons()["llm_a"] == 2).all())
        (torch.Size([32, 8]), True, True)
        >>> sorted(dm.pairs("test"))
        [(2, 0), (2, 1), (2, 3)]
    """

    def __init__(
        self,
        source: Literal["arena", "jsonl", "parquet"] = "arena",
        path: str | None = None,
        population: Literal["arena", "shifted"] = "arena",
        num_llms: int = 6,
        comparisons_per_pair: int = 400,
        dim: int = 8,
        holdout_llm: int | None = None,
        drop_ties_in_train: bool = True,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_choice("source", source, ("arena", "jsonl", "parquet"))
        check_choice("population", population, ("arena", "shifted"))
        for name, value, low in (("num_llms", num_llms, 2), ("comparisons_per_pair", comparisons_per_pair, 1),
                                 ("dim", dim, 2), ("batch_size", batch_size, 1), ("num_workers", num_workers, 0)):
            check_range(name, value, low=low, integer=True)  # fmt: skip
        check_range("holdout_llm", holdout_llm, low=0, integer=True, optional=True)
        check_range("val_fraction", val_fraction, 0, 1, high_open=True)
        check_range("test_fraction", test_fraction, 0, 1, high_open=True)
        if source != "arena" and not path:
            raise ValueError(f"PreferenceDataModule(source={source!r}) needs path, the file of comparisons.")
        if source != "arena" and population != "arena":
            raise ValueError(f"population={population!r} applies to source='arena' only; leave it at 'arena'.")
        if holdout_llm is not None and (holdout_llm < 0 or (source == "arena" and holdout_llm >= num_llms)):
            raise ValueError(f"Expected holdout_llm in [0, {num_llms}) or None, got {holdout_llm}.")
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(f"Expected val_fraction + test_fraction < 1, got {val_fraction} + {test_fraction}.")
        self.save_hyperparameters()
        self.llm_names: list[str] = []
        self.train_set = self.val_set = self.test_set = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        if hp.source == "arena":
            columns = make_tiny_arena(hp.num_llms, hp.comparisons_per_pair, hp.dim, hp.population, hp.seed)
            self.llm_names = [f"llm{k}" for k in range(hp.num_llms)]
        else:
            columns, self.llm_names = read_preference_rows(hp.path)
        data = PairwisePreferences(columns)
        rng = np.random.default_rng(hp.seed)
        if hp.holdout_llm is not None:
            k = hp.holdout_llm
            if k >= len(self.llm_names):
                raise ValueError(
                    f"holdout_llm={k}, but {hp.path} holds {len(self.llm_names)} models (ids 0..."
                    f"{len(self.llm_names) - 1}: {', '.join(self.llm_names)})."
                )
            involved = ((data.columns["llm_a"] == k) | (data.columns["llm_b"] == k)).numpy()
            pool = rng.permutation(np.nonzero(~involved)[0])
            n_val = int(round(hp.val_fraction * len(pool)))
            val_rows, train_rows = pool[:n_val], pool[n_val:]
            self.test_set = PairwisePreferences(data.oriented(k))
        else:
            perm = rng.permutation(len(data))
            n_val, n_test = (int(round(f * len(data))) for f in (hp.val_fraction, hp.test_fraction))
            test_rows, val_rows, train_rows = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
            self.test_set = PairwisePreferences(data.columns, np.sort(test_rows))
        train_rows = np.sort(train_rows)
        if hp.drop_ties_in_train:
            train_rows = train_rows[data.columns["z"][train_rows].numpy() != 0.5]
        self.train_set = PairwisePreferences(data.columns, train_rows)
        self.val_set = PairwisePreferences(data.columns, np.sort(val_rows))

    # ----------------------------------------------------------------------------------------------- evaluation
    def _split(self, split: str) -> PairwisePreferences:
        sets = {"train": "train_set", "val": "val_set", "test": "test_set"}
        if split not in sets:
            raise ValueError(f"Expected split to be 'train', 'val' or 'test', got {split!r}.")
        self.setup()
        return getattr(self, sets[split])

    def test_comparisons(self) -> dict[str, Tensor | list[str]]:
        """The whole test split as one batch (oriented with the held-out LLM as "A"), for win-rate evaluation."""
        return self._split("test").all()

    def pairs(self, split: Literal["train", "val", "test"] = "test") -> dict[tuple[int, int], Tensor]:
        """Row indices of each ordered pair ``(llm_a, llm_b)`` in ``split`` (rows of that split, in its order).

        With a held-out LLM k the test keys are ``(k, j)``; otherwise (A, B) and (B, A) are separate keys, as the
        card groups comparisons by ordered pair.
        """
        return self._split(split).pairs()

    @property
    def num_llms(self) -> int:
        return len(self.llm_names) if self.llm_names else self.hparams.num_llms

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        split = (
            f"leave-LLM-{hp.holdout_llm}-out"
            if hp.holdout_llm is not None
            else f"random split (val {hp.val_fraction}, test {hp.test_fraction})"
        )
        ties = "ties dropped in train" if hp.drop_ties_in_train else "ties kept"
        if hp.source == "arena":
            return (
                f"tiny arena (cv-winrate card §5 Part B): {hp.num_llms} LLMs, {hp.comparisons_per_pair} comparisons "
                f"per pair, dim {hp.dim}, {hp.population} population, {split}, {ties}, seed {hp.seed}"
            )
        return f"{hp.source} preferences from {hp.path}, {split}, {ties}, seed {hp.seed}"
