"""Shard lists, node/worker splitting and seeds (wds_cloud.pipeline.shards, wds_cloud.pytorch)."""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys

import pytest
import webdataset

from wds_cloud import pytorch as wp
from wds_cloud.errors import ConfigError
from wds_cloud.pipeline import shards
from wds_cloud.pipeline.shards import WorkerInfo, derive_seed


def urls_of(items: object) -> list[str]:
    return [d["url"] for d in items]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- expansion


@pytest.mark.parametrize(
    "spec",
    [
        "data/shard-{000000..000011}.tar",
        "s3://bucket/a-{0..3}.tar::gs://b/c-{00..02}.tgz",
        "x-{a,b,c}-{1..2}.tar",
        "single.tar",
    ],
)
def test_expansion_matches_webdataset(spec: str) -> None:
    ours = shards.SimpleShardList(spec)
    theirs = webdataset.SimpleShardList(spec)
    assert ours.urls == theirs.urls
    assert urls_of(ours) == urls_of(theirs)
    assert len(ours) == len(theirs)


def test_env_variable_substitution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_BUCKET", "s3://my-bucket/train")
    spec = "${BUCKET}/shard-{0..2}.tar::${BUCKET}/extra.tar"
    assert shards.SimpleShardList(spec).urls == webdataset.SimpleShardList(spec).urls


def test_missing_env_variable_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="WDS_NOPE"):
        shards.SimpleShardList("${NOPE}/a.tar")


def test_list_is_taken_as_is_like_webdataset() -> None:
    urls = ["a-{0..2}.tar", "b.tar"]
    assert shards.SimpleShardList(urls).urls == webdataset.SimpleShardList(urls).urls == urls


@pytest.mark.parametrize("bad", [[], (), iter([])])
def test_empty_shard_list_is_an_error(bad: object) -> None:
    with pytest.raises(ValueError, match="empty shard list"):
        shards.SimpleShardList(bad)  # type: ignore[arg-type]


def test_non_string_url_is_an_error() -> None:
    with pytest.raises(ConfigError, match="must be strings"):
        shards.SimpleShardList(["a.tar", 3])  # type: ignore[list-item]


def test_shardspec() -> None:
    assert shards.shardspec("a-{0..4}.tar").urls == webdataset.shardspec("a-{0..4}.tar").urls
    with pytest.raises(ConfigError, match="YAML"):
        shards.shardspec("spec.yaml")


# ---------------------------------------------------------------- shuffling shard lists


def test_seeded_shard_list_is_a_reproducible_permutation_new_each_set_epoch() -> None:
    """Without ``set_epoch``, webdataset's order in every iteration; each ``set_epoch(n)``
    gives its own order (epoch 0 webdataset's), the same for every copy."""
    spec = "s-{000..049}.tar"
    plain = urls_of(shards.SimpleShardList(spec))
    a, b = shards.SimpleShardList(spec, seed=7), shards.SimpleShardList(spec, seed=7)
    unset = [urls_of(a) for _ in range(3)]
    assert len({tuple(o) for o in unset}) == 1
    assert sorted(unset[0]) == sorted(plain) and unset[0] != plain
    epochs_a, epochs_b = [], []
    for epoch in range(3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        epochs_a.append(urls_of(a))
        epochs_b.append(urls_of(b))
    assert epochs_a == epochs_b
    assert epochs_a[0] == unset[0]
    for order in epochs_a:
        assert sorted(order) == sorted(plain) and order != plain
    assert len({tuple(o) for o in epochs_a}) == 3
    assert urls_of(shards.SimpleShardList(spec, seed=8)) != epochs_a[0]


def test_shard_list_set_epoch_survives_pickling() -> None:
    lst = shards.SimpleShardList("s-{000..049}.tar", seed=3)
    orders = []
    for epoch in range(3):
        lst.set_epoch(epoch)
        copy = pickle.loads(pickle.dumps(lst))  # what a fresh DataLoader worker gets
        orders.append(urls_of(copy))
    assert len({tuple(o) for o in orders}) == 3


# ---------------------------------------------------------------- splitting


def split_all(urls: list[str], world: int, workers: int) -> list[list[str]]:
    parts = []
    for rank, worker in itertools.product(range(world), range(workers)):
        info = WorkerInfo(rank=rank, world_size=world, worker=worker, num_workers=workers)
        src = shards.SimpleShardList(urls)
        nodes = shards.node_share(src, worker_info=info)
        parts.append(urls_of(shards.worker_share(nodes, worker_info=lambda i=info: i)))
    return parts


@pytest.mark.parametrize("world,workers", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 4), (5, 2)])
def test_every_shard_exactly_once_across_ranks_and_workers(world: int, workers: int) -> None:
    urls = [f"shard-{i:03d}.tar" for i in range(37)]
    parts = split_all(urls, world, workers)
    flat = [u for part in parts for u in part]
    assert sorted(flat) == sorted(urls)
    assert len(flat) == len(set(flat))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_split_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    urls = [f"shard-{i:03d}.tar" for i in range(23)]
    seen = []
    for rank, worker in itertools.product(range(2), range(3)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("WORKER", str(worker))
        monkeypatch.setenv("NUM_WORKERS", "3")
        # the environment-only L2 versions and the torch-aware public ones agree
        l2 = urls_of(shards.worker_share(shards.node_share(shards.SimpleShardList(urls))))
        pub = urls_of(wp.split_by_worker(wp.split_by_node(shards.SimpleShardList(urls))))
        assert l2 == pub
        assert wp.worker_info() == WorkerInfo(rank, 2, worker, 3)
        seen.extend(l2)
    assert sorted(seen) == urls


def test_partial_env_pairs_are_ignored_like_webdataset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("NUM_WORKERS", "4")
    assert wp.worker_info() == WorkerInfo()
    assert shards.resolve_worker_info(None) == WorkerInfo()


def test_split_env_matches_webdataset(monkeypatch: pytest.MonkeyPatch) -> None:
    urls = [f"shard-{i:03d}.tar" for i in range(17)]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("WORKER", "1")
    monkeypatch.setenv("NUM_WORKERS", "2")
    ours = urls_of(wp.split_by_worker(wp.split_by_node(shards.SimpleShardList(urls))))
    src = webdataset.SimpleShardList(urls)
    theirs = urls_of(webdataset.split_by_worker(webdataset.split_by_node(src)))
    assert ours == theirs


def test_invalid_worker_info_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="rank"):
        WorkerInfo(rank=2, world_size=2)
    with pytest.raises(ConfigError, match="worker"):
        WorkerInfo(worker=0, num_workers=0)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="RANK"):
        list(wp.split_by_node(["a"]))


def test_bad_worker_info_callable() -> None:
    with pytest.raises(ConfigError, match="expected WorkerInfo"):
        list(shards.worker_share(["a"], worker_info=lambda: (0, 1)))  # type: ignore[arg-type,return-value]


def test_single_node_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert list(shards.require_single_node(["a", "b"], worker_info=WorkerInfo())) == ["a", "b"]
    with pytest.raises(ConfigError, match="split_by_node"):
        list(shards.require_single_node(["a"], worker_info=WorkerInfo(rank=0, world_size=2)))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="single-node"):
        list(wp.single_node_only(["a"]))


def test_group_needs_the_torch_aware_version() -> None:
    with pytest.raises(ConfigError, match="process group"):
        list(shards.node_share(["a"], group=object()))


def test_non_empty() -> None:
    assert list(shards.non_empty(iter([1, 2]))) == [1, 2]
    with pytest.raises(ValueError, match="empty shard list"):
        list(shards.non_empty(iter([])))


# ---------------------------------------------------------------- seeds and resampling


def test_derive_seed_is_stable_across_processes_and_spread() -> None:
    args = [(0, 0, 0, 0), (1, 2, 3, 4), (2**70, -1, 5, 9)]
    code = (
        "from wds_cloud.pipeline.shards import derive_seed\n"
        f"print([derive_seed(*a) for a in {args!r}])"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "123"},
    )
    assert other.stdout.strip() == repr([derive_seed(*a) for a in args])
    neighbours = {derive_seed(0, r, w, e) for r in range(4) for w in range(4) for e in range(4)}
    assert len(neighbours) == 64
    assert all(0 <= s < 2**63 for s in neighbours)
    assert derive_seed(1, 0, 0, 0) != derive_seed(1, 0, 0, 0, 99)
    with pytest.raises(TypeError):
        derive_seed("1", 0, 0, 0)  # type: ignore[arg-type]


def resampled_stream(
    rank: int = 0, worker: int = 0, epoch: int = 0, seed: int = 0, n: int = 40
) -> list[str]:
    info = WorkerInfo(rank=rank, world_size=4, worker=worker, num_workers=4)
    rs = shards.ShardResampler(
        "s-{000..099}.tar", nshards=n, seed=seed, deterministic=True, worker_info=info
    )
    rs.set_epoch(epoch)
    return urls_of(rs)


def test_resampled_determinism() -> None:
    base = resampled_stream()
    assert base == resampled_stream()
    assert len(base) == 40
    assert set(base) <= {f"s-{i:03d}.tar" for i in range(100)}
    others = [
        resampled_stream(rank=1), resampled_stream(worker=1), resampled_stream(epoch=1),
        resampled_stream(seed=1),
    ]
    for other in others:
        assert other != base
    assert len({tuple(o) for o in others}) == len(others)


def test_resampled_nondeterministic_by_default() -> None:
    a = shards.ShardResampler("s-{000..099}.tar", nshards=30, worker_info=WorkerInfo())
    b = shards.ShardResampler("s-{000..099}.tar", nshards=30, worker_info=WorkerInfo())
    assert urls_of(a) != urls_of(b)


def test_resampled_epochs_advance_in_process_and_across_fresh_workers() -> None:
    rs = shards.ShardResampler(
        "s-{000..099}.tar", nshards=20, deterministic=True, worker_info=WorkerInfo()
    )
    in_process = [urls_of(rs) for _ in range(3)]
    assert len({tuple(s) for s in in_process}) == 3
    # a fresh pickled copy per epoch, as non-persistent DataLoader workers get:
    fresh = shards.ShardResampler(
        "s-{000..099}.tar", nshards=20, deterministic=True, worker_info=WorkerInfo()
    )
    without_epoch = [urls_of(pickle.loads(pickle.dumps(fresh))) for _ in range(3)]
    assert len({tuple(s) for s in without_epoch}) == 1  # nothing tells the copies apart...
    with_epoch = []
    for epoch in range(3):
        fresh.set_epoch(epoch)  # ...unless set_epoch is called (WebLoader does)
        with_epoch.append(urls_of(pickle.loads(pickle.dumps(fresh))))
    assert len({tuple(s) for s in with_epoch}) == 3


def test_resampled_mixes_torch_worker_seed_only_without_set_epoch() -> None:
    def stream(torch_seed: int, epoch: int | None) -> list[str]:
        info = WorkerInfo(worker=1, num_workers=2, seed=torch_seed)
        rs = shards.ShardResampler(
            "s-{000..099}.tar", nshards=20, deterministic=True, worker_info=info
        )
        if epoch is not None:
            rs.set_epoch(epoch)
        return urls_of(rs)

    assert stream(11, None) != stream(12, None)
    assert stream(11, None) == stream(11, None)
    assert stream(11, 3) == stream(12, 3)


def test_resampled_worker_seed_and_errors() -> None:
    def ws(value: int) -> list[str]:
        rs = shards.ShardResampler(
            ["a", "b", "c", "d"], nshards=30, deterministic=True, worker_seed=lambda: value,
            worker_info=WorkerInfo(),
        )
        return urls_of(rs)

    assert ws(1) == ws(1) != ws(2)
    with pytest.raises(ValueError, match="empty shard list"):
        shards.ShardResampler([])
    assert urls_of(shards.ShardResampler([], empty_check=False)) == []
    with pytest.raises(ConfigError, match="nshards"):
        shards.ShardResampler(["a"], nshards=-1)


def test_resampled_max_urls_limits_iterables() -> None:
    rs = shards.ShardResampler(
        (f"u{i}" for i in range(100)), max_urls=5, nshards=50, worker_info=WorkerInfo()
    )
    assert rs.urls == [f"u{i}" for i in range(5)]
    assert set(urls_of(rs)) <= set(rs.urls)


def test_public_resampled_shards_pickles_and_uses_worker_info() -> None:
    rs = wp.ResampledShards("s-{000..099}.tar", nshards=10, deterministic=True)
    rs.set_epoch(2)
    copy = pickle.loads(pickle.dumps(rs))
    assert urls_of(copy) == urls_of(rs)


def test_resampled_stage() -> None:
    items = list(range(10))
    a = list(shards.resample_items(iter(items), 25, seed=5, worker_info=WorkerInfo()))
    b = list(shards.resample_items(iter(items), 25, seed=5, worker_info=WorkerInfo()))
    assert a == b and len(a) == 25 and set(a) <= set(items)
    assert a != list(shards.resample_items(iter(items), 25, seed=6, worker_info=WorkerInfo()))
    stage = pickle.loads(pickle.dumps(wp.resampled(5)))
    assert len(list(stage(iter(items)))) == 5


def test_shard_shuffle_stage() -> None:
    urls = [{"url": f"s{i}"} for i in range(60)]

    def run(seed: int, epoch: int, worker: int = 0) -> list[str]:
        info = WorkerInfo(worker=worker, num_workers=2)
        stage = shards.ShardShuffle(20, seed=seed, worker_info=info)
        stage.set_epoch(epoch)
        return urls_of(pickle.loads(pickle.dumps(stage))(iter(urls)))

    base = run(1, 0)
    assert sorted(base) == sorted(urls_of(urls)) and base != urls_of(urls)
    assert base == run(1, 0)
    assert base != run(1, 1) and base != run(2, 0) and base != run(1, 0, worker=1)


def test_resampled_shards_count_epochs_as_webdataset() -> None:
    """``epoch`` is -1 before the first iteration and counts the iterations started;
    assigning it chooses the next one (webdataset's attribute), as ``rng`` is the generator
    of the iteration under way."""
    def make() -> shards.ShardResampler:
        return shards.ShardResampler("s-{000..099}.tar", 5, seed=3, deterministic=True,
                                     worker_info=shards.WorkerInfo())

    rs = make()
    assert rs.epoch == -1 and rs.rng is None
    streams = [urls_of(rs) for _ in range(3)]
    assert rs.epoch == 2 and rs.rng is not None
    again = make()
    again.epoch = 0  # the next iteration is number 1
    assert urls_of(again) == streams[1] and again.epoch == 1
