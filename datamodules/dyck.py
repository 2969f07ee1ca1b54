"""Dyck-2 strings of a fixed length: a vectorised generator and the exact process verifier (prefix acceptor).

Tokens: ``PAD 0, BOS 1, EOS 2, ( 3, ) 4, [ 5, ] 6``. A string is ``BOS``, exactly ``length`` brackets, ``EOS``.
The generator pushes a bracket of type ``(`` / ``[`` with ``type_probs`` and pops with probability ``pop_prob``; a
pop is forced when the depth reaches ``max_depth`` or equals the brackets left, a push when the stack is empty (the
official ``dyck.py`` rules). Every sequence is generated at once, one tensor operation per position.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BOS", "EOS", "PAD", "VOCAB", "DyckGrammar", "to_text"]

PAD, BOS, EOS = 0, 1, 2
OPEN = torch.tensor([3, 5])  # "(" and "["; the closer of an opener o is o + 1
VOCAB = 7
_CHARS = "_BE()[]"


def to_text(tokens: Tensor, length: int | None = None) -> str:
    """Readable form of one token sequence, e.g. ``B([])E``."""
    row = tokens.tolist()[: length if length is not None else len(tokens)]
    return "".join(_CHARS[t] for t in row)


class DyckGrammar:
    """Dyck-2 of ``length`` brackets: sampling, and the exact verifier of prefixes and complete strings.

    Args:
        length: brackets between BOS and EOS (even).
        max_depth: the generator's maximum depth (a property of the training distribution; the verifier does not
            enforce it, as in the official code).
        type_probs: probabilities of pushing ``(`` and ``[`` (training: (0.2, 0.8); out of distribution: flipped).
        pop_prob: probability of popping when neither move is forced.

    Example:
        >>> g = DyckGrammar(length=8, max_depth=4)
        >>> x = g.sample(3, generator=torch.Generator().manual_seed(0))
        >>> x.shape, bool(g.accept(x, torch.full((3,), 10)).all())
        (torch.Size([3, 10]), True)
    """

    def __init__(
        self, length: int = 24, max_depth: int = 8, type_probs: tuple[float, float] = (0.2, 0.8), pop_prob: float = 0.5
    ) -> None:
        if length < 2 or length % 2:
            raise ValueError(f"length must be an even number ≥ 2 of brackets, got {length}")
        if max_depth < 1:
            raise ValueError(f"max_depth must be ≥ 1, got {max_depth}")
        if len(type_probs) != 2 or min(type_probs) < 0 or abs(sum(type_probs) - 1) > 1e-6:
            raise ValueError(f"type_probs must be two probabilities summing to 1, got {type_probs}")
        self.length, self.max_depth, self.pop_prob = length, max_depth, pop_prob
        self.type_probs = torch.tensor(type_probs, dtype=torch.float)

    @property
    def seq_len(self) -> int:
        """Tokens in a complete string: BOS + brackets + EOS."""
        return self.length + 2

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` complete strings ``(n, length + 2)``, all generated together."""
        out = torch.empty(n, self.seq_len, dtype=torch.long)
        out[:, 0], out[:, -1] = BOS, EOS
        stack = torch.zeros(n, self.length + 1, dtype=torch.long)  # opener tokens, by depth
        depth = torch.zeros(n, dtype=torch.long)
        rows = torch.arange(n)
        for i in range(self.length):
            left = self.length - i
            forced_pop = (depth >= self.max_depth) | (depth >= left)
            forced_push = depth == 0
            pop = forced_pop | (~forced_push & (torch.rand(n, generator=generator) < self.pop_prob))
            kind = torch.multinomial(self.type_probs, n, replacement=True, generator=generator)
            opener = OPEN[kind]
            top = stack[rows, (depth - 1).clamp(min=0)]
            out[:, i + 1] = torch.where(pop, top + 1, opener)
            stack[rows, depth.clamp(max=self.length)] = torch.where(pop, stack[rows, depth], opener)
            depth = depth + torch.where(pop, -1, 1)
        return out

    def _scan(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(ok, depth): whether each prefix ``tokens[r, :lengths[r]]`` can still be completed, and its depth."""
        n, width = tokens.shape
        ok = torch.ones(n, dtype=torch.bool)
        depth = torch.zeros(n, dtype=torch.long)
        stack = torch.zeros(n, width + 1, dtype=torch.long)
        rows = torch.arange(n)
        for p in range(min(width, int(lengths.max()) if n else 0)):
            active = p < lengths
            t = tokens[:, p]
            if p == 0:
                ok &= ~active | (t == BOS)
                continue
            brackets_seen = p - 1  # brackets before position p
            is_open = (t == 3) | (t == 5)
            is_close = (t == 4) | (t == 6)
            is_eos = t == EOS
            top = stack[rows, (depth - 1).clamp(min=0)]
            close_ok = is_close & (depth > 0) & (t == top + 1)
            # After this token: brackets left = length − (brackets_seen + 1); the depth must fit in them.
            left_after = self.length - (brackets_seen + 1)
            open_ok = is_open & (brackets_seen < self.length) & (depth + 1 <= left_after)
            eos_ok = is_eos & (brackets_seen == self.length) & (depth == 0)
            step_ok = close_ok | open_ok | eos_ok
            ok &= ~active | step_ok
            push = active & open_ok
            stack[rows, depth.clamp(max=width)] = torch.where(push, t, stack[rows, depth.clamp(max=width)])
            depth = depth + (push.long() - (active & close_ok).long())
        return ok, depth

    def accept_prefix(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """The exact process verifier: True where ``tokens[r, :lengths[r]]`` extends to a valid string.

        A prefix fails on a wrong or unmatched closer, an opener the remaining length cannot close, EOS anywhere but
        after exactly ``length`` balanced brackets, a token after EOS, or no BOS first.
        """
        ok, _ = self._scan(tokens, lengths)
        return ok & (lengths <= self.seq_len)

    def accept(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """True where ``tokens[r, :lengths[r]]`` is a complete valid string (BOS, balanced brackets, EOS)."""
        ok, depth = self._scan(tokens, lengths)
        last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        return ok & (lengths == self.seq_len) & (last == EOS) & (depth == 0)
