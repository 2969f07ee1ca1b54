"""``StreamDetector``, the base every SEAD detector subclasses, and the ring-buffer and band helpers they share.

The prequential contract (score with what was learnt so far, then learn) and the all-buffers state are described in
``zoo.models.sead.detectors``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


class StreamDetector(nn.Module):
    """Base of the pool: prequential ``score(x)`` then ``learn(x)`` on one point ``x`` of shape ``(dim,)``.

    Subclasses implement ``_score`` and ``_learn`` on a checked float32 row and keep all state in buffers.

    Args:
        dim: width d of the stream's rows.
        seed: seed of the detector's random structure (projections, hashes, trees, random scores).

    Raises:
        ValueError: ``dim < 1``; at ``score``/``learn`` a row of the wrong shape or with NaN/inf (raised before
            any state changes, so the detector stays usable).
    """

    name: str = ""

    def __init__(self, dim: int, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"{type(self).__name__} expects dim >= 1 (the stream's width), got {dim!r}.")
        self.dim = dim
        self._params: dict[str, Any] = {}
        # The seed travels in the state too, so load_state_dict restores seeded behaviour that is still to come
        # (RandomScorer's stream, HalfSpaceTrees' trees) even into a copy built with another seed.
        self.register_buffer("rng_seed", torch.tensor(int(seed), dtype=torch.long))

    @property
    def seed(self) -> int:
        """The detector's seed (read from the ``rng_seed`` buffer, so it follows ``load_state_dict``)."""
        return int(self.rng_seed)

    @property
    def config(self) -> dict[str, Any]:
        """``{"name": ..., "params": {...}}``, JSON-serialisable; ``build_detector(config, dim, seed)`` rebuilds it."""
        return {"name": self.name, "params": dict(self._params)}

    @property
    def max_chunk(self) -> int:
        """Most rows ``_process`` takes at once (bounds its ``(B, window + B, ...)`` work tensors)."""
        return 256

    def _check(self, x: Tensor, where: str, rows: bool = False) -> Tensor:
        shape = f"(B, {self.dim})" if rows else f"({self.dim},)"
        if not isinstance(x, Tensor):
            raise TypeError(
                f"{type(self).__name__}.{where} expects a torch.Tensor of shape {shape}, got {type(x).__name__}."
            )
        if (x.ndim != 2 or x.shape[1] != self.dim) if rows else x.shape != (self.dim,):
            what = "an ordered chunk" if rows else "one point"
            raise ValueError(
                f"{type(self).__name__}.{where} expects {what} of shape {shape}, got {tuple(x.shape)}. "
                "Feed rows with the width the pool was built for."
            )
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            if rows:
                row = int((~finite.all(1)).nonzero()[0])
                where, finite = f"{where} (row {row})", finite[row]
            bad = (~finite).nonzero().flatten().tolist()
            raise ValueError(
                f"{type(self).__name__}.{where} got NaN/inf at features {bad} of a row of width "
                f"{self.dim}. Impute or drop the row first; the detector state was not changed."
            )
        return x.to(dtype=torch.float32, device=self.rng_seed.device)

    def score(self, x: Tensor) -> Tensor:
        """Raw anomaly score of ``x`` (0-d, higher = more anomalous), computed from the state before learning x."""
        return self._process(self._check(x, "score").unsqueeze(0), learn=False)[0]

    def learn(self, x: Tensor) -> None:
        """Insert ``x`` into the detector's state."""
        self._process(self._check(x, "learn").unsqueeze(0), score=False)

    def score_learn(self, x: Tensor) -> Tensor:
        """One prequential step: score ``x``, then learn it; returns the score."""
        return self._process(self._check(x, "score_learn").unsqueeze(0))[0]

    def score_learn_chunk(self, X: Tensor) -> Tensor:
        """Prequential steps over an ordered chunk ``(B, dim)``: the same scores ``(B,)`` as B ``score_learn`` calls.

        Every row is checked before any state changes, so a rejected chunk leaves the detector as it was.
        """
        return score_learn_many([self], X)[:, 0]

    def forward(self, x: Tensor) -> Tensor:
        """``score_learn`` for one point ``(dim,)``, ``score_learn_chunk`` for a chunk ``(B, dim)``."""
        return self.score_learn_chunk(x) if isinstance(x, Tensor) and x.ndim == 2 else self.score_learn(x)

    def extra_repr(self) -> str:
        return ", ".join([f"dim={self.dim}", f"seed={self.seed}"] + [f"{k}={v}" for k, v in self._params.items()])

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:  # pragma: no cover - abstract
        """Score each row of ``X (B, d)`` by the state that has learnt the rows before it; then (``learn``) learn all.

        ``B <= max_chunk``. Returns ``(B,)`` (unspecified values where ``score=False``).
        """
        raise NotImplementedError

    @classmethod
    def _process_many(
        cls, detectors: list[StreamDetector], X: Tensor, score: bool = True, learn: bool = True
    ) -> Tensor:
        """``_process`` of several detectors of this class on the same rows, ``(B, len(detectors))``.

        One by one here; a family whose settings can share tensor ops (RS-Hash's count-min tables) overrides it.
        """
        return torch.stack([d._process(X, score, learn) for d in detectors], 1)


def score_learn_many(detectors: list[StreamDetector] | nn.ModuleList, X: Tensor) -> Tensor:
    """``score_learn_chunk`` of every detector on the ordered chunk ``X (B, dim)``: scores ``(B, len(detectors))``.

    Detectors of one class run together through ``_process_many``, so a family that stacks its settings (the four
    RS-Hash settings of ``paper_pool``) pays its per-op cost once, not once per setting. ``X`` is checked before any
    state changes.

    Example:
        >>> from zoo.models.sead.detectors import build_pool, paper_pool
        >>> pool = build_pool(paper_pool(3), dim=3)
        >>> score_learn_many(pool, torch.randn(300, 3)).shape
        torch.Size([300, 13])
    """
    detectors = list(detectors)
    X = detectors[0]._check(X, "score_learn_chunk", rows=True)
    if any(d.dim != detectors[0].dim for d in detectors):
        raise ValueError(f"score_learn_many expects detectors of one width, got {[d.dim for d in detectors]}.")
    families: dict[type, list[int]] = {}
    for i, d in enumerate(detectors):
        families.setdefault(type(d), []).append(i)
    out = X.new_zeros(len(X), len(detectors))
    for cls, members in families.items():
        group = [detectors[i] for i in members]
        step = min(d.max_chunk for d in group)
        for i in range(0, len(X), step):
            out[i : i + step, members] = cls._process_many(group, X[i : i + step]).to(out.dtype)
    return out


def _ordered(ring: Tensor, n: Tensor) -> Tensor:
    """A ring buffer's rows oldest first: slots ``n % W, ..., W - 1, 0, ..., n % W - 1`` (unfilled slots lead)."""
    W = ring.shape[0]
    return ring[(n + torch.arange(W, device=ring.device)) % W]


def _write_ring(ring: Tensor, n: Tensor, X: Tensor) -> None:
    """Write rows ``X`` at ring positions ``n, n + 1, ...`` (only the last W rows matter when ``len(X) > W``)."""
    W = ring.shape[0]
    tail = X[-W:]
    ring[(n + len(X) - len(tail) + torch.arange(len(tail), device=ring.device)) % W] = tail


def _band(B: int, W: int, device: torch.device) -> Tensor:
    """``(B, W + B)`` mask: row b of a chunk sees positions ``b .. b + W - 1`` of ``[ordered window; chunk]``."""
    pos = torch.arange(W + B, device=device)
    b = torch.arange(B, device=device).unsqueeze(1)
    return (pos >= b) & (pos < b + W)


def _positive_int(owner: str, name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner} expects {name} to be an int >= {minimum}, got {value!r}.")
    return value
