"""DNA sequences: the reward-refine card's synthetic "natural" DNA (a second-order Markov chain with an exact
likelihood), FASTA / CSV readers for real sequences, and the DataModule that serves either.

Tokens: ``A 0, C 1, G 2, T 3`` (``MASK`` is the denoiser's, not the data's). The chain's tables are drawn once from
``seed``: the first letter from a Dirichlet(0.5) vector, the second from Dirichlet(0.5) rows given the first, every
later letter from Dirichlet(0.5) rows given the previous two, so ``log p(x)`` of any sequence is exact and finite.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from zoo.datamodules.base import BatchedDataModule, TensorBatches

__all__ = ["ALPHABET", "MarkovDNA", "MarkovDNADataModule", "decode", "encode", "read_sequences"]

ALPHABET = "ACGT"
_CODE = np.full(256, -1, dtype=np.int64)
for _i, _c in enumerate(ALPHABET):
    _CODE[ord(_c)] = _CODE[ord(_c.lower())] = _i


def encode(sequences: str | list[str], where: str = "sequence") -> Tensor:
    """Letters to tokens ``(N, L)``; every sequence must have one length and only the letters A, C, G, T.

    Example:
        >>> encode(["ACGT", "ttga"])
        tensor([[0, 1, 2, 3],
                [3, 3, 2, 0]])
    """
    if isinstance(sequences, str):
        sequences = [sequences]
    if not sequences:
        raise ValueError(f"no {where}s given")
    lengths = {len(s) for s in sequences}
    if len(lengths) != 1:
        raise ValueError(f"every {where} must have one length, got lengths {sorted(lengths)[:6]}")
    rows = []
    for n, s in enumerate(sequences):
        codes = _CODE[np.frombuffer(s.encode("latin-1", errors="replace"), dtype=np.uint8)]
        if (codes < 0).any():
            bad = sorted({s[i] for i in np.flatnonzero(codes < 0)})
            raise ValueError(
                f"{where} {n} has letters outside the DNA alphabet {ALPHABET}: {bad} (at position "
                f"{int(np.flatnonzero(codes < 0)[0])}); remove or replace them (e.g. N) before encoding"
            )
        rows.append(codes)
    return torch.from_numpy(np.stack(rows))


def decode(tokens: Tensor) -> list[str]:
    """Tokens ``(N, L)`` (or ``(L,)``) to letters.

    Example:
        >>> decode(torch.tensor([[0, 1, 2, 3]]))
        ['ACGT']
    """
    tokens = tokens.reshape(-1, tokens.shape[-1]) if tokens.dim() else tokens.view(1, 1)
    if tokens.numel() and (tokens.min() < 0 or tokens.max() > 3):
        raise ValueError("tokens must be in 0..3 (A, C, G, T); unmask every position before decoding")
    letters = np.frombuffer(ALPHABET.encode(), dtype=np.uint8)[tokens.cpu().numpy()]
    return [row.tobytes().decode() for row in letters]


def read_sequences(path: str | Path, column: str = "sequence") -> tuple[list[str], dict[str, list[float]]]:
    """Sequences from a FASTA file (``.fa``, ``.fasta``, ``.fna``) or a CSV file with a ``column`` of sequences.

    Returns the sequences and, for a CSV, every other numeric column (e.g. a measured ``activity``) as floats.

    Example:
        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "x.fa")
        >>> _ = open(f, "w").write(">a\\nACG\\nT\\n>b\\nTTGA\\n")
        >>> read_sequences(f)
        (['ACGT', 'TTGA'], {})
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: give a FASTA file (>name lines, then the sequence) or a CSV file with a "
            f"{column!r} column (and optionally a numeric column such as 'activity')"
        )
    if path.suffix.lower() in (".fa", ".fasta", ".fna"):
        seqs: list[str] = []
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith(">"):
                seqs.append("")
            elif line:
                if not seqs:
                    raise ValueError(f"{path}: a FASTA file must start with a '>name' line")
                seqs[-1] += line
        return [s for s in seqs if s], {}
    if path.suffix.lower() in (".csv", ".tsv"):
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
        if not rows or column not in rows[0]:
            raise ValueError(f"{path}: no {column!r} column (columns: {sorted(rows[0]) if rows else []})")
        values: dict[str, list[float]] = {}
        for key in rows[0]:
            if key == column:
                continue
            try:
                values[key] = [float(r[key]) for r in rows]
            except (TypeError, ValueError):
                continue  # a text column (names, notes)
        return [r[column].strip() for r in rows], values
    raise ValueError(f"{path}: unknown format {path.suffix!r}; use .fa/.fasta/.fna or .csv/.tsv")


class MarkovDNA:
    """A second-order Markov chain over A, C, G, T with Dirichlet(``concentration``) rows: sampling and exact log p.

    Args:
        length: letters per sequence.
        concentration: the Dirichlet concentration of every row (0.5: peaked, so the chain has real structure).
        seed: seed of the tables.

    Example:
        >>> chain = MarkovDNA(length=32)
        >>> x = chain.sample(1000, generator=torch.Generator().manual_seed(0))
        >>> x.shape, bool(chain.log_prob(x).mean() / 32 > -math.log(4))
        (torch.Size([1000, 32]), True)
    """

    def __init__(self, length: int = 32, concentration: float = 0.5, seed: int = 0) -> None:
        if length < 3:
            raise ValueError(f"length must be ≥ 3, got {length}")
        rng = np.random.default_rng(seed)
        self.length = length
        self.first = torch.from_numpy(rng.dirichlet([concentration] * 4))
        self.second = torch.from_numpy(rng.dirichlet([concentration] * 4, size=4))  # [x0, x1]
        self.table = torch.from_numpy(rng.dirichlet([concentration] * 4, size=(4, 4)))  # [x_{t-2}, x_{t-1}, x_t]

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` sequences ``(n, length)``, all drawn together (one multinomial per position)."""
        out = torch.empty(n, self.length, dtype=torch.long)
        out[:, 0] = torch.multinomial(self.first, n, replacement=True, generator=generator)
        out[:, 1] = torch.multinomial(self.second[out[:, 0]], 1, generator=generator).squeeze(1)
        for t in range(2, self.length):
            out[:, t] = torch.multinomial(self.table[out[:, t - 2], out[:, t - 1]], 1, generator=generator).squeeze(1)
        return out

    def log_prob(self, x: Tensor) -> Tensor:
        """The exact ``log p(x)`` of each sequence ``(N,)`` (float64)."""
        if x.dim() != 2 or x.shape[1] != self.length:
            raise ValueError(f"expected sequences (N, {self.length}), got {tuple(x.shape)}")
        x = x.cpu().long()
        lp = self.first.log()[x[:, 0]] + self.second.log()[x[:, 0], x[:, 1]]
        return lp + self.table.log()[x[:, :-2], x[:, 1:-1], x[:, 2:]].sum(1)

    def entropy_rate(self) -> float:
        """The stationary entropy per letter of the second-order part (nats), for reference."""
        p = self.table.reshape(16, 4)
        trans = torch.zeros(16, 16, dtype=p.dtype)  # state (a, b) -> (b, c)
        for s in range(16):
            trans[s, (s % 4) * 4 : (s % 4) * 4 + 4] = p[s]
        pi = torch.full((16,), 1 / 16, dtype=p.dtype)
        for _ in range(500):
            pi = pi @ trans
        return float(-(pi[:, None] * p * p.clamp_min(1e-300).log()).sum())


class MarkovDNADataModule(BatchedDataModule):
    """Sequences of one length as ``(tokens,)`` batches: the card's Markov chain, or sequences read from a file.

    Args:
        length: letters per sequence (for a file, every sequence must have it).
        train_size: training sequences drawn from the chain.
        val_size: validation sequences.
        test_size: test sequences.
        batch_size: sequences per batch.
        num_workers: DataLoader workers.
        seed: seed of the sequences (and of a file's split).
        chain_seed: seed of the chain's tables (the "natural" distribution).
        path: a FASTA or CSV file of real sequences (e.g. enhancers) instead of the chain; split 90/5/5.

    Example:
        >>> dm = MarkovDNADataModule(train_size=256, batch_size=32)
        >>> dm.setup("fit")
        >>> next(iter(dm.train_dataloader()))[0].shape
        torch.Size([32, 32])
    """

    def __init__(
        self,
        length: int = 32,
        train_size: int = 64000,
        val_size: int = 1000,
        test_size: int = 1000,
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
        chain_seed: int = 0,
        path: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.chain = MarkovDNA(length, seed=chain_seed)

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        if hp.path:
            return f"{hp.path}: sequences of {hp.length} letters, split 90/5/5 (seed {hp.seed})"
        return (
            f"second-order Markov DNA of {hp.length} letters with Dirichlet(0.5) rows (chain seed {hp.chain_seed}): "
            f"{hp.train_size} training sequences, {hp.test_size} test (seed {hp.seed})"
        )

    def _file_splits(self) -> tuple[Tensor, Tensor, Tensor]:
        hp = self.hparams
        seqs, _ = read_sequences(hp.path)
        x = encode(seqs, where=f"{hp.path}: sequence")
        if x.shape[1] != hp.length:
            raise ValueError(f"{hp.path}: sequences have {x.shape[1]} letters, the DataModule's length is {hp.length}")
        if len(x) < 20:
            raise ValueError(f"{hp.path}: {len(x)} sequences; need at least 20 for a 90/5/5 split")
        x = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(hp.seed))]
        n_val = n_test = max(1, len(x) // 20)
        return x[n_val + n_test :], x[:n_val], x[n_val : n_val + n_test]

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        if hp.path:
            train, val, test = self._file_splits()
        else:
            g = torch.Generator().manual_seed(hp.seed)
            train, val, test = (self.chain.sample(n, generator=g) for n in (hp.train_size, hp.val_size, hp.test_size))
        self.train_set, self.val_set, self.test_set = TensorBatches(train), TensorBatches(val), TensorBatches(test)
