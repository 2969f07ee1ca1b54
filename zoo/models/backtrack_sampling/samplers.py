"""Verifier-assisted samplers for any LM with the ``(tokens, lengths) -> (logits, hidden)`` interface of ``lm.py``.

Every sampler runs all rows (prompts × samples) together: each step is one batched LM call, one batched verifier
call and one batched draw; a backtrack only shortens a row. Each returns a :class:`Generation` with the LM queries
charged as in the paper (tokens generated, including the ones later erased), backtracks and verifier calls per row.
Every sampler is bounded: plain sampling by the length, backtracking by its quota, rejection by its attempts.

* :func:`generate` — plain / temperature / nucleus sampling, and with a ``verifier`` the paper's Algorithm 1
  (tokenwise rejection sampling with backtracking: check the prefix after each new token; when the verifier's
  P(error) ≥ τ, erase ``stride`` tokens (never into the prompt), spend one of ``quota`` backtracks, resample).
  Tokenwise rejection sampling is ``stride=1`` with ``forbid_repeat=False``.
* :func:`rejection_sample` — full-sequence rejection: redraw rows whose complete sample fails, up to ``max_attempts``.
* :func:`block_best_of_n` — per block of tokens, draw ``n`` continuations and keep the one the verifier scores
  lowest.

A verifier is ``verifier(tokens, lengths, hidden) -> P(error)`` ``(R,)`` in [0, 1]; ``hidden`` is the LM's last-layer
state at each row's last token (what a probe reads; an exact checker ignores it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Generation", "block_best_of_n", "draw", "generate", "rejection_sample"]

LM = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
Verifier = Callable[[Tensor, Tensor, Tensor], Tensor]
_HASH_MOD = (1 << 31) - 1


@dataclass
class Generation:
    """What a sampler returns, one row per sample: ``tokens[r, :lengths[r]]`` is the prompt and its completion."""

    tokens: Tensor
    lengths: Tensor
    prompt_lengths: Tensor
    queries: Tensor
    backtracks: Tensor
    verifier_calls: Tensor

    def completions(self) -> list[tuple[int, ...]]:
        """Each row's generated tokens (after the prompt), as tuples (for diversity counts)."""
        rows = self.tokens.tolist()
        return [tuple(r[p:n]) for r, p, n in zip(rows, self.prompt_lengths.tolist(), self.lengths.tolist())]


def draw(
    logits: Tensor, temperature: float = 1.0, top_p: float = 1.0, generator: torch.Generator | None = None
) -> Tensor:
    """One token per row from ``softmax(logits / temperature)`` restricted to the top-p nucleus (transformers'
    ``TopPLogitsWarper``); ``temperature=0`` is greedy."""
    if temperature == 0:
        return logits.argmax(-1)
    scores = logits.float() / temperature
    if top_p < 1.0:
        from transformers.generation.logits_process import TopPLogitsWarper

        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]


@functools.lru_cache(maxsize=8)
def _hash_powers(width: int) -> Tensor:
    """8191^i mod a 31-bit prime for i < width (each product stays far inside int64)."""
    powers = [1]
    for _ in range(width - 1):
        powers.append(powers[-1] * 8191 % _HASH_MOD)
    return torch.tensor(powers, dtype=torch.long)


def _prefix_hash(tokens: Tensor, lengths: Tensor) -> Tensor:
    """A key of each row's prefix: its polynomial hash mod p = 2³¹ − 1 and its length, packed one-to-one.

    The pair (hash, length) is packed exactly: ``hash · (width + 1) + length`` with ``length ≤ width``, in int64
    for any width below 2³². The hash itself is not exact: two different prefixes of the same length share it
    when their difference polynomial in the base 8191 vanishes mod p, odds of about 1/p ≈ 4.7·10⁻¹⁰ per pair for
    unrelated strings. A collision only makes forbid-repeat skip one backtrack it would have made.
    """
    width = tokens.shape[1]
    powers = _hash_powers(width)
    mask = torch.arange(width, device=tokens.device)[None, :] < lengths[:, None]
    mixed = ((tokens.long() + 1) * mask) % _HASH_MOD * powers.to(tokens.device) % _HASH_MOD
    return (mixed.sum(1) % _HASH_MOD) * (width + 1) + lengths


def _start(
    lm: LM, prompts: Tensor, prompt_lengths: Tensor, max_length: int, continuing: bool = False
) -> tuple[Tensor, Tensor]:
    if prompts.dim() != 2 or prompt_lengths.shape != prompts.shape[:1]:
        raise ValueError(f"prompts must be (R, P) token ids with (R,) lengths, got {tuple(prompts.shape)}")
    if len(prompts) == 0 or int(prompt_lengths.min()) < 1:
        raise ValueError("empty prompt: every row needs at least one token (e.g. BOS)")
    if not continuing and int(prompt_lengths.max()) >= max_length:
        raise ValueError(f"prompt of {int(prompt_lengths.max())} tokens leaves no room before max_length={max_length}")
    vocab = getattr(lm, "vocab_size", None) or getattr(getattr(lm, "lm", None), "vocab_size", None)
    used = prompts[torch.arange(prompts.shape[1], device=prompts.device)[None, :] < prompt_lengths[:, None]]
    if vocab is not None and (int(used.min()) < 0 or int(used.max()) >= vocab):
        raise ValueError(f"prompt tokens must be in [0, {vocab}), got {int(used.min())}…{int(used.max())}")
    tokens = torch.zeros(len(prompts), max_length, dtype=torch.long, device=prompts.device)
    width = min(prompts.shape[1], max_length)
    tokens[:, :width] = prompts[:, :width]
    return tokens, prompt_lengths.clone()


def generate(
    lm: LM,
    prompts: Tensor,
    prompt_lengths: Tensor,
    max_length: int,
    verifier: Verifier | None = None,
    quota: int = 4,
    stride: int = 4,
    threshold: float = 0.5,
    temperature: float = 1.0,
    top_p: float = 1.0,
    forbid_repeat: bool = True,
    redo_argmax: bool = False,
    final_check: bool = False,
    eos: int | None = None,
    generator: torch.Generator | None = None,
    check_prompt: bool = True,
    continuing: bool = False,
) -> Generation:
    """Sample completions to ``max_length`` tokens; with ``verifier``, backtrack on flagged prefixes (Algorithm 1).

    Args:
        lm: ``(tokens, lengths) -> (logits, hidden)``.
        prompts: ``(R, P)`` token ids (right-padded), one row per sample.
        prompt_lengths: ``(R,)`` prompt lengths (≥ 1).
        max_length: total tokens of a finished row (prompt + completion).
        verifier: ``(tokens, lengths, hidden) -> P(error)``; None: plain sampling.
        quota: backtracks allowed per row (Q; the paper's default 4).
        stride: tokens erased per backtrack (B; 4; never into the prompt). 1 is tokenwise rejection sampling.
        threshold: backtrack when P(error) ≥ τ.
        temperature: sampling temperature (0: greedy).
        top_p: nucleus mass.
        forbid_repeat: never backtrack twice from the same prefix (the intended rule; the official code's check never
            fires, which ``forbid_repeat=False`` reproduces: only the quota limits backtracking).
        redo_argmax: decode the ``b`` tokens after a backtrack greedily (an explicit form of the official option).
        final_check: also verify the finished row (the official loop never checks the last token).
        eos: stop a row at this token (None: every row runs to ``max_length``, as the official Dyck runs).
        generator: the random stream of the draws.
        check_prompt: raise if the verifier flags a prompt itself (no completion could pass, since backtracking never
            erases the prompt); turn it off for a learned verifier, whose false alarms on a prompt only spend quota.
        continuing: rows may already be complete (``max_length`` tokens); they are left as they are (the block
            samplers continue partly finished rows).
    """
    tokens, lengths = _start(lm, prompts, prompt_lengths, max_length, continuing)
    rows = torch.arange(len(tokens), device=tokens.device)
    zeros = torch.zeros(len(tokens), dtype=torch.long, device=tokens.device)
    queries, backtracks, calls, greedy_left = zeros.clone(), zeros.clone(), zeros.clone(), zeros.clone()
    visited = torch.full((len(tokens), max(quota, 1)), -1, dtype=torch.long, device=tokens.device)
    done = lengths >= max_length
    if verifier is not None and check_prompt:
        _, hidden = lm(tokens, lengths)
        flagged = verifier(tokens, lengths, hidden) >= threshold
        if bool(flagged.any()):
            bad = flagged.nonzero()[:, 0].tolist()
            raise ValueError(
                f"the verifier rejects the prompt itself in rows {bad[:10]}{' …' if len(bad) > 10 else ''}: "
                "backtracking never erases the prompt, so no completion can pass; fix the prompt or the verifier"
            )
    while True:
        while not bool(done.all()):
            logits, hidden = lm(tokens, lengths)
            generated = lengths - prompt_lengths
            if verifier is not None:
                check = ~done & (generated > 0) & (backtracks < quota)
                if bool(check.any()):
                    if _backtrack(verifier, tokens, lengths, hidden, check, generated, threshold, stride,
                                  forbid_repeat, visited, backtracks, queries, calls, greedy_left, redo_argmax):  # fmt: skip
                        logits, hidden = lm(tokens, lengths)  # the shortened rows' next-token logits
            x = draw(logits, temperature, top_p, generator)
            if redo_argmax:
                x = torch.where(greedy_left > 0, logits.argmax(-1), x)
            active = ~done
            position = lengths.clamp(max=max_length - 1)
            tokens[rows, position] = torch.where(active, x, tokens[rows, position])
            lengths = lengths + active.long()
            queries += active.long()
            greedy_left = (greedy_left - active.long()).clamp(min=0)
            done = _finished(tokens, lengths, prompt_lengths, max_length, eos)
        if verifier is None or not final_check:
            break
        _, hidden = lm(tokens, lengths)
        generated = lengths - prompt_lengths
        check = (generated > 0) & (backtracks < quota)
        if not bool(check.any()) or not _backtrack(verifier, tokens, lengths, hidden, check, generated, threshold,
                                                   stride, forbid_repeat, visited, backtracks, queries, calls,
                                                   greedy_left, redo_argmax):  # fmt: skip
            break
        done = _finished(tokens, lengths, prompt_lengths, max_length, eos)
    return Generation(tokens, lengths, prompt_lengths.clone(), queries, backtracks, calls)


def _finished(tokens: Tensor, lengths: Tensor, prompt_lengths: Tensor, max_length: int, eos: int | None) -> Tensor:
    """Rows at ``max_length`` or whose last generated token is ``eos`` (they stay finished on later steps)."""
    done = lengths >= max_length
    if eos is not None:
        last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        done |= (last == eos) & (lengths > prompt_lengths)
    return done


def _backtrack(
    verifier: Verifier,
    tokens: Tensor,
    lengths: Tensor,
    hidden: Tensor,
    check: Tensor,
    generated: Tensor,
    threshold: float,
    stride: int,
    forbid_repeat: bool,
    visited: Tensor,
    backtracks: Tensor,
    queries: Tensor,
    calls: Tensor,
    greedy_left: Tensor,
    redo_argmax: bool,
) -> bool:
    """Verify the rows in ``check``; shorten the flagged ones in place. Returns whether any row backtracked."""
    p_error = verifier(tokens, lengths, hidden)
    calls += check.long()
    back = check & (p_error >= threshold)
    if forbid_repeat:
        key = _prefix_hash(tokens, lengths)
        back &= ~(visited == key[:, None]).any(1)
    if not bool(back.any()):
        return False
    if forbid_repeat:
        slot = backtracks.clamp(max=visited.shape[1] - 1)
        rows = torch.arange(len(tokens), device=tokens.device)
        visited[rows, slot] = torch.where(back, key, visited[rows, slot])
    erase = torch.minimum(torch.full_like(generated, stride), generated) * back.long()
    lengths -= erase
    backtracks += back.long()
    if redo_argmax:
        greedy_left.copy_(torch.where(back, erase, greedy_left))
    # Erased tokens were generated and are already charged to `queries` (the paper's count: final + erased tokens).
    return True


def rejection_sample(
    lm: LM,
    prompts: Tensor,
    prompt_lengths: Tensor,
    max_length: int,
    accept: Callable[[Tensor, Tensor], Tensor],
    max_attempts: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos: int | None = None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Full-sequence rejection sampling: redraw the rows whose complete sample ``accept`` rejects, at most
    ``max_attempts`` draws per row; a row never accepted keeps its last draw (and every attempt's queries)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be ≥ 1, got {max_attempts}")
    result = generate(lm, prompts, prompt_lengths, max_length, None, temperature=temperature, top_p=top_p, eos=eos,
                      generator=generator)  # fmt: skip
    ok = accept(result.tokens, result.lengths)
    for _ in range(max_attempts - 1):
        pending = (~ok).nonzero()[:, 0]
        if len(pending) == 0:
            break
        again = generate(lm, prompts[pending], prompt_lengths[pending], max_length, None, temperature=temperature,
                         top_p=top_p, eos=eos, generator=generator)  # fmt: skip
        result.tokens[pending], result.lengths[pending] = again.tokens, again.lengths
        result.queries[pending] += again.queries
        ok[pending] = accept(again.tokens, again.lengths)
    return result


def block_best_of_n(
    lm: LM,
    prompts: Tensor,
    prompt_lengths: Tensor,
    max_length: int,
    verifier: Verifier,
    block: int = 6,
    n: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos: int | None = None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Block best-of-N: for each block of ``block`` tokens draw ``n`` continuations of every row and keep the one with
    the lowest verifier P(error) at its end (ties: the first). Charges ``n × block`` queries per block."""
    if block < 1 or n < 1:
        raise ValueError(f"block and n must be ≥ 1, got {block}, {n}")
    tokens, lengths = _start(lm, prompts, prompt_lengths, max_length)
    R = len(tokens)  # noqa: N806
    queries = torch.zeros(R, dtype=torch.long, device=tokens.device)
    calls = torch.zeros_like(queries)
    ended = torch.zeros(R, dtype=torch.bool, device=tokens.device)  # rows stopped at EOS keep their length
    while bool(((lengths < max_length) & ~ended).any()):
        stop = torch.where(ended, lengths, torch.clamp(lengths + block, max=max_length))
        wide = generate(lm, tokens.repeat_interleave(n, 0), lengths.repeat_interleave(n), int(stop.max()), None,
                        temperature=temperature, top_p=top_p, eos=eos, generator=generator, continuing=True)  # fmt: skip
        # Rows whose block ends before the widest: keep only their own block (lengths capped at their stop).
        cand_lengths = torch.minimum(wide.lengths, stop.repeat_interleave(n))
        cand = torch.zeros(R * n, max_length, dtype=torch.long, device=tokens.device)
        cand[:, : wide.tokens.shape[1]] = wide.tokens
        _, hidden = lm(cand, cand_lengths)
        score = verifier(cand, cand_lengths, hidden).view(R, n)
        best = score.argmin(1) + torch.arange(R, device=tokens.device) * n
        queries += (cand_lengths - lengths.repeat_interleave(n)).view(R, n).sum(1)
        calls += n * (stop > lengths).long()  # finished rows are carried along, not verified again
        tokens, lengths = cand[best], cand_lengths[best]
        if eos is not None:
            ended |= (tokens.gather(1, (lengths - 1)[:, None])[:, 0] == eos) & (lengths > prompt_lengths)
    zeros = torch.zeros_like(queries)
    return Generation(tokens, lengths, prompt_lengths.clone(), queries, zeros, calls)
