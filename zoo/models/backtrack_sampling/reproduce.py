"""``zoo reproduce backtrack-sampling``: tokenwise rejection sampling with backtracking against the baselines.

The card's §5 experiment: Dyck-2 with 24 brackets (max depth 8); the tiny LM (2 layers, d = 64) trained here for
600 steps on strings with push probabilities (0.2, 0.8) (``conf/backtrack-sampling.yaml``); out-of-distribution
prompts cut at 6–16 brackets from strings with (0.8, 0.2); 4 samples per prompt with the same random stream for every
method. Verifiers: the exact prefix acceptor, and a logistic probe on the LM's hidden state trained here (200 Adam
steps, class-balanced) on first-error / earlier-position prefixes of the LM's own samples, labelled by the exact one.

Methods: plain sampling, nucleus (top-p 0.9), temperature 0.7, full-sequence rejection (exact checker, at most 4
draws), tokenwise rejection (B = 1, Q = 16), backtracking (Q = 4, B = 4; the paper's default) and block best-of-N
(blocks of 6, N = 4), each verifier-based one with both verifiers; the stride sweep B ∈ {1, 2, 4, 8} at Q = 4 is
reported. Metrics: accuracy (valid complete strings), LM queries per sample (tokens generated, erased ones included),
queries per correct sample, diversity (distinct correct completions / samples per prompt) and distinct / correct.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from datamodules.grammar import DyckDataModule, error_pairs
from zoo.models.backtrack_sampling.lm import CachedLM
from zoo.models.backtrack_sampling.module import DyckLM
from zoo.models.backtrack_sampling.probe import VerifierProbe
from zoo.models.backtrack_sampling.samplers import Generation, block_best_of_n, generate, rejection_sample
from zoo.reporting import print_claims, write_results

__all__ = ["run", "score", "train_lm", "train_probe"]

SAMPLES = 4
STRIDES = (1, 2, 4, 8)


def train_lm(seed: int = 0) -> tuple[DyckLM, DyckDataModule, float]:
    """The conf's LM: 600 AdamW steps (one epoch of 38,400 strings); returns (model, datamodule, seconds)."""
    from lightning import Trainer, seed_everything

    seed_everything(seed, verbose=False)
    dm = DyckDataModule(train_size=38400, seed=seed)
    model = DyckLM()
    trainer = Trainer(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator="cpu",
        devices=1,
    )
    start = time.perf_counter()
    trainer.fit(model, dm)
    dm.setup("test")
    return model.eval(), dm, time.perf_counter() - start


def train_probe(model: DyckLM, num_prompts: int = 4000, steps: int = 200, seed: int = 0) -> tuple[VerifierProbe, dict]:
    """Logistic probe on the LM's hidden states: 200 full-batch Adam steps on ``error_pairs`` of ``num_prompts``
    completions (half shifted prompts); returns it and its balanced accuracy on fresh shifted-prompt pairs."""
    from datamodules.grammar import PrefixErrorDataModule

    torch.manual_seed(seed)
    hidden, labels = PrefixErrorDataModule.pairs(model, num_prompts, seed)
    probe = VerifierProbe(d_model=model.hparams.d_model)
    opt = torch.optim.Adam(probe.parameters(), lr=1e-2)
    for _ in range(steps):
        loss, _ = probe.loss((hidden, labels))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    probe.eval()
    # Held out: fresh completions of shifted prompts, the distribution the probe is used on.
    g = torch.Generator().manual_seed(seed + 1000)
    split = DyckDataModule(train_size=1, val_size=1, test_size=1)._split(1000, True, g)
    h, y, _, _ = error_pairs(model.lm, model.grammar, *split.tensors, g)
    with torch.no_grad():
        pred = probe(h).argmax(-1)
    recall = [float((pred[y == c] == c).float().mean()) for c in (0, 1)]
    return probe, {
        "probe/train_pairs": float(len(labels)),
        "probe/train_error_share": float(labels.float().mean()),
        "probe/heldout_balanced_accuracy": sum(recall) / 2,
        "probe/heldout_error_recall": recall[1],
    }


def score(gen: Generation, accept: Callable, samples: int) -> dict[str, float]:
    """Accuracy, queries, queries per correct sample, diversity and distinct / correct of one method's rows."""
    ok = accept(gen.tokens, gen.lengths)
    completions = gen.completions()
    prompts = len(ok) // samples
    distinct = 0
    for p in range(prompts):  # a set per prompt of the correct completions (a few hundred prompts, at the end)
        distinct += len({completions[r] for r in range(p * samples, (p + 1) * samples) if ok[r]})
    correct = int(ok.sum())
    return {
        "accuracy": float(ok.float().mean()),
        "queries": float(gen.queries.float().mean()),
        "queries_per_correct": float(gen.queries.sum()) / max(correct, 1),
        "diversity": distinct / (prompts * samples),
        "distinct_per_correct": distinct / max(correct, 1),
        "backtracks": float(gen.backtracks.float().mean()),
        "verifier_calls": float(gen.verifier_calls.float().mean()),
    }


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Train the LM and the probe, run every sampler, print the table; with ``out`` write JSON and a PNG.

    ``quick``: 100 prompts instead of 300, no stride sweep.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # rows of 26 tokens through a 64-wide model: one thread is fastest
    try:
        start = time.perf_counter()
        r: dict[str, Any] = {}
        model, dm, r["seconds_train_lm"] = train_lm(0)
        probe, stats = train_probe(model)
        r.update(stats)
        grammar, accept = model.grammar, model.grammar.accept
        n_prompts = 100 if quick else 300
        tokens, prompt_lengths = (t[:n_prompts].repeat_interleave(SAMPLES, 0) for t in dm.test_set.tensors)
        id_tokens, id_lengths = (t[:n_prompts].repeat_interleave(SAMPLES, 0) for t in dm.val_set.tensors)
        lm = CachedLM(model.lm)
        exact, learned = model.exact_verifier, probe.verifier
        L = grammar.seq_len  # noqa: N806
        methods: dict[str, Callable[[torch.Generator], Generation]] = {
            "plain": lambda g: generate(lm, tokens, prompt_lengths, L, None, generator=g),
            "nucleus_0.9": lambda g: generate(lm, tokens, prompt_lengths, L, None, top_p=0.9, generator=g),
            "temperature_0.7": lambda g: generate(lm, tokens, prompt_lengths, L, None, temperature=0.7, generator=g),
            "rejection": lambda g: rejection_sample(lm, tokens, prompt_lengths, L, accept, max_attempts=4, generator=g),
        }
        for vname, verifier in (("exact", exact), ("probe", learned)):
            check = vname == "exact"  # the probe's false alarms on a prompt only spend quota
            methods[f"tokenwise/{vname}"] = lambda g, v=verifier, c=check: generate(
                lm, tokens, prompt_lengths, L, v, quota=16, stride=1, forbid_repeat=False, generator=g, check_prompt=c
            )
            methods[f"backtrack/{vname}"] = lambda g, v=verifier, c=check: generate(
                lm, tokens, prompt_lengths, L, v, quota=4, stride=4, generator=g, check_prompt=c
            )
            methods[f"best_of_n/{vname}"] = lambda g, v=verifier: block_best_of_n(
                lm, tokens, prompt_lengths, L, v, block=6, n=4, generator=g
            )
            for stride in () if quick else (1, 2, 8):
                methods[f"sweep/{vname}/B{stride}"] = lambda g, v=verifier, b=stride, c=check: generate(
                    lm, tokens, prompt_lengths, L, v, quota=4, stride=b, generator=g, check_prompt=c
                )
        for name, method in methods.items():
            t0 = time.perf_counter()
            gen = method(torch.Generator().manual_seed(0))
            seconds = time.perf_counter() - t0
            for key, value in score(gen, accept, SAMPLES).items():
                r[f"{name}/{key}"] = value
            r[f"{name}/seconds"] = seconds
        in_dist = generate(lm, id_tokens, id_lengths, L, None, generator=torch.Generator().manual_seed(0))
        r["plain_in_distribution/accuracy"] = float(accept(in_dist.tokens, in_dist.lengths).float().mean())
        r["seconds"] = time.perf_counter() - start
        r.update(_claims(r))
        _print(r, quick)
        if out is not None:
            write_results(r, out, "backtrack-sampling", _plot)
        return r
    finally:
        torch.set_num_threads(threads)


def _claims(r: dict[str, Any]) -> dict[str, float]:
    """The card's §5 assertions (300 shifted prompts × 4 samples, paired random streams); 1.0 when they hold."""
    plain = r["plain/accuracy"]
    return {
        "claims/precondition_plain_ood_at_most_0.85": float(plain <= 0.85),
        "claims/sanity_plain_in_distribution_at_least_0.85": float(r["plain_in_distribution/accuracy"] >= 0.85),
        "claims/backtrack_exact_beats_plain_by_0.10": float(r["backtrack/exact/accuracy"] >= plain + 0.10),
        "claims/backtrack_probe_beats_plain_by_0.03": float(r["backtrack/probe/accuracy"] > plain + 0.03),
        "claims/backtrack_fewer_queries_per_correct_than_rejection": float(
            r["backtrack/exact/queries_per_correct"] < r["rejection/queries_per_correct"]
        ),
        "claims/backtrack_diversity_within_0.02_of_temperature_0.7": float(
            r["backtrack/exact/diversity"] >= r["temperature_0.7/diversity"] - 0.02
        ),
    }


def _print(r: dict[str, Any], quick: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    names = sorted({k.rsplit("/", 1)[0] for k in r if k.endswith("/accuracy") and "in_distribution" not in k},
                   key=lambda n: (n.startswith("sweep"), n))  # fmt: skip
    table = Table(title=f"Dyck-2, {100 if quick else 300} shifted prompts × {SAMPLES} samples")
    for column in ("method", "accuracy", "queries", "queries / correct", "diversity", "distinct / correct",
                   "backtracks", "seconds"):  # fmt: skip
        table.add_column(column, justify="left" if column == "method" else "right")
    for name in names:
        table.add_row(
            name,
            *(f"{r[f'{name}/{k}']:.3f}" for k in ("accuracy",)),
            *(f"{r[f'{name}/{k}']:.1f}" for k in ("queries", "queries_per_correct")),
            *(f"{r[f'{name}/{k}']:.3f}" for k in ("diversity", "distinct_per_correct")),
            f"{r[f'{name}/backtracks']:.2f}",
            f"{r[f'{name}/seconds']:.1f}",
        )
    console.print(table)
    console.print(
        f"plain sampling in distribution: {r['plain_in_distribution/accuracy']:.3f}; probe: held-out balanced accuracy "
        f"{r['probe/heldout_balanced_accuracy']:.3f}, error recall {r['probe/heldout_error_recall']:.3f} "
        f"({r['probe/train_pairs']:.0f} training pairs, {r['probe/train_error_share']:.0%} errors); LM trained in "
        f"{r['seconds_train_lm']:.0f} s; total {r['seconds']:.0f} s"
    )
    print_claims(console, r)


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k.rsplit("/", 1)[0] for k in r if k.endswith("/accuracy") and not k.startswith(("sweep", "plain_in"))]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    for name in names:
        ax.scatter(r[f"{name}/queries_per_correct"], r[f"{name}/accuracy"], s=40)
        ax.annotate(name, (r[f"{name}/queries_per_correct"], r[f"{name}/accuracy"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel("LM queries per correct sample")
    ax.set_ylabel("accuracy (valid strings)")
    ax.set_title("shifted Dyck prompts: accuracy vs cost")
    ax = axes[1]
    for vname in ("exact", "probe"):
        strides = [b for b in STRIDES if f"sweep/{vname}/B{b}/accuracy" in r or b == 4]
        if len(strides) > 1:
            acc = [r[f"backtrack/{vname}/accuracy"] if b == 4 else r[f"sweep/{vname}/B{b}/accuracy"] for b in strides]
            ax.plot(strides, acc, marker="o", label=f"{vname} verifier")
    ax.axhline(r["plain/accuracy"], color="grey", linestyle="--", label="plain sampling")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("backtrack stride B (Q = 4)")
    ax.set_ylabel("accuracy")
    ax.set_title("stride sweep")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
