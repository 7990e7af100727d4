"""The examples under ``config/``, one per dialect, read over data laid out where they name it:
each by ``WebDataset`` and by ``wds-cloud spec check``."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from dialects import local_put, prepare, put_shards, shard_bytes
from stores.base import Store

import wds_cloud as wds
from wds_cloud.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "config"


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["-q", "spec", "check", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_energon_metadataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(CONFIG / "energon-metadataset.yaml", tmp_path)
    for name in ("coco", "coyo"):
        prepare(local_put(tmp_path), name, name, shards=10, per_shard=10)
    spec = str(tmp_path / "energon-metadataset.yaml")
    samples = list(zip(range(8000), wds.WebDataset(spec, seed=0), strict=False))
    shares = Counter(s["__source__"] for _, s in samples)
    for name, share in {"coco": 5 / 8, "coyo": 2 / 8, "coyo-val": 1 / 8}.items():
        assert shares[name] / 8000 == pytest.approx(share, abs=0.02)
    assert {s["__subflavors__"]["augmentation_type"] for _, s in samples
            if s["__source__"] == "coco"} == {"small_images"}
    assert len(list(wds.WebDataset(spec, split="val"))) == 20  # coco's val split, once
    out = _check(capsys, spec)
    assert "dialect: energon, split 'train'" in out and "augmentation_type=small_images" in out
    assert "dialect: energon, split 'val'" in _check(capsys, spec, "--split", "val")


def test_llm_foundry_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # Mosaic's relative paths are the working directory's
    put = local_put(tmp_path / "my-copy-c4")
    put_shards(put, "c4/train", "c4", 20, 100)
    put_shards(put, "wiki/train", "wiki", 5, 100)
    spec = str(CONFIG / "llm-foundry-streams.yaml")
    got = list(wds.WebDataset(spec))
    assert Counter(s["__source__"] for s in got) == {"c4": 8000, "wiki": 2000}
    assert "dialect: mosaic" in _check(capsys, f"{spec}#train_loader.dataset")


def test_webdataset_epochs(store_factory: Callable[[str], Store],
                           monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """Its ``s3://demo/train/`` reached through a rewrite rule, as a user would point it
    elsewhere: every shard of ``head`` once, two of ``tail``."""
    store = store_factory("s3")
    for i in range(8):
        store.put(f"train/demo-{i:06d}.tar",
                  shard_bytes([(f"s{i}-{k}", {"txt": b"x"}) for k in range(3)]))
    monkeypatch.setenv("WDS_REWRITE", f"s3://demo/train/={store.url('train/')}")
    options = store.storage_options
    spec = str(CONFIG / "webdataset-epochs.yaml")
    for _ in range(2):
        got = Counter(s["__source__"] for s in wds.WebDataset(spec, storage_options=options))
        assert got == {"head": 12, "tail": 6}
    out = _check(capsys, spec, "--storage-options", json.dumps(options))
    assert "dialect: webdataset" in out and "choose 2" in out
