"""``KeyedRandom``: golden values, so that a numpy or Python upgrade cannot change a stream,
and the properties the mixing relies on."""

from __future__ import annotations

import numpy as np
import pytest

from wds_cloud.pipeline.rng import MIX, SCALE, SHARDS, KeyedRandom


def test_golden_values() -> None:
    r = KeyedRandom(1234, 0, 0, MIX)
    assert [int(x) for x in r.words(3)] == [
        9776858197864240729, 18141569369032610391, 14425606260867322493]
    assert r.random() == 0.9021354739087099
    assert r.below(10) == 7
    assert r.uniform(2, 3) == 2.567516808018043
    items = list(range(10))
    r.shuffle(items)
    assert items == [3, 6, 7, 5, 1, 0, 2, 8, 9, 4]
    assert r.sample(list("abcdef"), 3) == ["d", "e", "c"]
    assert r.choose(np.array([0.25, 1.0]), 8).tolist() == [1, 0, 1, 1, 0, 0, 1, 1]
    assert r.draws == 26


def test_keys_give_unrelated_streams_and_the_same_key_the_same_stream() -> None:
    keys = [(1, 0, 0, MIX), (2, 0, 0, MIX), (1, 1, 0, MIX), (1, 0, 1, MIX), (1, 0, 0, SHARDS),
            (1, 0, -1, SCALE)]
    firsts = [KeyedRandom(*k).word() for k in keys]
    assert len(set(firsts)) == len(keys)
    assert KeyedRandom(1, 0, 0, SHARDS, 2).word() != KeyedRandom(1, 0, 0, SHARDS, 3).word()
    assert [KeyedRandom(*k).word() for k in keys] == firsts


def test_draws_do_not_depend_on_how_they_are_grouped() -> None:
    one, many = KeyedRandom(5, 1, 2, MIX), KeyedRandom(5, 1, 2, MIX)
    singles = [one.random() for _ in range(3000)]
    grouped = [*many.randoms(1000).tolist(), *many.randoms(2000).tolist()]
    assert singles == grouped
    skipped = KeyedRandom(5, 1, 2, MIX)
    skipped.skip(2500)
    assert skipped.random() == singles[2500]


def test_choose_follows_the_probabilities() -> None:
    counts = np.bincount(KeyedRandom(9, 0, 0, MIX).choose(np.array([0.2, 0.7, 1.0]), 100_000))
    assert counts / 100_000 == pytest.approx([0.2, 0.5, 0.3], abs=0.01)


def test_below_is_unbiased_and_bounded() -> None:
    r = KeyedRandom(3, 0, 0, SHARDS)
    values = [r.below(3) for _ in range(30_000)]
    assert set(values) == {0, 1, 2}
    assert np.bincount(values) / 30_000 == pytest.approx([1 / 3] * 3, abs=0.015)
    with pytest.raises(ValueError):
        r.below(0)
