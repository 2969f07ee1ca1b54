"""SynLang: a synthetic language with a known generative process (meaning classes with synonyms), and its DataModule.

The e2e-wm card's §5 language. ``n_classes`` meaning classes × ``n_synonyms`` surface tokens each, plus PAD and BOS.
The class sequence is a first-order Markov chain (each class has ``n_successors`` allowed successors with
Dirichlet(1) probabilities), each class emits one of its synonyms with Dirichlet(2) probabilities, both drawn once
from ``seed``. A transition outside the allowed successors keeps probability ``smoothing / n_classes`` so that the
exact log-likelihood of *any* text is finite (a watermark may pick a token the chain never would). The meaning of a
text is its class sequence; replacing a token by another synonym of its class keeps it exactly.

Tokens: ``PAD 0, BOS 1``, then ``2 + class · n_synonyms + synonym``. As text, a token is the word ``w<class><letter>``
(``w07b``: class 7, synonym b), words separated by spaces.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import torch
from torch import Tensor

from zoo.datamodules.base import BatchedDataModule, TensorBatches

__all__ = ["BOS", "PAD", "SynLang", "SynLangDataModule"]

PAD, BOS = 0, 1
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _dirichlet(shape: tuple[int, ...], concentration: int, generator: torch.Generator) -> Tensor:
    # Gamma(k, 1) for integer k is a sum of k standard exponentials: a seeded Dirichlet without torch.distributions
    # (which takes no generator).
    u = torch.rand(*shape, concentration, generator=generator, dtype=torch.float64).clamp_min(1e-300)
    g = -u.log().sum(-1)
    return g / g.sum(-1, keepdim=True)


class SynLang:
    """The synthetic language: sampling, the exact per-token NLL, synonym structure, and a text form.

    Args:
        n_classes: meaning classes.
        n_synonyms: surface tokens per class (at most 26).
        n_successors: allowed successor classes per class.
        smoothing: probability mass spread uniformly over all classes at every transition.
        seed: seed of the transition and synonym tables.

    Example:
        >>> lang = SynLang()
        >>> x = lang.sample(4, 10, generator=torch.Generator().manual_seed(0))
        >>> x.shape, lang.vocab_size, bool((x[:, 0] == BOS).all())
        (torch.Size([4, 10]), 98, True)
        >>> lang.from_text(lang.to_text(x[0])) == x[0, 1:].tolist()
        True
        >>> bool((lang.class_of(lang.swap_synonyms(x, 1.0, torch.Generator().manual_seed(1))) == lang.class_of(x)).all())
        True
    """

    def __init__(
        self, n_classes: int = 24, n_synonyms: int = 4, n_successors: int = 6, smoothing: float = 0.01, seed: int = 0
    ) -> None:
        if not 1 <= n_synonyms <= len(_LETTERS):
            raise ValueError(f"n_synonyms must be in [1, {len(_LETTERS)}], got {n_synonyms}")
        if not 1 <= n_successors <= n_classes:
            raise ValueError(f"n_successors must be in [1, n_classes={n_classes}], got {n_successors}")
        self.n_classes, self.n_synonyms, self.seed = n_classes, n_synonyms, seed
        g = torch.Generator().manual_seed(seed)
        allowed = torch.zeros(n_classes, n_classes, dtype=torch.float64)
        for c in range(n_classes):
            successors = torch.randperm(n_classes, generator=g)[:n_successors]
            allowed[c, successors] = _dirichlet((n_successors,), 1, g)
        self.transition = ((1 - smoothing) * allowed + smoothing / n_classes).float()  # (C, C), rows sum to 1
        self.initial = torch.full((n_classes,), 1.0 / n_classes)
        self.emission = _dirichlet((n_classes, n_synonyms), 2, g).float()  # (C, S)
        self._words = [f"w{c:02d}{_LETTERS[j]}" for c in range(n_classes) for j in range(n_synonyms)]
        self._ids = {w: i + 2 for i, w in enumerate(self._words)}

    @property
    def vocab_size(self) -> int:
        return 2 + self.n_classes * self.n_synonyms

    def sample(self, n: int, length: int, generator: torch.Generator | None = None) -> Tensor:
        """``(n, length)`` sequences: BOS, then ``length − 1`` tokens of the process, one batched draw per position."""
        classes = torch.multinomial(self.initial.expand(n, -1), 1, generator=generator)[:, 0]
        out = [torch.full((n,), BOS)]
        for t in range(length - 1):
            if t:
                classes = torch.multinomial(self.transition[classes], 1, generator=generator)[:, 0]
            synonym = torch.multinomial(self.emission[classes], 1, generator=generator)[:, 0]
            out.append(2 + classes * self.n_synonyms + synonym)
        return torch.stack(out, 1)

    def _check(self, tokens: Tensor) -> None:
        if tokens.dtype != torch.long:
            raise TypeError(f"tokens must be integer ids (torch.long), got {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"token ids must be in [0, {self.vocab_size}) for this SynLang, got {int(tokens.min())}…"
                f"{int(tokens.max())}: ids of another tokenizer?"
            )

    def class_of(self, tokens: Tensor) -> Tensor:
        """Each token's class (−1 for PAD and BOS)."""
        self._check(tokens)
        return torch.where(tokens >= 2, (tokens - 2) // self.n_synonyms, -1)

    def membership(self) -> Tensor:
        """``(V, n_classes)`` token → class indicator (zero rows for PAD and BOS)."""
        m = torch.zeros(self.vocab_size, self.n_classes)
        ids = torch.arange(2, self.vocab_size)
        m[ids, (ids - 2) // self.n_synonyms] = 1.0
        return m

    def synonym_average(self) -> Tensor:
        """``(V, V)`` row-stochastic S: a content token's row averages its class's synonyms; PAD and BOS map to
        themselves. ``x · S`` is the card's mean-field synonym swap of a vocabulary-space vector ``x``."""
        m = self.membership()
        s = m @ m.T / self.n_synonyms
        s[PAD, PAD] = s[BOS, BOS] = 1.0
        return s

    def swap_synonyms(self, tokens: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
        """The attack: each content token, with probability ``p``, becomes a uniformly random *different* synonym."""
        self._check(tokens)
        content = tokens >= 2
        swap = (torch.rand(tokens.shape, generator=generator) < p).to(tokens.device) & content
        shift = torch.randint(1, max(self.n_synonyms, 2), tokens.shape, generator=generator).to(tokens.device)
        if self.n_synonyms == 1:
            return tokens.clone()
        base, j = (tokens - 2).div(self.n_synonyms, rounding_mode="floor"), (tokens - 2) % self.n_synonyms
        swapped = 2 + base * self.n_synonyms + (j + shift) % self.n_synonyms
        return torch.where(swap, swapped, tokens)

    def nll(self, tokens: Tensor, start: int = 1) -> Tensor:
        """Exact NLL (nats) of every token at positions ``≥ start`` given what precedes it: ``(B, L − start)``.

        Position 1 (the first token after BOS) uses the uniform initial distribution; tokens must be content tokens.
        """
        classes = self.class_of(tokens)
        if start < 1 or bool((classes[:, start:] < 0).any()):
            raise ValueError("nll scores content tokens after BOS: start ≥ 1 and no PAD or BOS at positions ≥ start")
        c, j = classes[:, start:], (tokens[:, start:] - 2) % self.n_synonyms
        emission = -self.emission.to(tokens.device)[c, j].log()
        prev = classes[:, start - 1 : -1]
        trans = self.transition.to(tokens.device)
        step = torch.where(prev >= 0, -trans[prev.clamp_min(0), c].log(), -self.initial.to(tokens.device)[c].log())
        return emission + step

    def entropy_rate(self) -> float:
        """The process's stationary entropy per token (nats): the floor of any model's NLL."""
        t = self.transition.double()
        evals, evecs = torch.linalg.eig(t.T)
        pi = evecs[:, evals.real.argmax()].real
        pi = pi / pi.sum()
        e = self.emission.double()
        h_class = -(t * t.log()).sum(1)
        h_syn = -(e * e.log()).sum(1)
        return float((pi * (h_class + h_syn)).sum())

    def to_text(self, tokens: Tensor) -> str:
        """One sequence as words (PAD and BOS dropped)."""
        self._check(tokens)
        return " ".join(self._words[t - 2] for t in tokens.tolist() if t >= 2)

    def from_text(self, text: str) -> list[int]:
        """Token ids of a text of SynLang words; an unknown word is an error naming the closest words."""
        words = text.split()
        if not words:
            raise ValueError("empty text: nothing to score")
        ids = []
        for i, w in enumerate(words):
            if w not in self._ids:
                close = difflib.get_close_matches(w, self._words, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ValueError(
                    f"word {i} {w!r} is not a SynLang word (w<class><letter>, e.g. w07b){hint} This detector reads "
                    "text of its own LM's tokenizer."
                )
            ids.append(self._ids[w])
        return ids


def _read_texts(path: Path) -> list[str]:
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: give a .txt file (one document per line) or a .jsonl file with a 'text' field, e.g. "
            "WikiText-103 or C4 documents"
        )
    if path.suffix == ".jsonl":
        texts = []
        for n, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                row = json.loads(line)
                if "text" not in row:
                    raise ValueError(f"{path}:{n + 1}: a .jsonl row needs a 'text' field, got {sorted(row)}")
                texts.append(row["text"])
        return texts
    return [t for t in path.read_text().splitlines() if t.strip()]


class SynLangDataModule(BatchedDataModule):
    """Sequences of SynLang (the embedded default) or of a user's documents tokenized by a Hugging Face tokenizer.

    Every batch is ``(tokens,)``, ``(B, seq_len)``: for SynLang, BOS then ``seq_len − 1`` tokens of the process;
    for documents, the first ``seq_len`` tokens of each document long enough (shorter ones are dropped, as the card's
    "≥ 100 tokens" filter). The LM trains on whole sequences; the watermark takes their first tokens as prompts and
    the rest as human-written negatives.

    Args:
        seq_len: tokens per sequence.
        train_size / val_size / test_size: SynLang sequences per split (documents: the split sizes are the first
            ``val_size`` and ``test_size`` documents held out, the rest trains).
        batch_size: sequences per batch.
        num_workers: DataLoader workers.
        seed: seed of the sequences.
        language_seed: seed of the language's tables.
        texts: a .txt (one document per line) or .jsonl (``text`` field) file; ``None`` for SynLang.
        tokenizer: a Hugging Face tokenizer name or folder (with ``texts``).

    Example:
        >>> dm = SynLangDataModule(train_size=128, batch_size=32)
        >>> dm.setup("fit")
        >>> next(iter(dm.train_dataloader()))[0].shape
        torch.Size([32, 40])
    """

    def __init__(
        self,
        seq_len: int = 40,
        train_size: int = 20000,
        val_size: int = 1000,
        test_size: int = 500,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        language_seed: int = 0,
        texts: str | None = None,
        tokenizer: str | None = None,
    ) -> None:
        super().__init__()
        if (texts is None) != (tokenizer is None):
            raise ValueError("give both `texts` (a document file) and `tokenizer` (its Hugging Face tokenizer), or neither")
        self.save_hyperparameters()
        self.language = SynLang(seed=language_seed)

    def _documents(self) -> Tensor:
        from transformers import AutoTokenizer

        hp = self.hparams
        tok = AutoTokenizer.from_pretrained(hp.tokenizer)
        rows = [ids[: hp.seq_len] for ids in tok(_read_texts(Path(hp.texts)), add_special_tokens=False)["input_ids"]]
        rows = [r for r in rows if len(r) >= hp.seq_len]
        if len(rows) <= hp.val_size + hp.test_size:
            raise ValueError(
                f"{hp.texts}: {len(rows)} documents have ≥ {hp.seq_len} tokens, fewer than val_size + test_size + 1 = "
                f"{hp.val_size + hp.test_size + 1}"
            )
        return torch.tensor(rows, dtype=torch.long)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        if hp.texts is not None:
            docs = self._documents()
            val, test = docs[: hp.val_size], docs[hp.val_size : hp.val_size + hp.test_size]
            self.train_set = TensorBatches(docs[hp.val_size + hp.test_size :])
            self.val_set, self.test_set = TensorBatches(val), TensorBatches(test)
            return
        g = torch.Generator().manual_seed(hp.seed)
        self.train_set = TensorBatches(self.language.sample(hp.train_size, hp.seq_len, g))
        self.val_set = TensorBatches(self.language.sample(hp.val_size, hp.seq_len, g))
        self.test_set = TensorBatches(self.language.sample(hp.test_size, hp.seq_len, g))

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        if hp.texts is not None:
            return f"documents of {hp.texts} tokenized by {hp.tokenizer}, first {hp.seq_len} tokens"
        lang = self.language
        return (
            f"SynLang ({lang.n_classes} meaning classes × {lang.n_synonyms} synonyms, language seed {lang.seed}): "
            f"{hp.train_size} training sequences of {hp.seq_len} tokens, {hp.test_size} test (seed {hp.seed})"
        )
