"""``PreferenceDataModule``: the tiny arena, orientation, leave-one-LLM-out splits, batches and the JSONL path."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from zoo.datamodules.preferences import PairwisePreferences, PreferenceDataModule, make_tiny_arena


def _agreement(z: torch.Tensor, gap: torch.Tensor) -> float:
    """Fraction of non-tie labels whose winner has the larger utility (z = 1 with gap > 0, or z = 0 with gap < 0)."""
    decided = z != 0.5
    return ((z[decided] == 1) == (gap[decided] > 0)).float().mean().item()


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _row(i: int, model_a: str, model_b: str, **label: object) -> dict:
    return {"prompt": f"p{i}", "response_a": f"a{i}", "response_b": f"b{i}", "model_a": model_a, "model_b": model_b,
            **label}  # fmt: skip


_ROWS = [
    _row(0, "vicuna", "gpt-4", winner="model_b"),
    _row(1, "gpt-4", "alpaca", winner="model_a"),
    _row(2, "alpaca", "vicuna", winner="tie"),
    _row(3, "gpt-4", "vicuna", winner="tie (bothbad)"),
    _row(4, "alpaca", "gpt-4", z=1),
    _row(5, "vicuna", "alpaca", z=0.0),
]


# ------------------------------------------------------------------------------------------------ tiny arena
def test_make_tiny_arena_gives_shapes_and_is_deterministic() -> None:
    """Check that the arena has the documented keys, shapes and dtypes, repeats per seed and changes across seeds."""
    d = make_tiny_arena(num_llms=5, comparisons_per_pair=30, dim=6, seed=3)
    M = 10 * 30
    assert {k: tuple(v.shape) for k, v in d.items()} == {
        "x": (M, 6), "a": (M, 6), "b": (M, 6), "llm_a": (M,), "llm_b": (M,), "z": (M,), "utility_gap": (M,)
    }  # fmt: skip
    assert d["llm_a"].dtype == d["llm_b"].dtype == torch.long
    assert d["z"].dtype == d["utility_gap"].dtype == d["x"].dtype == torch.float32
    assert set(d["z"].unique().tolist()) <= {0.0, 0.5, 1.0}
    again = make_tiny_arena(num_llms=5, comparisons_per_pair=30, dim=6, seed=3)
    assert all(torch.equal(d[k], again[k]) for k in d)
    other = make_tiny_arena(num_llms=5, comparisons_per_pair=30, dim=6, seed=4)
    assert not torch.equal(d["a"], other["a"])


def test_make_tiny_arena_has_comparisons_per_pair_rows_for_every_pair() -> None:
    """Check that every unordered pair i < j has exactly comparisons_per_pair rows, seen in both A/B orders."""
    d = make_tiny_arena(num_llms=6, comparisons_per_pair=400, seed=0)
    assert (d["llm_a"] != d["llm_b"]).all()
    lo, hi = torch.minimum(d["llm_a"], d["llm_b"]), torch.maximum(d["llm_a"], d["llm_b"])
    counts = torch.bincount(lo * 6 + hi, minlength=36).view(6, 6)
    assert torch.equal(counts, torch.triu(torch.full((6, 6), 400), diagonal=1))
    a_first = (d["llm_a"] < d["llm_b"]).float().mean().item()
    assert 0.45 < a_first < 0.55  # a fair coin decides which LLM is "A"


def test_make_tiny_arena_tie_rate_is_in_band() -> None:
    """Check that ties are exactly the rows with |U_A − U_B| < 0.05, at a rate in a sane band (measured 7.7 %)."""
    d = make_tiny_arena(seed=0)
    assert torch.equal(d["z"] == 0.5, d["utility_gap"].abs() < 0.05)
    tie_rate = (d["z"] == 0.5).float().mean().item()
    assert 0.01 < tie_rate < 0.25, tie_rate


def test_make_tiny_arena_labels_agree_with_utility_gap() -> None:
    """Check that non-tie labels follow sign(U_A − U_B) well above chance but not always (measured 0.75)."""
    d = make_tiny_arena(seed=0)
    agreement = _agreement(d["z"], d["utility_gap"])
    assert 0.65 < agreement < 0.95, agreement


def test_make_tiny_arena_shifted_masks_last_feature_and_disagrees_with_arena() -> None:
    """Check that "shifted" is the same sample with the last feature zeroed and labels far from the arena utility."""
    arena, shifted = make_tiny_arena(seed=0), make_tiny_arena(population="shifted", seed=0)
    for key in ("a", "b"):
        assert (shifted[key][:, -1] == 0).all() and (arena[key][:, -1] != 0).all()
        assert torch.equal(shifted[key][:, :-1], arena[key][:, :-1])
    for key in ("x", "llm_a", "llm_b"):
        assert torch.equal(shifted[key], arena[key])  # paired sample: only the human and the mask differ
    gap = arena["utility_gap"]
    # measured 0.75 for the arena labels and 0.43 for the shifted ones (c = −1 reverses the ‖y‖₁ preference)
    assert _agreement(shifted["z"], gap) < _agreement(arena["z"], gap) - 0.15
    assert not torch.equal(shifted["utility_gap"], gap)


def test_make_tiny_arena_sample_seed_redraws_comparisons_only() -> None:
    """Check that sample_seed changes the prompts and labels while the default stays the seed's own draw."""
    d, redrawn = make_tiny_arena(4, 20, seed=0), make_tiny_arena(4, 20, seed=0, sample_seed=7)
    assert not torch.equal(d["x"], redrawn["x"])
    assert torch.equal(make_tiny_arena(4, 20, seed=0, sample_seed=0)["x"], d["x"])


@pytest.mark.parametrize(("kwargs", "match"), [({"population": "human"}, "'arena' or 'shifted'"),
                                               ({"num_llms": 1}, "num_llms >= 2")])  # fmt: skip
def test_make_tiny_arena_raises_on_bad_arguments(kwargs: dict, match: str) -> None:
    """Check that an unknown population or a single LLM is refused with the expected values in the message."""
    with pytest.raises(ValueError, match=match):
        make_tiny_arena(**kwargs)


# ------------------------------------------------------------------------------------------------ dataset
def test_pairwise_preferences_getitems_returns_dict_batch() -> None:
    """Check that __getitems__ indexes every column at once, tensors and lists of str alike."""
    d = make_tiny_arena(4, 10, seed=0)
    ds = PairwisePreferences(d)
    batch = ds.__getitems__([7, 2, 7])
    assert len(ds) == 60 and set(batch) == set(d)
    assert all(torch.equal(batch[k], d[k][[7, 2, 7]]) for k in d)
    columns = {"llm_a": torch.tensor([0, 1]), "llm_b": torch.tensor([1, 0]), "z": torch.tensor([1.0, 0.5])}
    text = PairwisePreferences({**columns, "a": ["x", "y"]})
    assert text.__getitems__([1, 0])["a"] == ["y", "x"] and text[1]["z"] == 0.5


def test_pairwise_preferences_oriented_puts_llm_as_a_and_flips_labels() -> None:
    """Check that oriented(k) keeps every row involving k, with k as A, a/b swapped, z → 1 − z and gap → −gap."""
    d = make_tiny_arena(4, 50, seed=1)
    out = PairwisePreferences(d).oriented(2)
    involved = (d["llm_a"] == 2) | (d["llm_b"] == 2)
    assert len(out["z"]) == int(involved.sum()) == 3 * 50
    assert (out["llm_a"] == 2).all() and (out["llm_b"] != 2).all()
    was_b = d["llm_b"][involved] == 2
    assert 0 < int(was_b.sum()) < len(was_b)
    torch.testing.assert_close(out["z"][was_b], 1 - d["z"][involved][was_b], rtol=0, atol=0)
    torch.testing.assert_close(out["z"][~was_b], d["z"][involved][~was_b], rtol=0, atol=0)
    torch.testing.assert_close(out["a"][was_b], d["b"][involved][was_b], rtol=0, atol=0)
    torch.testing.assert_close(out["utility_gap"][was_b], -d["utility_gap"][involved][was_b], rtol=0, atol=0)
    assert _agreement(out["z"], out["utility_gap"]) > 0.65  # orientation kept z and the gap aligned


def test_pairwise_preferences_raises_when_columns_differ_in_length() -> None:
    """Check that columns of different lengths are refused with every length in the message."""
    with pytest.raises(ValueError, match="Expected columns of one length"):
        PairwisePreferences({"llm_a": torch.zeros(3), "llm_b": torch.zeros(3), "z": torch.zeros(2)})


# ------------------------------------------------------------------------------------------------ splits
def test_datamodule_holdout_keeps_llm_out_of_train_and_val() -> None:
    """Check that holdout_llm=k puts every comparison with k in test (k as A, z flipped) and none in train/val."""
    k = 3
    dm = PreferenceDataModule(holdout_llm=k, comparisons_per_pair=200, seed=0)
    dm.setup("fit")
    for split in (dm.train_set, dm.val_set):
        cols = split.columns
        assert not ((cols["llm_a"] == k) | (cols["llm_b"] == k)).any()
    test = dm.test_comparisons()
    assert len(test["z"]) == 5 * 200 and (test["llm_a"] == k).all() and (test["llm_b"] != k).all()
    agreement = _agreement(test["z"], test["utility_gap"])
    assert agreement > 0.65, agreement  # a wrong flip would drop this to ~0.25
    total = len(dm.train_set) + len(dm.val_set)
    ties_in_pool = int((make_tiny_arena(comparisons_per_pair=200)["z"] == 0.5).sum())
    assert 10 * 200 - ties_in_pool <= total <= 10 * 200
    assert sorted(dm.pairs("test")) == [(k, j) for j in range(6) if j != k]


def test_datamodule_drops_ties_from_train_only() -> None:
    """Check that ties leave the training split when drop_ties_in_train, and stay in validation and test."""
    dm = PreferenceDataModule(seed=0)
    dm.setup("fit")
    assert not (dm.train_set.columns["z"] == 0.5).any()
    assert (dm.val_set.columns["z"] == 0.5).any() and (dm.test_set.columns["z"] == 0.5).any()
    keep = PreferenceDataModule(seed=0, drop_ties_in_train=False)
    keep.setup("fit")
    assert (keep.train_set.columns["z"] == 0.5).any() and len(keep.train_set) > len(dm.train_set)


def test_datamodule_random_split_is_seeded_and_sized() -> None:
    """Check that holdout_llm=None splits 10 % / 10 % / rest, repeats per seed, and changes across seeds."""
    dm = PreferenceDataModule(drop_ties_in_train=False, seed=0)
    dm.setup()
    assert (len(dm.val_set), len(dm.test_set), len(dm.train_set)) == (600, 600, 4800)
    again, other = PreferenceDataModule(drop_ties_in_train=False, seed=0), PreferenceDataModule(seed=1)
    again.setup()
    other.setup()
    assert torch.equal(again.test_comparisons()["a"], dm.test_comparisons()["a"])
    assert not torch.equal(other.test_comparisons()["a"], dm.test_comparisons()["a"])


def test_datamodule_pairs_group_rows_by_ordered_pair() -> None:
    """Check that pairs(split) maps each ordered (llm_a, llm_b) to exactly the rows of that pair in the split."""
    dm = PreferenceDataModule(num_llms=4, comparisons_per_pair=100, seed=0)
    groups = dm.pairs("train")
    cols = dm.train_set.columns
    assert sum(len(rows) for rows in groups.values()) == len(dm.train_set) and len(groups) == 12
    for (i, j), rows in groups.items():
        assert (cols["llm_a"][rows] == i).all() and (cols["llm_b"][rows] == j).all()
    with pytest.raises(ValueError, match="'train', 'val' or 'test'"):
        dm.pairs("dev")


def test_datamodule_train_batches_are_dicts_of_batch_size() -> None:
    """Check that the train loader yields dicts of tensors with batch_size rows, covering the split once."""
    dm = PreferenceDataModule(batch_size=64, seed=0)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    first = batches[0]
    assert isinstance(first, dict) and all(isinstance(v, torch.Tensor) for v in first.values())
    assert first["a"].shape == (64, 8) and first["z"].shape == (64,) and first["llm_a"].dtype == torch.long
    assert sum(len(b["z"]) for b in batches) == len(dm.train_set)
    assert {len(b["z"]) for b in batches[:-1]} == {64}
    assert next(iter(dm.val_dataloader()))["x"].shape == (64, 8)


def test_datamodule_describe_names_the_split() -> None:
    """Check that describe() is one line naming the source, population and held-out LLM."""
    line = PreferenceDataModule(population="shifted", holdout_llm=2).describe()
    assert "\n" not in line and "tiny arena" in line and "shifted" in line and "leave-LLM-2-out" in line


# ------------------------------------------------------------------------------------------------ files
def test_datamodule_reads_jsonl_round_trip(tmp_path: Path) -> None:
    """Check that a JSONL file maps winners/z to labels, model names to sorted ids, and serves text batches."""
    path = _write_jsonl(tmp_path / "prefs.jsonl", _ROWS)
    dm = PreferenceDataModule(source="jsonl", path=str(path), val_fraction=0.0, test_fraction=0.0,
                              drop_ties_in_train=False, batch_size=4)  # fmt: skip
    dm.setup("fit")
    assert dm.llm_names == ["alpaca", "gpt-4", "vicuna"] and dm.num_llms == 3
    rows = dm.train_set.all()
    assert rows["z"].tolist() == [0.0, 1.0, 0.5, 0.5, 1.0, 0.0]
    assert rows["llm_a"].tolist() == [2, 1, 0, 1, 0, 2] and rows["llm_b"].tolist() == [1, 0, 2, 2, 1, 0]
    assert rows["prompt"] == [f"p{i}" for i in range(6)] and rows["b"][0] == "b0"
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch["prompt"], list) and len(batch["a"]) == 4 and batch["z"].shape == (4,)

    held = PreferenceDataModule(source="jsonl", path=str(path), holdout_llm=1, val_fraction=0.0)  # gpt-4
    test = held.test_comparisons()
    assert (test["llm_a"] == 1).all() and test["prompt"] == ["p0", "p1", "p3", "p4"]
    assert test["z"].tolist() == [1.0, 1.0, 0.5, 0.0] and test["a"] == ["b0", "a1", "a3", "b4"]
    assert sorted(held.train_set.columns["prompt"]) == ["p5"]  # the tie p2 is dropped, the rest involve gpt-4


def test_datamodule_raises_when_file_is_missing(tmp_path: Path) -> None:
    """Check that a missing file raises FileNotFoundError naming it and showing an example line."""
    dm = PreferenceDataModule(source="jsonl", path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"(?s)No preference file at .*nope\.jsonl.*\"winner\": \"model_a\""):
        dm.setup()


@pytest.mark.parametrize(("update", "match"), [({"z": 0.7}, "line 3: expected z to be 0, 0.5 or 1"),
                                               ({"winner": "draw"}, "line 3: unknown winner 'draw'")])  # fmt: skip
def test_datamodule_raises_on_bad_label_with_line_number(tmp_path: Path, update: dict, match: str) -> None:
    """Check that a label outside {0, 0.5, 1} or an unknown winner raises ValueError naming the line."""
    rows = [dict(r) for r in _ROWS]
    rows[2].pop("winner")
    rows[2].update(update)
    dm = PreferenceDataModule(source="jsonl", path=str(_write_jsonl(tmp_path / "bad.jsonl", rows)))
    with pytest.raises(ValueError, match=match):
        dm.setup()


def test_datamodule_raises_when_holdout_is_not_a_model_in_the_file(tmp_path: Path) -> None:
    """Check that a held-out id beyond the file's models is refused in setup, listing the models."""
    dm = PreferenceDataModule(source="jsonl", path=str(_write_jsonl(tmp_path / "p.jsonl", _ROWS)), holdout_llm=5)
    with pytest.raises(ValueError, match="holds 3 models .*alpaca, gpt-4, vicuna"):
        dm.setup()


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow is installed")
def test_datamodule_raises_for_parquet_without_pyarrow(tmp_path: Path) -> None:
    """Check that reading parquet without pyarrow says to `pip install pyarrow`."""
    (tmp_path / "p.parquet").write_bytes(b"PAR1")
    dm = PreferenceDataModule(source="parquet", path=str(tmp_path / "p.parquet"))
    with pytest.raises(ImportError, match="pip install pyarrow"):
        dm.setup()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source": "jsonl"}, r"source='jsonl'\) needs path"),
        ({"holdout_llm": 6}, r"holdout_llm in \[0, 6\) or None, got 6"),
        ({"source": "jsonl", "path": "x.jsonl", "population": "shifted"}, "applies to source='arena' only"),
    ],
)
def test_datamodule_raises_on_bad_arguments(kwargs: dict, match: str) -> None:
    """Check that bad arguments are refused in __init__ with what was expected."""
    with pytest.raises(ValueError, match=match):
        PreferenceDataModule(**kwargs)
