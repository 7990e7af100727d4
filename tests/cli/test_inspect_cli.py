"""``wds-cloud inspect``: per-shard counts, extensions and size percentiles, and each anomaly
flagged (with shard, member and offset) in deliberately broken shards written with Python's
tarfile; a clean set reports nothing. Local shards, globs, a spec, and the real S3 server."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from shardgen import write_tar
from stores.base import Store

from wds_cloud.cli import main

Item = tuple[str, "bytes | str"]  # (name, data), or (name, "dir") / (name, "->target")


def tar(path: Path, items: Iterable[Item], mode: str = "w") -> Path:
    """A shard with members ``items``: bytes are files, ``"dir"`` a directory, ``"->t"`` a
    symlink to ``t``."""
    with tarfile.open(path, mode) as out:
        for name, data in items:
            info = tarfile.TarInfo(name)
            if data == "dir":
                info.type = tarfile.DIRTYPE
                out.addfile(info)
            elif isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data[2:]
                out.addfile(info)
            else:
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
    return path


def clean(prefix: str, n: int = 4) -> list[Item]:
    return [item for i in range(n) for item in
            ((f"{prefix}{i}.jpg", b"j" * (100 + i)), (f"{prefix}{i}.txt", b"caption"))]


def offset_of(path: Path, name: str, nth: int = 0) -> int:
    """Where tarfile says the ``nth`` member called ``name`` begins."""
    with tarfile.open(path) as t:
        return [m.offset for m in t.getmembers() if m.name == name][nth]


def inspect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["-q", "inspect", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = inspect(capsys, *args, "--json")
    return code, json.loads(out)


def by_shard(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    """``{shard basename: {kind: count}}`` of the shards with anomalies."""
    return {Path(r["url"]).name: r["anomalies"] for r in doc["shards"] if r["anomalies"]}


def found(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [a for a in doc["anomalies"] if a["kind"] == kind]


def broken_set(root: Path) -> list[Path]:
    """One shard per anomaly, in a directory of otherwise clean shards (unique keys)."""
    root.mkdir(exist_ok=True)
    shards = [
        tar(root / "00-clean.tar", clean("c")),
        tar(root / "01-split-a.tar", [*clean("sa"), ("cut.jpg", b"j" * 100)]),
        tar(root / "02-split-b.tar", [("cut.txt", b"caption"), *clean("sb")]),
        tar(root / "03-dup.tar", [*clean("du"), ("du1.txt", b"again")]),
        tar(root / "04-nonadj.tar", [("na0.jpg", b"j"), *clean("nb"), ("na0.txt", b"t")]),
        tar(root / "05-dots.tar", [*clean("do"), ("photo.2021.jpg", b"j" * 100)]),
        tar(root / "06-nonreg.tar", [("imgs/", "dir"), *clean("nr"), ("link.jpg", "->nr0.jpg")]),
        tar(root / "07-gz.tar.gz", clean("gz"), "w:gz"),
        tar(root / "08-gzdata.tar", []),
        tar(root / "09-cut.tar", clean("cu", 6)),
    ]
    gz = tar(root / "tmp.tar.gz", clean("gd"), "w:gz")
    gz.rename(shards[8])
    data = shards[9].read_bytes()
    cut_at = offset_of(shards[9], "cu4.jpg") + 512 + 50  # inside the data of cu4.jpg
    shards[9].write_bytes(data[:cut_at])
    return shards


EXPECTED = {
    "02-split-b.tar": {"split-sample": 1},
    "03-dup.tar": {"duplicate-key": 1},
    "04-nonadj.tar": {"non-adjacent": 1},
    "05-dots.tar": {"extra-dots": 1},
    "06-nonreg.tar": {"non-regular": 2},
    "08-gzdata.tar": {"compression": 1},
    "09-cut.tar": {"corrupt": 1},
}


def check_broken(doc: dict[str, Any], root: Path) -> None:
    """Each anomaly of :func:`broken_set` where it is, and nothing else."""
    assert by_shard(doc) == EXPECTED
    assert doc["anomaly_counts"] == {"corrupt": 1, "compression": 1, "non-regular": 2,
                                     "duplicate-key": 1, "non-adjacent": 1, "extra-dots": 1,
                                     "split-sample": 1, "mixed-compression": 1}
    (split,) = found(doc, "split-sample")
    assert "'cut'" in split["message"] and split["url"].endswith("02-split-b.tar")
    assert split["message"].count("01-split-a.tar") == 1
    (dup,) = found(doc, "duplicate-key")
    assert dup["member"] == "du1.txt"
    assert dup["offset"] == offset_of(root / "03-dup.tar", "du1.txt", 1)
    (nonadj,) = found(doc, "non-adjacent")
    assert (nonadj["member"], nonadj["offset"]) == ("na0.txt",
                                                    offset_of(root / "04-nonadj.tar", "na0.txt"))
    (dots,) = found(doc, "extra-dots")
    assert dots["member"] == "photo.2021.jpg" and "'2021.jpg'" in dots["message"]
    nonreg = {a["member"]: a for a in found(doc, "non-regular")}
    assert set(nonreg) == {"imgs/", "link.jpg"}
    assert "directory" in nonreg["imgs/"]["message"] and nonreg["imgs/"]["offset"] == 0
    assert "symbolic link -> 'nr0.jpg'" in nonreg["link.jpg"]["message"]
    assert nonreg["link.jpg"]["offset"] == offset_of(root / "06-nonreg.tar", "link.jpg")
    (comp,) = found(doc, "compression")
    assert "the name says plain tar but the data is gzip" in comp["message"]
    (cut,) = found(doc, "corrupt")
    assert cut["member"] == "cu4.jpg" and "truncated" in cut["message"]
    assert cut["offset"] == 8 * 1024  # the 9th member; each takes a header and a data block
    (mixed,) = found(doc, "mixed-compression")
    assert mixed["url"] is None
    assert "(by names): 1 gzip" in mixed["message"] and "9 plain tar" in mixed["message"]
    rows = {Path(r["url"]).name: r for r in doc["shards"]}
    assert rows["09-cut.tar"]["samples"] == 4  # the samples before the cut are counted
    assert rows["07-gz.tar.gz"]["compression"] == "gzip"
    assert rows["00-clean.tar"]["compression"] is None


def test_each_anomaly_is_flagged(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shards = broken_set(tmp_path / "set")
    code, doc = report(capsys, f"{tmp_path}/set/*.tar*", "--all", "--workers", "3")
    assert code == 1
    check_broken(doc, tmp_path / "set")
    assert doc["summary"]["inspected"] == doc["summary"]["listed"] == len(shards)
    code, out, _ = inspect(capsys, f"{tmp_path}/set/*.tar*", "--all")
    assert code == 1
    assert "9 anomalies: 1 corrupt, 1 compression, 2 non-regular" in out
    assert (f"  duplicate-key: {shards[3]} member 'du1.txt' at offset "
            f"{offset_of(shards[3], 'du1.txt', 1)}: sample 'du1' has a second 'txt' member") in out
    assert f"  non-regular: {shards[6]} member 'imgs/' at offset 0: a directory" in out
    assert "  mixed-compression: (shard set): " in out


def test_clean_set_reports_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for s in range(3):
        tar(tmp_path / f"train-{s:06d}.tar", clean(f"k{s}-", 5))
    code, doc = report(capsys, f"{tmp_path}/train-{{000000..000002}}.tar", "--all")
    assert code == 0 and doc["anomalies"] == [] and doc["anomaly_counts"] == {}
    assert [r["samples"] for r in doc["shards"]] == [5, 5, 5]
    assert [r["members"] for r in doc["shards"]] == [10, 10, 10]
    ext = doc["summary"]["extensions"]
    assert ext["jpg"] == {"samples": 15, "members": 15,
                          "sizes": {"p0": 100, "p50": 102, "p90": 104, "p99": 104, "max": 104}}
    assert ext["txt"]["sizes"] == {"p0": 7, "p50": 7, "p90": 7, "p99": 7, "max": 7}
    assert ext["*"]["members"] == 30 and ext["*"]["sizes"]["max"] == 104
    assert doc["shards"][0]["extensions"]["jpg"]["sizes"]["p50"] == 102
    assert doc["summary"]["bytes"] == 3 * (sum(100 + i for i in range(5)) + 5 * 7)
    code, out, _ = inspect(capsys, f"{tmp_path}/train-*.tar", "--all")
    assert code == 0 and out.rstrip().endswith("no anomalies")
    assert "3 shards inspected: 15 samples, 30 members" in out
    assert out.splitlines()[0].split() == ["shard", "samples", "members", "data",
                                           "compression", "anomalies"]


def test_first_shards_only_without_all(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    broken_set(tmp_path / "set")
    code, doc = report(capsys, f"{tmp_path}/set/0*.tar*", "-n", "2")
    assert doc["summary"] == {**doc["summary"], "listed": 10, "selected": 2, "inspected": 2}
    # the two read are clean; the names of all ten still show mixed compression
    assert code == 1 and list(doc["anomaly_counts"]) == ["mixed-compression"]
    code, out, _ = inspect(capsys, f"{tmp_path}/set/00-clean.tar")
    assert code == 0 and "1 shard inspected: 4 samples" in out and "of 1" not in out
    code, out, _ = inspect(capsys, f"{tmp_path}/set/0[0-2]*.tar")
    assert code == 0 and "1 shard inspected (of 3 listed; --all reads every one)" in out


def test_missing_shard_exits_2_after_the_others(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    tar(tmp_path / "a-0.tar", clean("a"))
    code, out, err = inspect(capsys, f"{tmp_path}/a-{{0..1}}.tar", "--all")
    assert code == 2 and "1 shard inspected (of 2 listed)" in out
    assert "wds-cloud inspect: error:" in err and f"{tmp_path}/a-1.tar" in err


def test_spec_sources_are_compared_each_on_its_own(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        for s in range(2):  # the same keys in both sources: not an anomaly
            write_tar(tmp_path / name / f"{s}.tar", [(f"k{s}-{i}", {"txt": b"x", "cls": b"1"})
                                                     for i in range(3)])
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"datasets": [
        {"name": "one", "shards": f"{tmp_path}/one/{{0..1}}.tar"},
        {"name": "two", "shards": f"{tmp_path}/two/*.tar", "weight": 2}]}))
    code, doc = report(capsys, str(spec), "--all")
    assert code == 0, doc["anomalies"]
    assert [(Path(r["url"]).parent.name, r["source"]) for r in doc["shards"]] == [
        ("one", "one"), ("one", "one"), ("two", "two"), ("two", "two")]
    write_tar(tmp_path / "two" / "1.tar", [("k0-2", {"txt": b"x"})])  # 0.tar's last key
    code, doc = report(capsys, str(spec), "--all")
    assert code == 1 and doc["anomaly_counts"] == {"split-sample": 1}
    assert found(doc, "split-sample")[0]["url"] == f"{tmp_path}/two/1.tar"


def test_a_local_shard_of_thousands_of_members(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    # (how fast is a benchmark's business, never a timed assertion)
    path = write_tar(tmp_path / "big.tar", [(f"k{i:06d}", {"jpg": b"x" * 300, "txt": b"t",
                                                           "cls": b"1"}) for i in range(3000)])
    code, out, _ = inspect(capsys, path)
    assert code == 0 and "3,000 samples, 9,000 members" in out


def test_on_s3(capsys: pytest.CaptureFixture[str], tmp_path: Path,
               store_factory: Callable[[str], Store]) -> None:
    store = store_factory("s3")
    shards = broken_set(tmp_path / "set")
    for path in shards:
        store.put(f"data/{path.name}", path.read_bytes())
    options = store.storage_options["s3"]
    flags = ["-o", f"s3.endpoint_url={options['endpoint_url']}", "-o", f"s3.key={options['key']}",
             "-o", f"s3.secret={options['secret']}",
             "-o", f"s3.config_kwargs={json.dumps(options.get('config_kwargs', {}))}"]
    code, doc = report(capsys, store.url("data/*.tar*"), "--all", *flags)
    assert code == 1
    assert by_shard(doc) == EXPECTED
    assert all(r["url"].startswith(store.url("data/")) for r in doc["shards"])
    (dup,) = found(doc, "duplicate-key")
    assert dup["offset"] == offset_of(shards[3], "du1.txt", 1)
    code, out, _ = inspect(capsys, store.url("data/0[3]*.tar"), "--storage-options",
                           json.dumps(store.storage_options))
    assert code == 1 and f"duplicate-key: {store.url('data/03-dup.tar')} member 'du1.txt'" in out


def test_a_shard_cut_in_the_last_members_padding(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    """The member is whole: the line names the shard, the member and where the archive is cut."""
    whole = write_tar(tmp_path / "whole.tar", [("k0", {"txt": b"hello", "cls": b"12345678"})])
    data = Path(whole).read_bytes()
    with tarfile.open(whole) as t:
        last = t.getmembers()[-1]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:last.offset_data + last.size + 4])
    assert main(["inspect", str(cut)]) == 1
    line = next(line for line in capsys.readouterr().out.splitlines() if "corrupt:" in line)
    assert line.strip() == (
        f"corrupt: {cut} member {last.name!r} at offset {last.offset}: the archive is cut at "
        f"offset {last.offset_data + last.size + 4}, in the padding after {last.name!r}, which "
        f"is whole ({last.size} bytes of data at offset {last.offset_data}): "
        f"{512 - last.size - 4} bytes of padding and the end-of-archive blocks are missing (a "
        "shard cut short, e.g. by an interrupted copy or upload)")
