"""The evidence standard's records: the verdict rendered from a recorded run, cards that carry it, the pending note,
argument checks, reference fixtures."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

import zoo.evidence as evidence
from zoo.claims import Claim, TaskCheck
from zoo.evidence import Headline
from zoo.reporting import conclude

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "fixtures" / "reference"


def _module() -> types.SimpleNamespace:
    claim = Claim("acc_at_least_0.8", lambda r, a: r[f"{a}/acc"], method="m", at_least=0.8,
                  baselines={"b": "the paper's baseline"}, ablations={"a": "the key part off"},
                  alternatives={"h": "a heuristic"})  # fmt: skip
    task = TaskCheck(lambda r, a: r[f"{a}/acc"], method="m", heuristics={"h": "a heuristic"}, margin=0.1)
    headline = Headline("accurate", "The method is accurate.", claims=[claim.name])
    return types.SimpleNamespace(CLAIMS=[claim], CHECKS=[task], HEADLINES=[headline])


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[types.SimpleNamespace, Path]:
    """The paper 'tsm' faked at the standard (a toy module), with a recorded full run under a temporary RECORDS."""
    module = _module()
    monkeypatch.setattr(evidence, "RECORDS", tmp_path)
    monkeypatch.setattr(evidence, "reproduction_module", lambda slug: module)
    r = {"m/acc": 0.9, "b/acc": 0.7, "a/acc": 0.6, "h/acc": 0.5}
    folder = tmp_path / "tsm"
    conclude("tsm", r, module.CLAIMS, module.CHECKS, out=folder, console=None, headlines=module.HEADLINES)
    evidence.write_meta(folder, "tsm", command="zoo reproduce tsm", quick=False, seconds=12.0)
    return module, folder


def test_recorded_verdict_renders_the_recorded_numbers_with_the_codes_words(recorded) -> None:
    """Check that the verdict comes from the record's numbers (an edited number shows) and says how the run went."""
    module, folder = recorded
    verdict = evidence.recorded_verdict("tsm")
    assert "From the full run `zoo reproduce tsm`" in verdict and "12 s" in verdict
    row = "| The method is accurate. | reproduced | `acc_at_least_0.8` >= 0.8 | m 0.9 | b 0.7 x | a 0.6 x | h 0.5 x |"
    assert row in verdict
    results = json.loads((folder / "tsm.json").read_text())
    results["values/acc_at_least_0.8/m"] = 0.95
    (folder / "tsm.json").write_text(json.dumps(results))
    assert "| m 0.95 |" in evidence.recorded_verdict("tsm")


def test_recorded_verdict_is_none_without_a_record_and_pending_without_headlines(recorded, monkeypatch) -> None:
    """Check the two other states: at the standard with no recorded run (None), and pending (the pending note)."""
    module, folder = recorded
    (folder / "tsm.meta.json").unlink()
    assert evidence.recorded_verdict("tsm") is None
    monkeypatch.setattr(evidence, "reproduction_module", lambda slug: types.SimpleNamespace(CLAIMS=[]))
    assert evidence.recorded_verdict("tsm") == evidence.PENDING


def test_pending_paper_pages_say_so_and_standard_pages_open_with_the_verdict(recorded, monkeypatch) -> None:
    """Check that a paper page opens with the verdict section for a paper at the standard and the pending warning
    otherwise."""
    import zoo.docs as docs

    paper = next(p for p in docs.papers() if p.slug == "tsm")
    monkeypatch.setattr(docs, "ROOT", ROOT)
    page = docs._paper_page(paper, None, notebook=False)
    assert page.index("## Verdict at this scale") < page.index("| entry | what it is |")
    assert "| The method is accurate. | reproduced |" in page
    monkeypatch.setattr(evidence, "reproduction_module", lambda slug: types.SimpleNamespace(CLAIMS=[]))
    page = docs._paper_page(paper, None, notebook=False)
    assert '!!! warning "Evidence standard: pending"' in page and "## Verdict" not in page


def test_card_verdict_is_refreshed_in_place_without_retraining(recorded, tmp_path: Path, monkeypatch) -> None:
    """Check that a card carries the verdict block between its markers and `refresh_verdict` rewrites only that
    block when the record changes."""
    from zoo.publish import refresh_verdict, verdict_block

    block = verdict_block("tsm")
    assert block.startswith("\n<!-- verdict") and "| The method is accurate. | reproduced |" in block
    card = tmp_path / "entry" / "README.md"
    card.parent.mkdir()
    card.write_text(f"# tsm\n\nsummary\n\nPaper: x.\n{block}\n## Use\n\nrest\n")
    module, folder = recorded
    results = json.loads((folder / "tsm.json").read_text())
    results["values/acc_at_least_0.8/m"] = 0.97
    (folder / "tsm.json").write_text(json.dumps(results))
    refresh_verdict("tsm", dest=card.parent)
    text = card.read_text()
    assert "| m 0.97 |" in text and "| m 0.9 |" not in text
    assert text.startswith("# tsm\n\nsummary\n\nPaper: x.\n\n<!-- verdict")
    assert text.endswith("-->\n\n## Use\n\nrest\n")
    # published after the headlines and before the record: no section yet, so it goes before "## Use"
    card.write_text("# tsm\n\nsummary\n\nPaper: x.\n\n## Use\n\nrest\n")
    refresh_verdict("tsm", dest=card.parent)
    assert card.read_text() == text
    card.write_text("# old card\n")
    with pytest.raises(ValueError, match="no verdict section"):
        refresh_verdict("tsm", dest=card.parent)


def test_reproduce_command_writes_how_it_ran_and_refuses_a_missing_diagnosis(tmp_path: Path, monkeypatch) -> None:
    """Check that `zoo reproduce --out` writes <slug>.meta.json (command, quick, seconds, commit, threads) and that
    `--diagnose` on a paper without a diagnosis says so in one line."""
    import zoo.cli as cli

    calls = []
    monkeypatch.setattr("zoo.registry.import_object", lambda path: (lambda quick, out: calls.append((quick, out))))
    cli.main(["reproduce", "cv-winrate", "--quick", "--out", str(tmp_path)])
    meta = json.loads((tmp_path / "cv-winrate.meta.json").read_text())
    assert calls == [(True, tmp_path)] and meta["command"] == "zoo reproduce cv-winrate --quick" and meta["quick"]
    assert {"seconds", "finished", "commit", "torch_threads", "cpu_count", "versions"} <= set(meta)
    monkeypatch.undo()
    with pytest.raises(SystemExit, match="has no diagnosis"):
        cli.main(["reproduce", "tsm", "--diagnose"])


# --- argument checks ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.check_probability("p", 1.5), "Expected argument `p` to be a finite float in [0, 1], but got 1.5."),
        (lambda c: c.check_probability("p", float("nan")), "but got nan"),
        (lambda c: c.check_range("alpha", float("inf"), optional=True), "a finite float or None, but got inf"),
        (lambda c: c.check_range("steps", 0, low=1, integer=True), "`steps` to be an int >= 1, but got 0."),
        (lambda c: c.check_range("steps", 2.0, low=1, integer=True), "an int >= 1, but got 2.0"),
        (lambda c: c.check_range("steps", True, low=0, integer=True), "but got True"),
        (lambda c: c.check_range("lr", -1, low=0, low_open=True), "a finite float > 0, but got -1"),
        (lambda c: c.check_choice("mode", "Raw", ("raw", "full")), "one of 'raw', 'full', but got 'Raw' (did you mean 'raw'?)."),
        (lambda c: c.check_interval("clamp", (10, 0.1)), "(low, high) with low <= high, but got (10, 0.1)."),
        (lambda c: c.check_interval("clamp", (-1, 2), low=0), "both within [0, inf]"),
        (lambda c: c.check_interval("clamp", "ab"), "but got 'ab'"),
    ],
)
def test_argument_checks_name_the_argument_and_what_is_accepted(call, message: str) -> None:
    """Check each helper's refusal message: the argument, the accepted values, the value given."""
    import zoo.arguments as checks

    with pytest.raises(ValueError, match=re.escape(message)):
        call(checks)


def test_argument_checks_accept_the_edges_and_numpy_numbers() -> None:
    """Check that closed ends, None where optional, and numpy scalars pass."""
    import numpy as np

    from zoo.arguments import check_choice, check_interval, check_probability, check_range

    check_probability("p", 0.0)
    check_probability("p", np.float32(1.0))
    check_range("n", np.int64(3), low=1, integer=True)
    check_range("n", None, low=1, optional=True)
    check_choice("flag", True, (True, False))
    check_interval("clamp", [0.1, 0.1], low=0.0)
    with pytest.raises(ValueError, match="one of 1, 2"):
        check_choice("k", 1.0, (1, 2))  # a float is not the int choice


# --- reference fixtures ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("note", sorted(REFERENCE.glob("*/*.json")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_reference_fixture_records_where_it_came_from(note: Path) -> None:
    """Check that every reference fixture has its arrays beside it and a note naming the official repository, the
    commit, the function and the command that made it."""
    meta = json.loads(note.read_text())
    assert {"repository", "commit", "function", "command"} <= set(meta), note
    assert re.fullmatch(r"[0-9a-f]{7,40}", meta["commit"]), meta["commit"]
    assert meta["repository"].startswith("https://github.com/")
    assert note.with_suffix(".npz").is_file(), f"{note}: no arrays beside the note"
