"""``detect(texts)`` and ``zoo watermark detect FILE``: a score, a p-value and a decision per text, at a chosen FPR.

The scheme is a zoo entry (``"e2e-wm"``: the trained decoder, with its empirical null) or a keyed baseline,
``"kgw"`` / ``"unigram"`` / ``"exp"``, whose key, γ and vocabulary are arguments (nothing depends on a secret the
user cannot set). Texts are read in the scheme's tokenizer: the E2E entry's LM's, or ``tokenizer`` for the baselines
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
    """Per text: ``score`` (decoder logit, z-score or EXP's score), ``p_value``, ``watermarked`` (``p_value ≤ fpr``)
    and ``length`` (tokens scored); ``warnings`` says where the p-values cannot be read at face value.

    KGW's and Unigram's p-values are exact binomial tails and EXP's an exact Gamma tail when the scored tokens are
    independent under no watermark (i.i.d. text; over keys for EXP). Real text repeats tokens and contexts, which
    makes them somewhat anti-conservative: on SynLang human text a nominal 1 % flags 1.1-1.5 % on average over Unigram
    keys and up to 6 % for one key. E2E's are empirical against human text of the same length (up to the entry's
    ``eval_len``; a longer text is compared with the ``eval_len`` null, and a warning says so); the smallest is
    1/513. A text too short for any p-value to reach ``fpr``, or an ``fpr`` below E2E's smallest p-value, is warned
    of.

    Example:
        >>> out = detect(["w00a w03b w11c w05a w07d w02b w00c w09a"], scheme="kgw")
        >>> sorted(out), out["watermarked"], out["length"]
        (['config', 'length', 'p_value', 'score', 'warnings', 'watermarked'], [False], [8])
        >>> detect(["w00a w03b w11c w05a w07d"], scheme="kgw")["warnings"]  # 4 scored tokens: p ≥ 0.5⁴
        ['1 text(s) shorter than 8 tokens: no kgw p-value can reach 0.01 there']
    """
    from zoo.arguments import check_probability

    if isinstance(texts, str):
        texts = [texts]
    if not texts:
        raise ValueError("no texts to score")
    check_probability("fpr", fpr, open_low=True, open_high=True)
    warnings: list[str] = []
    if scheme in ("kgw", "unigram", "exp"):
        from zoo.models.e2e_wm.watermarks import EXPWatermark, KGWWatermark, UnigramWatermark

        check_probability("gamma", gamma, open_low=True, open_high=True)
        ids, lengths, vocab = _baseline_ids(texts, tokenizer)
        if scheme == "exp":
            wm = EXPWatermark(vocab, key=key)
        else:
            wm = (KGWWatermark if scheme == "kgw" else UnigramWatermark)(vocab, gamma=gamma, key=key)
        if scheme != "unigram" and int(lengths.min()) < 2:
            raise ValueError(f"{scheme} scores each token against its predecessor: every text needs two tokens or more")
        scores = wm.score(ids, lengths)
        p, config = wm.p_value(scores, lengths), wm.config()
        if scheme != "exp":  # the smallest p-value of n tokens is γⁿ (all green)
            n = wm.counted(lengths).double()
            short = int((gamma**n > fpr).sum())
            if short:
                need = int(torch.ceil(torch.tensor(fpr).log() / torch.tensor(gamma).log())) + (scheme == "kgw")
                warnings.append(
                    f"{short} text(s) shorter than {need} tokens: no {scheme} p-value can reach {fpr:g} there"
                )
    else:
        import zoo

        model = zoo.load(scheme, hub=hub)
        if not hasattr(model, "detect"):
            raise ValueError(f"{scheme!r} is not a watermark; choose e2e-wm, kgw, unigram or exp")
        out = model.detect(texts, fpr)
        scores, p, lengths = out["score"], out["p_value"], out["length"]
        config = {"scheme": scheme, "lm": model.hparams.lm}
        longest, floor = model.null_scores.shape[0], 1 / (1 + model.null_scores.shape[1])
        if fpr < floor:  # the empirical p-value's smallest value: nothing could be flagged
            warnings.append(f"fpr {fpr:g} is below the smallest E2E p-value, 1/{model.null_scores.shape[1] + 1} = "
                            f"{floor:.4f} (512 null quantiles): no text can be flagged")  # fmt: skip
        long = int((lengths > longest).sum())
        if long:
            warnings.append(f"{long} text(s) longer than the {longest} tokens the null was calibrated at: their "
                            f"p-values use the {longest}-token null")  # fmt: skip
    return {"score": scores.tolist(), "p_value": p.tolist(), "watermarked": (p <= fpr).tolist(),
            "length": lengths.tolist(), "warnings": warnings, "config": config}  # fmt: skip


def report(path: str | Path, **kwargs: Any) -> str:
    """One line per text (length, score, p-value, decision), the warnings, then the share flagged, as
    ``zoo watermark detect`` prints."""
    texts = read_texts(path)
    out = detect(texts, **kwargs)
    fpr = kwargs.get("fpr", 0.01)
    lines = [f"# {json.dumps(out['config'])}; decision: p-value ≤ {fpr:g}", "text\ttokens\tscore\tp_value\twatermarked"]
    lines += [f"{i}\t{n}\t{s:.4f}\t{p:.3g}\t{int(w)}" for i, (n, s, p, w) in
              enumerate(zip(out["length"], out["score"], out["p_value"], out["watermarked"]))]  # fmt: skip
    lines += [f"# warning: {w}" for w in out["warnings"]]
    lines.append(f"# {sum(out['watermarked'])} of {len(texts)} texts flagged as watermarked")
    return "\n".join(lines)
