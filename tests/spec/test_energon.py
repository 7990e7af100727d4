"""Megatron-Energon metadatasets as Energon's docs and tests write them (the ``__module__`` /
``__class__`` wrapper, ``splits:``, ``blend:``, ``blend_epochized:``, nested metadatasets,
``subflavors``, ``split_part``), over Energon-prepared datasets (``.nv-meta/``) on a local
directory and on the local S3 server: the shares and per-epoch counts they ask for, with
DataLoader workers and two ranks, and every bad input named by file and key."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from dialects import local_put, prepare, slots_read
from stores.base import Store

import wds_cloud as wds
from wds_cloud.cli import main
from wds_cloud.errors import ShardNotFoundError, SpecError
from wds_cloud.spec import load_spec


class Checked:
    """What ``wds-cloud spec check ARGS`` returned and printed (run in this process)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], *args: str) -> None:
        self.returncode = main(["-q", "spec", "check", *args])
        self.stdout, self.stderr = capsys.readouterr()


@pytest.fixture
def s3_datasets(store_factory: Callable[[str], Store]) -> Store:
    """coco, coyo and other, Energon-prepared, in a bucket of the local S3 server."""
    store = store_factory("s3")
    for name in ("coco", "coyo", "other"):
        prepare(store.put, name, name, shards=10, per_shard=20)
    return store


@pytest.mark.slow
def test_nested_metadatasets_blend_by_weight_with_subflavors_on_s3(
        s3_datasets: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' three-way blend (5/2/1), nested inside another metadataset (weight 4, with
    subflavors that override the inner ones) next to the inner file's val split: the shares
    multiply through the nesting, read by 2 ranks x 2 workers."""
    url = s3_datasets.url
    (tmp_path / "inner.yaml").write_text(f"""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  # Split defines the train/val/test subsets composition
  train:
    # Mix the following datasets
    blend:
      - weight: 5
        path: {url('coco')}
        subflavors:
          augmentation_type: small_images
          text_length: short
      - weight: 2
        path: {url('coyo')}
        subflavors:
          augmentation_type: large_images
      - weight: 1
        path: {url('other')}
  val:
    # Only use coco-val for val
    path: {url('coco')}
""")
    (tmp_path / "outer.yaml").write_text("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 4
        path: ./inner.yaml
        split_part: train
        subflavors:
          source: outer.yaml
          text_length: long
      - path: ./inner.yaml
        split_part: val
        subflavors:
          source: outer.yaml
""")
    options = s3_datasets.storage_options
    ranks = slots_read(lambda: wds.WebDataset(str(tmp_path / "outer.yaml"), seed=7,
                                              storage_options=options),
                       monkeypatch, ranks=2, workers=2, limit=6000)
    samples = [s for rank in ranks for s in rank]
    shares = Counter(s["__source__"] for s in samples)
    expected = {"coco": 0.8 * 5 / 8, "coyo": 0.8 * 2 / 8, "other": 0.8 / 8, "coco-val": 0.2}
    for name, share in expected.items():
        assert shares[name] / len(samples) == pytest.approx(share, abs=0.02), (name, shares)
    flavors = {s["__source__"]: s["__subflavors__"] for s in samples}
    assert flavors["coco"] == {"augmentation_type": "small_images", "text_length": "long",
                               "source": "outer.yaml"}
    assert flavors["coyo"] == {"augmentation_type": "large_images", "source": "outer.yaml",
                               "text_length": "long"}
    assert flavors["coco-val"] == {"source": "outer.yaml"}
    parts = yaml.safe_load(s3_datasets.get("coco/.nv-meta/split.yaml") or b"")["split_parts"]
    for s in samples:  # each sample from its split's shards only
        split = "val" if s["__source__"] == "coco-val" else "train"
        if s["__source__"].startswith("coco"):
            assert s["__url__"].split("coco/", 1)[1] in parts[split]
    assert ranks[0][:50] != ranks[1][:50]


def test_blend_epochized_reads_each_sample_its_repetitions_per_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Repetitions 2, 0.5 and 1 (coyo's val split): over 2 ranks x 2 workers, every train
    sample of coco twice, half of coyo's once, coyo's val once; equal totals per rank, and
    the next epoch the same counts in another order."""
    put = local_put(tmp_path)
    prepare(put, "coco", "coco", shards=5, per_shard=12)
    prepare(put, "coyo", "coyo", shards=5, per_shard=12)
    (tmp_path / "metadataset.yaml").write_text("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    # Blend the following datasets, repeating coco 2 times, coyo-train 0.5 times and
    # coyo-val 1 time
    blend_epochized:
      - repetitions: 2
        path: ./coco
      - repetitions: 0.5
        path: ./coyo
      - repetitions: 1
        path: ./coyo
        split_part: val
""")
    def make() -> wds.WebDataset:
        return wds.WebDataset(str(tmp_path / "metadataset.yaml"), seed=3)

    assert len(make().pipeline[0]) == 2 * 48 + 24 + 12
    read = slots_read(make, monkeypatch, ranks=2, workers=2, epochs=2)
    epochs = []
    for epoch in range(2):
        ranks = read[2 * epoch:2 * epoch + 2]
        assert abs(len(ranks[0]) - len(ranks[1])) <= 1
        epochs.append([s for rank in ranks for s in rank])
    for samples in epochs:
        per_key = Counter((s["__source__"], s["__key__"]) for s in samples)
        coco = [n for (src, _), n in per_key.items() if src == "coco"]
        assert len(coco) == 48 and set(coco) == {2}
        coyo = [n for (src, _), n in per_key.items() if src == "coyo"]
        assert len(coyo) == 24 and set(coyo) == {1}
        val = [k for (src, k) in per_key if src == "coyo-val"]
        assert len(val) == 12 and all(k.startswith("coyo-04-") for k in val)
    assert [s["__key__"] for s in epochs[0]] != [s["__key__"] for s in epochs[1]]


def test_other_splits_read_every_sample_once(tmp_path: Path) -> None:
    """Energon's validation mode: a blend is concatenated, its weights ignored."""
    put = local_put(tmp_path)
    prepare(put, "coco", "coco", shards=5, per_shard=6)
    prepare(put, "coyo", "coyo", shards=5, per_shard=6)
    (tmp_path / "mds.yaml").write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"path": "./coco"},
                   "val": {"blend": [{"weight": 9, "path": "./coco"},
                                     {"weight": 1, "path": "./coyo"}]}}}))
    got = list(wds.WebDataset(str(tmp_path / "mds.yaml"), split="val"))
    assert Counter(s["__source__"] for s in got) == {"coco": 6, "coyo": 6}
    assert len({s["__key__"] for s in got}) == 12


def test_the_older_metadataset_class_and_legacy_subflavor(tmp_path: Path) -> None:
    """``__class__: Metadataset`` (Energon before V2): ``splits.train.datasets``, and the
    legacy ``subflavor`` carried as ``__subflavor__``."""
    put = local_put(tmp_path)
    prepare(put, "ds1", "ds1", shards=2, per_shard=5)
    prepare(put, "ds2", "ds2", shards=2, per_shard=5)
    (tmp_path / "metadataset.yaml").write_text("""\
__module__: megatron.energon
__class__: Metadataset
splits:
  train:
    datasets:
      - weight: 1
        path: ds1
        subflavor: ds1
        subflavors:
          source: metadataset.yaml
          number: 43
      - weight: 3
        path: ds2
        subflavor: ds2
""")
    spec = load_spec(tmp_path / "metadataset.yaml")
    assert spec.dialect == "energon" and spec.mode == "mix"
    assert [s.weight for s in spec.sources] == [0.25, 0.75]
    assert spec.sources[0].subflavors == {"__subflavor__": "ds1", "source": "metadataset.yaml",
                                          "number": 43}


def test_a_prepared_directory_and_a_plain_one_as_webdataset_sources(tmp_path: Path) -> None:
    """A ``datasets:`` source may name an Energon-prepared directory (its train split from
    .nv-meta) or a plain directory (every .tar under it, sorted); neither is a clear error."""
    put = local_put(tmp_path)
    prepare(put, "prepared", "p", shards=5, per_shard=4, exclude=["parts/data-1.tar",
                                                                   "parts/data-2.tar/p-02-0003"])
    put_plain = local_put(tmp_path / "plain")
    for s in range(3):
        from dialects import shard_bytes
        put_plain(f"sub/x-{s}.tar", shard_bytes([(f"x{s}-{i}", {"txt": b"x"})
                                                 for i in range(2)]))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("nothing")
    spec = {"datasets": [{"name": "p", "shards": str(tmp_path / "prepared")},
                         {"name": "x", "shards": str(tmp_path / "plain")}]}
    got = list(wds.WebDataset(spec, seed=1))
    keys = Counter(s["__source__"] for s in got)
    assert keys == {"p": 3 * 4 - 1, "x": 6}  # train: shards 0-3, less shard 1 and one key
    assert "p-02-0003" not in {s["__key__"] for s in got}
    with pytest.raises(ShardNotFoundError, match=r"datasets\[0\] \('e'\): .*empty' has no "
                       r"\.nv-meta/ \(an Energon-prepared dataset\) and no \*\.tar"):
        list(wds.WebDataset({"datasets": [{"name": "e", "shards": str(tmp_path / "empty")}]}))


def test_metadatasets_in_a_bucket_name_their_datasets_relative_to_themselves(
        s3_datasets: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """A metadataset kept beside the datasets in the bucket (as Energon's users keep them in
    object storage), naming a nested one and the datasets by relative paths: read by
    ``WebDataset(url)``, ``spec check URL`` and ``ls`` of a glob of them; a missing one is an
    error naming its URL."""
    s3_datasets.put("specs/inner.yaml", b"""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 3
        path: ../coco
      - weight: 1
        path: ../coyo
""")
    s3_datasets.put("specs/outer.yaml", b"""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 1
        path: ./inner.yaml
        subflavors: {source: outer}
      - weight: 1
        path: ../other
""")
    options = s3_datasets.storage_options
    url = s3_datasets.url("specs/outer.yaml")
    dataset = wds.WebDataset(url, seed=3, storage_options=options).with_epoch(4000)
    shares = Counter(s["__source__"] for s in dataset)
    total = sum(shares.values())
    for name, share in {"coco": 0.375, "coyo": 0.125, "other": 0.5}.items():
        assert shares[name] / total == pytest.approx(share, abs=0.03), shares
    as_json = json.dumps(options)
    done = Checked(capsys, url, "--storage-options", as_json)
    assert done.returncode == 0, done.stderr
    assert "dialect: energon" in done.stdout and "coco" in done.stdout
    assert main(["ls", s3_datasets.url("specs/*.yaml"), "--storage-options", as_json]) == 0
    listed = capsys.readouterr().out
    assert "specs/inner.yaml" in listed and "specs/outer.yaml" in listed
    missing = s3_datasets.url("specs/nothing.yaml")
    with pytest.raises(SpecError, match=re.escape(missing) + ": cannot read the spec: no such"):
        wds.WebDataset(missing, storage_options=options)
    with pytest.raises(SpecError, match=r"open_stream=wds\.gopen"):
        load_spec(url)


def test_the_metadata_read_counts_as_requests_not_as_shards(s3_datasets: Store) -> None:
    """Reading a prepared dataset's ``.nv-meta`` files costs GETs (``requests``), but they are
    no shards: ``shards`` and ``gets`` count the shards an epoch reads, so ``gets_per_shard``
    stays 1.0 (it read 1.25 for an epoch of 2 shards and 3 metadata files)."""
    spec = {"__module__": "megatron.energon", "__class__": "MetadatasetV2",
            "splits": {"val": {"path": s3_datasets.url("coco")}}}
    before = wds.io_stats()
    dataset = wds.WebDataset(spec, split="val", storage_options=s3_datasets.storage_options)
    built = wds.io_stats()
    assert built["requests"] - before["requests"] >= 2  # .info.json, split.yaml at least
    assert built["shards"] == before["shards"] and built["gets"] == before["gets"]
    count = sum(1 for _ in dataset)
    after = wds.io_stats()
    shards = after["shards"] - built["shards"]
    assert count > 0 and shards == after["gets"] - built["gets"] > 0


BAD = {
    "missing split part": ("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 1
        path: ./coco
        split_part: tain
""", r"mds\.yaml: splits\.train\.blend\[0\] \('coco'\): .*coco/\.nv-meta/split\.yaml has no "
     r"split 'tain' \(its splits: train, val\); pick one with split_part"),
    "unknown key": ("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - wieght: 2
        path: ./coco
""", r"mds\.yaml: splits\.train\.blend\[0\]\.wieght: unknown key 'wieght'; did you mean "
     r"'weight'\?"),
    "join": ("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    join:
      a: {path: ./coco}
    joiner: {__module__: x, __class__: Y}
""", r"mds\.yaml: splits\.train\.join: joining datasets .* is not supported"),
    "join in a blend": ("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 1
        join:
          image_source:
            path: ./coco
          caption_source:
            path: ./coco
        joiner:
          __module__: megatron.energon
          __class__: CaptioningSample
""", r"mds\.yaml: splits\.train\.blend\[0\]\.join: joining datasets .* is not supported"),
    "a JSONL dataset": ("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    path: ./my_dataset.jsonl
""", r"mds\.yaml: splits\.train\.path: .*my_dataset\.jsonl: Energon's JSONL datasets .* "
     r"are not supported here"),
    "no split": ("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  val:
    path: ./coco
""", r"mds\.yaml: splits: no split 'train' \(splits here: val\); pick one with split="),
    "a dataset config": ("""\
__module__: megatron.energon
__class__: CrudeWebdataset
""", r"mds\.yaml: __class__: 'CrudeWebdataset': expected one of MetadatasetV2, Metadataset"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_metadatasets_name_the_file_and_key_in_python_and_spec_check(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    prepare(local_put(tmp_path), "coco", "coco", shards=5, per_shard=2)
    text, message = BAD[case]
    (tmp_path / "mds.yaml").write_text(text)
    with pytest.raises((SpecError, ShardNotFoundError), match=message):
        list(wds.WebDataset("mds.yaml"))
    done = Checked(capsys, "mds.yaml")
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert re.search(message, lines[0]), lines[0]


def test_spec_check_lists_keys_not_used_here_and_refuses_them_under_strict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    prepare(local_put(tmp_path), "coco", "coco", shards=5, per_shard=3)
    (tmp_path / "mds.yaml").write_text("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 1
        path: ./coco
        shuffle_over_epochs_multiplier: 3
        subflavors: {kind: captions}
""")
    done = Checked(capsys, "mds.yaml", "--split", "train")
    assert done.returncode == 0, done.stderr
    assert "dialect: energon, split 'train'" in done.stdout
    assert "kind=captions" in done.stdout  # the subflavors column
    assert ("not used here: splits.train.blend[0].shuffle_over_epochs_multiplier: Energon's "
            "shuffle window") in done.stdout
    assert "coco/.nv-meta/dataset.yaml: sample_type, field_map: configures Energon's" \
        in done.stdout
    strict = Checked(capsys, "mds.yaml", "--strict")
    assert strict.returncode == 1
    assert "shuffle_over_epochs_multiplier: not used here" in strict.stderr
    assert "dataset.yaml" not in strict.stderr  # what energon prepare wrote is only noted
    (tmp_path / "plain.yaml").write_text("""\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 1
        path: ./coco
""")
    plain = Checked(capsys, "plain.yaml", "--strict")
    assert plain.returncode == 0, plain.stderr
    assert "coco/.nv-meta/dataset.yaml: sample_type, field_map" in plain.stdout
    with pytest.raises(SpecError, match="shuffle_over_epochs_multiplier: not used here"):
        load_spec(tmp_path / "mds.yaml", strict=True)


def test_the_older_info_yaml_and_a_split_config(tmp_path: Path) -> None:
    """Datasets prepared by older Energon releases have ``.nv-meta/.info.yaml``; a reference
    may name another split file with ``split_config``."""
    put = local_put(tmp_path)
    prepare(put, "old", "old", shards=4, per_shard=3)
    meta = tmp_path / "old" / ".nv-meta"
    (meta / ".info.yaml").write_text(yaml.safe_dump(yaml.safe_load(
        (meta / ".info.json").read_text())))
    (meta / ".info.json").unlink()
    (meta / "custom.yaml").write_text(yaml.safe_dump(
        {"split_parts": {"train": ["parts/data-{2..3}.tar"]}}))
    (tmp_path / "mds.yaml").write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"blend_epochized": [
            {"repetitions": 1, "path": "old", "split_config": "custom.yaml"}]}}}))
    got = list(wds.WebDataset(str(tmp_path / "mds.yaml")))
    assert sorted(s["__key__"] for s in got) == [f"old-{s:02d}-{i:04d}" for s in (2, 3)
                                                 for i in range(3)]


def test_a_damaged_shard_midway_with_a_handler_that_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The epoch counts what the shards really gave: with ``warn_and_continue`` the samples
    before the damage are read, the shortfall is logged naming the shard; with the default
    handler the damage is an error naming the shard."""
    put = local_put(tmp_path)
    prepare(put, "ds", "ds", shards=5, per_shard=10)
    shard = tmp_path / "ds" / "parts" / "data-1.tar"
    shard.write_bytes(shard.read_bytes()[:2900])  # inside the third sample
    (tmp_path / "mds.yaml").write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"blend_epochized": [{"repetitions": 1, "path": "ds"}]}}}))
    dataset = wds.WebDataset(str(tmp_path / "mds.yaml"), handler=wds.warn_and_continue)
    with pytest.warns(UserWarning, match="truncated"):
        got = [s["__key__"] for s in dataset]
    assert len(got) == 30 + 2 and "ds-01-0001" in got and "ds-01-0002" not in got
    assert f"{shard}".replace(str(tmp_path), "") in caplog.text.replace(str(tmp_path), "")
    assert "gave 2 samples, but 10 were counted for it" in caplog.text
    with pytest.raises(wds.ShardFormatError, match=r"data-1\.tar"):
        list(wds.WebDataset(str(tmp_path / "mds.yaml")))


def test_nv_meta_is_read_where_it_is_never_from_the_shard_cache(
        s3_datasets: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a shard cache, the shards are cached, the small .nv-meta files are not: a split
    changed in the bucket is what the next dataset reads."""
    monkeypatch.chdir(tmp_path)
    spec = {"__module__": "megatron.energon", "__class__": "MetadatasetV2",
            "splits": {"val": {"path": s3_datasets.url("coco")}}}

    def read() -> set[str]:
        return {s["__url__"].rsplit("/", 1)[-1] for s in wds.WebDataset(
            spec, split="val", cache_dir="cache", storage_options=s3_datasets.storage_options)}

    assert read() == {"data-8.tar", "data-9.tar"}
    s3_datasets.put("coco/.nv-meta/split.yaml", yaml.safe_dump(
        {"split_parts": {"val": ["parts/data-0.tar"]}}).encode())
    time.sleep(1.2)  # rclone's --dir-cache-time 1s: it serves the old size until then
    assert read() == {"data-0.tar"}
    cached = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert any(n.endswith(".tar") for n in cached)
    assert not [n for n in cached if n.startswith(("info.", "split.", "dataset."))], cached
