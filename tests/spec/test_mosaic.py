"""Mosaic streaming's and llm-foundry's ``streams:`` as their docs and training YAMLs write them
(``remote``/``local``/``split``, ``proportion``, ``repeat``, ``choose``, ``epoch_size``,
``${variables.x}``), on the local S3 server: the per-epoch counts Mosaic's rules give, with
DataLoader workers and two ranks, the ``local`` cache filled, and bad inputs named."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from dialects import local_put, put_shards, slots_read
from stores.base import Store

import wds_cloud as wds
from wds_cloud.cli import main
from wds_cloud.errors import SpecError
from wds_cloud.spec import load_spec

#: an llm-foundry training YAML (scripts/train/yamls/finetune/*-streaming-dataset.yaml), with
#: its dataset section's streams on the local S3 server
TRAIN_YAML = """\
variables:
  global_seed: 17
  max_seq_len: 512
  data_remote: {remote}
  data_local: {local}

max_seq_len: ${{variables.max_seq_len}}

# Dataloaders
train_loader:
  name: finetuning
  dataset:
    ############
    streams:
      c4:
        remote: ${{variables.data_remote}}/c4
        local: ${{variables.data_local}}/c4
        split: train
        proportion: 3
      wiki:
        remote: ${{variables.data_remote}}/wiki
        local: ${{variables.data_local}}/wiki
        split: train
        proportion: 1
    ############
    shuffle: true
    max_seq_len: ${{variables.max_seq_len}}
    shuffle_seed: ${{variables.global_seed}}
    epoch_size: 2000
    decoder_only_format: true
  drop_last: true
  num_workers: 8
"""


@pytest.fixture
def s3_streams(store_factory: Callable[[str], Store]) -> Store:
    """c4 (10 shards x 30 samples) and wiki (5 x 20) under train/ in a bucket."""
    store = store_factory("s3")
    put_shards(store.put, "c4/train", "c4", 10, 30)
    put_shards(store.put, "wiki/train", "wiki", 5, 20)
    return store


def _keys(samples: list[dict[str, object]]) -> Counter[tuple[object, object]]:
    return Counter((s["__source__"], s["__key__"]) for s in samples)


def test_an_llm_foundry_training_yaml_used_as_it_is(
        s3_streams: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``train.yaml#train_loader.dataset`` (and the whole file): proportions 3:1 of
    ``epoch_size`` 2,000 exactly per epoch over 2 ranks x 2 workers, the shards cached in each
    stream's ``local`` directory, ``shuffle_seed`` the seed."""
    cache = tmp_path / "my-copy"
    spec_file = tmp_path / "train.yaml"
    spec_file.write_text(TRAIN_YAML.format(remote=s3_streams.url("").rstrip("/"),
                                           local=cache))
    options = s3_streams.storage_options
    spec = load_spec(f"{spec_file}#train_loader.dataset")
    assert (spec.dialect, spec.mode, spec.seed, spec.epoch_size) == ("mosaic", "samples", 17,
                                                                     2000)
    assert load_spec(spec_file) == spec  # a training YAML: its train_loader.dataset
    read = slots_read(lambda: wds.WebDataset(f"{spec_file}#train_loader.dataset",
                                             storage_options=options),
                      monkeypatch, ranks=2, workers=2, epochs=2)
    for epoch in range(2):
        samples = read[2 * epoch] + read[2 * epoch + 1]
        assert len(samples) == 2000 and abs(len(read[2 * epoch]) - len(read[2 * epoch + 1])) <= 1
        assert Counter(s["__source__"] for s in samples) == {"c4": 1500, "wiki": 500}
        per_key = _keys(samples)  # 1,500 of c4's 300: each 5 times; wiki's 100: each 5 times
        assert set(per_key.values()) == {5} and len(per_key) == 400
    assert read[0] != read[2]  # another order next epoch
    cached = [p for p in cache.rglob("*") if p.is_file()]
    assert {p.relative_to(cache).parts[0] for p in cached} == {"c4", "wiki"}
    monkeypatch.chdir(tmp_path)
    code = main(["-q", "spec", "check", "train.yaml#train_loader.dataset", "--workers", "2",
                 "--storage-options", json.dumps(options)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "dialect: mosaic" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.startswith(("c4 ", "wiki "))}
    assert rows["c4"][rows["c4"].index("proportion") + 1:][:3] == ["3", "75.00%", "1,500"]
    assert rows["wiki"][rows["wiki"].index("proportion") + 1:][:3] == ["1", "25.00%", "500"]
    assert "not used here: decoder_only_format: llm-foundry's" in out


def test_repeat_and_choose_count_samples_per_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mosaic's docs: ``repeat: 3`` sees every sample of A three times, ``repeat: 0.25`` a
    quarter of B, ``choose: 50`` fifty samples of C (never 50 shards); a stream with none of
    them reads its samples once."""
    put = local_put(tmp_path)
    for name, shards, per in (("A", 4, 10), ("B", 4, 10), ("C", 10, 10), ("D", 2, 5)):
        put_shards(put, name, name, shards, per)
    (tmp_path / "mix.yaml").write_text("""\
streams:
  A:
    local: ./A
    repeat: 3
  B:
    local: ./B
    repeat: 0.25
  C:
    local: ./C
    choose: 50
  D:
    local: ./D
""")
    monkeypatch.chdir(tmp_path)
    read = slots_read(lambda: wds.WebDataset("mix.yaml", seed=5), monkeypatch, ranks=2,
                      workers=2)
    samples = read[0] + read[1]
    assert Counter(s["__source__"] for s in samples) == {"A": 120, "B": 10, "C": 50, "D": 10}
    per_key = _keys(samples)
    assert {n for (src, _), n in per_key.items() if src == "A"} == {3}
    assert len([k for k in per_key if k[0] == "A"]) == 40
    assert {n for (src, _), n in per_key.items() if src in "BCD"} == {1}
    assert abs(len(read[0]) - len(read[1])) <= 1


BAD = {
    "proportion and choose": ("""\
streams:
  A: {remote: ./A, proportion: 0.5}
  B: {remote: ./A, choose: 50}
""", r"mix\.yaml: streams\.B: streams\.A gives a proportion and streams\.B gives choose "
     r"\(Mosaic's rule: a spec uses proportions \(relative\) or repeat/choose \(absolute\), "
     r"not both\)"),
    "two weights in a stream": ("""\
streams:
  A: {remote: ./A, repeat: 2, choose: 5}
""", r"mix\.yaml: streams\.A: give at most one of proportion, repeat, choose"),
    "unknown key": ("""\
streams:
  c4: {remot: ./A, local: /tmp/c4}
""", r"mix\.yaml: streams\.c4\.remot: unknown key 'remot'; did you mean 'remote'\?"),
    "MDS data": ("""\
streams:
  A: {remote: ./mds}
""", r"mix\.yaml: streams\.A \('A'\): '\./mds' holds Mosaic MDS data \(index\.json, \*\.mds\): "
     r"wds_cloud reads WebDataset tar shards"),
    "epoch_size with choose": ("""\
epoch_size: 100
streams:
  A: {remote: ./A, choose: 5}
""", r"mix\.yaml: epoch_size: epoch_size goes with proportions"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_streams_name_the_file_and_key_in_python_and_spec_check(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    put = local_put(tmp_path)
    put_shards(put, "A", "A", 2, 3)
    put("mds/index.json", b'{"version": 2, "shards": []}')
    put("mds/shard.00000.mds", b"")
    text, message = BAD[case]
    (tmp_path / "mix.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=message):
        list(wds.WebDataset("mix.yaml"))
    code = main(["-q", "spec", "check", "mix.yaml"])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and re.search(message, lines[0]), err


def test_dataset_keys_map_onto_settings_or_are_listed_as_not_used(tmp_path: Path) -> None:
    """StreamingDataset's ``download_retry``, ``download_timeout``, ``cache_limit``,
    ``shuffle``, ``shuffle_seed`` take effect (the dataset's openers get them); its
    partitioning keys are listed with why."""
    put_shards(local_put(tmp_path), "A", "A", 2, 3)
    data = {"streams": [{"local": str(tmp_path / "A")}], "download_retry": 2,
            "download_timeout": 5, "cache_limit": "10gb", "shuffle": False,
            "shuffle_seed": 9, "predownload": 8, "num_canonical_nodes": 2, "batch_size": 4}
    spec = load_spec(data)
    assert spec.settings == {"retries": 2, "timeout": 5.0, "cache_size": 10**10}
    assert (spec.shuffle, spec.seed) == (False, 9)
    assert [key for key, _ in spec.unused] == ["predownload", "num_canonical_nodes",
                                               "batch_size"]
    dataset = wds.WebDataset(data)
    opener = dataset.pipeline[0].read.openers[0]
    assert (opener.settings.retries, opener.settings.timeout) == (2, 5.0)
    keys = [s["__key__"] for s in dataset]  # shuffle: false keeps the listed shard order
    assert sorted(keys[:3]) == [f"A-00-{i:04d}" for i in range(3)] or \
        sorted(keys[3:]) == [f"A-00-{i:04d}" for i in range(3)]
    with pytest.raises(SpecError, match=r"predownload: not used here: Mosaic's samples"):
        load_spec(data, strict=True)


def test_absent_shuffle_keys_take_mosaics_defaults(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``shuffle`` StreamingDataset does not shuffle, and without ``shuffle_seed`` it
    seeds with 9176, so that a run repeats: the same here. ``seed=`` (or ``WDS_SEED``) still
    wins over that default."""
    monkeypatch.delenv("WDS_SEED", raising=False)
    put_shards(local_put(tmp_path), "A", "A", 4, 5)
    plain = {"streams": {"a": {"local": str(tmp_path / "A")}}}
    spec = load_spec(plain)
    assert (spec.shuffle, spec.seed) == (False, 9176)
    shuffled = {**plain, "shuffle": True}
    assert load_spec(shuffled).seed == 9176

    def keys(data: dict[str, object], **kw: object) -> list[object]:
        return [s["__key__"] for s in wds.WebDataset(data, **kw)]

    listed = keys(plain)
    assert listed == sorted(listed) and len(listed) == 20
    first = keys(shuffled)
    assert first == keys(shuffled) and sorted(first) == listed and first != listed
    assert keys(shuffled, seed=5) != first
