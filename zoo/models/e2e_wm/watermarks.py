"""Watermarks as Hugging Face ``LogitsProcessor``s, each with its detector: the learned E2E one, KGW and Unigram.

Every class here is a ``transformers.LogitsProcessor`` (``model.generate(..., logits_processor=[wm])`` works with
each) and has ``score(ids, lengths) -> (B,)``, higher = more likely watermarked, and ``p_value(scores, lengths)``.
KGW, Unigram and EXP are keyed: the key is an argument and recorded in ``config()``. KGW's and Unigram's scores are
z-scores of the green-token count, their p-values the exact binomial tail of that count (the normal approximation
flags 1.6 % of 6-token Unigram texts at a nominal 1 %); EXP's score is Aaronson's sum of −log(1 − r), its p-value
the exact Gamma tail over keys. Both are exact for independent tokens; real text repeats tokens and contexts, which
makes them somewhat anti-conservative for one key (on SynLang human text a nominal 1 % flags up to 6 % for one
Unigram key). E2E has no key: its detector is the trained decoder, its p-value an empirical one against the decoder's
scores on human text of the same length, kept with the weights.

KGW, Unigram and EXP are written here (about 40 lines each, as the card suggests) rather than taken from ``markllm``,
which loads Hugging Face models at construction and cannot run offline.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor

__all__ = ["E2ELogitsProcessor", "EXPWatermark", "KGWWatermark", "UnigramWatermark", "green_lists", "keyed_uniforms"]

_M = (1 << 31) - 1


def _mix(x: Tensor) -> Tensor:
    """A 64-bit integer mixer (splitmix64's finaliser, wrapping arithmetic): keyed pseudo-random numbers in batch."""
    x = x ^ (x >> 31)
    x = x * -4658895280553007687  # 0xBF58476D1CE4E5B9 as a signed int64
    x = x ^ (x >> 27)
    x = x * -7723592293110705685  # 0x94D049BB133111EB
    return (x ^ (x >> 33)) & _M


def green_lists(key: int, prev: Tensor, vocab_size: int, gamma: float) -> Tensor:
    """``(B, V)`` booleans: exactly ``round(γ·V)`` green tokens per row, a keyed permutation seeded by ``prev``
    ``(B,)`` (KGW's previous-token hash). Same key, same previous token, same list."""
    tokens = torch.arange(vocab_size, device=prev.device)
    h = _mix(_mix(prev.long()[:, None] * 1_000_003 + key) + tokens[None, :])
    rank = h.argsort(-1).argsort(-1)
    return rank < round(gamma * vocab_size)


def keyed_uniforms(key: int, prev: Tensor, vocab_size: int) -> Tensor:
    """``(B, V)`` pseudo-uniforms in (0, 1) seeded by the key and the previous token ``prev`` ``(B,)`` (EXP's r)."""
    tokens = torch.arange(vocab_size, device=prev.device)
    h = _mix(_mix(prev.long()[:, None] * 1_000_003 + key) + tokens[None, :] + 7_919)
    return (h.double() + 0.5) / (_M + 1)


def _z(green: Tensor, counted: Tensor, gamma: float) -> Tensor:
    n = counted.sum(-1).clamp_min(1)
    return ((green & counted).sum(-1) - gamma * n) / (n * gamma * (1 - gamma)).sqrt()


def _normal_sf(z: Tensor) -> Tensor:
    return 0.5 * torch.erfc(z.double() / math.sqrt(2)).to(z.dtype if z.is_floating_point() else torch.float)


def _mask(ids: Tensor, lengths: Tensor | None) -> Tensor:
    if ids.dim() != 2:
        raise ValueError(f"ids must be (B, L) token ids, got shape {tuple(ids.shape)}")
    if lengths is None:
        return torch.ones_like(ids, dtype=torch.bool)
    if lengths.shape != ids.shape[:1] or int(lengths.min()) < 1 or int(lengths.max()) > ids.shape[1]:
        raise ValueError(f"lengths must be ({len(ids)},) values in [1, {ids.shape[1]}] (the ids' width), got "
                         f"shape {tuple(lengths.shape)}, {int(lengths.min())}…{int(lengths.max())}")  # fmt: skip
    return torch.arange(ids.shape[1], device=ids.device)[None] < lengths.to(ids.device)[:, None]


class _Keyed(LogitsProcessor):
    def __init__(self, vocab_size: int, gamma: float = 0.5, delta: float = 2.0, key: int = 15485863) -> None:
        if not 0 < gamma < 1:
            raise ValueError(f"gamma must be in (0, 1), got {gamma}")
        self.vocab_size, self.gamma, self.delta, self.key = vocab_size, gamma, delta, int(key)

    def config(self) -> dict[str, Any]:
        """What a detector needs to reproduce the lists (record it beside the texts)."""
        return {"scheme": type(self).__name__, "vocab_size": self.vocab_size, "gamma": self.gamma,
                "delta": self.delta, "key": self.key}  # fmt: skip

    def _check(self, ids: Tensor, scores: Tensor | None = None) -> None:
        if scores is not None and scores.shape[-1] != self.vocab_size:
            raise ValueError(f"scores have {scores.shape[-1]} tokens, the watermark {self.vocab_size}: another LM?")
        if ids.dim() != 2 or 0 in ids.shape:
            raise ValueError(
                f"ids must be (B, L) token ids holding text, got shape {tuple(ids.shape)}: nothing to score"
            )
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.vocab_size}) of the watermark's vocabulary, got "
                             f"{int(ids.min())}…{int(ids.max())}: ids of another tokenizer?")  # fmt: skip

    def counted(self, lengths: Tensor) -> Tensor:
        """Tokens scored in texts of ``lengths`` tokens (KGW: all but the first, which has no predecessor)."""
        return lengths

    def p_value(self, scores: Tensor, lengths: Tensor) -> Tensor:
        """Exact one-sided p-value ``P(Binomial(n, γ) ≥ green count)`` of z-scores of texts of ``lengths`` tokens
        under no watermark (each scored token green with probability γ; repeated contexts are counted again, as in
        KGW's and MarkLLM's detectors)."""
        from scipy.stats import binom

        n = self.counted(lengths.to(scores.device)).clamp_min(1).double()
        green = (scores.double() * (n * self.gamma * (1 - self.gamma)).sqrt() + self.gamma * n).round()
        p = binom.sf(green.cpu().numpy() - 1, n.cpu().numpy(), self.gamma)
        return torch.as_tensor(p, dtype=torch.float32, device=scores.device)


class KGWWatermark(_Keyed):
    """KGW (Kirchenbauer et al., 2023): +δ on a green list of γ·V tokens seeded by the previous token and the key.

    Example:
        >>> wm = KGWWatermark(vocab_size=50, delta=100.0, key=1)
        >>> ids = torch.randint(0, 50, (2, 1))
        >>> for _ in range(30):
        ...     ids = torch.cat([ids, wm(ids, torch.zeros(2, 50)).argmax(-1, keepdim=True)], 1)
        >>> bool((wm.score(ids) > 4).all()), bool((wm.score(torch.randint(0, 50, (2, 31))).abs() < 4).all())
        (True, True)
    """

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self._check(input_ids, scores)
        green = green_lists(self.key, input_ids[:, -1], self.vocab_size, self.gamma)
        return scores + self.delta * green.to(scores.dtype)

    def counted(self, lengths: Tensor) -> Tensor:
        return lengths - 1

    def score(self, ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        """z-score of the green count over tokens 2… (each scored against its predecessor's list)."""
        self._check(ids)
        counted = _mask(ids, lengths)[:, 1:]
        b, length = ids.shape
        green = green_lists(self.key, ids[:, :-1].reshape(-1), self.vocab_size, self.gamma).view(b, length - 1, -1)
        hit = green.gather(-1, ids[:, 1:, None])[..., 0]
        return _z(hit, counted, self.gamma)


class UnigramWatermark(_Keyed):
    """Unigram (Zhao et al., 2024): one fixed green list of γ·V tokens from the key (robust to edits of context).

    Example:
        >>> wm = UnigramWatermark(vocab_size=50, delta=100.0)
        >>> ids = wm(torch.zeros(3, 1, dtype=torch.long), torch.randn(3, 50)).argmax(-1, keepdim=True).repeat(1, 20)
        >>> bool((wm.score(ids) > 4).all())
        True
    """

    def green(self, device: torch.device | None = None) -> Tensor:
        return green_lists(self.key, torch.zeros(1, dtype=torch.long, device=device), self.vocab_size, self.gamma)[0]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self._check(input_ids, scores)
        return scores + self.delta * self.green(scores.device).to(scores.dtype)

    def score(self, ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        """z-score of the green count over every token."""
        self._check(ids)
        return _z(self.green(ids.device)[ids], _mask(ids, lengths), self.gamma)


class EXPWatermark(_Keyed):
    """EXP (Aaronson, 2023): distortion-free Gumbel-max sampling, ``x_t = argmax_i log(r_i) / p_i`` with keyed
    uniforms ``r`` seeded by the previous token. Over keys each token is drawn from ``p`` exactly (no distortion).

    A context (previous token) already used earlier in the text is not watermarked again: the step samples ``p``
    plainly, and the detector skips it (with a one-token context, Gumbel-max alone falls into loops such as
    ``a b a b …`` once a context recurs, and repeated contexts would break the null). Detection sums
    ``S = Σ −log(1 − r_{x_t})`` over the n tokens with a fresh context, which is Gamma(n, 1) without the watermark;
    ``score`` is ``−log P(Gamma(n, 1) ≥ S)`` (comparable across lengths) and ``p_value`` its exact p-value.

    As a ``LogitsProcessor`` it leaves only the chosen token finite (any sampler then picks it). It applies the
    sampling temperature itself (``temperature``): Gumbel-max must see the distribution the user means to sample.

    Example:
        >>> wm = EXPWatermark(vocab_size=50, key=1)
        >>> ids = torch.randint(0, 50, (4, 1))
        >>> for _ in range(40):
        ...     ids = torch.cat([ids, torch.multinomial(wm(ids, torch.randn(4, 50)).softmax(-1), 1)], 1)
        >>> bool((wm.p_value(wm.score(ids), torch.full((4,), 41)) < 1e-4).all())
        True
    """

    def __init__(self, vocab_size: int, key: int = 15485863, temperature: float = 1.0) -> None:
        super().__init__(vocab_size, gamma=0.5, delta=0.0, key=key)
        self.temperature = temperature

    def config(self) -> dict[str, Any]:
        return {"scheme": "EXPWatermark", "vocab_size": self.vocab_size, "key": self.key,
                "temperature": self.temperature}  # fmt: skip

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self._check(input_ids, scores)
        p = (scores.double() / self.temperature).softmax(-1)
        r = keyed_uniforms(self.key, input_ids[:, -1], self.vocab_size)
        chosen = (r.log() / p).argmax(-1, keepdim=True)  # argmax r^(1/p): exactly a draw from p over keys
        marked = torch.full_like(scores, float("-inf")).scatter(-1, chosen, 0.0)
        repeated = (input_ids[:, :-1] == input_ids[:, -1:]).any(-1, keepdim=True)
        return torch.where(repeated, scores, marked)

    def scored(self, ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``(B, L − 1)``: token i + 1 is scored when its context, token i, is within the text and occurs nowhere
        before position i."""
        eq = ids[:, :-1, None] == ids[:, None, :-1]
        seen = (eq & torch.ones_like(eq[0]).tril(-1)).any(-1)
        return _mask(ids, lengths)[:, 1:] & ~seen

    def score(self, ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``−log`` of the exact p-value of Aaronson's sum over the tokens with a fresh context."""
        self._check(ids)
        counted = self.scored(ids, lengths)
        b, length = ids.shape
        r = keyed_uniforms(self.key, ids[:, :-1].reshape(-1), self.vocab_size).view(b, length - 1, -1)
        total = (-(-r.gather(-1, ids[:, 1:, None])[..., 0]).log1p() * counted).sum(-1)
        n = counted.sum(-1).double()
        p = torch.where(n > 0, torch.special.gammaincc(n.clamp_min(1), total), torch.ones_like(total))
        return (-p.clamp_min(1e-300).log()).float()

    def p_value(self, scores: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The exact p-value ``P(Gamma(n, 1) ≥ S)`` (``lengths`` unused: the score already accounts for n)."""
        return (-scores.double()).exp().float()


class E2ELogitsProcessor(LogitsProcessor):
    """The trained encoder at generation time: once the input has ``window − 1`` tokens, each step's top-k logits get
    ``±δ`` from the context (the card's inference; a failure raises rather than leaving text unwatermarked).

    Build it with :meth:`E2EWatermark.logits_processor`; ``embedding`` is the encoder's LM's input table.
    """

    def __init__(self, encoder: torch.nn.Module, embedding: Tensor) -> None:
        self.encoder, self.embedding = encoder, embedding

    @torch.no_grad()
    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        w = self.encoder.window
        if scores.shape[-1] != self.embedding.shape[0]:
            raise ValueError(f"scores have {scores.shape[-1]} tokens, the encoder's LM {self.embedding.shape[0]}: "
                             "the E2E watermark runs on the LM (tokenizer) it was trained with")  # fmt: skip
        if input_ids.shape[1] < w - 1:
            return scores  # too little context yet (the official processor starts at the window's length too)
        ctx = self.embedding[input_ids[:, input_ids.shape[1] - (w - 1) :]]
        return self.encoder(scores, ctx.to(self.embedding.dtype), self.embedding).to(scores.dtype)
