"""The ProDiff card's synthetic street-grid city (§5): users with home, work and errands, trips routed along a
1 km street grid, and check-ins along the routes, as ``{user: {"hours", "latitudes", "longitudes"}}``.

Two route models: ``"habits"`` (default), where the endpoints leave several plausible routes and the hour settles
most of the choice (north-south first before noon, east-west first after), and the card's ``"rules"``, where the endpoints set the route (straight short walks, x-first or
y-first L-routes, arterial detours)."""

from __future__ import annotations

import itertools
import math
from typing import Literal

import numpy as np

__all__ = [
    "CITY_CENTER",
    "KM_LAT",
    "habit_route",
    "km_to_latlon",
    "latlon_to_km",
    "street_grid_checkins",
    "street_route",
]

CITY_CENTER = (35.68, 139.76)  # (lat, lon) of the synthetic city's centre, near Tokyo Station (card §5)
KM_LAT = 0.008983  # degrees of latitude per km; a km of longitude is KM_LAT / cos(lat)
Users = dict[str, dict[str, np.ndarray]]


# ------------------------------------------------------------------------------------------------ the synthetic city
def km_to_latlon(x: np.ndarray, y: np.ndarray, size_km: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """City coordinates in km (origin at the south-west corner) to (lat, lon) degrees around :data:`CITY_CENTER`.

    Longitude degrees per km are ``KM_LAT / cos(35.68°)``, taken at the centre's latitude, so streets stay straight.

    Example:
        >>> lat, lon = km_to_latlon(np.array([5.0, 6.0]), np.array([5.0, 5.0]))
        >>> lat.round(4).tolist(), lon.round(4).tolist()
        ([35.68, 35.68], [139.76, 139.7711])
    """
    lat0, lon0 = CITY_CENTER
    lat = lat0 + (np.asarray(y, dtype=np.float64) - size_km / 2) * KM_LAT
    lon = lon0 + (np.asarray(x, dtype=np.float64) - size_km / 2) * KM_LAT / math.cos(math.radians(lat0))
    return lat, lon


def latlon_to_km(lat: np.ndarray, lon: np.ndarray, size_km: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`km_to_latlon`: (lat, lon) degrees to city (x, y) km.

    Example:
        >>> x, y = latlon_to_km(*km_to_latlon(np.array([1.25]), np.array([7.0])))
        >>> x.round(9).tolist(), y.round(9).tolist()
        ([1.25], [7.0])
    """
    lat0, lon0 = CITY_CENTER
    y = (np.asarray(lat, dtype=np.float64) - lat0) / KM_LAT + size_km / 2
    x = (np.asarray(lon, dtype=np.float64) - lon0) * math.cos(math.radians(lat0)) / KM_LAT + size_km / 2
    return x, y


def street_route(
    start: np.ndarray,
    end: np.ndarray,
    size_km: float = 10.0,
    short_km: float = 1.5,
    long_km: float = 6.0,
    arterial_km: float = 3.0,
) -> tuple[np.ndarray, str]:
    """The route between two city points (km) and its rule, chosen by the endpoints alone (card §5).

    Rules, by the straight-line distance d between the endpoints and the start's half of the city:
    (A) ``d < short_km``: straight (the walker's jitter is added by the sampler); (B) start in the south half
    (``y < size_km / 2``): x first, then y, along the streets through the start and the end; (C) start in the north
    half: y first, then x; (D) ``d > long_km``: B or C, but the long leg runs on the arterial street (every
    ``arterial_km``) nearest the start.

    Returns:
        The route's vertices ``(V, 2)`` in km (no two consecutive ones equal) and its rule ``"A"`` to ``"D"``.

    Example:
        >>> street_route(np.array([1.0, 2.0]), np.array([4.0, 5.0]))
        (array([[1., 2.],
               [4., 2.],
               [4., 5.]]), 'B')
        >>> vertices, rule = street_route(np.array([1.0, 7.0]), np.array([9.0, 1.0]))  # north start, 10 km apart
        >>> vertices.tolist(), rule  # via the arterial street x = 0
        ([[1.0, 7.0], [0.0, 7.0], [0.0, 1.0], [9.0, 1.0]], 'D')
    """
    s, e = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    d = float(np.hypot(*(e - s)))
    south = s[1] < size_km / 2
    if d < short_km:
        vertices, rule = np.stack([s, e]), "A"
    elif d > long_km:  # (D): detour to the arterial street nearest the start, carry the long leg along it
        if south:
            ya = min(round(s[1] / arterial_km) * arterial_km, size_km)
            vertices = np.array([s, (s[0], ya), (e[0], ya), e])
        else:
            xa = min(round(s[0] / arterial_km) * arterial_km, size_km)
            vertices = np.array([s, (xa, s[1]), (xa, e[1]), e])
        rule = "D"
    elif south:
        vertices, rule = np.array([s, (e[0], s[1]), e]), "B"
    else:
        vertices, rule = np.array([s, (s[0], e[1]), e]), "C"
    keep = np.concatenate([[True], (np.diff(vertices, axis=0) != 0).any(1)])
    return vertices[keep], rule


def habit_route(
    start: np.ndarray,
    end: np.ndarray,
    hour: float,
    rng: np.random.Generator,
    short_km: float = 1.5,
    p_habit: float = 0.8,
) -> tuple[np.ndarray, str]:
    """A route between two stops (km) where the endpoints leave a choice and the time of day settles most of it.

    Trips shorter than ``short_km`` walk straight (rule ``"A"``). Longer ones follow the commuter's habit with
    probability ``p_habit``: before noon north-south first, then east-west (rule ``"E"``), from noon east-west first
    (rule ``"L"``), the two L-routes between the stops. Otherwise (rule ``"U"``) the route runs in three legs: the
    first and last along one axis (a fair coin), the middle one along a street of the other axis chosen uniformly
    among the streets from the start's coordinate to the end's (an L-route when it is the start's or the end's own).
    So a window of check-ins that spans a turn has several plausible routes, and the hour tells the habitual ones
    apart.

    Returns:
        The route's vertices ``(V, 2)`` in km (no two consecutive ones equal) and its rule.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> habit_route(np.array([1.0, 2.0]), np.array([4.0, 5.0]), hour=8.0, rng=rng, p_habit=1.0)[0].tolist()
        [[1.0, 2.0], [1.0, 5.0], [4.0, 5.0]]
        >>> habit_route(np.array([1.0, 2.0]), np.array([4.0, 5.0]), hour=15.0, rng=rng, p_habit=1.0)[0].tolist()
        [[1.0, 2.0], [4.0, 2.0], [4.0, 5.0]]
    """
    s, e = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    habit, x_axis_first, pick = rng.random() < p_habit, rng.random() < 0.5, rng.random()
    if float(np.hypot(*(e - s))) < short_km:
        return np.stack([s, e]), "A"
    if habit:
        rule = "E" if hour < 12.0 else "L"
        corner = np.array([s[0], e[1]]) if rule == "E" else np.array([e[0], s[1]])
        vertices = np.array([s, corner, e])
    else:
        a = 0 if x_axis_first else 1  # the axis of the first and last legs; the middle leg runs along the other one
        lo, hi = sorted((s[a], e[a]))
        streets = np.arange(np.ceil(lo), np.floor(hi) + 1)
        if not len(streets):  # both ends inside one block along the axis (not a city stop): the nearest street
            streets = np.array([np.round((lo + hi) / 2)])
        turn = streets[min(int(pick * len(streets)), len(streets) - 1)]
        p1, p2 = s.copy(), e.copy()
        p1[a], p2[a] = turn, turn
        vertices, rule = np.array([s, p1, p2, e]), "U"
    keep = np.concatenate([[True], (np.diff(vertices, axis=0) != 0).any(1)])
    return vertices[keep], rule


def _next_stop(rng: np.random.Generator, prev: np.ndarray, avoid: np.ndarray | None, grid: int, p_near: float):
    """An errand intersection: a neighbour of ``prev`` with probability ``p_near`` (a short walk), else uniform."""
    while True:
        if rng.random() < p_near:
            step = rng.integers(-1, 2, size=2)
            stop = np.where((prev + step < 0) | (prev + step > grid), prev - step, prev + step)  # reflect at the edge
        else:
            stop = rng.integers(0, grid + 1, size=2)
        if (stop != prev).any() and (avoid is None or (stop != avoid).any()):
            return stop.astype(np.float64)


def _arc_fractions(rng: np.random.Generator, m: int, kind: str) -> np.ndarray:
    """``m`` sorted arc-length fractions in (0, 1), denser near both stops (Beta(0.7, 0.7))."""
    if kind == "random":  # i.i.d. draws: the interior of a window is not determined by its endpoints
        return np.sort(rng.beta(0.7, 0.7, m))
    # The Beta(0.7, 0.7) quantiles of evenly spaced probabilities, each jittered by a tenth of a spacing.
    from scipy.special import betaincinv  # the Beta quantile function; imported here to keep imports light

    p = (np.arange(1, m + 1) + rng.uniform(-0.1, 0.1, m)) / (m + 1)
    return betaincinv(0.7, 0.7, p)


def street_grid_checkins(
    n_users: int = 1500,
    seed: int = 0,
    size_km: int = 10,
    stops: tuple[int, int] = (3, 4),
    points_per_trip: tuple[int, int] = (6, 10),
    p_near: float = 0.35,
    speed_kmh: tuple[float, float] = (10.0, 30.0),
    walk_jitter_km: float = 0.05,
    gps_noise_km: float = 0.01,
    arc_fractions: Literal["quantiles", "random"] = "quantiles",
    routes: Literal["habits", "rules"] = "habits",
    p_habit: float = 0.8,
    with_routes: bool = False,
) -> Users:
    """The card's synthetic city (§5): a day of check-ins for each user on a street grid, routed by habit or by rule.

    The city is ``size_km`` × ``size_km`` with streets every km, mapped to degrees by :func:`km_to_latlon`. Each user
    has a home and a work intersection and a day of ``stops`` (inclusive range) stops: home, work, errands (a
    neighbouring intersection with probability ``p_near``, else a uniform one), home. Each trip follows
    :func:`habit_route` (``routes="habits"``) or :func:`street_route` (``"rules"``); ``points_per_trip`` (inclusive range) check-ins lie along it at arc-length fractions denser
    near the stops (Beta(0.7, 0.7), see ``arc_fractions``), then one at the arrival stop; the day starts with a check-in at
    home at 7-9 h. Times come from a speed ~ U(``speed_kmh``) per trip plus dwell times (work 6-9 h, errands
    0.25-1.5 h); ``hours`` is cumulative hours since midnight. Walks (rule A) get ``walk_jitter_km`` Gaussian jitter
    per coordinate, every other point ``gps_noise_km``. The defaults give about 24 points per user, so k = 6 windows
    number about 19 per user (≈ 24k for 1275 training users), two thirds of them inside one trip (few stops, many
    check-ins per trip: a window spanning a stop has an interior the endpoints do not determine).

    Users are drawn from independent streams of ``seed`` (``SeedSequence(seed).spawn``), so user ``i`` is the same for
    every ``n_users``.

    Args:
        routes: ``"habits"`` (default): :func:`habit_route`, several plausible routes between two stops, the hour
            settling most of the choice (``p_habit``). ``"rules"``: the card's §5 :func:`street_route`, one route set by
            the endpoints (on that city a nearest-neighbour lookup of the training windows by their endpoints beats
            ProDiff: issue 53).
        p_habit: the probability that a ``"habits"`` trip turns at its hour's street.
        arc_fractions: ``"quantiles"`` (default): the Beta(0.7, 0.7) quantiles of evenly spaced probabilities, each
            jittered by ±0.1 of a spacing, so the endpoints of a window inside one trip nearly determine its interior.
            ``"random"``: sorted i.i.d. Beta(0.7, 0.7) draws, the card's literal §5; the interior of a window is then
            random given its endpoints and no imputation beats linear interpolation (measured on k = 6 windows of
            seed 0: a nearest-neighbour lookup of the training windows by endpoints reaches TC@0.5km 0.435 against
            linear's 0.440; with ``"quantiles"`` 0.663 against 0.534).
        with_routes: also return, per point, ``"trip"`` (the trip index, −1 for the first check-in) and ``"rule"``
            (``"S"`` for a check-in at a stop, else the trip's rule: ``"A"``-``"D"`` of :func:`street_route`, or
            ``"A"``, ``"E"``, ``"L"``, ``"U"`` of :func:`habit_route`).

    Returns:
        ``{user_id: {"hours", "latitudes", "longitudes"}}`` with float64 arrays; ids are ``"u00000"``, ``"u00001"``...

    Example:
        >>> users = street_grid_checkins(n_users=3, seed=0)
        >>> sorted(users), sorted(users["u00000"])
        (['u00000', 'u00001', 'u00002'], ['hours', 'latitudes', 'longitudes'])
        >>> bool(np.all(np.diff(users["u00001"]["hours"]) >= 0))
        True
    """
    if n_users < 1:
        raise ValueError(f"n_users must be ≥ 1, got {n_users}")
    if arc_fractions not in ("quantiles", "random"):
        raise ValueError(f"arc_fractions must be 'quantiles' or 'random', got {arc_fractions!r}")
    if routes not in ("habits", "rules"):
        raise ValueError(f"routes must be 'habits' or 'rules', got {routes!r}")
    if not 0 <= p_habit <= 1:
        raise ValueError(f"p_habit must be in [0, 1], got {p_habit}")
    if not (3 <= stops[0] <= stops[1]) or not (1 <= points_per_trip[0] <= points_per_trip[1]):
        raise ValueError(
            f"need 3 ≤ stops[0] ≤ stops[1] and 1 ≤ points_per_trip[0] ≤ points_per_trip[1], got "
            f"stops={stops}, points_per_trip={points_per_trip}"
        )
    users: Users = {}
    for i, child in enumerate(np.random.SeedSequence(seed).spawn(n_users)):
        rng = np.random.default_rng(child)
        home = rng.integers(0, size_km + 1, size=2).astype(np.float64)
        work = _next_stop(rng, home, None, size_km, p_near=0.0)
        n_errands = int(rng.integers(stops[0], stops[1] + 1)) - 3
        day = [home, work]
        for j in range(n_errands):
            day.append(_next_stop(rng, day[-1], home if j == n_errands - 1 else None, size_km, p_near))
        day.append(home)
        t = rng.uniform(7.0, 9.0)
        xy, hours, trip_of, rule_of = [home + rng.normal(0, gps_noise_km, 2)], [t], [-1], ["S"]
        for trip, (s, e) in enumerate(itertools.pairwise(day)):
            if routes == "rules":
                vertices, rule = street_route(s, e, size_km=size_km)
            else:
                vertices, rule = habit_route(s, e, t, rng, p_habit=p_habit)
            cum = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(vertices, axis=0).T))])
            m = int(rng.integers(points_per_trip[0], points_per_trip[1] + 1))
            arc = _arc_fractions(rng, m, arc_fractions) * cum[-1]
            pts = np.stack([np.interp(arc, cum, vertices[:, 0]), np.interp(arc, cum, vertices[:, 1])], 1)
            pts += rng.normal(0, walk_jitter_km if rule == "A" else gps_noise_km, pts.shape)
            speed = rng.uniform(*speed_kmh)
            xy += [*pts, e + rng.normal(0, gps_noise_km, 2)]
            hours += [*(t + arc / speed), t + cum[-1] / speed]
            trip_of += [trip] * (m + 1)
            rule_of += [rule] * m + ["S"]
            t = hours[-1] + (rng.uniform(6.0, 9.0) if trip == 0 else rng.uniform(0.25, 1.5))  # dwell at the stop
        xy_ = np.asarray(xy)
        lat, lon = km_to_latlon(xy_[:, 0], xy_[:, 1], size_km)
        user = {"hours": np.asarray(hours), "latitudes": lat, "longitudes": lon}
        if with_routes:
            user.update(trip=np.asarray(trip_of), rule=np.asarray(rule_of))
        users[f"u{i:05d}"] = user
    return users
