"""The documentation site: built from this session's executed notebooks and quick reproductions, opened in Chromium.

The contract tests execute every notebook and quick reproduction once and leave them in the session's ``docs_cache``;
the site test runs last (``tests/conftest.py``), waits for the ones collected in this session, and builds from them
without running anything again (what was not collected, e.g. when this file runs alone, ``zoo.docs.build`` runs).
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from zoo.docs import _demote, papers

WAIT_S = 45 * 60  # the other worker may still be running the long contract tests


def _chromium() -> str | None:
    return os.environ.get("ZOO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _wait_for_session_outputs(cache: Path, inputs: dict[str, list[str]]) -> list[str]:
    """Block until every notebook / reproduction collected in this session has left its output or a failure marker;
    returns the ones that failed."""
    expected = [cache / "notebooks" / nb for nb in inputs["notebooks"]] + [
        cache / "reproduce" / function.split(".")[2].replace("_", "-") for function in inputs["reproductions"]
    ]
    deadline = time.monotonic() + WAIT_S
    while True:
        failed = [p.name for p in expected if p.with_name(f"{p.name}.failed").exists()]
        pending = [p.name for p in expected if not p.exists() and p.name not in failed]
        if not pending:
            return failed
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting {WAIT_S} s for this session's notebooks / reproductions: {pending}")
        time.sleep(2)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path, docs_cache: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, str]]:
    inputs = getattr(request.config, "zoo_docs_inputs", {"notebooks": [], "reproductions": []})
    failed = _wait_for_session_outputs(docs_cache, inputs)
    assert not failed, f"the site needs these, which failed in this session's contract tests: {failed}"
    from zoo.docs import build

    site = build(tmp_path / "build", cache=docs_cache, execute=True, progress=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield site, f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()


def test_demote_pushes_headings_down_and_drops_front_matter() -> None:
    """Check that a model card's headings nest under the paper page's and its YAML front matter goes."""
    card = "---\nlibrary_name: zoo\n---\n# sead\n\n## Use\n\n```python\n# a comment, not a heading\n```\n"
    assert _demote(card, 2).splitlines() == ["### sead", "", "#### Use", "", "```python", "# a comment, not a heading",
                                             "```"]  # fmt: skip


def test_zoo_docs_without_executing_builds_every_paper_page_and_api(tmp_path: Path) -> None:
    """Check ``zoo docs --no-execute`` on an empty cache: the README as home page, every paper's overview with its
    entries and card, and its API page rendered from the docstrings (no notebook or claims without the cache)."""
    from zoo.cli import main

    main(["docs", "--no-execute", "--out", str(tmp_path), "--cache", str(tmp_path / "empty")])
    site = tmp_path / "site"
    assert "PyTorch Lightning model zoo" in (site / "index.html").read_text()
    for paper in papers():
        overview = (site / "papers" / paper.slug / "index.html").read_text()
        assert paper.entries[0].name in overview and "Model cards" in overview, paper.slug
        assert not (site / "papers" / paper.slug / "notebook").exists()
        assert ("This build ran no reproduction" in overview) == (paper.reproduce is not None), paper.slug
    assert "RelaxedArchetypalDictionary" in (site / "papers" / "ra-sae" / "api" / "index.html").read_text()


def test_zoo_docs_outside_a_clone_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Check that an installed zoo (no README, notebooks or notes) refuses with the way to build the site."""
    import zoo.docs

    monkeypatch.setattr(zoo.docs, "in_clone", lambda: False)
    with pytest.raises(FileNotFoundError, match="builds from a clone"):
        zoo.docs.build(tmp_path)


def test_site_builds_and_every_page_loads_in_chromium(served: tuple[Path, str], tmp_path: Path) -> None:
    """Check the built site in headless Chromium: every page loads without a console error, a script error or a
    failed request, every image loads, each paper has its overview, executed notebook (with outputs) and API pages,
    each reproduction's claims table and figure are on its paper's page, and the search finds a paper by name.
    A screenshot of one paper page is written to the test's tmp dir."""
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium binary (apt install chromium, or set ZOO_CHROMIUM); .ci/run installs it")
    from playwright.sync_api import sync_playwright

    site, base = served
    pages = sorted(p.relative_to(site).parent.as_posix() for p in site.rglob("index.html"))
    for paper in papers():
        for page_name in ("", "notebook", "api"):
            assert f"papers/{paper.slug}/{page_name}".rstrip("/") in pages, (paper.slug, page_name)
    problems, images = {}, 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"script error: {e}"))
        # ERR_ABORTED is the browser dropping a still-loading request (the search worker) when the test moves on
        page.on("requestfailed", lambda r: None if "ERR_ABORTED" in (r.failure or "") else errors.append(
            f"request failed: {r.url} ({r.failure})"))  # fmt: skip
        for rel in pages:
            errors.clear()
            page.goto(base + (rel + "/" if rel != "." else ""), wait_until="load")
            broken = page.evaluate(
                "() => Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
            )
            images += page.evaluate("() => document.images.length")
            if errors or broken:
                problems[rel] = {"errors": list(errors), "broken images": broken}
            if rel.startswith("papers/") and rel.count("/") == 1:  # a paper's overview
                slug = rel.split("/")[1]
                has_reproduction = next(p for p in papers() if p.slug == slug).reproduce is not None
                if has_reproduction:
                    text = page.inner_text("article")
                    assert "Claims (this build's quick reproduction)" in text and "stand-ins" in text, slug
                    assert page.locator("article img").count() >= 1, f"{slug}: no reproduction figure"
            if rel.endswith("/notebook"):
                assert page.locator(".jp-OutputArea-output").count() > 0, f"{rel}: the notebook has no outputs"
        assert not problems, problems
        assert images >= len([p for p in papers() if p.reproduce]), images

        page.goto(base, wait_until="load")
        page.fill("input.md-search__input", "Segment Anyword")
        page.wait_for_selector(".md-search-result__item", timeout=15000)
        hits = page.eval_on_selector_all(".md-search-result__item a", "els => els.map(e => e.href)")
        assert "/papers/segment-anyword/" in hits[0], hits[:3]

        page.goto(base + "papers/ra-sae/", wait_until="load")
        shot = tmp_path / "ra-sae-page.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert shot.stat().st_size > 10_000
