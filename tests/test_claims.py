"""Claims, checks and the reproduction harness (``zoo.claims``, ``zoo.reporting``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoo.claims import Check, Claim, evaluate, seed_views, verdicts
from zoo.reporting import arm_table, conclude, run_arms


def _gap(r: dict, arm: str) -> float:
    return r[f"{arm}/acc"] - r["base/acc"]


def _claim(**kwargs) -> Claim:
    args = dict(name="beats_base_by_0.1", value=_gap, method="m", stand_ins={"base": "baseline"}, at_least=0.1)
    return Claim(**{**args, **kwargs})


def test_claim_holds_only_when_every_stand_in_misses_the_bound() -> None:
    r = {"m/acc": 0.9, "base/acc": 0.5, "init/acc": 0.55, "other/acc": 0.85}
    ok = evaluate(r, [_claim(stand_ins={"base": "baseline", "init": "untrained"})])
    assert ok["claims/beats_base_by_0.1"] == 1.0
    assert ok["rejects/beats_base_by_0.1/init"] == 1.0
    assert ok["values/beats_base_by_0.1/m"] == pytest.approx(0.4)
    bad = evaluate(r, [_claim(stand_ins={"base": "baseline", "other": "a stand-in that passes"})])
    assert bad["claims/beats_base_by_0.1"] == 0.0
    assert bad["rejects/beats_base_by_0.1/other"] == 0.0
    assert verdicts(bad)["stand_ins_passed"] == ["beats_base_by_0.1/other"]


def test_claim_fails_when_the_method_misses_or_is_nan() -> None:
    assert evaluate({"m/acc": 0.55, "base/acc": 0.5}, [_claim()])["claims/beats_base_by_0.1"] == 0.0
    assert evaluate({"m/acc": float("nan"), "base/acc": 0.5}, [_claim()])["claims/beats_base_by_0.1"] == 0.0
    at_most = _claim(name="error_below", value=lambda r, a: r[f"{a}/err"], at_least=None, at_most=0.2)
    out = evaluate({"m/err": 0.1, "base/err": 0.3}, [at_most])
    assert out["claims/error_below"] == 1.0 and out["rejects/error_below/base"] == 1.0


def test_a_stand_in_that_was_not_run_is_an_error_naming_the_arm() -> None:
    with pytest.raises(KeyError, match="stand-in arm 'init'"):
        evaluate({"m/acc": 0.9, "base/acc": 0.5}, [_claim(stand_ins={"init": "untrained"})])


def test_claims_need_a_bound_and_a_stand_in_that_is_not_the_method() -> None:
    with pytest.raises(ValueError, match="is a Check"):
        _claim(stand_ins={})
    with pytest.raises(ValueError, match="its own stand-in"):
        _claim(stand_ins={"m": "itself"})
    with pytest.raises(ValueError, match="at_least"):
        _claim(at_least=None)
    with pytest.raises(ValueError, match="one path segment"):
        _claim(name="a/b")
    with pytest.raises(ValueError, match="unique"):
        evaluate({"m/acc": 1, "base/acc": 0}, [_claim(), _claim()])


def test_reported_claims_and_checks_have_their_own_prefixes() -> None:
    r = {"m/acc": 0.9, "base/acc": 0.5}
    out = evaluate(
        r, [_claim(asserted=False)], [Check("base_above_chance", lambda r: r["base/acc"], at_least=0.6)]
    )
    assert "claims/beats_base_by_0.1" not in out and out["reported/beats_base_by_0.1"] == 1.0
    assert out["checks/base_above_chance"] == 0.0 and out["values/base_above_chance"] == 0.5
    assert verdicts(out)["checks"] == ["base_above_chance"]


def test_seeds_held_counts_the_seeds_a_claim_holds_on() -> None:
    r = run_arms(["m", "base"], [0, 1, 2], lambda arm, s: {"acc": 0.5 + (0.3 if arm == "m" and s else 0.05)}, log=None)
    out = evaluate(r, [_claim()])
    assert out["claims/beats_base_by_0.1"] == 1.0  # the mean gap is 0.183
    assert out["seeds_held/beats_base_by_0.1"] == pytest.approx(2 / 3)
    assert seed_views(r)[0]["m/acc"] == pytest.approx(0.55)


def test_run_arms_writes_per_seed_values_means_and_seconds() -> None:
    calls = []

    def arm(name: str, seed: int) -> dict[str, float]:
        calls.append((name, seed))
        return {"acc": seed + (10 if name == "b" else 0)}

    r = run_arms(["a", "b"], [1, 3], arm, prefix="clean/", log=None)
    assert calls == [("a", 1), ("b", 1), ("a", 3), ("b", 3)]
    assert r["clean/a/acc/seed3"] == 3.0 and r["clean/a/acc"] == 2.0 and r["clean/b/acc"] == 12.0
    assert "clean/a/seconds" in r


def test_a_second_run_arms_on_other_seeds_keeps_the_first_calls_means() -> None:
    """Check that a 1-seed side experiment written into a 3-seed run's results leaves the 3-seed means alone (they
    were once recomputed over the second call's seeds: seed 0 only)."""
    r = run_arms(["a"], [0, 1, 2], lambda arm, s: {"acc": float(s)}, log=None)
    run_arms(["side"], [0], lambda arm, s: {"acc": 5.0}, results=r, log=None)
    assert r["a/acc"] == 1.0 and r["side/acc"] == 5.0


def test_run_arms_averages_keys_an_arm_wrote_into_the_results_itself() -> None:
    """Check that a per-seed key an arm stores in the shared results (not in its returned metrics) gets its mean."""
    r: dict = {}

    def arm(name: str, seed: int) -> dict[str, float]:
        r[f"side/epochs/seed{seed}"] = 10.0 * (seed + 1)
        return {"acc": 1.0}

    run_arms(["a"], [0, 1], arm, results=r, log=None)
    assert r["side/epochs"] == 15.0


def test_conclude_prints_writes_and_returns_the_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rich.console import Console

    r = run_arms(["m", "base"], [0, 1, 2], lambda arm, s: {"acc": 0.9 if arm == "m" else 0.5}, log=None)
    plotted = []
    out = conclude(
        "toy",
        r,
        [_claim()],
        [Check("base_sane", lambda r: r["base/acc"], at_least=0.4)],
        out=tmp_path,
        plot=lambda res, path: plotted.append(path),
        tables=[arm_table(r, ["m", "base"], ["acc"], "toy")],
        console=Console(width=200),
    )
    printed = capsys.readouterr().out
    assert "PASS" in printed and "beats_base_by_0.1" in printed and "base 0 x" in printed and "0.900 ± 0.000" in printed
    assert json.loads((tmp_path / "toy.json").read_text())["claims/beats_base_by_0.1"] == 1.0
    assert plotted == [tmp_path / "toy.png"] and out["checks/base_sane"] == 1.0


# --- the evidence standard: stand-ins by kind, the task check, headlines --------------------------------------------


def _kinded(**kwargs) -> Claim:
    args = dict(
        name="saves_at_least_0.1",
        value=lambda r, a: r[f"{a}/saving"],
        method="cv",
        baselines={"human": "human labels only", "ppi": "alpha = 1"},
        ablations={"rand": "a random control"},
        alternatives={"strat": "stratified sampling"},
        at_least=0.1,
    )
    return Claim(**{**args, **kwargs})


_SAVINGS = {"cv/saving": 0.2, "human/saving": 0.0, "ppi/saving": 0.05, "rand/saving": -0.01, "strat/saving": 0.08}


def test_claim_with_kinds_holds_only_when_every_kind_is_rejected() -> None:
    """Check that each kind's arms are evaluated in the method's place, and one passing alternative sinks the claim."""
    out = evaluate(_SAVINGS, [_kinded()])
    assert out["claims/saves_at_least_0.1"] == 1.0
    assert {k for k in out if k.startswith("rejects/")} == {f"rejects/saves_at_least_0.1/{a}" for a in
                                                             ("human", "ppi", "rand", "strat")}  # fmt: skip
    assert out["bounds/saves_at_least_0.1/at_least"] == 0.1
    passing = evaluate({**_SAVINGS, "strat/saving": 0.3}, [_kinded()])
    assert passing["claims/saves_at_least_0.1"] == 0.0 and passing["rejects/saves_at_least_0.1/strat"] == 0.0


def test_claim_kind_may_be_empty_only_with_a_reason() -> None:
    """Check that an empty kind needs a one-line reason, that a reason for a kind with arms is refused, and that an
    arm may not sit in two kinds or kinds mix with unclassified stand-ins."""
    with pytest.raises(ValueError, match="has no ablations"):
        _kinded(ablations={})
    with pytest.raises(ValueError, match="has no ablations"):
        _kinded(ablations={}, why_none={"ablations": "  "})
    claim = _kinded(ablations={}, why_none={"ablations": "the estimator has no component to remove"})
    assert claim.classified and claim.kind_of("strat") == "alternatives"
    with pytest.raises(ValueError, match="which has arms"):
        _kinded(why_none={"baselines": "none"})
    with pytest.raises(ValueError, match="the kinds are"):
        _kinded(why_none={"baseline": "typo"})
    with pytest.raises(ValueError, match="in both baselines and alternatives"):
        _kinded(alternatives={"ppi": "again"})
    with pytest.raises(ValueError, match="not both"):
        _kinded(stand_ins={"x": "unclassified"})
    with pytest.raises(ValueError, match="above at_most"):
        _kinded(at_least=0.5, at_most=0.1)


def test_claim_distance_ranks_stand_ins_by_how_close_they_came() -> None:
    """Check the distance outside a one- and a two-sided bound, by hand: 0 inside, the gap outside, inf for NaN."""
    one = _kinded()
    assert one.distance(0.25) == 0.0 and one.distance(0.04) == pytest.approx(0.06)
    assert one.distance(float("nan")) == float("inf")
    two = _kinded(at_least=-0.2, at_most=0.2)
    assert two.distance(0.5) == pytest.approx(0.3) and two.distance(-0.3) == pytest.approx(0.1)


def test_task_check_compares_the_method_with_the_best_heuristic() -> None:
    """Check the task check's margin by hand in both directions, and that a heuristic within the margin fails it."""
    from zoo.claims import TaskCheck

    up = TaskCheck(lambda r, a: r[f"{a}/acc"], method="m", heuristics={"colour": "", "size": ""}, margin=0.1)
    out = evaluate({"m/acc": 0.8, "colour/acc": 0.65, "size/acc": 0.3}, checks=[up])
    assert out["values/task_needs_the_method"] == pytest.approx(0.15) and out["checks/task_needs_the_method"] == 1.0
    assert out["values/task_needs_the_method/colour"] == 0.65
    out = evaluate({"m/acc": 0.8, "colour/acc": 0.75, "size/acc": 0.3}, checks=[up])
    assert out["checks/task_needs_the_method"] == 0.0
    down = TaskCheck(lambda r, a: r[f"{a}/mse"], method="m", heuristics={"mean": ""}, margin=1.0,
                     higher_is_better=False, name="task_needs_the_method_B")  # fmt: skip
    out = evaluate({"m/mse": 2.0, "mean/mse": 3.5}, checks=[down])
    assert out["values/task_needs_the_method_B"] == pytest.approx(1.5) and out["checks/task_needs_the_method_B"] == 1.0
    with pytest.raises(ValueError, match="starts with 'task_needs_the_method'"):
        TaskCheck(up.value, method="m", heuristics={"h": ""}, margin=0.1, name="heuristics_lose")
    with pytest.raises(ValueError, match="names no heuristic"):
        TaskCheck(up.value, method="m", heuristics={}, margin=0.1)
    with pytest.raises(ValueError, match="margin"):
        TaskCheck(up.value, method="m", heuristics={"h": ""}, margin=-1)


def test_headline_verdicts_reproduced_not_reproduced_contradicted() -> None:
    """Check the three verdicts: every named claim asserted and holding; a reported or failing one; a contradiction."""
    from zoo.evidence import Headline, headline_verdict, judge

    reverse = Claim("strat_saves_more_than_cv", lambda r, a: r[f"{a}/saving"] - r["cv/saving"], method="strat",
                    baselines={"cv": "the method"}, why_none={"ablations": "-", "alternatives": "-"}, at_least=0.05,
                    asserted=False)  # fmt: skip
    h = Headline("saves", "CV saves labels.", claims=["saves_at_least_0.1"],
                 contradicted_by=["strat_saves_more_than_cv"])  # fmt: skip
    claims = [_kinded(), reverse]

    def verdict(r: dict, headline: Headline = h) -> float:
        return judge({**r, **evaluate(r, claims)}, [headline], claims)[f"headlines/{headline.name}"]

    assert verdict(_SAVINGS) == 1.0
    assert headline_verdict({**_SAVINGS, **evaluate(_SAVINGS, claims)}, h) == "reproduced"
    assert verdict({**_SAVINGS, "cv/saving": 0.09}) == 0.0
    assert verdict({**_SAVINGS, "strat/saving": 0.3}) == -1.0  # the reported reverse claim holds: strat is 0.1 ahead
    reported = Headline("r", "A claim only reported.", claims=["strat_saves_more_than_cv"])
    assert verdict({**_SAVINGS, "strat/saving": 0.3}, reported) == 0.0
    with pytest.raises(ValueError, match="not among the claims"):
        judge(_SAVINGS, [Headline("x", "typo", claims=["saves"])], claims)
    with pytest.raises(ValueError, match="names no claim"):
        Headline("x", "nothing")


def test_verdict_table_shows_the_best_stand_in_of_each_kind_and_the_diagnosis() -> None:
    """Check the verdict table's cells: the closest stand-in per kind with its mark, the reason for an empty kind,
    'no diagnosis yet' for a headline that does not reproduce without one, and the task check's line."""
    from zoo.claims import TaskCheck
    from zoo.evidence import Headline, judge, verdict_markdown

    c = _kinded(ablations={}, why_none={"ablations": "nothing to remove"})
    task = TaskCheck(lambda r, a: r[f"{a}/saving"], method="cv", heuristics={"human": "the label mean"}, margin=0.1)
    ok = Headline("saves", "CV saves labels.", claims=[c.name], paper="24.8 %")
    bad = Headline("bad", "It also does X.", claims=[c.name])
    r = {**_SAVINGS, "ppi/saving": 0.15}  # ppi passes: the claim fails
    r.update(evaluate(r, [c], [task]))
    r.update(judge(r, [ok, bad], [c]))
    table = verdict_markdown(r, [ok, bad], [c], [task])
    row = table.splitlines()[2]
    assert row.startswith("| CV saves labels. (paper: 24.8 %) | not reproduced | `saves_at_least_0.1` >= 0.1 |")
    assert "| cv 0.2 |" in row
    assert "| ppi 0.15 ! | none: nothing to remove | strat 0.08 x |" in row and "**no diagnosis yet**" in row
    assert "cv 0.2 against the non-learned heuristics human 0 (margin 0.2, required 0.1)" in table


def test_conclude_writes_the_verdict_table_with_headlines(tmp_path: Path) -> None:
    """Check that conclude writes <name>.verdict.md beside the JSON when given headlines, and not otherwise."""
    from zoo.evidence import Headline

    h = Headline("saves", "CV saves labels.", claims=["saves_at_least_0.1"])
    out = conclude("toy", dict(_SAVINGS), [_kinded()], out=tmp_path, console=None, headlines=[h])
    assert out["headlines/saves"] == 1.0
    assert "| CV saves labels. | reproduced |" in (tmp_path / "toy.verdict.md").read_text()
    conclude("plain", dict(_SAVINGS), [_kinded()], out=tmp_path, console=None)
    assert not (tmp_path / "plain.verdict.md").exists()


def test_verdicts_ignore_passing_stand_ins_of_reported_claims() -> None:
    """Check that a reported claim's passing stand-in is not listed (it is why the claim is reported), while an
    asserted claim's is."""
    r = {"cv/saving": 0.2, "human/saving": 0.0, "ppi/saving": 0.3, "rand/saving": 0.0, "strat/saving": 0.0}
    reported = evaluate(r, [_kinded(asserted=False)])
    assert verdicts(reported)["stand_ins_passed"] == []
    assert verdicts(evaluate(r, [_kinded()]))["stand_ins_passed"] == ["saves_at_least_0.1/ppi"]


def test_seeds_held_counts_only_the_seeds_that_ran_the_claims_experiment() -> None:
    """Two experiments in one run on different seeds: a claim on the 2-seed one is judged on 2 seeds, not on the
    other experiment's 5 with its means filled in."""
    r = {"a/x": 0.5, "a/x/seed0": 1.0, "a/x/seed1": 0.0, "b/x": 0.0, "b/x/seed0": 0.0, "b/x/seed1": 0.0}
    r.update({f"c/y/seed{s}": float(s) for s in range(5)})
    claim = Claim("x_at_least_0.4", lambda res, arm: res[f"{arm}/x"], method="a", at_least=0.4,
                  baselines={"b": "b"}, why_none={"ablations": "none", "alternatives": "none"})  # fmt: skip
    out = evaluate(r, [claim])
    assert out["claims/x_at_least_0.4"] == 1.0 and out["seeds_held/x_at_least_0.4"] == 0.5  # seeds 0 and 1 only
