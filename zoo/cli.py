"""The ``zoo`` command.

``zoo fit|validate|test|predict`` are Lightning's ``LightningCLI`` (subclass mode for model and data, configs
from ``conf/``, every init argument overridable, ``--pretrained NAME_OR_DIR`` to start from hub weights);
``-c NAME`` takes an entry's conf as installed (``-c conf/NAME.yaml`` or any other file works too).
``zoo list``, ``zoo info NAME``, ``zoo conf NAME``, ``zoo reproduce NAME`` and ``zoo publish NAME`` are the zoo's own.

``zoo list`` and ``zoo info`` import no torch, so they answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

__all__ = ["main"]

_LIGHTNING = ("fit", "validate", "test", "predict")
_OWN = ("list", "info", "conf", "reproduce", "publish", "winrate", "watermark")


def _resolve_confs(argv: list[str]) -> list[str]:
    """``-c NAME`` / ``--config NAME`` / ``--config=NAME`` naming no existing file: an entry's conf, or a conf of the
    installed set by its relative name (``-c logger/wandb``), from the package in a wheel or conf/ in a clone."""
    from zoo.registry import CONF_DIR, conf_path, list_models

    names = set(list_models())

    def resolve(value: str) -> str:
        if Path(value).exists():
            return value
        if value in names:
            return str(conf_path(value))
        shipped = CONF_DIR / (value if value.endswith((".yaml", ".yml")) else value + ".yaml")
        return str(shipped) if shipped.is_file() else value

    out = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if eq and flag == "--config":
            arg = f"--config={resolve(value)}"
        elif i > 0 and argv[i - 1] in ("-c", "--config"):
            arg = resolve(arg)
        out.append(arg)
    return out


def _lightning_cli(argv: list[str] | None) -> None:
    from zoo.lightning_cli import ZooCLI

    ZooCLI(args=argv)  # None: LightningCLI reads sys.argv itself
    _close_process_group()


def _close_process_group() -> None:
    """Tear down a DDP process group before the interpreter exits.

    Lightning leaves it open; at exit gloo's threads are then killed mid-flight and the process can abort
    ("terminate called without an active exception", exit -6) after a run that succeeded.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _cmd_list(args: argparse.Namespace) -> None:
    from zoo.registry import get_entry, list_models

    names = list_models(args.pattern)
    width = max((len(n) for n in names), default=4)
    for name in names:
        print(f"{name:<{width}}  {get_entry(name).summary}")


def _cmd_info(args: argparse.Namespace) -> None:
    from zoo import hub
    from zoo.registry import get_entry

    entry = get_entry(args.name)
    print(f"{entry.name}: {entry.summary}\npaper: {entry.paper.title} ({entry.paper.venue}); code: {entry.paper.code}")
    print(f"module: {entry.module}\ndata: {entry.datamodule}\nconf: conf/{entry.conf}\n")
    try:
        print(hub.card(args.name, hub=args.hub))
    except FileNotFoundError as err:
        print(f"(no published weights: {err})")


def _cmd_conf(args: argparse.Namespace) -> None:
    from zoo.registry import conf_path

    sys.stdout.write(conf_path(args.name).read_text())


def _cmd_reproduce(args: argparse.Namespace) -> None:
    from zoo.registry import get_entry, import_object

    entry = get_entry(args.name)
    if entry.reproduce is None:
        raise SystemExit(f"'{args.name}' has no reproduction.")
    function = entry.reproduce
    if args.diagnose:
        # A paper's diagnosis of the headlines that do not reproduce: `diagnose` beside `run` in its reproduce module.
        function = f"{entry.reproduce.rsplit('.', 1)[0]}.diagnose"
        try:
            import_object(function)
        except (AttributeError, ImportError):
            module = entry.reproduce.rsplit(".", 1)[0]
            raise SystemExit(f"'{args.name}' has no diagnosis (no `diagnose` in {module}): every headline of its "
                             "reproduction reproduces, or it is not at the evidence standard yet.")  # fmt: skip
    out = Path(args.out) if args.out else None
    start = time.perf_counter()
    import_object(function)(quick=args.quick, out=out)
    if out is not None:
        from zoo.evidence import write_meta

        slug = entry.module.split(".")[2].replace("_", "-")
        command = " ".join(["zoo reproduce", args.name] + ["--quick"] * args.quick + ["--diagnose"] * args.diagnose)
        write_meta(out, f"{slug}.diagnose" if args.diagnose else slug, command=command, quick=args.quick,
                   seconds=time.perf_counter() - start)  # fmt: skip


def _cmd_publish(args: argparse.Namespace) -> None:
    from zoo.publish import publish, refresh_verdict

    if args.verdict_only:
        print(f"Refreshed the verdict of {refresh_verdict(args.name, dest=args.dest)}")
        return
    publish(args.name, dest=Path(args.dest) if args.dest else None, max_epochs=args.max_epochs)


def _cmd_winrate(args: argparse.Namespace) -> None:
    from zoo.models.cv_winrate.estimate import report

    print(report(args.file, human=args.human, synthetic=args.synthetic, level=args.level))


def _cmd_watermark(args: argparse.Namespace) -> None:
    from zoo.models.e2e_wm.detect import report

    print(report(args.file, scheme=args.scheme, fpr=args.fpr, key=args.key, gamma=args.gamma,
                 tokenizer=args.tokenizer, hub=args.hub))  # fmt: skip


def _cmd_docs(args: argparse.Namespace) -> None:
    from zoo.docs import build, serve

    site = build(args.out, cache=args.cache, execute=not args.no_execute)
    print(f"Built {site}; `zoo docs --serve` (or `python -m http.server -d {site}`) serves it for a browser.")
    if args.serve:
        serve(site, port=args.port)


def _own_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zoo", description="A PyTorch Lightning model zoo of ICML 2025 papers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list the entries")
    p.add_argument("pattern", nargs="?", default=None, help="shell-style wildcard, e.g. '*sae'")
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("info", help="print an entry's model card")
    p.add_argument("name")
    p.add_argument("--hub", default=None, help="hub location to search first")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("conf", help="print an entry's training conf (`zoo conf ra-sae > my.yaml`, then -c my.yaml)")
    p.add_argument("name")
    p.set_defaults(func=_cmd_conf)
    p = sub.add_parser("reproduce", help="run the paper's small-scale claim against its baseline")
    p.add_argument("name")
    p.add_argument("--quick", action="store_true", help="about a minute instead of the full run")
    p.add_argument("--out", default=None, help="folder for the JSON results, the PNG plot, the claims and verdict "
                   "tables and how it ran (docs/reproductions/NAME records a paper's full run for its page and cards)")
    p.add_argument("--diagnose", action="store_true", help="run the diagnosis of the headlines that do not "
                   "reproduce (a scale sweep) instead of the reproduction")
    p.set_defaults(func=_cmd_reproduce)
    p = sub.add_parser("publish", help="train with conf/NAME.yaml, test, and write the hub entry with its card")
    p.add_argument("name")
    p.add_argument("--dest", default=None, help="entry folder (default in a clone: zoo/pretrained/NAME; an installed "
                   "zoo needs one)")
    p.add_argument("--max-epochs", type=int, default=None, help="override the conf's trainer.max_epochs")
    p.add_argument("--verdict-only", action="store_true", help="only rewrite the card's verdict section from the "
                   "recorded full run (docs/reproductions), keeping the weights and the rest of the card")
    p.set_defaults(func=_cmd_publish)
    p = sub.add_parser("winrate", help="unbiased win rate from human labels (some missing) + synthetic scores")
    p.add_argument(
        "file", help=".csv or .jsonl with a human label column (empty = unlabelled) and a synthetic score column"
    )
    p.add_argument("--human", default="human", help="column of human labels: 1 A wins, 0 B wins, 0.5 tie")
    p.add_argument("--synthetic", default="synthetic", help="column of synthetic P(A wins), e.g. a reward model's")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the interval")
    p.set_defaults(func=_cmd_winrate)
    p = sub.add_parser("watermark", help="watermark tools: `zoo watermark detect FILE`")
    wsub = p.add_subparsers(dest="action", required=True)
    p = wsub.add_parser("detect", help="a score, p-value and decision per text of FILE (.txt lines or .jsonl 'text')")
    p.add_argument("file")
    p.add_argument("--scheme", default="e2e-wm", help="a zoo watermark entry (e2e-wm), or kgw / unigram / exp")
    p.add_argument("--fpr", type=float, default=0.01, help="false-positive rate of the decision (p-value ≤ fpr)")
    p.add_argument("--key", type=int, default=15485863, help="kgw / unigram / exp: the key the text was generated with")
    p.add_argument("--gamma", type=float, default=0.5, help="kgw / unigram: the green-list share")
    p.add_argument("--tokenizer", default="synlang", help="kgw / unigram / exp: 'synlang' or a Hugging Face tokenizer")
    p.add_argument("--hub", default=None, help="hub location to search first (e2e-wm entries)")
    p.set_defaults(func=_cmd_watermark)
    p = sub.add_parser("docs", help="build the documentation site (executes the notebooks and quick reproductions)")
    p.add_argument("--out", default="site", help="build folder: the site goes to OUT/site (default: ./site)")
    p.add_argument("--cache", default=None, help="executed notebooks and quick reproductions to reuse (OUT/cache)")
    p.add_argument("--no-execute", action="store_true", help="run nothing: pages show only what the cache holds")
    p.add_argument("--serve", action="store_true", help="then serve the site on http://127.0.0.1:PORT/")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=_cmd_docs)
    for name in _LIGHTNING:
        sub.add_parser(name, help=f"Lightning CLI `{name}` (see `zoo {name} --help`)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    from_sys = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    try:
        if command in _LIGHTNING:
            resolved = _resolve_confs(argv)
            _lightning_cli(None if from_sys and resolved == argv else resolved)
            return
        args = _own_parser().parse_args(argv)
        args.func(args)
    except (KeyError, FileNotFoundError, ValueError, FloatingPointError) as err:
        # Bad input (unknown name, missing data, corrupt file, NaN loss) gets its one-line message, not a traceback;
        # ZOO_DEBUG=1 shows the traceback.
        if os.environ.get("ZOO_DEBUG"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        raise SystemExit(f"zoo {command}: {message}") from None


if __name__ == "__main__":  # pragma: no cover
    main()
