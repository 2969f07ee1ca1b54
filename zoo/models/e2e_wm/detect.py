"""``detect(texts)`` and ``zoo watermark detect FILE``: a score, a p-value and a decision per text, at a chosen FPR.

The scheme is a zoo entry (``"e2e-wm"``: the trained decoder, with its empirical null) or a keyed baseline,
``"kgw"`` / ``"unigram"``, whose key, γ and vocabulary are arguments (nothing depends on a secret the user cannot
set). Texts are read in the scheme's tokenizer: the E2E entry's LM's, or ``tokenizer`` for the baselines
(``"synlang"``: SynLang words; otherwise a Hugging Face tokenizer name or folder).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["detect", "read_texts", "report"]


def read_texts(path: str | Path) -> list[str]:
    """Texts of a .txt file (one per line) or a .jsonl file (a ``text`` field per row)."""
    from zoo.datamodules.synlang import _read_texts

    return _read_texts(Path(path))


def _baseline_ids(texts: list[str], tokenizer: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    if tokenizer == "synlang":
        from zoo.datamodules.synlang import SynLang

        lang = SynLang()
        rows, vocab = [lang.from_text(t) for t in texts], lang.vocab_size
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
        rows, vocab = tok(texts, add_special_tokens=False)["input_ids"], len(tok)
    for i, r in enumerate(rows):
        if not r:
            raise ValueError(f"text {i} is empty: nothing to score")
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(r) for r in rows], batch_first=True)
    return ids, lengths, vocab


def detect(
    texts: list[str],
    scheme: str = "e2e-wm",
    fpr: float = 0.01,
    key: int = 15485863,
    gamma: float = 0.5,
    tokenizer: str = "synlang",
    hub: str | None = None,
) -> dict[str, Any]:
    """Per text: ``score`` (decoder logit or z-score), ``p_value`` and ``watermarked`` (``p_value ≤ fpr``).

    Example:
        >>> out = detect(["w00a w03b w11c w05a w07d w02b w00c w09a"], scheme="kgw")
        >>> sorted(out), out["watermarked"]
        (['config', 'p_value', 'score', 'watermarked'], [False])
    """
    if isinstance(texts, str):
        texts = [texts]
    if not texts:
        raise ValueError("no texts to score")
    if not 0 < fpr < 1:
        raise ValueError(f"fpr must be in (0, 1), got {fpr}")
    if scheme in ("kgw", "unigram"):
        from zoo.models.e2e_wm.watermarks import KGWWatermark, UnigramWatermark

        ids, lengths, vocab = _baseline_ids(texts, tokenizer)
        wm = (KGWWatermark if scheme == "kgw" else UnigramWatermark)(vocab, gamma=gamma, key=key)
        if scheme == "kgw" and int(lengths.min()) < 2:
            raise ValueError("KGW scores each token against its predecessor: every text needs two tokens or more")
        scores = wm.score(ids, lengths)
        p, config = wm.p_value(scores), wm.config()
    else:
        import zoo

        model = zoo.load(scheme, hub=hub)
        if not hasattr(model, "detect"):
            raise ValueError(f"{scheme!r} is not a watermark; choose e2e-wm, kgw or unigram")
        out = model.detect(texts, fpr)
        scores, p, config = out["score"], out["p_value"], {"scheme": scheme, "lm": model.hparams.lm}
    return {"score": scores.tolist(), "p_value": p.tolist(), "watermarked": (p <= fpr).tolist(), "config": config}


def report(path: str | Path, **kwargs: Any) -> str:
    """One line per text (score, p-value, decision), then the share flagged, as ``zoo watermark detect`` prints."""
    texts = read_texts(path)
    out = detect(texts, **kwargs)
    fpr = kwargs.get("fpr", 0.01)
    lines = [f"# {json.dumps(out['config'])}; decision: p-value ≤ {fpr:g}", "text\tscore\tp_value\twatermarked"]
    lines += [f"{i}\t{s:.4f}\t{p:.3g}\t{int(w)}" for i, (s, p, w) in
              enumerate(zip(out["score"], out["p_value"], out["watermarked"]))]  # fmt: skip
    lines.append(f"# {sum(out['watermarked'])} of {len(texts)} texts flagged as watermarked")
    return "\n".join(lines)
