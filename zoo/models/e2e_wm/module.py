"""``E2EWatermark``: the encoder and decoder trained end to end through a frozen LM (manual optimisation, MGDA)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAUROC, BinaryROC

from zoo.arguments import check_choice, check_probability, check_range
from zoo.datamodules.synlang import BOS, PAD, SynLang
from zoo.models.e2e_wm.generation import (
    differentiable_generate,
    online_paraphrase,
    online_semantic,
    sample,
    soft_synonym_swap,
)
from zoo.models.e2e_wm.lm import _module, load_generator
from zoo.models.e2e_wm.metrics import tpr_at_fpr
from zoo.models.e2e_wm.mgda import mgda_combine
from zoo.models.e2e_wm.nets import PerturbationEncoder, WatermarkDecoder
from zoo.models.e2e_wm.watermarks import E2ELogitsProcessor
from zoo.module import ZooModule

__all__ = ["E2EWatermark"]

# The official online-prompting templates (card §1); the text is spliced in between each pair.
SEMANTIC_TEMPLATE = ('This sentence : "A jockey riding a horse." means in one word:"Equestrian".This sentence : "',
                     '" means in one word:"')  # fmt: skip
PARAPHRASE_TEMPLATE = ("[User] : Rewrite the following text, maintaining the original meaning. \n[Target Text] : ",
                       "\n[User] : Now start rewrite the above text. \n[Rewritten Text] : ")  # fmt: skip


class E2EWatermark(ZooModule):
    """End-to-end logits-perturbation watermark (Wong et al., ICML 2025): encoder θ and decoder φ, frozen LM ``f``.

    Training (one batch): generate ``gen_len`` tokens after each prompt twice with Gumbel-softmax mixtures through the
    frozen LM (under ``no_grad``), once with the encoder's ±δ top-k perturbation and once without; from step
    ``noise_from`` the watermarked text goes, with probability ``noise_prob``, through the noise layer (SynLang: the
    differentiable synonym swap; an HF LM: online paraphrasing by the same LM, kept where its meaning stays within
    cos > 0.9); the detection loss ``L_D = detection_weight · BCE(dec([x_wm; x_nwm]), [1; 0])`` trains the decoder and,
    before step ``semantic_from``, the encoder; from then on the encoder's gradient is MGDA's ``α·g_D + (1 − α)·g_S``
    with ``L_S = −cos(s(x_wm), s(x_nwm))`` and ``α ≤ mgda_cap``. ``s`` is the class histogram on SynLang, online
    prompting ("means in one word") on an HF LM. Two Adam optimisers, manual optimisation.

    Validation and test sample ``eval_len`` tokens after each prompt with the encoder as a logits processor, score them
    and the human continuation with the decoder, and log ``{val,test}/auc`` and ``tpr@1%`` (torchmetrics) and
    ``delta_nll`` (exact NLL on SynLang, the frozen LM's otherwise, of watermarked minus unwatermarked samples).
    Validation also keeps, per text length up to ``eval_len``, 512 quantiles of the decoder's scores on the human
    text's prefixes of that length: the null of :meth:`detect`'s p-values.

    Args:
        lm: the frozen LM: a zoo LM entry (``"e2e-wm-lm"``) or a Hugging Face causal LM name or folder.
        window / top_k / delta / mapper_hidden / mapper_layers / sharpness: the encoder (card §5: 4, 8, 1.5, 32).
        decoder_hidden / decoder_layers: the LSTM detector.
        gumbel_tau / temperature / hard_weight: Gumbel-softmax τ, the LM's sampling temperature, the hard share.
        prompt_len / gen_len / eval_len: prompt tokens; generated tokens per branch in training, in evaluation.
        lr / weight_decay: both Adams.
        detection_weight: weight of L_D (10).
        semantic_from / noise_from / noise_prob: the stage switches (training steps) and the noise probability.
        mgda_cap: the cap on α (0.01; ``None`` or 1.0 for plain MGDA).
        noise: ``"auto"`` (synonym on SynLang, paraphrase on an HF LM), ``"synonym"``, ``"paraphrase"`` or ``"none"``
            (the ablation).
        synonym_prob: the swap mask's Bernoulli p.
        paraphrase_len: tokens the online paraphrase generates.
        train_encoder: ``False`` leaves the encoder at initialisation (the stand-in: only the decoder learns).
        encoder_context: what the encoder sees of the tokens generated in training: ``"hard"`` (default, the official
            ``llm_forward``) the kept tokens' embeddings without gradient, as at inference; ``"soft"`` the Gumbel
            mixtures times the table with their gradients (a zoo variant; earlier steps' perturbations then reach
            later steps through the context).

    Lightning's ``max_steps`` counts optimiser steps, and every batch takes two (the encoder's Adam and the
    decoder's): ``max_steps=2 * n`` trains ``n`` batches; with ``train_encoder=False`` only the decoder steps, and
    ``max_steps=n`` trains ``n`` batches. The stage switches (``semantic_from``, ``noise_from``) count batches.

    Example:
        >>> model = E2EWatermark(lm="e2e-wm-lm")
        >>> prompts = torch.ones(2, 4, dtype=torch.long)
        >>> text = model.generate(prompts, 12, rng=torch.Generator().manual_seed(0))
        >>> text.shape, model.score(text[:, 4:]).shape
        (torch.Size([2, 16]), torch.Size([2]))
    """

    def __init__(
        self,
        lm: str = "e2e-wm-lm",
        window: int = 4,
        top_k: int = 8,
        delta: float = 1.5,
        mapper_hidden: int = 32,
        mapper_layers: int = 5,
        sharpness: float = 1000.0,
        decoder_hidden: int = 32,
        decoder_layers: int = 1,
        gumbel_tau: float = 0.5,
        temperature: float = 1.0,
        hard_weight: float = 0.5,
        prompt_len: int = 4,
        gen_len: int = 32,
        eval_len: int = 48,
        lr: float = 1e-3,
        weight_decay: float = 1e-5,
        detection_weight: float = 10.0,
        semantic_from: int = 400,
        noise_from: int = 800,
        noise_prob: float = 0.5,
        mgda_cap: float | None = 0.01,
        noise: Literal["auto", "synonym", "paraphrase", "none"] = "auto",
        synonym_prob: float = 0.5,
        paraphrase_len: int = 32,
        train_encoder: bool = True,
        encoder_context: Literal["hard", "soft"] = "hard",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_choice("noise", noise, ("auto", "synonym", "paraphrase", "none"))
        check_choice("encoder_context", encoder_context, ("hard", "soft"))
        for name in ("noise_prob", "synonym_prob", "hard_weight"):
            check_probability(name, getattr(self.hparams, name))
        for name in ("delta", "gumbel_tau", "temperature", "lr"):
            check_range(name, getattr(self.hparams, name), low=0, low_open=True)
        for name in ("prompt_len", "gen_len", "eval_len", "paraphrase_len"):
            check_range(name, getattr(self.hparams, name), low=1, integer=True)
        check_range("mgda_cap", mgda_cap, 0, 1, optional=True)
        if prompt_len < window - 1:
            raise ValueError(f"prompt_len={prompt_len} must be ≥ window − 1 = {window - 1} (the encoder's context)")
        self.generator, self.codec = load_generator(lm)
        self.is_synlang = isinstance(self.codec, SynLang)
        self.noise_kind = ("synonym" if self.is_synlang else "paraphrase") if noise == "auto" else noise
        if self.noise_kind == "synonym" and not self.is_synlang:
            raise ValueError("noise='synonym' needs the SynLang LM (its synonym blocks); use 'paraphrase' or 'none'")
        if self.noise_kind == "paraphrase" and self.is_synlang:
            raise ValueError("noise='paraphrase' prompts the LM in natural language: it needs an HF LM and tokenizer")
        self.frozen_lm = _module(self.generator)  # a submodule so it moves with the model; kept out of the weights
        dim = self.generator.embedding.shape[1]
        self.encoder = PerturbationEncoder(dim, window, top_k, delta, mapper_hidden, mapper_layers, sharpness)
        self.decoder = WatermarkDecoder(dim, decoder_hidden, decoder_layers)
        # The null of the p-values, per text length: row l − 1 holds 512 quantiles of the decoder's scores on the
        # first l tokens of human text (a decoder's scores drift with length: one null for all lengths flagged 8 %
        # of 4-token human texts at a nominal 1 %).
        self.register_buffer("null_scores", torch.full((eval_len, 512), float("nan")))
        if self.is_synlang:
            self.register_buffer("membership", self.codec.membership(), persistent=False)
            self.register_buffer("synonyms", self.codec.synonym_average(), persistent=False)
        else:
            for name, (a, b) in {"semantic": SEMANTIC_TEMPLATE, "paraphrase": PARAPHRASE_TEMPLATE}.items():
                self.register_buffer(f"{name}_before", self._ids(a), persistent=False)
                self.register_buffer(f"{name}_after", self._ids(b), persistent=False)
        self._register_state_dict_hook(_drop_frozen_lm)
        self.register_load_state_dict_post_hook(_allow_missing_frozen_lm)
        self.automatic_optimization = False
        self.train_steps = 0
        self.eval_metrics = nn.ModuleDict()
        for s in ("val", "test"):
            self.eval_metrics[f"{s}_auc"] = BinaryAUROC()
            self.eval_metrics[f"{s}_roc"] = BinaryROC()
            self.eval_metrics[f"{s}_dnll"] = MeanMetric()
        self._null: list[Tensor] = []

    # ------------------------------------------------------------------------------------------------ text
    def _ids(self, text: str) -> Tensor:
        return torch.tensor(self.codec(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    def encode(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Right-padded ids ``(B, L)`` and lengths of ``texts`` in the LM's tokenizer (SynLang words or HF's)."""
        if isinstance(texts, str):
            texts = [texts]
        rows = []
        for i, text in enumerate(texts):
            ids = self.codec.from_text(text) if self.is_synlang else self._ids(text).tolist()
            if not ids:
                raise ValueError(f"text {i} is empty: nothing to score")
            rows.append(torch.tensor(ids))
        lengths = torch.tensor([len(r) for r in rows])
        return nn.utils.rnn.pad_sequence(rows, batch_first=True).to(self.device), lengths.to(self.device)

    def decode(self, ids: Tensor) -> list[str]:
        """Texts of ``ids`` ``(B, L)``."""
        if self.is_synlang:
            return [self.codec.to_text(row) for row in ids.cpu()]
        return self.codec.batch_decode(ids, skip_special_tokens=True)

    # ------------------------------------------------------------------------------------------------ inference
    def logits_processor(self) -> E2ELogitsProcessor:
        """The encoder as a Hugging Face ``LogitsProcessor`` for ``model.generate(logits_processor=[...])``."""
        return E2ELogitsProcessor(self.encoder, self.generator.embedding)

    def generate(self, prompts: Tensor, n_new: int, watermark: bool = True, rng: torch.Generator | None = None,
                 processors: list[Any] | None = None) -> Tensor:  # fmt: skip
        """Sample ``n_new`` tokens after ``prompts`` ``(B, P)`` (temperature ``temperature``): ``(B, P + n_new)``.
        ``processors`` replaces the zoo's watermark (a baseline's, or ``[]`` for none). On SynLang, PAD and BOS are
        never sampled."""
        procs = processors if processors is not None else ([self.logits_processor()] if watermark else [])
        suppress = (PAD, BOS) if self.is_synlang else ()
        return sample(self.generator, prompts, n_new, procs, self.hparams.temperature, rng, suppress=suppress)

    def _embed(self, ids: Tensor, lengths: Tensor | None) -> Tensor:
        vocab = self.generator.embedding.shape[0]
        if ids.dtype != torch.long or ids.dim() != 2:
            raise ValueError(f"ids must be (B, L) torch.long token ids, got {ids.dtype} {tuple(ids.shape)}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"ids of shape {tuple(ids.shape)} hold no text: nothing to score")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab}) of the detector's LM vocabulary, got "
                             f"{int(ids.min())}…{int(ids.max())}: ids of another tokenizer?")  # fmt: skip
        if lengths is not None:
            if lengths.shape != ids.shape[:1]:
                raise ValueError(f"lengths must be ({len(ids)},), one per row of ids, got {tuple(lengths.shape)}")
            if int(lengths.min()) < 1 or int(lengths.max()) > ids.shape[1]:
                raise ValueError(f"lengths must be in [1, {ids.shape[1]}] (the ids' width), got "
                                 f"{int(lengths.min())}…{int(lengths.max())}")  # fmt: skip
        return self.generator.embedding[ids]

    def score(self, ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The decoder's watermark logits ``(B,)`` for token ids ``(B, L)`` (no BOS, as in training), right-padded to
        ``lengths`` if given."""
        return self.decoder(self._embed(ids, lengths), lengths)

    def prefix_scores(self, ids: Tensor) -> Tensor:
        """``(B, L)``: column l − 1 is the decoder's score of each row's first l tokens (one LSTM pass)."""
        return self.decoder.prefix_scores(self._embed(ids, None))

    @torch.no_grad()
    def calibrate(self, human_ids: Tensor) -> None:
        """Set the null of :meth:`p_value` from human text ``(B, L)`` (token ids, ``L ≥ eval_len``): per length l ≤
        ``eval_len``, 512 quantiles of the decoder's scores on the texts' first l tokens. A few hundred texts give
        an FPR within about a point of the nominal 1 % (``zoo reproduce e2e-wm`` measures it on fresh text)."""
        if not isinstance(human_ids, Tensor) or human_ids.dtype != torch.long:
            got = human_ids.dtype if isinstance(human_ids, Tensor) else type(human_ids).__name__
            raise ValueError(f"calibrate takes human text as (B, L) torch.long token ids (it scores every prefix "
                             f"length), got {got}")  # fmt: skip
        n = len(self.null_scores)
        if human_ids.dim() != 2 or human_ids.shape[1] < n or len(human_ids) < 100:
            raise ValueError(f"calibrate needs at least 100 human texts of at least eval_len = {n} tokens, got "
                             f"shape {tuple(human_ids.shape)}")  # fmt: skip
        scores = self.prefix_scores(human_ids[:, :n].to(self.device)).float()
        if not bool(torch.isfinite(scores).all()):
            raise ValueError("the decoder's scores on the human text are not finite: the null would be meaningless")
        q = torch.linspace(0, 1, self.null_scores.shape[1], device=scores.device)
        self.null_scores.copy_(torch.quantile(scores, q, dim=0).T)

    def p_value(self, scores: Tensor, lengths: Tensor) -> Tensor:
        """Empirical one-sided p-value of decoder ``scores`` ``(B,)`` of texts of ``lengths`` tokens against the
        human-text null at the same length (texts longer than ``eval_len``: the null at ``eval_len``)."""
        if bool(self.null_scores.isnan().any()):
            raise RuntimeError("no null calibrated: fit the model (validation calibrates it) or call calibrate()")
        if not bool(torch.isfinite(scores).all()):
            raise ValueError("scores contain NaN or inf")
        null = self.null_scores.to(scores.device)
        rows = null[(lengths.to(scores.device).clamp(1, len(null)) - 1).long()]
        return (1 + (rows >= scores[:, None]).sum(-1)) / (1 + null.shape[1])

    @torch.no_grad()
    def detect(self, texts: list[str], fpr: float = 0.01) -> dict[str, Tensor]:
        """``score``, ``p_value``, ``watermarked`` (p ≤ ``fpr``) and ``length`` (tokens) per text. The p-values hold
        at each length up to ``eval_len``; longer texts are compared with the ``eval_len`` null."""
        check_probability("fpr", fpr, open_low=True, open_high=True)
        ids, lengths = self.encode(texts)
        scores = self.score(ids, lengths)
        p = self.p_value(scores, lengths)
        return {"score": scores, "p_value": p, "watermarked": p <= fpr, "length": lengths}

    def forward(self, ids: Tensor | tuple[Tensor, ...] | list[Tensor]) -> Tensor:
        """Watermark logits of token ids ``(B, L)``; a ``(tokens,)`` batch is accepted."""
        return self.score(ids[0] if isinstance(ids, (tuple, list)) else ids)

    # ------------------------------------------------------------------------------------------------ training
    def _semantic(self, mixes: Tensor) -> Tensor:
        if self.is_synlang:  # the card's sem(x): the L2-normalised class histogram of the soft one-hots
            return nn.functional.normalize((mixes @ self.membership).sum(1), dim=-1)
        E = self.generator.embedding
        return online_semantic(self.generator, self.semantic_before, mixes.to(E.dtype) @ E, self.semantic_after)

    def _noise(self, mixes: Tensor) -> Tensor:
        hp = self.hparams
        if self.noise_kind == "synonym":
            return soft_synonym_swap(mixes, self.synonyms, hp.synonym_prob)
        E = self.generator.embedding
        para = online_paraphrase(self.generator, self.paraphrase_before, mixes.to(E.dtype) @ E, self.paraphrase_after,
                                 hp.paraphrase_len, hp.hard_weight)  # fmt: skip
        if para.shape[1] != mixes.shape[1]:  # same length for the batch: pad with the mixes' tail or truncate
            para = torch.cat([para, mixes[:, para.shape[1] :]], 1)[:, : mixes.shape[1]]
        keep = nn.functional.cosine_similarity(self._semantic(para), self._semantic(mixes), dim=-1) > 0.9
        return torch.where(keep[:, None, None], para.to(mixes.dtype), mixes)  # invalid paraphrases fall back

    def _branches(self, prompts: Tensor) -> tuple[Tensor, Tensor]:
        hp, E = self.hparams, self.generator.embedding
        kw = {"window": hp.window, "tau": hp.gumbel_tau, "hard_weight": hp.hard_weight, "temperature": hp.temperature,
              "context": hp.encoder_context}  # fmt: skip
        perturb = lambda logits, ctx: self.encoder(logits, ctx, E)
        x_w = differentiable_generate(self.generator, E[prompts], hp.gen_len, perturb, **kw)
        with torch.no_grad():
            x_n = differentiable_generate(self.generator, E[prompts], hp.gen_len, None, **kw)
        return x_w, x_n

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        hp, E = self.hparams, self.generator.embedding
        opt_e, opt_d = self.optimizers()
        step = self.train_steps
        x_w, x_n = self._branches(batch[0][:, : hp.prompt_len])
        x_pos = x_w
        if self.noise_kind != "none" and step >= hp.noise_from and float(torch.rand(())) < hp.noise_prob:
            x_pos = self._noise(x_w)
        logits = self.decoder(torch.cat([x_pos, x_n]).to(E.dtype) @ E)
        target = torch.cat([torch.ones(len(x_pos)), torch.zeros(len(x_n))]).to(logits)
        loss_d = hp.detection_weight * nn.functional.binary_cross_entropy_with_logits(logits, target)
        opt_e.zero_grad()
        opt_d.zero_grad()
        params = list(self.encoder.parameters())
        joint = hp.train_encoder and step >= hp.semantic_from
        self.manual_backward(loss_d, retain_graph=joint)
        if joint:
            loss_s = -nn.functional.cosine_similarity(self._semantic(x_w), self._semantic(x_n), dim=-1).mean()
            g_d = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
            g_s = torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for p, g in
                             zip(params, torch.autograd.grad(loss_s, params, allow_unused=True))])  # fmt: skip
            combined, alpha = mgda_combine(g_d, g_s, hp.mgda_cap)
            offset = 0
            for p in params:
                p.grad = combined[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            self.log("train/semantic_loss", loss_s, batch_size=len(x_w))
            self.log("train/mgda_alpha", alpha, batch_size=len(x_w))
        if hp.train_encoder:
            opt_e.step()
        opt_d.step()
        self.train_steps += 1
        accuracy = ((logits > 0).float() == target).float().mean()
        self.log("train/detection_loss", loss_d, prog_bar=True, batch_size=len(x_w))
        self.log("train/decoder_accuracy", accuracy, prog_bar=True, batch_size=len(x_w))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.trainer.precision == "16-mixed":  # MGDA mixes a scaled (manual_backward) and an unscaled gradient
            raise ValueError("E2EWatermark trains in 32-true or bf16-mixed precision, not 16-mixed")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["e2e_train_steps"] = self.train_steps  # the stage switches key off it

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.train_steps = int(checkpoint.get("e2e_train_steps", 0))

    def train(self, mode: bool = True) -> E2EWatermark:
        super().train(mode)
        self.frozen_lm.eval()  # frozen: no dropout in its forward, whatever the module's mode
        return self

    # ------------------------------------------------------------------------------------------------ evaluation
    def _evaluate(self, batch: tuple[Tensor, ...], batch_idx: int, stage: str) -> None:
        hp = self.hparams
        tokens = batch[0]
        n = min(hp.eval_len, tokens.shape[1] - hp.prompt_len)
        prompts, human = tokens[:, : hp.prompt_len], tokens[:, hp.prompt_len : hp.prompt_len + n]
        rng = torch.Generator().manual_seed(batch_idx)
        wm = self.generate(prompts, n, rng=rng)
        plain = self.generate(prompts, n, watermark=False, rng=rng)
        pos, neg = self.score(wm[:, hp.prompt_len :]), self.score(human)
        scores = torch.cat([pos, neg])
        target = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]).long()
        self.eval_metrics[f"{stage}_auc"].update(scores, target)
        self.eval_metrics[f"{stage}_roc"].update(scores, target)
        self.eval_metrics[f"{stage}_dnll"].update(self._nll(wm) - self._nll(plain))
        if stage == "val":
            self._null.append(human)

    def _nll(self, ids: Tensor) -> Tensor:
        """Per-text mean NLL of the generated part: exact on SynLang, under the frozen LM otherwise."""
        p = self.hparams.prompt_len
        if self.is_synlang:
            return self.codec.nll(ids, start=p).mean(-1)
        E = self.generator.embedding
        logits = self.frozen_lm(inputs_embeds=E[ids]).logits[:, p - 1 : -1]
        return nn.functional.cross_entropy(logits.transpose(1, 2).float(), ids[:, p:], reduction="none").mean(-1)

    def _log_eval(self, stage: str) -> None:
        fpr, tpr, _ = self.eval_metrics[f"{stage}_roc"].compute()
        self.log(f"{stage}/auc", self.eval_metrics[f"{stage}_auc"].compute(), prog_bar=True)
        self.log(f"{stage}/tpr@1%", tpr_at_fpr(fpr, tpr, 0.01))
        self.log(f"{stage}/delta_nll", self.eval_metrics[f"{stage}_dnll"].compute())
        for key in ("auc", "roc", "dnll"):
            self.eval_metrics[f"{stage}_{key}"].reset()

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")
        if self._null and not self.trainer.sanity_checking:
            human = self.all_gather(torch.cat(self._null))
            human = human.flatten(0, -2) if human.dim() > 2 else human
            if human.shape[1] >= len(self.null_scores) and len(human) >= 100:
                self.calibrate(human)
            else:
                rank_zero_warn(
                    f"validation had {len(human)} human texts of {human.shape[1]} tokens; calibrate needs "
                    f"≥ 100 of ≥ eval_len = {len(self.null_scores)}: the p-values' null is not updated"
                )
        self._null = []

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "test")

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        """Watermarked continuations of the batch's prompts."""
        rng = torch.Generator().manual_seed(batch_idx)
        return self.generate(batch[0][:, : self.hparams.prompt_len], self.hparams.eval_len, rng=rng)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        hp = self.hparams
        return [torch.optim.Adam(m.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
                for m in (self.encoder, self.decoder)]  # fmt: skip

    def card_notes(self) -> str:
        return (
            "`test/auc` and `test/tpr@1%` separate 48-token watermarked continuations of 4-token SynLang prompts from "
            "the language's own continuations (the human text), unattacked; `test/delta_nll` is the exact NLL per "
            "token of watermarked minus unwatermarked samples of the frozen LM `e2e-wm-lm`. `zoo reproduce e2e-wm` "
            "adds 30 % and 50 % synonym swaps, KGW and Unigram δ sweeps, EXP (distortion-free), an LM-likelihood "
            "detector that needs no watermark, and the ablations. The paper's OPT-1.3B "
            "training, DIPPER paraphrases and C4 evaluation are not reproduced: the same class runs them with "
            "`lm='facebook/opt-1.3b'` and the document path of `SynLangDataModule`."
        )


def _drop_frozen_lm(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    # The frozen LM is its own entry (or a Hugging Face model): the watermark's weights are the encoder, the
    # decoder and the null, a few hundred kB even when the LM has billions of parameters.
    for key in [k for k in state_dict if k.startswith(prefix + "frozen_lm.")]:
        del state_dict[key]


def _allow_missing_frozen_lm(module: nn.Module, incompatible: Any) -> None:
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if "frozen_lm." not in k]
