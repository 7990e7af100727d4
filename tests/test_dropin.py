"""Drop-in: a training script written for webdataset 1.0.2 runs unchanged on wds_cloud.

Each script below is written once against a module parameter ``wds`` and run twice, with
``webdataset`` and with ``wds_cloud``; the results must agree (same order where the order is
deterministic, same multiset where shuffled or resampled).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import PIL.Image as PIL
import pytest
import webdataset
from shardgen import write_tar

import wds_cloud

NSHARDS, PER_SHARD = 8, 6


def png_bytes(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    out = io.BytesIO()
    PIL.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("shards")

    def samples(s: int) -> Iterator[tuple[str, dict[str, bytes]]]:
        for i in range(PER_SHARD):
            yield f"{s:03d}/{i:04d}", {
                "png": png_bytes(s * 1000 + i),
                "cls": str((s * PER_SHARD + i) % 10).encode(),
                "json": json.dumps({"shard": s, "i": i}).encode(),
            }

    return [write_tar(directory / f"train-{s:06d}.tar", samples(s)) for s in range(NSHARDS)]


def as_plain(x: Any) -> Any:
    """Tensors, arrays and containers as plain Python values, for comparison."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [as_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: as_plain(v) for k, v in x.items()}
    return x


def index_of(meta: dict[str, int]) -> int:
    return meta["shard"] * 100 + meta["i"]


def normalize(image: np.ndarray) -> np.ndarray:
    return image.astype(np.float32) / 255.0


# ---------------------------------------------------------------- the scripts


def script_deterministic(wds: Any, urls: list[str]) -> list[Any]:
    dataset = (
        wds.WebDataset(urls, shardshuffle=False)
        .decode("rgb8")
        .to_tuple("png", "cls", "json")
        .map_tuple(normalize, int, index_of)
        .batched(4)
    )
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    out = []
    for epoch in range(2):
        for images, labels, indices in loader:
            out.append((epoch, as_plain(images), as_plain(labels), as_plain(indices)))
    return out


def script_shuffled(wds: Any, urls: list[str]) -> list[Counter[str]]:
    dataset = (
        wds.WebDataset(urls, shardshuffle=100)
        .shuffle(20)
        .decode()
        .to_tuple("__key__", "cls")
        .batched(4)
    )
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    loader = loader.unbatched().shuffle(30).batched(8).with_epoch(NSHARDS * PER_SHARD // 8)
    epochs = []
    for _ in range(2):
        seen: Counter[str] = Counter()
        for keys, labels in loader:
            assert len(keys) == 8 and len(labels) == 8
            seen.update(f"{k}:{int(c)}" for k, c in zip(keys, labels, strict=True))
        epochs.append(seen)
    return epochs


def script_multinode(wds: Any, urls: list[str]) -> list[Any]:
    dataset = (
        wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node,
                       workersplitter=wds.split_by_worker)
        .decode()
        .to_tuple("__key__", "json")
    )
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    return [(key, as_plain(meta)) for key, meta in loader]


def script_resampled(wds: Any, urls: list[str]) -> list[Any]:
    dataset = wds.DataPipeline(
        wds.ResampledShards(urls),
        wds.tarfile_to_samples(),
        wds.shuffle(10),
        wds.decode("rgb8"),
        wds.to_tuple("__key__", "png", "cls"),
        wds.batched(3),
    ).with_epoch(5)
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    return [(list(keys), tuple(images.shape), len(labels)) for keys, images, labels in loader]


def run(script: Any, lib: Any, urls: list[str]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return script(lib, urls)


# ---------------------------------------------------------------- the comparisons


def test_deterministic_script_same_batches_in_same_order(urls: list[str]) -> None:
    ours = run(script_deterministic, wds_cloud, urls)
    theirs = run(script_deterministic, webdataset, urls)
    assert len(ours) == 2 * NSHARDS * PER_SHARD // 4
    assert ours == theirs


def test_shuffled_script_same_multiset(urls: list[str]) -> None:
    ours = run(script_shuffled, wds_cloud, urls)
    theirs = run(script_shuffled, webdataset, urls)
    assert ours == theirs  # Counters: the same samples, each once per epoch
    assert all(sum(c.values()) == NSHARDS * PER_SHARD == len(c) for c in ours)


def test_multinode_script_same_split(urls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    every = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        ours = run(script_multinode, wds_cloud, urls)
        assert ours == run(script_multinode, webdataset, urls)
        every += [key for key, _ in ours]
    universe = [f"{s:03d}/{i:04d}" for s in range(NSHARDS) for i in range(PER_SHARD)]
    assert sorted(every) == universe


def test_resampled_script_same_shapes_and_sample_universe(urls: list[str]) -> None:
    ours = run(script_resampled, wds_cloud, urls)
    theirs = run(script_resampled, webdataset, urls)
    assert len(ours) == len(theirs) == 10  # with_epoch(5) per worker, 2 workers
    assert [shape for _, shape, _ in ours] == [shape for _, shape, _ in theirs]
    universe = {f"{s:03d}/{i:04d}" for s in range(NSHARDS) for i in range(PER_SHARD)}
    assert {k for keys, _, _ in ours for k in keys} <= universe


def test_plain_datapipeline_in_a_torch_dataloader(urls: list[str]) -> None:
    """``wds.DataPipeline`` must be a torch IterableDataset in a fresh process, as webdataset's."""
    code = (
        "import torch.utils.data as d\n"
        "import wds_cloud as wds\n"
        f"ds = wds.DataPipeline(wds.SimpleShardList({urls!r}), wds.split_by_worker,\n"
        "                      wds.tarfile_to_samples())\n"
        "print(len(list(d.DataLoader(ds, batch_size=None, num_workers=2))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(NSHARDS * PER_SHARD)
