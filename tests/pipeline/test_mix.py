"""RandomMix and RoundRobin, against webdataset 1.0.2 and against the probabilities given."""

from __future__ import annotations

import itertools
import math
import pickle
import random
from collections import Counter
from typing import Any

import pytest
import webdataset as wd

from wds_cloud import DataPipeline, RandomMix, RoundRobin
from wds_cloud.errors import ConfigError


def tagged(tag: str, n: int) -> list[tuple[str, int]]:
    return [(tag, i) for i in range(n)]


def in_order_per_source(items: list[tuple[str, int]]) -> bool:
    seen: dict[str, int] = {}
    for tag, i in items:
        if i != seen.get(tag, -1) + 1:
            return False
        seen[tag] = i
    return True


@pytest.mark.parametrize("lengths", [(5, 3, 7), (4, 4), (0, 3), (6,), (2, 9, 1)])
@pytest.mark.parametrize("longest", [False, True])
def test_round_robin_matches_webdataset(lengths: tuple[int, ...], longest: bool) -> None:
    datasets = [tagged(chr(97 + j), n) for j, n in enumerate(lengths)]
    ours = list(RoundRobin(datasets, longest=longest))
    assert ours == list(wd.RoundRobin(datasets, longest=longest))
    assert list(RoundRobin(datasets, longest=longest)) == ours  # each iter() starts afresh
    if longest:
        assert Counter(ours) == Counter(x for d in datasets for x in d)


def test_round_robin_edge_cases_and_pickling() -> None:
    assert list(RoundRobin([])) == []
    rr = RoundRobin([range(3), range(10, 12)])
    clone = pickle.loads(pickle.dumps(rr))
    assert list(clone) == list(rr) == [0, 10, 1, 11, 2]


def mix_counts(probs: list[float], n: int, seed: int) -> Counter[str]:
    datasets = [tagged(chr(97 + j), n) for j in range(len(probs))]
    mix = RandomMix(datasets, probs, seed=seed)
    return Counter(tag for tag, _ in itertools.islice(mix, n))


@pytest.mark.parametrize("probs", [[1.0, 3.0], [0.2, 0.3, 0.5], [5.0, 5.0], [1.0, 0.0, 1.0]])
def test_random_mix_follows_the_probabilities(probs: list[float]) -> None:
    n = 20000
    counts = mix_counts(probs, n, seed=11)
    total = sum(probs)
    for j, p in enumerate(probs):
        expected = n * p / total
        sigma = math.sqrt(n * (p / total) * (1 - p / total))
        assert abs(counts[chr(97 + j)] - expected) <= 5 * sigma + 1e-9, (counts, probs)


def test_random_mix_seeding() -> None:
    datasets = [tagged("a", 500), tagged("b", 500)]
    state = random.getstate()
    first = list(RandomMix(datasets, seed=1))
    assert random.getstate() == state, "RandomMix touched the global random generator"
    assert list(RandomMix(datasets, seed=1)) == first
    assert list(RandomMix(datasets, seed=2)) != first
    assert list(RandomMix(datasets, rng=random.Random(1))) == list(
        RandomMix(datasets, rng=random.Random(1))
    )
    unseeded = {tuple(RandomMix(datasets)) for _ in range(3)}
    assert len(unseeded) == 3
    clone = pickle.loads(pickle.dumps(RandomMix(datasets, [1, 2], seed=1)))
    assert list(clone) == list(RandomMix(datasets, [1, 2], seed=1))


def test_random_mix_stops_at_the_first_exhausted_source() -> None:
    short, long_ = tagged("a", 5), tagged("b", 1000)
    out = list(RandomMix([short, long_], seed=3))
    assert set(short) <= set(out) and len(out) < len(short) + len(long_)
    assert in_order_per_source(out)


def test_random_mix_longest_yields_everything() -> None:
    datasets = [tagged("a", 5), tagged("b", 50), tagged("c", 20)]
    ours = list(RandomMix(datasets, [1, 2, 3], longest=True, seed=4))
    theirs = list(wd.RandomMix(datasets, [1, 2, 3], longest=True))
    assert Counter(ours) == Counter(theirs) == Counter(x for d in datasets for x in d)
    assert in_order_per_source(ours)
    # a zero-weight source is never drawn from
    zero = list(RandomMix([tagged("a", 5), tagged("z", 5)], [1, 0], longest=True, seed=0))
    assert zero == tagged("a", 5)


def test_random_mix_in_a_pipeline() -> None:
    mix = RandomMix([tagged("a", 30), tagged("b", 30)], seed=5)
    ds = DataPipeline(mix).with_epoch(10)
    assert len(list(ds)) == 10


@pytest.mark.parametrize(
    ("probs", "kw", "match"),
    [
        ([1.0], {}, "1 probabilities for 2"),
        ([1.0, -1.0], {}, "non-negative"),
        ([0.0, 0.0], {}, "not all zero"),
        ([1.0, float("nan")], {}, "finite"),
        (None, {"seed": 1, "rng": random.Random()}, "either"),
    ],
)
def test_random_mix_rejects_bad_arguments(probs: Any, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RandomMix([[1], [2]], probs, **kw)
