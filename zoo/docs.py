"""``zoo docs``: the documentation site, a page per paper with its card, executed notebook, claims and API.

The site is built with MkDocs and the Material theme: Material gives a model-zoo layout (navigation per paper,
client-side search that works offline) from Markdown, ``mkdocs-jupyter`` renders executed notebooks with their
outputs and plots, and ``mkdocstrings`` renders the API reference from the docstrings (Google style, read from the
source by griffe, so no model is imported to document it). Sphinx with ``myst-nb`` would do the same with more
configuration; MkDocs keeps the site's sources plain Markdown that this module writes.

:func:`build` writes the sources into ``<out>/src`` and the site into ``<out>/site``:

* ``index.md``: the README;
* ``quickstart.ipynb``: the executed tour notebook;
* per paper ``papers/<slug>/``: ``index.md`` (title, links, entries, the quick reproduction's claims table and
  figure, the paper's notes from ``docs/papers/<slug>.md``, the model cards), ``notebook.ipynb`` (executed) and
  ``api.md`` (``::: zoo.models.<package>``).

Notebooks and quick reproductions run once and are kept in a cache folder (``<out>/cache`` unless given): an
executed notebook at ``notebooks/<name>.ipynb``, a reproduction's JSON, PNG and ``.claims.md`` under
``reproduce/<slug>/``. The test suite writes the same layout while it runs them, and its site test builds from it
without running anything twice. Nothing fetched from the internet: the theme's web fonts are off and the notebook
pages' MathJax is replaced by an inline no-op, so the site works offline.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo._layout import REPO_DIR, in_clone
from zoo.registry import ENTRIES, Entry, import_object

__all__ = ["Paper", "build", "execute_notebook", "papers", "run_quick_reproduction", "serve"]

ROOT = REPO_DIR  # the clone: README.md, notebooks/, docs/papers/


@dataclass(frozen=True)
class Paper:
    """One paper of the zoo: its page slug (the package's name with dashes) and its registry entries."""

    slug: str
    package: str
    entries: tuple[Entry, ...]

    @property
    def title(self) -> str:
        return self.entries[0].paper.title

    @property
    def reproduce(self) -> str | None:
        return self.entries[0].reproduce


def papers() -> list[Paper]:
    """Every paper, in the order of the registry (the README's model table).

    Example:
        >>> [p.slug for p in papers()][:2], len(papers())
        (['ra-sae', 'backtrack-sampling'], 19)
    """
    grouped: dict[str, list[Entry]] = {}
    for entry in ENTRIES:
        grouped.setdefault(entry.module.split(".")[2], []).append(entry)
    return [Paper(pkg.replace("_", "-"), pkg, tuple(entries)) for pkg, entries in grouped.items()]


def execute_notebook(source: Path, dest: Path, timeout: int = 300) -> Path:
    """Run ``source`` top to bottom on a fresh kernel (working folder: the notebook's) and write it, outputs and
    all, to ``dest`` (via a temporary file and a rename, so a reader never sees half a notebook)."""
    import nbclient
    import nbformat

    nb = nbformat.read(source, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(source.parent)}}
    )
    client.execute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, dest)
    return dest


def run_quick_reproduction(function: str, dest: Path) -> dict[str, Any]:
    """Run ``function(quick=True, out=...)`` (a ``zoo reproduce`` entry point) and put its JSON, PNG and claims table
    in ``dest``, replacing what was there; returns the results."""
    from zoo.hub import staging

    from zoo.evidence import write_meta

    slug = function.split(".")[2].replace("_", "-")
    with staging(dest) as tmp:  # a temporary sibling folder, renamed into place on success
        start = time.perf_counter()
        results = import_object(function)(quick=True, out=tmp)
        write_meta(tmp, slug, command=f"zoo reproduce {slug} --quick", quick=True, seconds=time.perf_counter() - start)
    return results


def _demote(markdown: str, levels: int) -> str:
    """Strip YAML front matter and push every ATX heading down ``levels`` (a card's ``# name`` becomes ``###``)."""
    markdown = re.sub(r"\A---\n.*?\n---\n", "", markdown, flags=re.S)
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def _verdict_section(paper: Paper) -> list[str]:
    """The page's opening section: the verdict table of the recorded full run, or the pending note."""
    from zoo.evidence import PENDING, RECORDS, recorded_verdict

    verdict = recorded_verdict(paper.slug)
    if verdict == PENDING:
        return ['!!! warning "Evidence standard: pending"', "", f"    {PENDING}", ""]
    lines = ["## Verdict at this scale", ""]
    if verdict is None:
        return lines + [f"No full run is recorded: run `zoo reproduce {paper.slug} --out docs/reproductions/"
                        f"{paper.slug}`.", ""]  # fmt: skip
    lines += [verdict.strip(), ""]
    for name, caption in (("", "the full run's figure"), (".diagnose", "the diagnosis: the scale sweep")):
        if (RECORDS / paper.slug / f"{paper.slug}{name}.png").is_file():
            lines += [f"![{caption}](full-run{name}.png)", ""]
    return lines


def _paper_page(paper: Paper, reproduction: Path | None, notebook: bool) -> str:
    from zoo.hub import card

    first = next((e for e in paper.entries if e.name == paper.slug), paper.entries[0])  # ra-sae, not a-sae
    links = [first.paper.venue]
    if first.paper.arxiv:
        links.append(f"[arXiv {first.paper.arxiv}](https://arxiv.org/abs/{first.paper.arxiv})")
    if first.paper.code:
        links.append(f"[official code]({first.paper.code})")
    lines = [f"# {paper.title}", "", " · ".join(links), ""]
    if paper.reproduce:
        lines += _verdict_section(paper)
    lines += ["| entry | what it is |", "|---|---|"]
    lines += [f"| `{e.name}` | {e.summary} |" for e in paper.entries]
    lines += [
        "",
        "```python",
        "import zoo",
        f'model = zoo.load("{first.name}")         # the hub weights, checksum-verified',
        f'dm = zoo.datamodule("{first.name}")      # the data it was trained on',
        "```",
        "",
        f"Train with `zoo fit -c {first.name}`"
        + ("; the [executed notebook](notebook.ipynb) shows the model at work" if notebook else "")
        + "; the [API reference](api.md) lists its classes.",
        "",
    ]
    if paper.reproduce and reproduction is None:
        lines += ["## Claims", "", "This build ran no reproduction (`zoo docs --no-execute`, none cached).", ""]
    if paper.reproduce and reproduction is not None:
        lines += ["## Claims (this build's quick reproduction)", ""]
        claims = sorted(reproduction.glob("*.claims.md"))
        lines += [claims[0].read_text().strip() if claims else "(no claims table was written)", ""]
        figure = sorted(reproduction.glob("*.png"))
        if figure:
            lines += [f"![the quick reproduction's figure]({figure[0].name})", ""]
    if paper.reproduce:
        lines += [
            f"`zoo reproduce {first.name} --quick` re-runs this; `zoo reproduce {first.name}` runs the full "
            "reproduction that the notes below report.",
            "",
        ]
    notes = ROOT / "docs" / "papers" / f"{paper.slug}.md"
    if notes.is_file():
        lines += [re.sub(r"\A<!--.*?-->\n*", "", notes.read_text(), flags=re.S).strip(), ""]
    lines += ["## Model cards", ""]
    for entry in paper.entries:
        lines += [_demote(card(entry.name), 2).strip(), ""]
    return "\n".join(lines)


def _mkdocs_yml(nav: list[Any], out: Path) -> dict[str, Any]:
    return {
        "site_name": "zoo: ICML 2025 papers as software",
        "docs_dir": "src",
        "site_dir": "site",
        "use_directory_urls": True,
        "theme": {
            "name": "material",
            "font": False,  # no Google Fonts: the site works offline
            "features": ["navigation.sections", "navigation.top", "search.highlight", "content.code.copy"],
        },
        "markdown_extensions": ["tables", "admonition", "pymdownx.superfences", {"toc": {"permalink": True}}],
        "plugins": [
            "search",
            {
                "mkdocs-jupyter": {
                    "execute": False,  # executed once, by zoo docs or the test suite, before the build
                    "include": ["*.ipynb"],
                    "include_requirejs": False,
                    "ignore_h1_titles": True,  # the nav says "Notebook", not the notebook's first heading
                    # no CDN: an inline no-op instead of MathJax (equations show as their TeX source)
                    "custom_mathjax_url": "data:text/javascript,",
                    "cache_dir": str(out / "jupyter-cache"),  # not the caller's working folder
                }
            },
            {
                "mkdocstrings": {
                    "handlers": {
                        "python": {
                            "paths": [str(ROOT)],
                            "options": {
                                "docstring_style": "google",
                                "show_source": False,
                                "members_order": "source",
                                "show_root_heading": False,
                                "heading_level": 2,
                            },
                        }
                    }
                }
            },
        ],
        "nav": nav,
    }


def build(
    out: Path | str = "site",
    cache: Path | str | None = None,
    execute: bool = True,
    progress: bool = True,
) -> Path:
    """Build the documentation site into ``<out>/site`` and return that folder (open ``index.html`` through
    :func:`serve`: the search index loads over HTTP only).

    Args:
        out: the build folder (sources under ``src/``, the site under ``site/``, the MkDocs config).
        cache: executed notebooks and quick reproductions (see the module docstring); ``<out>/cache`` if ``None``.
        execute: run the notebooks and quick reproductions missing from the cache (else their sections say so).
        progress: a progress bar over the papers.

    Raises:
        FileNotFoundError: outside a clone of the repository (the README, notebooks and notes are not installed).
        ImportError: the docs extras are missing (``pip install -e ".[docs]"``).
    """
    if not in_clone():
        raise FileNotFoundError(
            "zoo docs builds from a clone of the repository (README.md, notebooks/ and docs/papers/ are not in the "
            "wheel): git clone the zoo, pip install -e '.[docs]', then run zoo docs there."
        )
    try:
        from mkdocs.commands.build import build as mkdocs_build
        from mkdocs.config import load_config
    except ImportError as err:
        raise ImportError("zoo docs needs the docs extras: pip install -e '.[docs]'") from err
    import logging

    import yaml
    from rich.progress import track

    from zoo.evidence import RECORDS

    # griffe reports docstring-style nits ("a / b: ..." argument lists) as warnings, a hundred lines a build
    logging.getLogger("griffe").setLevel(logging.ERROR)

    out = Path(out).resolve()
    cache = Path(cache).resolve() if cache is not None else out / "cache"
    src = out / "src"
    if src.exists():
        shutil.rmtree(src)
    (src / "papers").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", src / "index.md")

    def notebook(name: str) -> Path | None:
        cached = cache / "notebooks" / f"{name}.ipynb"
        if not cached.is_file() and execute:
            execute_notebook(ROOT / "notebooks" / f"{name}.ipynb", cached)
        return cached if cached.is_file() else None

    nav: list[Any] = [{"Home": "index.md"}]
    quickstart = notebook("quickstart")
    if quickstart is not None:
        shutil.copy(quickstart, src / "quickstart.ipynb")
        nav.append({"Quickstart": "quickstart.ipynb"})
    paper_nav = []
    for paper in track(papers(), description="paper pages", disable=not progress):
        folder = src / "papers" / paper.slug
        folder.mkdir()
        reproduction = None
        if paper.reproduce:
            reproduction = cache / "reproduce" / paper.slug
            if not any(reproduction.glob("*.json")) and execute:
                run_quick_reproduction(paper.reproduce, reproduction)
            if any(reproduction.glob("*.json")):
                for png in reproduction.glob("*.png"):
                    shutil.copy(png, folder / png.name)
            else:
                reproduction = None
        for name in ("", ".diagnose"):  # the recorded full run's figures (the verdict section shows them)
            figure = RECORDS / paper.slug / f"{paper.slug}{name}.png"
            if figure.is_file():
                shutil.copy(figure, folder / f"full-run{name}.png")
        executed = notebook(paper.slug)
        (folder / "index.md").write_text(_paper_page(paper, reproduction, executed is not None))
        (folder / "api.md").write_text(f"# API: {paper.slug}\n\n::: zoo.models.{paper.package}\n")
        pages = [{"Overview": f"papers/{paper.slug}/index.md"}]
        if executed is not None:
            shutil.copy(executed, folder / "notebook.ipynb")
            pages.append({"Notebook": f"papers/{paper.slug}/notebook.ipynb"})
        pages.append({"API": f"papers/{paper.slug}/api.md"})
        paper_nav.append({paper.slug: pages})
    nav.append({"Papers": paper_nav})
    config_file = out / "mkdocs.yml"
    config_file.write_text(yaml.safe_dump(_mkdocs_yml(nav, out), sort_keys=False, allow_unicode=True))
    mkdocs_build(load_config(str(config_file)))
    return out / "site"


def serve(site: Path | str, port: int = 8000) -> None:
    """Serve a built site on ``http://127.0.0.1:<port>/`` until interrupted (the search needs HTTP, not file://)."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(site))
    with ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"Serving {site} on http://127.0.0.1:{port}/ (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
