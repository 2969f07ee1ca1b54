"""``CLUDIModule``: clustering via self-supervised diffusion (Uziel, Chelly, Freifeld & Pakman, ICML 2025)."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torchmetrics import MetricCollection
from torchmetrics.clustering import AdjustedRandScore, ClusterAccuracy, NormalizedMutualInfoScore
from torchmetrics.functional.clustering import normalized_mutual_info_score

from zoo.models.cludi.denoiser import AssignmentDenoiser
from zoo.models.cludi.diffusion import ClusterDiffusion
from zoo.models.cludi.losses import perturb_features, row_column_ce
from zoo.module import ZooModule

__all__ = ["CLUDIModule"]

Teacher = Literal["student_eval", "ema"]
Mode = Literal["diffusion", "no_diffusion"]


# The smallest training batch accepted, in rows per cluster: the loss normalises each cluster's column over the batch.
_MIN_ROWS_PER_CLUSTER = 2


class CLUDIModule(ZooModule):
    """Cluster frozen features with a conditional diffusion model over cluster-assignment embeddings.

    Each step, a *teacher* draws ``batch_diffusion`` assignments per feature row by η = 1 DDIM sampling
    (``train_steps`` steps, clean features, dropout off); the *student* sees a noisy, masked view of the features,
    denoises the teacher's embedding from a random timestep and is pulled to the teacher by the min-SNR-weighted
    embedding MSE plus ``ce_lambda`` times the row/column-normalised cross-entropy between every teacher and student
    copy. Labels come from the logits averaged over ``eval_samples`` chains of ``eval_steps`` steps.

    The official teacher is the student network itself in eval mode, with gradients flowing back through the whole
    sampling chain (``teacher="student_eval"``, ``detach_teacher=False``, the default). ``detach_teacher=True``
    samples it under ``no_grad``; ``teacher="ema"`` samples from an exponential moving average of the weights
    (always detached). ``mode="no_diffusion"`` is the card's ablation: the same network and loss between a clean
    (teacher, eval mode) and noisy (student) view of the features, with z_t = z_sc = 0, t = 0 and no sampling.

    Labels (scored at validation and test only) are class ids in ``0 .. num_classes − 1``, and −1 marks an unlabelled
    row: it is clustered and counted in ``clusters_used`` but left out of ACC / NMI / ARI, which a stage without any
    labelled row does not log.

    Args:
        num_clusters: K (≥ 2).
        feat_dim: feature width F.
        emb_dim: assignment embedding width E.
        assign_dim: the assignment path's output width (None: F/2, the official ratio).
        depth: square trunk layers (4).
        dropout: dropout of the network's paths (0.15).
        num_classes: number of true classes the labels use, for the matched accuracy (None: ``num_clusters``); a
            larger label is refused.
        batch_diffusion: S, diffusion copies per training batch.
        train_steps: teacher DDIM steps R (must divide ``num_timesteps``).
        eval_steps: DDIM steps at evaluation.
        eval_samples: chains whose logits are averaged at evaluation.
        num_timesteps: T.
        rescale: noise scale r.
        min_snr: γ of the min-SNR weights.
        clamp: clamp ẑ_0 to [−1, 1] while sampling (the official code does).
        self_cond_prob: probability of a self-conditioning pass per step.
        emb_temperature: softmax temperature of Emb (0.1).
        ce_lambda: λ_ce, weight of the clustering loss.
        tau_row: prediction-side temperature of the clustering loss.
        tau_col: target-side temperature.
        noise_scale: range of the student's unit-noise scale s (one per copy).
        feature_drop: range of the student's feature-mask rate (one per copy).
        teacher: ``"student_eval"`` (official) or ``"ema"``.
        detach_teacher: sample the teacher without gradients.
        ema_decay: decay of the EMA teacher.
        mode: ``"diffusion"`` (CLUDI) or ``"no_diffusion"`` (the ablation).
        lr: peak AdamW learning rate (after one warm-up epoch, cosine to ``min_lr`` per step).
        min_lr: final learning rate.
        weight_decay: AdamW weight decay on weight matrices (not on biases and norms).
        warmup_epochs: epochs of linear warm-up.
        clip_per_param: clip each parameter's gradient norm to this (the official ``clip_gradients``; 0: off).
        seed: seed of the cluster codes and of the evaluation chains (each evaluation call reuses it, so a
            model's test metrics are reproducible).

    Raises:
        ValueError: a bad argument; features of another width, or a feature row that is not finite (NaN or inf) or
            is all zeros (every call and step, naming the first such row); a label ≥ ``num_classes`` (validation and
            test).

    Example:
        >>> model = CLUDIModule(num_clusters=3, feat_dim=8, emb_dim=4, eval_samples=2, eval_steps=10)
        >>> labels, probs = model.eval().cluster(torch.randn(5, 8))
        >>> labels.shape, probs.shape, bool(torch.allclose(probs.sum(-1), torch.ones(5)))
        (torch.Size([5]), torch.Size([5, 3]), True)
    """

    def __init__(
        self,
        num_clusters: int = 10,
        feat_dim: int = 64,
        emb_dim: int = 16,
        assign_dim: int | None = None,
        depth: int = 4,
        dropout: float = 0.15,
        num_classes: int | None = None,
        batch_diffusion: int = 4,
        train_steps: int = 10,
        eval_steps: int = 20,
        eval_samples: int = 16,
        num_timesteps: int = 1000,
        rescale: float = 49.0,
        min_snr: float = 5.0,
        clamp: bool = True,
        self_cond_prob: float = 0.5,
        emb_temperature: float = 0.1,
        ce_lambda: float = 50.0,
        tau_row: float = 0.1,
        tau_col: float = 0.05,
        noise_scale: tuple[float, float] = (0.2, 1.0),
        feature_drop: tuple[float, float] = (0.05, 0.10),
        teacher: Teacher = "student_eval",
        detach_teacher: bool = False,
        ema_decay: float = 0.999,
        mode: Mode = "diffusion",
        lr: float = 1e-3,
        min_lr: float = 1e-6,
        weight_decay: float = 0.01,
        warmup_epochs: int = 1,
        clip_per_param: float = 4.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if num_clusters < 2:
            raise ValueError(f"num_clusters (K) must be at least 2, got {num_clusters}")
        if teacher not in ("student_eval", "ema"):
            raise ValueError(f"teacher must be 'student_eval' or 'ema', got {teacher!r}")
        if mode not in ("diffusion", "no_diffusion"):
            raise ValueError(f"mode must be 'diffusion' or 'no_diffusion', got {mode!r}")
        for name, steps in (("train_steps", train_steps), ("eval_steps", eval_steps)):
            if steps < 1 or num_timesteps % steps:
                raise ValueError(f"{name}={steps} must divide num_timesteps={num_timesteps}")
        if batch_diffusion < 1 or eval_samples < 1:
            raise ValueError(f"batch_diffusion and eval_samples must be ≥ 1, got {batch_diffusion}, {eval_samples}")
        self.save_hyperparameters()
        self.net = AssignmentDenoiser(feat_dim, num_clusters, emb_dim, assign_dim, depth, dropout, seed)
        self.diffusion = ClusterDiffusion(num_timesteps, rescale, min_snr, clamp)
        # The EMA copy exists only when it is the teacher (the official code updates one it never uses).
        self.ema = AveragedModel(self.net, multi_avg_fn=get_ema_multi_avg_fn(ema_decay)) if teacher == "ema" else None
        classes = max(num_classes or num_clusters, num_clusters)
        self.metrics = nn.ModuleDict(
            {
                stage: MetricCollection(
                    {
                        "accuracy": ClusterAccuracy(num_classes=classes),
                        "nmi": NormalizedMutualInfoScore("arithmetic"),
                        "ari": AdjustedRandScore(),
                    },
                    prefix=f"{stage}/",
                )
                for stage in ("val", "test")
            }
        )
        self._counts: dict[str, Tensor] = {}

    # ------------------------------------------------------------------------------------------------ inference
    def _features(self, x: Tensor | tuple[Tensor, ...] | list[Tensor]) -> Tensor:
        """The L2-normalised feature rows ``(B, F)`` of ``x`` (or of an ``(x, y)`` batch), checked first.

        Every path (``forward``, ``cluster``, the training, test and predict steps) comes through here, so a bad row
        is refused once, with its index in the batch: a NaN or inf row would give NaN logits that argmax labels 0,
        and an all-zero row stays zero under L2 normalisation, so it has no direction to cluster.

        Raises:
            ValueError: features not ``(B, F)``, or the first row that is not finite or is all zeros.
        """
        if isinstance(x, (tuple, list)):
            x = x[0]
        if x.dim() != 2 or x.shape[1] != self.hparams.feat_dim:
            raise ValueError(
                f"expected features (B, {self.hparams.feat_dim}), got {tuple(x.shape)}: this model was trained on "
                f"{self.hparams.feat_dim}-d features"
            )
        x = x.float()  # checked after the cast: a float64 value beyond float32's range becomes inf here
        finite = torch.isfinite(x).all(-1)
        zero = (x == 0).all(-1)
        if not bool((finite & ~zero).all()):  # one host sync per call; the row is looked up on the error path only
            if not bool(finite.all()):
                bad, what, fix = ~finite, "is not finite (NaN or inf)", "Drop or impute such rows before clustering."
            else:
                bad, what = zero, "is all zeros"
                fix = "L2 normalisation leaves it without a direction to cluster: drop such rows before clustering."
            row, count = int(bad.nonzero()[0, 0]), int(bad.sum())
            raise ValueError(f"features row {row} {what}; {count} of {len(x)} rows are. {fix}")
        return nn.functional.normalize(x, dim=-1)

    def _direct(self, net: nn.Module, x: Tensor) -> Tensor:
        """The no-diffusion path: the network with z_t = z_sc = 0 and t = 0."""
        z = torch.zeros(*x.shape[:-1], self.hparams.emb_dim, device=x.device)
        return net.head(net(z, x, torch.zeros(x.shape[0], dtype=torch.long, device=x.device), z))

    def forward(
        self, x: Tensor | tuple[Tensor, ...] | list[Tensor], generator: torch.Generator | None = None
    ) -> Tensor:
        """Cluster logits ``(B, K)``: the mean over ``eval_samples`` DDIM chains (a ``(x, y)`` batch is accepted).

        The chains' noise comes from ``generator``, by default one seeded with ``seed``, so a call is reproducible.
        """
        x = self._features(x)
        if self.hparams.mode == "no_diffusion":
            return self._direct(self.net, x[None])[0]
        generator = generator or torch.Generator().manual_seed(self.hparams.seed)
        copies = x[None].expand(self.hparams.eval_samples, *x.shape)
        with torch.no_grad():
            logits = self.diffusion.sample(self.net, copies, self.hparams.eval_steps, generator=generator)
        return logits.mean(0)

    @torch.no_grad()
    def cluster(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(labels (B,), probabilities (B, K))`` of features ``x`` ``(B, F)``: argmax and softmax of the mean logits."""
        logits = self(x)
        return logits.argmax(-1), logits.softmax(-1)

    # ------------------------------------------------------------------------------------------------ training
    def training_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x = self._features(batch)
        hp = self.hparams
        s = hp.batch_diffusion
        if len(x) < _MIN_ROWS_PER_CLUSTER * hp.num_clusters:
            raise ValueError(
                f"a batch of {len(x)} rows for K={hp.num_clusters}: the clustering loss normalises over the batch, "
                f"so use batches of at least {_MIN_ROWS_PER_CLUSTER}·K = {_MIN_ROWS_PER_CLUSTER * hp.num_clusters} "
                "rows (10·K or more trains better; drop_last in the loader)"
            )
        x = x[None].expand(s, *x.shape)
        student_x = perturb_features(x, hp.noise_scale, hp.feature_drop)
        if hp.mode == "no_diffusion":
            teacher_logits = self._teacher(lambda net: self._direct(net, x[:1]).expand(s, -1, -1))
            student_logits = self._direct(self.net, student_x)
            loss = hp.ce_lambda * row_column_ce(teacher_logits, student_logits, None, hp.tau_row, hp.tau_col)
            self.log("train/loss_ce", loss / hp.ce_lambda)
        else:
            teacher_logits = self._teacher(lambda net: self.diffusion.sample(net, x, hp.train_steps, head=net.head))
            target = self.net.embed((teacher_logits / hp.emb_temperature).softmax(-1))
            t = torch.randint(0, hp.num_timesteps, (s,), device=x.device)
            z_t = self.diffusion.q_sample(target, t, torch.randn_like(target))
            z_sc = torch.zeros_like(z_t)
            if float(torch.rand(())) < hp.self_cond_prob:
                with torch.no_grad():
                    z_sc = self.net(z_t, student_x, t, z_sc)
            student_logits = self.net.head(self.net(z_t, student_x, t, z_sc))
            z_loop = self.net.embed((student_logits / hp.emb_temperature).softmax(-1))
            w = self.diffusion.weights(t)
            loss_diff = (((z_loop - target) ** 2).mean((1, 2)) * w).mean()
            loss_ce = row_column_ce(teacher_logits, student_logits, w, hp.tau_row, hp.tau_col)
            loss = loss_diff + hp.ce_lambda * loss_ce
            self.log_dict({"train/loss_diff": loss_diff, "train/loss_ce": loss_ce})
        self.log("train/loss", loss, prog_bar=True)
        if isinstance(batch, (tuple, list)) and len(batch) > 1:  # monitoring only: NMI of one teacher sample
            labelled = batch[1] >= 0  # −1 marks an unlabelled row, as at evaluation
            if bool(labelled.any()):
                nmi = normalized_mutual_info_score(teacher_logits[0].argmax(-1)[labelled].detach(), batch[1][labelled])
                self.log("train/nmi_teacher", nmi, prog_bar=True)
        return loss

    def _teacher(self, run: Any) -> Tensor:
        """The teacher's logits from ``run(net)``: the student in eval mode (gradients kept unless detached) or the
        EMA copy (no gradients)."""
        if self.ema is not None:
            with torch.no_grad():
                return run(self.ema.module.eval())
        was_training = self.net.training
        self.net.eval()
        try:
            if self.hparams.detach_teacher:
                with torch.no_grad():
                    return run(self.net)
            return run(self.net)
        finally:
            self.net.train(was_training)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Per-parameter clipping (the official `clip_gradients`): Lightning's gradient_clip_val clips the global
        # norm, which is a different rule, so it is applied here with foreach kernels.
        clip = self.hparams.clip_per_param
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if clip and grads:
            norms = torch._foreach_norm(grads)
            torch._foreach_mul_(grads, [(clip / (n + 1e-6)).clamp(max=1.0) for n in norms])

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ema is not None:
            self.ema.update_parameters(self.net)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        decay = [p for p in self.net.parameters() if p.requires_grad and p.dim() > 1]
        no_decay = [p for p in self.net.parameters() if p.requires_grad and p.dim() <= 1]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr,
            betas=(0.9, 0.98),
        )
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        per_epoch = max(total // max(self.trainer.max_epochs or 1, 1), 1)
        warmup = min(hp.warmup_epochs * per_epoch, total - 1)
        floor = hp.min_lr / hp.lr

        def schedule(step: int) -> float:  # DINO's cosine_scheduler: linear warm-up from 0, cosine to min_lr
            if step < warmup:
                return step / warmup
            progress = (step - warmup) / max(total - warmup, 1)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------------------------------------ evaluation
    def _evaluate(self, batch: tuple[Tensor, ...], batch_idx: int, stage: str) -> None:
        """Cluster a ``(x, y)`` batch; every row counts towards ``clusters_used``, rows with ``y < 0`` (unlabelled)
        are left out of the ACC / NMI / ARI updates, and a batch without labelled rows updates none of them."""
        x, y = batch[0], batch[1]
        generator = torch.Generator().manual_seed(self.hparams.seed + batch_idx)
        labels = self(x, generator=generator).argmax(-1)
        counts = torch.bincount(labels, minlength=self.hparams.num_clusters)
        self._counts[stage] = self._counts.get(stage, torch.zeros_like(counts)) + counts
        labelled = y >= 0
        num_labelled, top = torch.stack([labelled.sum(), y.max().long()]).tolist() if len(y) else (0, -1)
        limit = self.hparams.num_classes or self.hparams.num_clusters
        if top >= limit:
            row = int((y >= limit).nonzero()[0, 0])
            built = (
                f"num_classes={limit}"
                if self.hparams.num_classes
                else f"num_classes=None, so labels are scored against num_clusters={limit} classes"
            )
            raise ValueError(
                f"{stage} batch {batch_idx}: label {int(y[row])} (row {row}) is out of range for a model built with "
                f"{built}: labels must be in 0..{limit - 1}, or -1 for an unlabelled row. Set num_classes to the "
                "number of classes the labels use."
            )
        if num_labelled == len(y):
            self.metrics[stage].update(labels, y)
        elif num_labelled:
            self.metrics[stage].update(labels[labelled], y[labelled])
        key = f"{stage}/labelled"  # kept beside the cluster counts, so a stage without labelled rows logs no scores
        self._counts[key] = self._counts.get(key, torch.zeros((), dtype=torch.long)) + num_labelled

    def _log_epoch(self, stage: str) -> None:
        """Log the stage's ACC / NMI / ARI (only if some row was labelled, on any process) and ``clusters_used``."""
        labelled = self._counts.pop(f"{stage}/labelled", torch.zeros((), dtype=torch.long)).float().to(self.device)
        if self._trainer is not None:  # every process must agree, or one would wait in compute()'s sync for ever
            labelled = self.trainer.strategy.reduce(labelled, reduce_op="sum")
        if bool(labelled > 0):
            self.log_dict(self.metrics[stage].compute(), prog_bar=stage == "val")
        self.metrics[stage].reset()
        counts = self._counts.pop(stage, None)
        if counts is not None:
            # Non-collapse: the share of clusters that hold at least 2 % of the points (the card's check).
            used = (counts.float() / counts.sum() >= 0.02).float().mean()
            self.log(f"{stage}/clusters_used", used)

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "test")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def predict_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int) -> dict[str, Tensor]:
        """``{"labels": (B,), "probs": (B, K)}``: the argmax and the softmax of the logits averaged over the chains
        (as :meth:`cluster`; not the mean of per-chain probabilities), with noise seeded per batch."""
        logits = self(batch, generator=torch.Generator().manual_seed(self.hparams.seed + batch_idx))
        return {"labels": logits.argmax(-1), "probs": logits.softmax(-1)}

    def card_notes(self) -> str:
        hp = self.hparams
        return (
            f"CLUDI on {hp.feat_dim}-d L2-normalised features, K = {hp.num_clusters} clusters, E = {hp.emb_dim}. "
            f"Labels are the argmax of logits averaged over {hp.eval_samples} η = 1 DDIM chains of {hp.eval_steps} "
            f"steps (seeded, so metrics are reproducible); `model.cluster(x)` returns labels and probabilities. "
            "Cluster ids are arbitrary: accuracy is Hungarian-matched (torchmetrics' ClusterAccuracy). Trained on "
            "scikit-learn's digits pixels, a stand-in for the frozen ViT features of the paper."
        )
