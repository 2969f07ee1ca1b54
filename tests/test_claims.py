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
