"""``zoo publish NAME``: train with ``conf/NAME.yaml`` at its seed, test on the held-out split, write the hub entry."""

from __future__ import annotations

import platform
import re
import shlex
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from zoo import hub
from zoo.registry import conf_path, get_entry

__all__ = ["publish", "library_versions", "refresh_verdict", "render_card", "verdict_block"]

DISTRIBUTION = "icml25-zoo"  # the zoo's name on the index (`zoo` there is an unrelated RPC framework)
_LIBRARIES = (DISTRIBUTION, "torch", "lightning", "torchmetrics", "safetensors", "huggingface_hub", "numpy",
              "scikit-learn")


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries a hub entry depends on, plus Python's."""
    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        key = "zoo" if name == DISTRIBUTION else name  # cards record the zoo's version under "zoo"
        try:
            versions[key] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[key] = "not installed"
    return versions


def _natural(key: str) -> list[Any]:
    """Sort key that orders numbers by value: ``snn_acc_T2`` before ``snn_acc_T16``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def render_card(
    name: str,
    model: Any,
    datamodule: Any,
    metrics: dict[str, float],
    command: str,
    train_seconds: float,
    pretrained: str | None = None,
) -> str:
    """The model card (``README.md``) of a hub entry: what, data, command, metrics, versions, limits."""
    entry = get_entry(name)
    describe = getattr(datamodule, "describe", None)
    data = describe() if callable(describe) else type(datamodule).__name__
    rows = "\n".join(f"| `{k}` | {v:.4f} |" for k, v in sorted(metrics.items(), key=lambda kv: _natural(kv[0])))
    versions = ", ".join(f"{k} {v}" for k, v in library_versions().items())
    hp = "\n".join(f"  - `{k}`: `{v}`" for k, v in model.hparams.items() if not k.startswith("_"))
    notes = model.card_notes() if hasattr(model, "card_notes") else ""
    code = f" Official code: {entry.paper.code}." if entry.paper.code else ""
    arxiv = f" arXiv {entry.paper.arxiv}." if entry.paper.arxiv else ""
    start = f"\n- Started from: the hub entry `{pretrained}` (fine-tuned from its weights)" if pretrained else ""
    return f"""---
library_name: zoo
tags: [zoo, {", ".join(entry.tags)}]
---
# {name}

{entry.summary}

Paper: *{entry.paper.title}* ({entry.paper.venue}).{arxiv}{code}
{verdict_block(name)}
## Use

```python
import zoo
model = zoo.load("{name}")        # eval mode, offline, checksum-verified safetensors
dm = zoo.datamodule("{name}")     # the data it was trained on
```

## Training

- Class: `{hub.class_path(type(model))}`
- Data: {data}{start}
- Command: `{command}` (conf `conf/{entry.conf}`), {train_seconds:.0f} s on this machine ({
        platform.processor() or platform.machine()
    }).
- Init arguments:
{hp}

## Test metrics (held-out split, measured by `zoo publish`)

| metric | value |
|---|---|
{rows}

## Limits

{notes or "A small model trained on the embedded default data; it is a working example, not the paper's checkpoint."}

## Versions

{versions}
"""


_VERDICT_OPEN, _VERDICT_CLOSE = "<!-- verdict: rendered from docs/reproductions by zoo publish -->", "<!-- /verdict -->"


def verdict_block(name: str) -> str:
    """The card's verdict section for entry ``name``: its paper's recorded full run (or the pending note), delimited
    so that :func:`refresh_verdict` can replace it; empty for a paper without a reproduction or outside a clone."""
    from zoo._layout import in_clone
    from zoo.evidence import recorded_verdict

    slug = get_entry(name).module.split(".")[2].replace("_", "-")
    verdict = recorded_verdict(slug) if in_clone() else None
    if verdict is None:
        return ""
    return f"\n{_VERDICT_OPEN}\n## Verdict at this scale\n\n{verdict.strip()}\n{_VERDICT_CLOSE}\n"


def refresh_verdict(name: str, dest: str | Path | None = None) -> Path:
    """Rewrite the verdict section of a published card from the recorded full run, without retraining (a card
    published before the run was recorded gets the section where :func:`render_card` puts it).

    The weights, config and the rest of the card stay as published; the card is written to a temporary file and
    renamed into place. Returns the card's path.

    Raises:
        FileNotFoundError: no published card at ``dest`` (default: the bundled entry).
        ValueError: the card has neither a verdict section nor a ``## Use`` section to put one before, or there is
            no recorded verdict to put there.
    """
    import os
    import uuid

    path = (Path(dest) if dest is not None else hub.BUNDLED / name) / hub.CARD
    if not path.is_file():
        raise FileNotFoundError(f"No model card at {path}: publish the entry first (zoo publish {name}).")
    text = path.read_text()
    block = verdict_block(name)
    if not block:
        raise ValueError(f"No recorded verdict for {name!r}: record its paper's full run first (zoo reproduce ... "
                         "--out docs/reproductions/<slug>).")  # fmt: skip
    start, end = text.find(_VERDICT_OPEN), text.find(_VERDICT_CLOSE)
    use = text.find("\n## Use\n")
    if (start < 0 or end < 0) and use >= 0:
        # a card published before its paper's run was recorded: the section goes where render_card puts it
        text = text[:use] + block.rstrip("\n") + "\n" + text[use:]
    elif start < 0 or end < 0:
        raise ValueError(f"{path} has no verdict section and no '## Use' section to put it before: re-publish it "
                         f"(zoo publish {name}).")  # fmt: skip
    else:
        text = text[: start - 1] + block.rstrip("\n") + text[end + len(_VERDICT_CLOSE) :]
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def publish(
    name: str, dest: str | Path | None = None, max_epochs: int | None = None, extra_args: list[str] | None = None
) -> Path:
    """Train entry ``name`` with its conf, test it, and write its hub entry atomically.

    Args:
        name: a registry entry.
        dest: entry folder (default ``zoo/pretrained/<name>`` in a clone; an installed zoo needs one: site-packages is
            often read-only, and an upgrade would replace what was written there).
        max_epochs: override the conf's ``trainer.max_epochs`` (quick checks).
        extra_args: more Lightning CLI arguments (``["--trainer.logger", "false"]``...).

    Returns:
        The entry folder.
    """
    from zoo._layout import in_clone
    from zoo.lightning_cli import ZooCLI

    entry = get_entry(name)
    if dest is None and not in_clone():
        raise ValueError("name the folder to write the entry to (--dest DIR, `publish(name, "
                         "dest=DIR)`): this zoo is installed from a wheel, and its bundled entries stay as installed; "
                         "load the new one with zoo.load(DIR) or ZOO_HUB=<parent of DIR>")  # fmt: skip
    args = ["-c", str(conf_path(name))]
    if max_epochs is not None:
        args += ["--trainer.max_epochs", str(max_epochs)]
    args += list(extra_args or [])
    cli = ZooCLI(args=args, run=False)
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    seconds = time.perf_counter() - start
    # Streaming models (SEAD) change their state while they are tested: publish the state that fit left.
    trained = {k: v.detach().clone() for k, v in cli.model.state_dict().items()}
    results = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    cli.model.load_state_dict(trained)
    metrics = {k: float(v) for k, v in results[0].items() if k.startswith("test/")}
    model = cli.model.cpu().eval()
    command = "zoo publish " + shlex.join([name] + (["--max-epochs", str(max_epochs)] if max_epochs else []))
    if extra_args:
        command += "  # plus Lightning CLI arguments: " + shlex.join(extra_args)
    dm = cli.datamodule
    pretrained = cli.config.get("pretrained")
    meta = {
        "pretrained": pretrained,
        "name": name,
        "module": entry.module,
        "datamodule": {
            "class_path": entry.datamodule,
            "init_args": {k: v for k, v in dm.hparams.items() if not k.startswith("_")},
        },
        "conf": entry.conf,
        "command": command,
        "seed": cli.config.get("seed_everything"),
        "metrics": metrics,
        "versions": library_versions(),
    }
    dest = Path(dest) if dest is not None else hub.BUNDLED / name
    hub.write_entry(
        model, dest, zoo_meta=meta, card_text=render_card(name, model, dm, metrics, command, seconds, pretrained)
    )
    print(f"Published {name} to {dest.resolve()}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))
    return dest
