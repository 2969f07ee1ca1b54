"""Generation through the frozen LM: differentiable (Gumbel-softmax mixtures, training) and hard (evaluation).

``generator`` is anything with the soft-input interface of :mod:`zoo.models.e2e_wm.lm` (``embedding``, ``begin``,
``step``, ``last_hidden``). Every loop is batched over rows: one LM call per generated position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

__all__ = [
    "differentiable_generate",
    "gumbel_mix",
    "online_paraphrase",
    "online_semantic",
    "sample",
    "soft_synonym_swap",
]

Perturb = Callable[[Tensor, Tensor], Tensor]  # (logits (B, V), context embeddings (B, w − 1, d)) -> logits


def gumbel_mix(
    logits: Tensor,
    tau: float,
    hard_weight: float = 0.5,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """``hard_weight·onehot(argmax y) + (1 − hard_weight)·y``, ``y = GumbelSoftmax(log_softmax(logits/T), τ)``.

    The card's soft/hard mix (0.5/0.5): the hard half has no gradient, the soft half carries it. ``(B, V)``.

    Example:
        >>> m = gumbel_mix(torch.randn(3, 10), tau=0.5, generator=torch.Generator().manual_seed(0))
        >>> torch.allclose(m.sum(-1), torch.ones(3)), bool((m.max(-1).values >= 0.5).all())
        (True, True)
    """
    # Drawn on the logits' device (no host-to-device copy per generated token) unless a CPU generator is given.
    device = logits.device if generator is None else generator.device
    u = torch.rand(logits.shape, generator=generator, device=device).to(logits.device).clamp(1e-10, 1 - 1e-7)
    g = -(-u.log()).log()
    y = ((logits.float() / temperature).log_softmax(-1) + g).div(tau).softmax(-1)
    hard = nn.functional.one_hot(y.argmax(-1), y.shape[-1]).to(y.dtype)
    return hard_weight * hard + (1 - hard_weight) * y


def differentiable_generate(
    generator: Any,
    prompt_embeds: Tensor,
    n_new: int,
    perturb: Perturb | None,
    window: int,
    tau: float = 0.5,
    hard_weight: float = 0.5,
    temperature: float = 1.0,
    rng: torch.Generator | None = None,
    context: Literal["hard", "soft"] = "hard",
) -> Tensor:
    """``n_new`` mixture vectors ``(B, n_new, V)`` after equal-length prompts ``(B, P, d)``.

    The LM runs under ``no_grad`` (the card: no gradient flows back through the autoregressive chain) and the encoder
    ``perturb`` sees the last ``window − 1`` tokens. ``context="hard"`` (the official ``llm_forward``) embeds the tokens
    kept, the argmax of each mixture, without gradient: the encoder's parameters reach step t's mixture only through
    step t's own perturbation, and training sees the context :class:`E2ELogitsProcessor` sees at inference.
    ``context="soft"`` feeds the mixtures times the table with their gradients (a zoo variant: earlier steps'
    perturbations then also reach step t through its context). ``perturb=None`` is the unwatermarked branch.

    Example:
        >>> from zoo.models.e2e_wm.lm import GRULM
        >>> lm = GRULM(20, 8, 16).eval()
        >>> enc = lambda logits, ctx: logits + ctx.sum((1, 2))[:, None]  # any (logits, context) -> logits
        >>> differentiable_generate(lm, lm.embedding[torch.zeros(2, 3, dtype=torch.long)], 5, enc, window=3).shape
        torch.Size([2, 5, 20])
    """
    if context not in ("hard", "soft"):
        raise ValueError(f"context must be 'hard' (the official code's) or 'soft', got {context!r}")
    E = generator.embedding
    if perturb is not None and prompt_embeds.shape[1] < window - 1:
        raise ValueError(f"prompts of {prompt_embeds.shape[1]} tokens are shorter than the encoder's context "
                         f"({window - 1} tokens)")  # fmt: skip
    with torch.no_grad():
        logits, state = generator.begin(prompt_embeds)
    recent = list(prompt_embeds[:, -(window - 1) :].detach().unbind(1)) if window > 1 else []
    mixes = []
    for _ in range(n_new):
        if perturb is not None:
            ctx = torch.stack(recent, 1) if recent else prompt_embeds[:, :0]
            logits = perturb(logits, ctx)
        m = gumbel_mix(logits, tau, hard_weight, temperature, rng)
        mixes.append(m)
        emb = m.to(E.dtype) @ E
        if window > 1:
            recent = recent[1:] + [E[m.detach().argmax(-1)] if context == "hard" else emb]
        with torch.no_grad():
            logits, state = generator.step(emb, state)
    return torch.stack(mixes, 1)


@torch.no_grad()
def sample(
    generator: Any,
    prompts: Tensor,
    n_new: int,
    processors: Sequence[Callable[[Tensor, Tensor], Tensor]] = (),
    temperature: float = 1.0,
    rng: torch.Generator | None = None,
    return_kl: bool = False,
    suppress: Sequence[int] = (),
) -> Tensor | tuple[Tensor, Tensor]:
    """Ancestral sampling of ``n_new`` tokens after ``prompts`` ``(B, P)``: ``(B, P + n_new)`` ids.

    ``processors`` are Hugging Face ``LogitsProcessor``-style callables ``(input_ids, scores) -> scores`` applied in
    order at every step (the watermarks), then the temperature (as ``generate`` applies warpers after processors).
    With ``return_kl`` also the watermark's distortion per row ``(B,)``: the mean over steps of KL(q ‖ p) between the
    distribution sampled (q, after the processors) and the LM's own (p), in nats. ``suppress``: token ids the LM
    never emits (PAD, BOS: as Hugging Face's ``suppress_tokens``), masked before the processors; p is then the LM's
    distribution over the other tokens.
    """
    E = generator.embedding
    logits, state = generator.begin(E[prompts])
    ids, kl = prompts, torch.zeros(len(prompts), device=prompts.device)
    banned = torch.zeros(E.shape[0], dtype=torch.bool, device=prompts.device)
    banned[list(suppress)] = True
    for _ in range(n_new):
        logits = logits.float().masked_fill(banned, float("-inf"))
        scores = logits
        for proc in processors:
            scores = proc(ids, scores)
        log_q = (scores / temperature).log_softmax(-1)
        if return_kl:
            q, log_p = log_q.exp(), (logits.float() / temperature).log_softmax(-1)
            kl += torch.where(q > 0, q * (log_q - log_p), 0.0).sum(-1)  # 0·log 0 = 0 (a processor may mask tokens)
        probs = log_q.exp()
        nxt = torch.multinomial(probs.cpu() if rng is not None else probs, 1, generator=rng).to(ids.device)
        ids = torch.cat([ids, nxt], 1)
        logits, state = generator.step(E[nxt[:, 0]], state)
    return (ids, kl / max(n_new, 1)) if return_kl else ids


def soft_synonym_swap(mixes: Tensor, synonym_average: Tensor, p: float, rng: torch.Generator | None = None) -> Tensor:
    """The toy noise layer: ``(1 − m)⊙x + m⊙(x·S)`` with a Bernoulli(``p``) position mask m (card §5).

    ``mixes`` are vocabulary-space vectors ``(B, T, V)``; ``S`` ``(V, V)`` averages each row within its synonym block
    (a mean-field surrogate of replacing the token by a random synonym), so gradients pass through.
    """
    device = mixes.device if rng is None else rng.device
    m = (torch.rand(mixes.shape[:2], generator=rng, device=device) < p).to(mixes.device, mixes.dtype)[..., None]
    return (1 - m) * mixes + m * (mixes @ synonym_average.to(mixes))


def online_semantic(generator: Any, before: Tensor, text_embeds: Tensor, after: Tensor) -> Tensor:
    """Online prompting for meaning: the last hidden state of ``before ‖ text ‖ after`` ``(B, D)``, differentiable in
    ``text_embeds`` ``(B, T, d)`` (``before``/``after``: template token ids, e.g. ``This sentence : "`` and
    ``" means in one word:"``)."""
    E = generator.embedding
    b = len(text_embeds)
    seq = torch.cat([E[before].expand(b, -1, -1), text_embeds.to(E.dtype), E[after].expand(b, -1, -1)], 1)
    return generator.last_hidden(seq)


def online_paraphrase(generator: Any, before: Tensor, text_embeds: Tensor, after: Tensor, n_new: int,
                      hard_weight: float = 0.5) -> Tensor:  # fmt: skip
    """The paraphrase noise layer: prompt the frozen LM to rewrite ``text_embeds`` and generate ``n_new`` mixtures
    ``(B, n_new, V)`` by greedy mixing ``hard_weight·onehot(argmax ℓ) + (1 − hard_weight)·softmax(ℓ)`` (no Gumbel
    noise). As in the official code only the last step's LM forward keeps gradients (to the whole input)."""
    E = generator.embedding
    b = len(text_embeds)
    seq = torch.cat([E[before].expand(b, -1, -1), text_embeds.to(E.dtype), E[after].expand(b, -1, -1)], 1)
    mixes = []

    def mix(logits: Tensor) -> Tensor:
        p = logits.float().softmax(-1)
        return hard_weight * nn.functional.one_hot(p.argmax(-1), p.shape[-1]).to(p) + (1 - hard_weight) * p

    with torch.no_grad():
        logits, state = generator.begin(seq)
        for _ in range(n_new - 1):
            mixes.append(mix(logits))
            logits, state = generator.step(mixes[-1].to(E.dtype) @ E, state)
    generated = torch.stack(mixes, 1).to(E.dtype) @ E if mixes else seq[:, :0]
    last = generator.begin(torch.cat([seq, generated], 1))[0]  # the one forward with gradients
    return torch.cat([torch.stack(mixes, 1), mix(last)[:, None]], 1) if mixes else mix(last)[:, None]
