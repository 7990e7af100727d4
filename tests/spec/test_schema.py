"""Spec files as users write them: the format, its aliases, ``${VAR}``, ``pipe:``, and every
error naming the file, the key path and what was expected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import wds_cloud as wds
from wds_cloud.errors import ConfigError, SpecError, UnsafeURLError
from wds_cloud.spec import DatasetSpec, load_spec

CONFIG = Path(__file__).resolve().parents[2] / "config"


def _write(tmp_path: Path, data: Any, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return path


def test_the_webdataset_docs_example_loads_unchanged() -> None:
    spec = DatasetSpec.from_yaml(CONFIG / "webdataset-docs.yaml")
    assert [s.name for s in spec.sources] == ["ia1", "cdipsub", "gsub", "bin-gsub", "rendered"]
    assert [s.weight for s in spec.sources] == [0.3, 1.0, 1.0, 1.0, 1.0]
    assert [s.scale for s in spec.sources] == [(1, 1), (1, 3), (0.4, 1), (0.3, 1), (1, 1)]
    assert spec.sources[3].extensions == ("nrm.jpg",)
    assert len(spec.sources[0].urls) == 34 and spec.sources[4].urls == (
        "gs://nvdata-ocropus/rendered.tar",)
    bounds = spec.probability_bounds()
    assert bounds["ia1"][1] == pytest.approx(0.3 / (0.3 + 2.0 + 0.7 + 0.65 + 1.0))
    for epoch in range(3):
        shares = spec.probabilities(epoch, seed=5)
        factors = spec.scale_factors(epoch, 5)
        raw = [s.weight * f for s, f in zip(spec.sources, factors, strict=True)]
        assert list(shares.values()) == pytest.approx([r / sum(raw) for r in raw])
        for (lo, _, hi), p in zip(bounds.values(), shares.values(), strict=True):
            assert lo <= p <= hi


def test_scale_factors_golden_values() -> None:
    """Pinned: a library upgrade must not change the shares of a published run."""
    spec = DatasetSpec.from_dict({"datasets": [{"shards": "x.tar", "scale": [0.5, 2]},
                                               {"shards": "y.tar"}]})
    assert spec.scale_factors(0, 1234) == (1.6534207064156397, 1.0)
    assert spec.scale_factors(1, 1234) == (0.8870868034601747, 1.0)


def test_the_example_configs_load() -> None:
    for path in sorted(CONFIG.glob("*.yaml")):
        assert DatasetSpec.from_yaml(path).sources, path


CANONICAL = {"prefix": "s3://b/", "datasets": [
    {"name": "x", "shards": "x-{0..1}.tar", "weight": 2},
    {"name": "y", "shards": ["y.tar"], "weight": 1, "scale": [0.5, 1]}]}


@pytest.mark.parametrize("data", [
    {"prefix": "s3://b/", "dataset": [{"name": "x", "shards": "x-{0..1}.tar", "scaleprob": 2},
                                      {"name": "y", "urls": ["y.tar"], "scale": [0.5, 1]}]},
    {"prefix": "s3://b/", "datasets": {"x": {"path": "x-{0..1}.tar", "prob": 2},
                                       "y": {"path": ["y.tar"], "proportion": 1,
                                             "scale": [0.5, 1]}}},
])
def test_aliases_normalize_to_the_canonical_keys(data: dict[str, Any]) -> None:
    """The same sources; only the key paths of messages keep the user's spelling."""
    from dataclasses import replace

    got = [replace(s, key="") for s in DatasetSpec.from_dict(data).sources]
    assert got == [replace(s, key="") for s in DatasetSpec.from_dict(CANONICAL).sources]


def test_yaml_json_and_dict_give_the_same_spec(tmp_path: Path) -> None:
    from_yaml = load_spec(_write(tmp_path, CANONICAL))
    json_path = tmp_path / "spec.json"
    json_path.write_text(json.dumps(CANONICAL))
    assert from_yaml.sources == load_spec(json_path).sources == load_spec(CANONICAL).sources
    assert from_yaml.sources[0].urls == ("s3://b/x-0.tar", "s3://b/x-1.tar")


def test_buckets_prefix_vars_and_storage_options() -> None:
    spec = DatasetSpec.from_dict({
        "prefix": "${ROOT}/", "buckets": "main", "seed": "${SEED}",
        "storage_options": {"s3": {"endpoint_url": "${EP}", "anon": True}},
        "datasets": [{"shards": "a-{0..2}.tar"},
                     {"shards": "b.tar", "buckets": ["other"],
                      "storage_options": {"s3": {"anon": False}}},
                     {"shards": "gs://elsewhere/c.tar"}]},
        environ={"ROOT": "s3://data", "SEED": "7", "EP": "http://127.0.0.1:9000"})
    assert spec.seed == 7
    assert spec.sources[0].urls[0] == "s3://data/main/a-0.tar"
    assert spec.sources[1].urls == ("s3://data/other/b.tar",)
    assert spec.sources[2].urls == ("gs://elsewhere/c.tar",)
    assert spec.sources[0].storage_options == {
        "s3": {"endpoint_url": "http://127.0.0.1:9000", "anon": True}}
    assert spec.sources[1].storage_options == {
        "s3": {"endpoint_url": "http://127.0.0.1:9000", "anon": False}}


def test_vars_come_from_the_environment_through_settings(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    monkeypatch.setenv("SHARD_ROOT", str(tmp_path))
    spec = DatasetSpec.from_dict({"datasets": [{"shards": "${SHARD_ROOT}/a.tar"}]})
    assert spec.sources[0].urls == (f"{tmp_path}/a.tar",)


def test_pipe_urls_are_refused_unless_allowed(tmp_path: Path) -> None:
    path = _write(tmp_path, {"datasets": [{"shards": "pipe:cat a.tar"}]})
    with pytest.raises(UnsafeURLError, match=r"spec.yaml: datasets\[0\].shards: 'pipe:cat"):
        DatasetSpec.from_yaml(path)
    with pytest.raises(UnsafeURLError, match="allow_pipe=True"):
        wds.WebDataset(str(path))
    assert DatasetSpec.from_yaml(path, allow_pipe=True).sources[0].urls == ("pipe:cat a.tar",)


def test_default_names_come_from_the_patterns() -> None:
    spec = DatasetSpec.from_dict({"datasets": [
        {"shards": "s3://b/train-{000..009}.tar"}, {"shards": "s3://c/train-*.tar"},
        {"shards": "s3://b/val.tgz"}]})
    assert [s.name for s in spec.sources] == ["train", "train-2", "val"]


@pytest.mark.parametrize("data, message", [
    ({"datasets": [{"shards": "a.tar", "wieght": 1}]},
     r"spec.yaml: datasets\[0\].wieght: unknown key 'wieght'; did you mean 'weight'\?"),
    ({"datasets": [{"shards": "a.tar"}], "seeed": 1},
     r"spec.yaml: seeed: unknown key 'seeed'; did you mean 'seed'\?"),
    ({"datasets": [{"shards": "a.tar"}, {"shards": "b.tar", "weight": -1}]},
     r"datasets\[1\].weight: expected a weight >= 0, got -1 \(negative\)"),
    ({"datasets": [{"shards": "a.tar", "weight": 0}, {"shards": "b.tar", "weight": 0}]},
     r"spec.yaml: all weights are zero"),
    ({"datasets": [{"shards": "a.tar"}, {"shards": "b.tar"},
                   {"shards": "c.tar", "scale": [3.0, 1.0]}]},
     r"datasets\[2\].scale: expected a number >= 0 or \[lo, hi\] with 0 <= lo <= hi, got "
     r"\[3.0, 1.0\] \(lo > hi\)"),
    ({"datasets": [{"shards": "a.tar", "resample": 2, "choose": 1}]},
     r"datasets\[0\]: give resample .* or choose .*, not both"),
    ({"datasets": [{"shards": ""}]}, r"datasets\[0\].shards: empty"),
    ({"datasets": [{"shards": []}]}, r"datasets\[0\].shards: empty"),
    ({"datasets": []}, r"spec.yaml: datasets: no sources"),
    ({"prefix": "s3://b/"}, r"spec.yaml: no 'datasets' key"),
    ({"datasets": [{"shards": "a-{0..3}.tar"}, {"shards": "a-{0..3}.tar"}]},
     r"datasets\[1\]: the same shards as datasets\[0\]"),
    ({"datasets": [{"shards": "a.tar", "weight": 2}, {"shards": "b.tar", "resample": 3}]},
     r"datasets\[0\]: weight cannot be combined with resample/choose \(as in datasets\[1\]\)"),
    ({"datasets": [{"shards": "a-{0..2}.tar", "choose": 5}]},
     r"datasets\[0\].choose: 5 shards asked for, but 'a-\{0..2\}.tar' has 3"),
    ({"datasets": [{"shards": "a.tar", "name": "x"}, {"shards": "b.tar", "name": "x"}]},
     r"datasets\[1\].name: 'x' is also the name of datasets\[0\]"),
    ({"datasets": [{"shards": "a.tar", "weight": "heavy"}]},
     r"datasets\[0\].weight: expected a weight >= 0, got 'heavy'"),
    ({"datasets": [{"shards": "a.tar"}], "seed": 1.5}, r"seed: expected an integer, got 1.5"),
    ({"datasets": [{"shards": "a.tar", "extensions": []}]},
     r"datasets\[0\].extensions: expected extensions as 'jpg txt' or \[jpg, txt\]"),
    ({"datasets": [{"shards": "a.tar", "resample": 0}]},
     r"datasets\[0\].resample: expected a number of shards >= 1, got 0"),
    ({"datasets": [{"shards": "a.tar", "buckets": ["x", "y"]}]},
     r"datasets\[0\].buckets: one bucket per source, got 2"),
    ({"datasets": [{"shards": "${NOT_SET_ANYWHERE}/a.tar"}]},
     r"datasets\[0\].shards: \$\{NOT_SET_ANYWHERE\} is not set"),
    ({"datasets": [{"shards": "a.tar", "storage_options": {"endpoint_url": "x"}}]},
     r"datasets\[0\].storage_options: expected options per scheme"),
    ({"datasets": [{"shards": "a.tar", "weight": 1, "scaleprob": 2}]},
     r"datasets\[0\].(weight|scaleprob): '(weight|scaleprob)' and '(weight|scaleprob)' both "
     r"give 'weight'"),
    ({"datasets": [{"weight": 1}]}, r"datasets\[0\]: no 'shards'"),
    ({"datasets": [{"shards": "a.tar", "scale": [0, 1]}, {"shards": "b.tar", "weight": 0}]},
     r"every source's weight x scale can be zero in the same epoch"),
])
def test_errors_name_the_file_the_key_and_the_expectation(tmp_path: Path, data: dict[str, Any],
                                                          message: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(SpecError, match=message):
        DatasetSpec.from_yaml(path, environ={})


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"missing.yaml: cannot read the spec"):
        DatasetSpec.from_yaml(tmp_path / "missing.yaml")
    bad = _write(tmp_path, "datasets:\n  - shards: [a.tar\n", name="bad.yaml")
    with pytest.raises(SpecError, match=r"bad.yaml: not valid YAML \(line \d+, column \d+\)"):
        DatasetSpec.from_yaml(bad)
    (tmp_path / "bad.json").write_text("{\"datasets\": [}")
    with pytest.raises(SpecError, match=r"bad.json: not valid JSON \(line 1, column 15\)"):
        DatasetSpec.from_json(tmp_path / "bad.json")
    assert issubclass(SpecError, ConfigError) and issubclass(SpecError, ValueError)


def test_unmatched_sources_name_the_source(tmp_path: Path) -> None:
    spec = {"datasets": [{"name": "gone", "shards": f"{tmp_path}/none-*.tar"}]}
    with pytest.raises(FileNotFoundError, match="none-"):
        wds.WebDataset(spec)


def test_describe_shows_the_canonical_keys() -> None:
    spec = DatasetSpec.from_dict({"dataset": [{"urls": "a.tar", "scaleprob": 0.5,
                                               "extensions": "jpg cls"}]})
    assert spec.describe()["datasets"] == [
        {"name": "a", "shards": "a.tar", "weight": 0.5, "scale": [1.0, 1.0],
         "extensions": ["jpg", "cls"]}]
