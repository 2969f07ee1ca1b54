"""Linguistic parsing for the prompt regularisation: the noun phrases of an expression, each with its head noun and
its modifiers (card §2.1). One interface, two parsers: spaCy's dependency parse where an English model is installed
(the paper uses Vicuna-7B and compares spaCy in its appendix), and a rule parser for the toy grammar.

Offline, only ``RuleParser`` works: spaCy ships no English model, the zoo's ``[grounding]`` extra installs spaCy but
none, and no model can be downloaded without internet (``python -m spacy download en_core_web_sm`` needs it). The rule
parser knows only the nouns and adjectives it is given (a closed vocabulary): on free-form expressions (RefCOCO) it
finds the phrases whose words it lists and nothing else.

A parse returns word indices (the caption split on whitespace); the pipeline maps words to token positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Parser", "Phrase", "RuleParser", "SpacyParser", "get_parser"]


@dataclass(frozen=True)
class Phrase:
    """A noun phrase: the word index of its head noun and of its modifiers (``amod`` / ``compound``)."""

    noun: int
    modifiers: tuple[int, ...] = field(default_factory=tuple)
    text: str = ""


class Parser(Protocol):
    def __call__(self, caption: str) -> list[Phrase]: ...


class RuleParser:
    """The toy grammar's parser: every run of adjectives followed by a noun (``nouns``) is a phrase, in order; the first
    phrase is the referring expression's root.

    Example:
        >>> RuleParser({"circle", "square"}, {"red", "blue"})("a red circle left of a blue square")
        [Phrase(noun=2, modifiers=(1,), text='red circle'), Phrase(noun=7, modifiers=(6,), text='blue square')]
    """

    def __init__(self, nouns: Sequence[str], adjectives: Sequence[str]) -> None:
        self.nouns, self.adjectives = set(nouns), set(adjectives)

    def __call__(self, caption: str) -> list[Phrase]:
        words = caption.lower().split()
        phrases, pending = [], []
        for i, word in enumerate(words):
            if word in self.adjectives:
                pending.append(i)
            elif word in self.nouns:
                phrases.append(Phrase(i, tuple(pending), " ".join(words[j] for j in (*pending, i))))
                pending = []
            else:
                pending = []
        return phrases


class SpacyParser:
    """spaCy's noun chunks: the chunk's root is the noun, its ``amod`` and ``compound`` children the modifiers.

    It needs an English spaCy model, which nothing here installs: spaCy ships none, the ``[grounding]`` extra installs
    spaCy only, and ``python -m spacy download en_core_web_sm`` (or ``pip install`` of the model's wheel) needs
    internet access. Offline, the only working parser is :class:`RuleParser`, which knows a closed vocabulary.

    Args:
        model: the name of an installed spaCy pipeline with a parser (``python -m spacy download en_core_web_sm``),
            or a loaded one (any callable from text to a parsed ``spacy.tokens.Doc``).

    Raises:
        ImportError / OSError: spaCy or the model is not installed (the message says what to run, and that offline
            only ``RuleParser`` works).
    """

    def __init__(self, model: str | Callable[[str], Any] = "en_core_web_sm") -> None:
        if not isinstance(model, str):
            self.nlp = model
            return
        try:
            import spacy
        except ImportError as err:
            raise ImportError("SpacyParser needs `pip install spacy` and an English model (`python -m spacy download "
                              f"{model}`); the toy grammar uses RuleParser") from err  # fmt: skip
        try:
            self.nlp = spacy.load(model)
        except OSError as err:
            raise OSError(f"spaCy model {model!r} is not installed: run `python -m spacy download {model}` (needs "
                          "internet; the [grounding] extra installs spaCy but no model). Offline, use "
                          "RuleParser(nouns, adjectives), the only parser that works without a download (a closed "
                          "vocabulary).") from err  # fmt: skip

    def __call__(self, caption: str) -> list[Phrase]:
        doc = self.nlp(caption)
        words = caption.split()
        # spaCy's tokens are not whitespace words: map each token to the whitespace word holding its first character
        starts, pos = [], 0
        for w in words:
            pos = caption.index(w, pos)
            starts.append(pos)
            pos += len(w)

        def word_of(token: object) -> int:
            idx = token.idx  # type: ignore[attr-defined]
            return max(i for i, s in enumerate(starts) if s <= idx)

        phrases = []
        for chunk in doc.noun_chunks:
            mods = tuple(sorted({word_of(t) for t in chunk.root.children if t.dep_ in ("amod", "compound")}))
            phrases.append(Phrase(word_of(chunk.root), mods, chunk.text))
        return phrases


def get_parser(name: str = "rule", nouns: Sequence[str] = (), adjectives: Sequence[str] = ()) -> Parser:
    """``"rule"`` (the toy grammar, given its nouns and adjectives) or a spaCy model name (``"en_core_web_sm"``).

    Offline only ``"rule"`` works: a spaCy model has to be downloaded first (``python -m spacy download
    en_core_web_sm``, with internet; the ``[grounding]`` extra installs none), and ``RuleParser`` finds only the nouns
    and adjectives it is given.

    Raises:
        ValueError: ``"rule"`` without nouns.
        OSError: the spaCy model is not installed.
    """
    if name == "rule":
        if not nouns:
            raise ValueError("the rule parser needs the grammar's nouns (and adjectives)")
        return RuleParser(nouns, adjectives)
    return SpacyParser(name)
