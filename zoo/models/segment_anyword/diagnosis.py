"""``zoo reproduce segment-anyword --diagnose``: why the pipeline does not ground better on the toy, as sweeps.

* **pretraining length and learning rate**: the toy text-to-image model trained from scratch for 1,000 / 4,000 steps
  at the conf's lr 3e-3, and 4,000 steps at 1e-3, beside the hub entry (8,000 steps at 3e-3), on the
  hub's data; for each, how selective its cross-attention is (a word's attention on the named object minus on the
  other objects, and whether the word's map peaks on the object), and raw attention and the full pipeline on
  shared-colour scenes;
* **textual-inversion steps**: 0 / 40 / 200 steps on the hub model (the paper: 1,100);
* **renormalisation**: BOS dropped (the toy's default) against BOS, EOS and padding dropped (the card's pitfall; the
  real path's default), on the hub model;
* **background seeds**: the random walker's background seeds where every target map is below 0.3 / 0.4 instead of
  the card's proposed 0.2, for the full pipeline and raw attention through the same post-processing.

Every sweep runs on seed 0 of the reproduction's scenes (32 per setting), not on held-out scenes: it explains, it
does not tune.

No official code exists (the repository holds a README only), so there is no official run on the same task.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from zoo.datamodules.shapes import captioned_shapes
from zoo.models.segment_anyword.attention import record_cross_attention
from zoo.models.segment_anyword.experiment import SCENES, Experiment
from zoo.reporting import conclude, run_arms

__all__ = ["attention_selectivity", "diagnose", "pretrain"]


def attention_selectivity(model: Any, scenes: int = 48, seed: int = 0) -> dict[str, float]:
    """How much the toy's cross-attention singles out the named object, on shared-colour scenes naming one object.

    For the colour and the shape word of the phrase: the mean attention probability (over heads, layers and 10
    noised copies at t in [50, 600], BOS excluded and renormalised, as the pipeline reads it) on the named object's
    pixels minus on the other objects' pixels (``<word>_selectivity``: 0 = blind to which object), and the share of
    scenes whose min-max map peaks on the named object (``<word>_pointing``).
    """
    data = captioned_shapes(scenes, size=model.hparams.size, seed=20_000 + seed, **(SCENES | {"hard_fraction": 0.0,
                            "shared_colour_fraction": 1.0}))  # fmt: skip
    t2i = model.model
    timesteps = torch.linspace(50, 600, 10).long()
    sums = {f"{w}_{k}": 0.0 for w in ("colour", "shape") for k in ("selectivity", "pointing")}
    count = 0
    for i in range(scenes):
        obj = int(data["phrase_object"][i, 0])
        others = data["masks"][i].any(0) & ~data["masks"][i, obj]
        if not others.any():
            continue
        ids, x0 = data["tokens"][i][None], data["image"][i][None]
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed * 1000 + i))
        with torch.no_grad(), record_cross_attention(t2i.unet) as store:
            states = t2i.encode_text(ids)
            for t in timesteps:
                t2i.unet(t2i.scheduler.add_noise(x0, noise, t[None]), t[None], encoder_hidden_states=states)
            positions = data["phrase_tokens"][i, 0][None]  # [colour, shape]
            probs = store.maps(positions, x0.shape[-1], renormalize=True)[0]  # min-max scaled, for the peak
            raw = torch.stack([
                torch.nn.functional.interpolate(
                    (r.probs[..., 1:] / r.probs[..., 1:].sum(-1, keepdim=True)).transpose(1, 2)
                    .reshape(1, -1, *r.size), size=x0.shape[-2:], mode="bilinear", align_corners=False)[0]
                for r in store.records]).mean(0)  # fmt: skip
        for j, word in enumerate(("colour", "shape")):
            column = raw[positions[0, j] - 1]
            sums[f"{word}_selectivity"] += float(column[data["masks"][i, obj]].mean() - column[others].mean())
            sums[f"{word}_pointing"] += float(data["masks"][i, obj].view(-1)[probs[j].view(-1).argmax()])
        count += 1
    return {k: v / max(count, 1) for k, v in sums.items()}


def pretrain(steps: int, seed: int = 0, **init_args: Any) -> Any:
    """The toy model trained from scratch as ``zoo fit -c conf/segment-anyword.yaml`` does (its model and data
    arguments, updated with ``init_args``; AdamW, batch 32), for ``steps`` steps, in a plain loop."""
    from zoo.hub import create
    from zoo.hub import datamodule as conf_datamodule

    torch.manual_seed(seed)
    model, datamodule = create("segment-anyword", **init_args), conf_datamodule("segment-anyword")
    datamodule.setup("fit")
    optimizer = model.configure_optimizers()
    model.train()
    loader = datamodule.train_dataloader()
    done = 0
    while done < steps:
        for batch in loader:
            loss = model.model.loss(batch["image"], batch["tokens"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    return model.eval()


def diagnose(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the sweeps and (with ``out``) write ``segment-anyword.diagnose.json``.

    Returns:
        flat results: ``pretraining/s<S>/<metric>`` (selectivity, pointing, raw / full shared-colour gIoU) and
        ``tuning/t<T>/full/<metric>``, ``renormalise/special/full/<metric>``, ``background/b<B>/<arm>/<metric>``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _diagnose(quick, out)
    finally:
        torch.set_num_threads(threads)


def _diagnose(quick: bool, out: Path | str | None) -> dict[str, Any]:
    import zoo

    start = time.perf_counter()
    runs = ((500, 3e-3), (1000, 3e-3)) if quick else ((1000, 3e-3), (4000, 3e-3), (4000, 1e-3))
    scenes, probe = (12, 24) if quick else (32, 64)
    r: dict[str, Any] = {}
    for steps, lr in runs:
        name = f"pretraining/s{steps}_lr{lr:g}/"
        model = pretrain(steps, lr=lr)
        r |= {f"{name}{k}": v for k, v in attention_selectivity(model, probe).items()}
        run_arms(["raw", "full"], (0,), Experiment(model, scenes, ("raw", "full")), prefix=name, results=r)
    hub = zoo.load("segment-anyword")
    r |= {f"pretraining/hub/{k}": v for k, v in attention_selectivity(hub, probe).items()}
    run_arms(["raw", "full"], (0,), Experiment(hub, scenes, ("raw", "full")), prefix="pretraining/hub/", results=r)
    for tuning in (0, 40) if quick else (0, 40, 200):
        experiment = Experiment(hub, scenes, ("full",), tuning_steps=tuning)
        run_arms(["full"], (0,), experiment, prefix=f"tuning/t{tuning}/", results=r)
    experiment = Experiment(hub, scenes, ("full",), exclude_tokens="special", special_ids=(0, 1, 2))
    run_arms(["full"], (0,), experiment, prefix="renormalise/special/", results=r)
    for threshold in (0.3, 0.4):
        experiment = Experiment(hub, scenes, ("full", "raw_refined"), background_threshold=threshold)
        run_arms(["full", "raw_refined"], (0,), experiment, prefix=f"background/b{threshold:g}/", results=r)
    r["seconds"] = time.perf_counter() - start
    return conclude("segment-anyword.diagnose", r, out=out, notes=[f"total {r['seconds']:.0f} s"])
