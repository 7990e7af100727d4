"""timm's webdataset reader (``timm/data/readers/reader_wds.py``) runs on wds_cloud with only its
imports changed: its import lines, ``wds.utils.pytorch_worker_seed()`` for the shuffle seed, and
``wds.utils.pytorch_worker_info()`` giving what webdataset's gives, in DataLoader workers and in
the main process with ``RANK``/``WORLD_SIZE`` set."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def test_timms_import_lines() -> None:
    # timm's lines, with ``webdataset`` replaced by ``wds_cloud``
    import wds_cloud as wds
    from wds_cloud.filters import _shuffle, getfirst
    from wds_cloud.shardlists import expand_urls
    from wds_cloud.tariterators import base_plus_ext, tar_file_expander, url_opener, valid_sample

    assert expand_urls("s3://b/train-{0000..0002}.tar") == [
        "s3://b/train-0000.tar", "s3://b/train-0001.tar", "s3://b/train-0002.tar"]
    seed = wds.utils.pytorch_worker_seed()
    assert seed == 0  # rank 0, worker 0
    rng = random.Random(seed)
    assert sorted(_shuffle(range(10), 5, 2, rng)) == list(range(10))
    assert getfirst({"jpg": 1}, "png;jpg") == 1
    assert base_plus_ext("a/b.c.jpg") == ("a/b", "c.jpg")
    assert valid_sample({"__key__": "k", "jpg": b""})
    assert callable(tar_file_expander) and callable(url_opener)


class _WhereAmI(torch.utils.data.IterableDataset):  # type: ignore[misc]
    """Yields, in each DataLoader worker, what wds_cloud and webdataset say about it."""

    def __iter__(self) -> Any:
        import webdataset

        import wds_cloud as wds

        yield (wds.utils.pytorch_worker_info(), webdataset.utils.pytorch_worker_info(),
               wds.utils.pytorch_worker_seed(), webdataset.utils.pytorch_worker_seed())


def test_worker_info_in_dataloader_workers_is_webdatasets(monkeypatch: Any) -> None:
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    loader = torch.utils.data.DataLoader(_WhereAmI(), num_workers=2, batch_size=None)
    got = list(loader)
    assert len(got) == 2
    for ours, theirs, our_seed, their_seed in got:
        assert tuple(ours) == tuple(theirs)
        assert our_seed == their_seed
    assert sorted(tuple(ours) for ours, *_ in got) == [(0, 1, 0, 2), (0, 1, 1, 2)]


def test_worker_info_in_the_main_process_with_rank_set(monkeypatch: Any) -> None:
    import webdataset

    import wds_cloud as wds

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.delenv("WORKER", raising=False)
    monkeypatch.delenv("NUM_WORKERS", raising=False)
    assert wds.utils.pytorch_worker_info() == webdataset.utils.pytorch_worker_info() == (3, 8, 0, 1)
    assert wds.utils.pytorch_worker_seed() == webdataset.utils.pytorch_worker_seed() == 3000
    monkeypatch.setenv("WORKER", "1")
    monkeypatch.setenv("NUM_WORKERS", "4")
    assert wds.utils.pytorch_worker_info() == webdataset.utils.pytorch_worker_info() == (3, 8, 1, 4)
