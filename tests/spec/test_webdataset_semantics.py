"""webdataset's own spec semantics, compared with the installed webdataset 1.0.2: a spec whose
sources have neither ``resample`` nor ``choose`` (nor weights) reads every shard once per epoch
and ends, in webdataset's order for the same seed; errors name the key as written; a spec may
be a section of a larger config (``FILE#key.path``) wherever a spec is accepted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import webdataset
import yaml
from dialects import local_put, shard_bytes, slots_read

import wds_cloud as wds
from wds_cloud.cli import main
from wds_cloud.errors import ShardNotFoundError, SpecError


@pytest.fixture
def two_sources(tmp_path: Path) -> Path:
    """The issue's repro: sources of 2 and 4 one-sample shards, no resample/choose."""
    put = local_put(tmp_path)
    for name, n in (("a", 2), ("b", 4)):
        for i in range(n):
            put(f"shards/{name}-{i}.tar", shard_bytes([(f"{name}{i}", {"txt": b"x"})]))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""\
prefix: {tmp_path}/shards/
datasets:
  - name: a
    shards: a-{{0..1}}.tar
  - name: b
    shards: b-{{0..3}}.tar
""")
    return spec


def _webdataset_keys(spec: Any, epoch_seed: int) -> list[str]:
    shards = webdataset.MultiShardSample(spec)
    shards.set_epoch(epoch_seed)
    pipeline = webdataset.DataPipeline(shards, webdataset.tarfile_to_samples())
    return [s["__key__"] for s in pipeline]


def test_every_shard_once_per_epoch_in_webdatasets_order(
        two_sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")  # webdataset gates MultiShardSample
    for seed in (0, 1, 7, 1234):
        theirs = webdataset.MultiShardSample(str(two_sources))
        theirs.set_epoch(seed)
        ours = wds.MultiShardSample(str(two_sources))
        ours.set_epoch(seed)
        assert [s["url"] for s in ours] == [s["url"] for s in theirs]
    assert len(list(wds.MultiShardSample(str(two_sources)))) == 6  # it ends
    dataset = wds.WebDataset(str(two_sources), seed=5)
    for epoch in range(3):  # epoch e: webdataset's order for seed + e
        assert [s["__key__"] for s in dataset] == _webdataset_keys(str(two_sources), 5 + epoch)


def test_resample_and_choose_in_webdatasets_order(two_sources: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")
    spec = yaml.safe_load(two_sources.read_text())
    spec["datasets"][0]["resample"] = 5
    spec["datasets"][1]["choose"] = 3
    for seed in (0, 3, 99):
        assert [s["__key__"] for s in wds.WebDataset(spec, seed=seed)] == \
            _webdataset_keys(spec, seed)


def test_every_shard_once_over_two_ranks_and_workers(two_sources: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    read = slots_read(lambda: wds.WebDataset(str(two_sources), seed=1, empty_check=False),
                      monkeypatch, ranks=2, workers=2, epochs=2)
    for epoch in range(2):
        keys = Counter(s["__key__"] for rank in read[2 * epoch:2 * epoch + 2] for s in rank)
        assert keys == Counter(["a0", "a1", "b0", "b1", "b2", "b3"])


def test_errors_name_the_key_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        two_sources: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets:\n  - shards: a-{0..1}.tar\n    scaleprob: -0.2\n")
    with pytest.raises(SpecError, match=r"bad\.yaml: datasets\[0\]\.scaleprob: expected a "
                       r"weight >= 0, got -0\.2"):
        wds.WebDataset(str(bad))
    assert main(["-q", "spec", "check", str(bad)]) == 1
    assert "datasets[0].scaleprob: expected a weight" in capsys.readouterr().err
    glob = tmp_path / "glob.yaml"
    glob.write_text(f"datasets:\n  - name: nothing\n    shards: {tmp_path}/shards/zz-*.tar\n")
    with pytest.raises(ShardNotFoundError, match=rf"glob\.yaml: datasets\[0\] \('nothing'\): "
                       rf"no shard matches '{tmp_path}/shards/zz-\*\.tar'"):
        wds.WebDataset(str(glob))


def test_a_section_of_a_larger_config_wherever_a_spec_is_accepted(
        tmp_path: Path, two_sources: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = yaml.safe_load(two_sources.read_text())
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": "resnet"},
                                      "data": {"train": spec, "batch_size": 8}}))
    section = f"{config}#data.train"
    assert [s["__key__"] for s in wds.WebDataset(section, seed=2)] == \
        [s["__key__"] for s in wds.WebDataset(str(two_sources), seed=2)]
    assert main(["-q", "spec", "check", section, "--no-list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"spec: {section}: 2 sources, per-epoch shard lists")
    assert main(["-q", "ls", section]) == 0
    assert capsys.readouterr().out.count(".tar") == 6
    with pytest.raises(SpecError, match=r"train\.yaml#data\.test: no key 'test' at data "
                       r"\(keys there: batch_size, train\)"):
        wds.WebDataset(f"{config}#data.test")
