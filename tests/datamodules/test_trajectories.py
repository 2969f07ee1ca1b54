"""Trajectories: the synthetic street-grid city, HDF5 and CSV files, checks, sliding windows, scaler, DataModule."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.datamodules.street_grid import habit_route
from zoo.datamodules.trajectories import (
    MinMaxScaler,
    TrajectoryDataModule,
    latlon_to_km,
    read_csv,
    read_h5,
    sliding_windows,
    street_grid_checkins,
    street_route,
    validate_trajectory,
    write_h5,
)


def _user(n: int, lat0: float = 35.68, lon0: float = 139.76, t0: float = 8.0) -> dict[str, np.ndarray]:
    """A hand-made trajectory of ``n`` points, one per hour, moving north-east."""
    i = np.arange(n, dtype=np.float64)
    return {"hours": t0 + i, "latitudes": lat0 + 0.001 * i, "longitudes": lon0 + 0.002 * i}


# ------------------------------------------------------------------------------------------------ windows
def test_sliding_windows_shape_count_and_content() -> None:
    """Check that users of 8 and 6 points give 3 + 1 stride-1 windows (N, 3, k) in float64, point for point."""
    users = {"a": _user(8), "b": _user(6, t0=100.0)}
    w = sliding_windows(users, k=6)
    assert w.shape == (4, 3, 6) and w.dtype == torch.float64
    a = users["a"]
    np.testing.assert_array_equal(w[2, 1].numpy(), a["latitudes"][2:8])
    np.testing.assert_array_equal(w[2, 2].numpy(), a["longitudes"][2:8])
    np.testing.assert_array_equal(w[:, 0].numpy(), np.tile(np.arange(6.0), (4, 1)))  # time relative to the window
    raw = sliding_windows(users, k=6, relative_time=False)
    np.testing.assert_array_equal(raw[3, 0].numpy(), users["b"]["hours"])
    assert torch.equal(raw[:, 1:], w[:, 1:])


def test_sliding_windows_raise_on_short_user_unless_skipped() -> None:
    """Check that a user shorter than k is an error naming it, and is dropped with skip_short."""
    users = {"long": _user(7), "short": _user(4)}
    with pytest.raises(ValueError, match="user 'short' has 4 points, fewer than k=6"):
        sliding_windows(users, k=6)
    assert len(sliding_windows(users, k=6, skip_short=True)) == 2
    with pytest.raises(ValueError, match="no user has at least k=6 points"):
        sliding_windows({"short": _user(4)}, k=6, skip_short=True)


# ------------------------------------------------------------------------------------------------ checks
@pytest.mark.parametrize(
    ("field", "index", "value", "match"),
    [
        ("latitudes", 2, np.nan, r"user 'x': latitudes\[2\] = nan"),
        ("longitudes", 1, np.inf, r"user 'x': longitudes\[1\] = inf"),
        ("latitudes", 3, 95.0, r"user 'x': latitudes\[3\] = 95.0 is outside \[-90, 90\]"),
        ("longitudes", 0, -181.0, r"user 'x': longitudes\[0\] = -181.0 is outside \[-180, 180\]"),
        ("hours", 3, 0.5, r"user 'x': hours\[3\] = 0.5 comes before hours\[2\]"),
    ],
)
def test_validate_trajectory_names_user_and_index(field: str, index: int, value: float, match: str) -> None:
    """Check that NaN/inf, out-of-range coordinates and time going back raise with the user, field and index."""
    traj = _user(5)
    traj[field][index] = value
    with pytest.raises(ValueError, match=match):
        validate_trajectory(**traj, user="x", source="f.h5")


def test_validate_trajectory_rejects_unequal_lengths() -> None:
    """Check that arrays of unequal length are refused with their shapes."""
    traj = _user(5)
    traj["longitudes"] = traj["longitudes"][:4]
    with pytest.raises(ValueError, match=r"user 'x': .* one length, got shapes .*'longitudes': \(4,\)"):
        validate_trajectory(**traj, user="x")


def test_read_h5_checks_every_user(tmp_path: Path) -> None:
    """Check that a bad point in a file stops reading with the file, the user and the index."""
    bad = _user(6)
    bad["latitudes"][4] = 95.0
    write_h5(tmp_path / "x.h5", {"ok": _user(6), "bad": bad})
    with pytest.raises(ValueError, match=r"x.h5: user 'bad': latitudes\[4\] = 95.0"):
        read_h5(tmp_path / "x.h5")


# ------------------------------------------------------------------------------------------------ the DataModule
def test_datamodule_reads_official_h5_layout(tmp_path: Path) -> None:
    """Check the HDF5 round trip through the DataModule: its raw windows equal those of the written users."""
    users = street_grid_checkins(n_users=20, seed=3)
    ids = sorted(users)
    write_h5(tmp_path / "train.h5", {u: users[u] for u in ids[:14]})
    write_h5(tmp_path / "test.h5", {u: users[u] for u in ids[14:]})
    assert {u: {f: t[f].tolist() for f in t} for u, t in read_h5(tmp_path / "test.h5").items()} == {
        u: {f: users[u][f].tolist() for f in ("hours", "latitudes", "longitudes")} for u in ids[14:]
    }
    dm = TrajectoryDataModule(data_dir=str(tmp_path), val_split=0.0, batch_size=32)
    dm.setup("fit")
    assert torch.equal(dm.train_set.tensors[1], sliding_windows({u: users[u] for u in ids[:14]}, 6))
    assert torch.equal(dm.test_set.tensors[1], sliding_windows({u: users[u] for u in ids[14:]}, 6))
    assert dm.val_set is not None and torch.equal(dm.val_set.tensors[1], dm.test_set.tensors[1])  # val_split=0
    scaled, raw = next(iter(dm.train_dataloader()))
    assert scaled.shape == raw.shape == (32, 3, 6) and scaled.dtype == torch.float32 and raw.dtype == torch.float64
    torch.testing.assert_close(scaled, dm.scaler.transform(raw).float(), rtol=0, atol=0)
    assert "train.h5" in dm.describe() and f"{len(dm.train_set)} training windows" in dm.describe()


def test_datamodule_skips_short_users_and_raises_when_none_remain(tmp_path: Path) -> None:
    """Check that users shorter than k are skipped (and counted), and that nothing left is a clear error."""
    write_h5(tmp_path / "all.h5", {"a": _user(6), "b": _user(9), "c": _user(3), "d": _user(7)})
    dm = TrajectoryDataModule(path=str(tmp_path / "all.h5"), split=0.5, val_split=0.0)
    dm.setup()
    assert dm.counts["skipped_users"] == 1 and "c" not in dm.user_ids["train"] + dm.user_ids["test"]
    assert len(dm.train_set) + len(dm.test_set) == 1 + 4 + 2
    with pytest.raises(ValueError, match=r"all.h5: no user has at least k=10 points \(4 users, the longest has 9\)"):
        TrajectoryDataModule(path=str(tmp_path / "all.h5"), k=10).setup()


def test_datamodule_missing_files_say_what_to_put_where(tmp_path: Path) -> None:
    """Check that a data_dir without test.h5 raises FileNotFoundError naming both expected files."""
    write_h5(tmp_path / "train.h5", {"a": _user(8)})
    with pytest.raises(FileNotFoundError, match=r"test.h5.*expects data_dir to hold train.h5 and test.h5"):
        TrajectoryDataModule(data_dir=str(tmp_path)).setup()
    with pytest.raises(FileNotFoundError, match=r"none.csv. TrajectoryDataModule\(path=...\) expects one .h5 file"):
        TrajectoryDataModule(path=str(tmp_path / "none.csv")).setup()


def test_datamodule_rejects_bad_arguments() -> None:
    """Check that a bad scaler name, k < 3 and both sources at once fail in __init__."""
    with pytest.raises(ValueError, match="scaler must be 'global' .* or 'per_batch' .* got 'batch'"):
        TrajectoryDataModule(scaler="batch")
    with pytest.raises(ValueError, match="k must be ≥ 3"):
        TrajectoryDataModule(k=2)
    with pytest.raises(ValueError, match="not both"):
        TrajectoryDataModule(data_dir="a", path="b.h5")


def test_datamodule_reads_csv_with_timestamps(tmp_path: Path) -> None:
    """Check a CSV round trip: shuffled rows with timestamp strings are grouped, sorted, and become hours since the
    file's first record."""
    users = street_grid_checkins(n_users=6, seed=1)
    start = datetime(2012, 4, 3)
    rows = [
        (u, (start + timedelta(hours=float(h))).isoformat(sep=" "), repr(float(la)), repr(float(lo)))
        for u, t in users.items()
        for h, la, lo in zip(t["hours"], t["latitudes"], t["longitudes"])
    ]
    order = np.random.default_rng(0).permutation(len(rows))
    lines = ["uid,extra,ts,latitude,longitude"] + [
        f"{rows[i][0]},x,{rows[i][1]},{rows[i][2]},{rows[i][3]}" for i in order
    ]
    (tmp_path / "checkins.csv").write_text("\n".join(lines) + "\n")
    read = read_csv(tmp_path / "checkins.csv", user="uid", time="ts", lat="latitude", lon="longitude")
    t_first = min(t["hours"][0] for t in users.values())
    assert sorted(read) == sorted(users)
    for u, t in users.items():
        np.testing.assert_allclose(read[u]["hours"], t["hours"] - t_first, rtol=0, atol=1e-6)  # µs timestamps
        np.testing.assert_array_equal(read[u]["latitudes"], t["latitudes"])
        np.testing.assert_array_equal(read[u]["longitudes"], t["longitudes"])
    dm = TrajectoryDataModule(path=str(tmp_path / "checkins.csv"), csv_columns=("uid", "ts", "latitude", "longitude"))
    dm.setup()
    assert len(dm.train_set) > 0 and len(dm.test_set) > 0
    with pytest.raises(ValueError, match=r"no column \['lat', 'lon'\]"):
        read_csv(tmp_path / "checkins.csv", user="uid", time="ts")


def test_scaler_is_fitted_on_training_users_only(tmp_path: Path) -> None:
    """Check that the scaler holds the training windows' bounds, test users beyond them scale outside [0, 1], and the
    inverse transform gives the degrees back within 1e-4 (float32 scaled values)."""
    write_h5(tmp_path / "train.h5", {"a": _user(10), "b": _user(8, lat0=35.70)})
    write_h5(tmp_path / "test.h5", {"c": _user(8, lat0=35.75, lon0=139.70)})
    dm = TrajectoryDataModule(data_dir=str(tmp_path), val_split=0.0)
    dm.setup()
    train_raw, test_raw = dm.train_set.tensors[1], dm.test_set.tensors[1]
    lo, hi = train_raw.transpose(1, 2).reshape(-1, 3).amin(0), train_raw.transpose(1, 2).reshape(-1, 3).amax(0)
    assert torch.equal(dm.scaler.min, lo) and torch.equal(dm.scaler.max, hi)
    test_scaled = dm.test_set.tensors[0]
    assert test_scaled[:, 1].max() > 1 and test_scaled[:, 2].min() < 0  # no clamping, no refit on the test users
    for scaled, raw in ((dm.train_set.tensors[0], train_raw), (test_scaled, test_raw)):
        back = dm.scaler.inverse_transform(scaled.double())
        assert (back[:, 1:] - raw[:, 1:]).abs().max() < 1e-4
        assert (dm.scaler.inverse_transform(scaled)[:, 1:].double() - raw[:, 1:]).abs().max() < 1e-4  # float32 out
    state = json.loads(json.dumps(dm.scaler.state_dict()))
    assert torch.equal(MinMaxScaler().load_state_dict(state).transform(test_raw), dm.scaler.transform(test_raw))


def test_scaler_errors() -> None:
    """Check that transforming before fit and a wrong channel count are explained."""
    with pytest.raises(RuntimeError, match="before fit"):
        MinMaxScaler().transform(torch.zeros(2, 3, 6))
    with pytest.raises(ValueError, match=r"expects \(\.\.\., 3, L\), got shape \(2, 4, 6\)"):
        MinMaxScaler().fit(torch.rand(2, 3, 6)).transform(torch.zeros(2, 4, 6))


def test_per_batch_scaler_serves_unscaled_windows() -> None:
    """Check that scaler='per_batch' serves the raw windows (float32) while still exposing the training scaler."""
    dm = TrajectoryDataModule(n_users=30, scaler="per_batch")
    dm.setup()
    x, raw = dm.train_set.tensors
    assert torch.equal(x, raw.float()) and dm.scaler.fitted
    assert "per_batch" in dm.describe()


# ------------------------------------------------------------------------------------------------ the synthetic city
def test_street_routes_follow_the_endpoint_rules() -> None:
    """Check rules A-D: a short hop is straight, south starts go x first, north starts y first, long trips use an
    arterial street."""
    assert street_route(np.array([2.0, 2.0]), np.array([3.0, 3.0]))[1] == "A"
    v, rule = street_route(np.array([2.0, 1.0]), np.array([5.0, 4.0]))
    assert rule == "B" and v.tolist() == [[2, 1], [5, 1], [5, 4]]
    v, rule = street_route(np.array([2.0, 8.0]), np.array([5.0, 5.0]))
    assert rule == "C" and v.tolist() == [[2, 8], [2, 5], [5, 5]]
    v, rule = street_route(np.array([1.0, 2.0]), np.array([8.0, 7.0]))
    assert rule == "D" and v.tolist() == [[1, 2], [1, 3], [8, 3], [8, 7]]  # along the arterial y = 3


def test_city_long_south_trips_are_l_routes_on_streets() -> None:
    """Check that points of long south-start trips (rule B) lie on the start's east-west street or the end's
    north-south street (within GPS noise), that some cut no corner off, and that rule C is the mirror image."""
    users = street_grid_checkins(n_users=150, seed=0, with_routes=True, routes="rules")
    off_chord, checked = [], 0
    for t in users.values():
        x, y = latlon_to_km(t["latitudes"], t["longitudes"])
        stops = np.flatnonzero(t["rule"] == "S")
        for a, b in itertools.pairwise(stops):
            rule = t["rule"][a + 1]
            if rule not in ("B", "C") or b == a + 1:
                continue
            s, e = np.round([x[a], y[a]]), np.round([x[b], y[b]])  # the stops are intersections (plus noise)
            px, py = x[a + 1 : b], y[a + 1 : b]
            if rule == "B":
                on_street = (np.abs(py - s[1]) < 0.05) | (np.abs(px - e[0]) < 0.05)
            else:
                on_street = (np.abs(px - s[0]) < 0.05) | (np.abs(py - e[1]) < 0.05)
            assert on_street.all(), (rule, s, e, px, py)
            d = e - s
            off_chord.append(np.abs(d[0] * (py - s[1]) - d[1] * (px - s[0])).max() / np.hypot(*d))
            checked += 1
    assert checked > 100 and np.mean(np.asarray(off_chord) > 0.3) > 0.5  # linear interpolation cuts these corners


def test_city_points_sit_on_the_street_grid() -> None:
    """Check that every point of the card's rule city not on a short walk lies on a street line (lat or lon on the
    1 km grid)."""
    users = street_grid_checkins(n_users=100, seed=2, with_routes=True, routes="rules")
    x, y = (np.concatenate(v) for v in zip(*(latlon_to_km(t["latitudes"], t["longitudes"]) for t in users.values())))
    rule = np.concatenate([t["rule"] for t in users.values()])
    street = rule != "A"
    gap = np.minimum(np.abs(x - np.round(x)), np.abs(y - np.round(y)))
    assert (gap[street] < 0.05).all()
    assert (x > -0.3).all() and (x < 10.3).all() and (y > -0.3).all() and (y < 10.3).all()  # walks jitter by 50 m
    assert set(rule) == {"S", "A", "B", "C", "D"}


def test_city_is_seeded_per_user() -> None:
    """Check that the same seed repeats the city, another changes it, and user i does not depend on n_users."""
    a, b, c = street_grid_checkins(5, seed=0), street_grid_checkins(8, seed=0), street_grid_checkins(5, seed=1)
    assert all(np.array_equal(a[u]["latitudes"], b[u]["latitudes"]) for u in a)
    assert not np.array_equal(a["u00000"]["latitudes"], c["u00000"]["latitudes"])


def test_city_datamodule_splits_by_user_with_the_cards_window_counts() -> None:
    """Check the default city: 1500 users split 85/15 by user (val from training users), no user in two splits,
    and about 20k training windows of k = 6."""
    dm = TrajectoryDataModule()
    dm.setup("fit")
    ids = dm.user_ids
    assert not (
        set(ids["train"]) & set(ids["test"])
        or set(ids["train"]) & set(ids["val"])
        or set(ids["val"]) & set(ids["test"])
    )
    assert len(ids["train"]) + len(ids["val"]) == 1275 and len(ids["test"]) == 225
    assert 17_000 < dm.counts["train"] < 23_000 and 2_500 < dm.counts["test"] < 5_000 and dm.counts["val"] > 500
    assert dm.counts["skipped_users"] == 0
    raw = dm.train_set.tensors[1]
    assert 35.63 < raw[:, 1].min() and raw[:, 1].max() < 35.73 and 139.70 < raw[:, 2].min() < raw[:, 2].max() < 139.82


def test_city_default_windows_mostly_lie_inside_one_trip() -> None:
    """Check that most default k = 6 windows have all four interior points on one trip: a window spanning a stop
    has an interior its endpoints do not determine (measured: 0.76 of the windows of 300 users)."""
    users = street_grid_checkins(n_users=300, seed=0, with_routes=True)
    inside = [
        len(set(trip[i + 1 : i + 5])) == 1
        for trip in (np.asarray(u["trip"]) for u in users.values())
        for i in range(len(trip) - 5)
    ]
    assert np.mean(inside) >= 0.5


def test_city_arc_fractions_quantiles_or_random() -> None:
    """Check that both arc-fraction modes give valid cities that differ, and that an unknown mode is refused."""
    a = street_grid_checkins(4, seed=0)
    b = street_grid_checkins(4, seed=0, arc_fractions="random")
    assert all(np.all(np.diff(city[u]["hours"]) >= 0) for city in (a, b) for u in city)
    assert not all(np.array_equal(a[u]["latitudes"], b[u]["latitudes"]) for u in a)
    with pytest.raises(ValueError, match="arc_fractions"):
        street_grid_checkins(2, arc_fractions="uniform")


# ------------------------------------------------------------------------------------------------ habitual routes
def _habit_routes(start: list[float], end: list[float], hour: float, p_habit: float, n: int) -> list:
    """``n`` habit routes between two points, one rng stream per draw (seeds 0..n-1)."""
    s, e = np.array(start), np.array(end)
    return [habit_route(s, e, hour, np.random.default_rng(i), p_habit=p_habit) for i in range(n)]


def test_habit_route_goes_north_south_first_before_noon_and_east_west_first_after() -> None:
    """Check the habit on stops at intersections (as the city's are): from (1, 2) to (4, 6) the route before noon is
    the L through the corner (1, 6), from noon the L through (4, 2), with rule E / L. Catches an hour that does not
    change the route (the two habits giving the same L-route, as an axis coin once made them), or swapped habits."""
    s, e = [1.0, 2.0], [4.0, 6.0]
    for hour, rule, corner in ((8.0, "E", [1.0, 6.0]), (12.0, "L", [4.0, 2.0]), (17.5, "L", [4.0, 2.0])):
        for vertices, got in _habit_routes(s, e, hour, p_habit=1.0, n=10):
            assert got == rule and vertices.tolist() == [s, corner, e]
    # with the city's p_habit the hour decides the most common route (0.8 + 0.2 × its share among the others)
    routes = {h: [str(v.tolist()) for v, _ in _habit_routes(s, e, h, p_habit=0.8, n=400)] for h in (8.0, 15.0)}
    morning, afternoon = str([s, [1.0, 6.0], e]), str([s, [4.0, 2.0], e])
    assert routes[8.0].count(morning) > 300 and routes[15.0].count(afternoon) > 300
    assert routes[8.0].count(afternoon) < 60 and routes[15.0].count(morning) < 60


def test_habit_route_short_trips_walk() -> None:
    """Check that a trip under 1.5 km is a straight walk, rule A, at any hour."""
    for hour in (8.0, 15.0):
        for vertices, rule in _habit_routes([2.0, 2.0], [3.0, 3.0], hour, p_habit=1.0, n=5):  # 1.41 km
            assert rule == "A" and vertices.tolist() == [[2, 2], [3, 3]]


def test_habit_route_without_habit_turns_on_every_street_between() -> None:
    """Check that with p_habit = 0 the turn street is uniform over every street from the start's to the end's (rule
    U). Catches a choice that leaves out the end streets or always picks the habitual one."""
    counts: dict[tuple[int, float], int] = {}
    for vertices, rule in _habit_routes([0.5, 0.5], [4.5, 3.5], 14.0, p_habit=0.0, n=400):
        assert rule == "U" and len(vertices) == 4
        axis = 0 if vertices[1, 1] == 0.5 else 1  # first leg along x: the turn is a north-south street x = c
        assert vertices[1, axis] == vertices[2, axis]
        counts[axis, float(vertices[1, axis])] = counts.get((axis, float(vertices[1, axis])), 0) + 1
    assert set(counts) == {(0, 1.0), (0, 2.0), (0, 3.0), (0, 4.0), (1, 1.0), (1, 2.0), (1, 3.0)}
    assert min(counts.values()) > 0.5 * 400 / 2 / 4  # about uniform: 50 per x street, 67 per y street


def test_habit_city_points_sit_on_the_street_grid_and_differ_from_the_rule_city() -> None:
    """Check the default (habit) city: every point not on a short walk is within 50 m of a street line, the rules
    are A, E, L, U, and the city is not the rule city. Catches routes off the grid and a routes flag ignored."""
    users = street_grid_checkins(n_users=100, seed=2, with_routes=True)
    x, y = (np.concatenate(v) for v in zip(*(latlon_to_km(t["latitudes"], t["longitudes"]) for t in users.values())))
    rule = np.concatenate([t["rule"] for t in users.values()])
    gap = np.minimum(np.abs(x - np.round(x)), np.abs(y - np.round(y)))
    assert (gap[rule != "A"] < 0.05).all()
    assert set(rule) == {"S", "A", "E", "L", "U"}
    rules = street_grid_checkins(n_users=5, seed=2, with_routes=True, routes="rules")
    assert set(np.concatenate([t["rule"] for t in rules.values()])) <= {"S", "A", "B", "C", "D"}
    assert not all(np.array_equal(users[u]["latitudes"], rules[u]["latitudes"]) for u in rules)
    with pytest.raises(ValueError, match="routes"):
        street_grid_checkins(2, routes="maps")
    with pytest.raises(ValueError, match="p_habit"):
        street_grid_checkins(2, p_habit=1.5)


def test_datamodule_passes_the_route_model_to_the_city() -> None:
    """Check that TrajectoryDataModule(routes="rules") builds the rule city (its windows are the rule city's), not
    the default. Catches the argument dropped on the way to street_grid_checkins."""
    dm = TrajectoryDataModule(n_users=20, routes="rules", val_split=0.0)
    dm.setup("fit")
    users = street_grid_checkins(20, seed=0, routes="rules")
    assert torch.equal(dm.train_set.tensors[1], sliding_windows({u: users[u] for u in dm.user_ids["train"]}, 6))
    assert "rules" in dm.describe()
    with pytest.raises(ValueError, match="routes"):
        TrajectoryDataModule(routes="maps")
