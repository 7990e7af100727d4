"""``wds-cloud head``: the first samples, text members decoded, binary members as size and
type (image dimensions, .npy dtype and shape, pickles never loaded); local shards, a glob, a
spec and the real S3 server; text and ``--json``."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from shardgen import write_tar
from stores.base import Store

from wds_cloud.cli import main
from wds_cloud.cli.head import describe_member


class Exploding:
    def __reduce__(self) -> Any:
        return (pytest.fail, ("the pickle was loaded",))


def png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    rows = b"".join(b"\0" + b"\0" * 3 * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                             0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def jpeg(width: int, height: int) -> bytes:
    """The start of a baseline JPEG: SOI, an APP0 segment, SOF0 with the dimensions."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


MEMBERS = {
    "jpg": jpeg(640, 480), "png": png(3, 2), "txt": "a cat\non a mat ü".encode(),
    "cls": b"7", "json": b'{"b": [1, 2],\n  "c": "d"}', "npy": npy(np.zeros((3, 4), np.int16)),
    "pyd": pickle.dumps(Exploding(), protocol=5), "bin": bytes(range(256)),
    "long.txt": b"word " * 200,
}


def make(root: Path, name: str = "train", shards: int = 2, per_shard: int = 3) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    return [write_tar(root / f"{name}-{s:06d}.tar",
                      [(f"{name}{s}-{i}", MEMBERS if i == 0 else {"txt": b"t%d" % i})
                       for i in range(per_shard)]) for s in range(shards)]


def head(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["-q", "head", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and err == ""
    return code, out


def head_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    code, out = head(capsys, *args, "--json")
    assert code == 0
    samples: list[dict[str, Any]] = json.loads(out)["samples"]
    return samples


def test_text_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    paths = make(tmp_path)
    code, out = head(capsys, paths[0], "-w", "60")
    assert code == 0
    blocks = out.split("\n\n")
    assert len(blocks) == 3  # the default: 3 samples
    lines = blocks[0].splitlines()
    assert lines[0] == f"#1 key 'train0-0' from {paths[0]}"
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["jpg"].endswith("JPEG image, 640x480")
    assert rows["png"].endswith("PNG image, 3x2")
    assert rows["txt"].endswith('"a cat\\non a mat ü"')
    assert rows["cls"].endswith('"7"')
    assert rows["json"].endswith('{"b": [1, 2], "c": "d"}')
    assert rows["npy"].endswith("numpy array, int16, shape (3, 4)")
    assert rows["pyd"].endswith("pickle (protocol 5; not loaded)")
    assert rows["bin"].endswith("256 B  binary data")
    assert '1000 B  "word word word' in rows["long.txt"]
    assert rows["long.txt"].endswith("...") and len(rows["long.txt"]) == 60
    assert all(len(line) <= 60 for line in lines[1:])  # members; the header keeps the URL
    assert blocks[2].splitlines() == [f"#3 key 'train0-2' from {paths[0]}",
                                      '  txt  2 B  "t2"']


def test_json_output_across_shards(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    paths = make(tmp_path)
    samples = head_json(capsys, f"{tmp_path}/train-*.tar", "-n", "4", "--max-chars", "30")
    assert [(s["key"], s["url"], s["source"]) for s in samples] == [
        ("train0-0", paths[0], None), ("train0-1", paths[0], None),
        ("train0-2", paths[0], None), ("train1-0", paths[1], None)]
    members = samples[0]["members"]
    assert members["txt"] == "a cat\non a mat ü" and members["cls"] == "7"
    assert members["json"] == '{"b": [1, 2], "c": "d"}'
    assert members["jpg"] == {"size": len(MEMBERS["jpg"]), "type": "JPEG image, 640x480"}
    assert members["pyd"]["type"].startswith("pickle")
    assert members["long.txt"] == ("word " * 6)[:27] + "..."
    assert samples[1]["members"] == {"txt": "t1"}


def test_spec_names_the_source(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    make(tmp_path / "a", "a", 1, 1)
    b = make(tmp_path / "b", "b", 1, 2)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"datasets": [
        {"name": "first", "shards": f"{tmp_path}/a/a-000000.tar"},
        {"name": "second", "shards": f"{tmp_path}/b/*.tar"}]}))
    samples = head_json(capsys, str(spec), "-n", "2")
    assert [(s["key"], s["source"]) for s in samples] == [("a0-0", "first"), ("b0-0", "second")]
    code, out = head(capsys, str(spec), "-n", "2")
    assert code == 0
    assert f"#2 key 'b0-0' from {b[0]} (source 'second')" in out


def test_on_s3(capsys: pytest.CaptureFixture[str], tmp_path: Path,
               store_factory: Callable[[str], Store]) -> None:
    store = store_factory("s3")
    for path in make(tmp_path):
        store.put(f"data/{Path(path).name}", Path(path).read_bytes())
    options = store.storage_options["s3"]
    flags = ["-o", f"s3.endpoint_url={options['endpoint_url']}", "-o", f"s3.key={options['key']}",
             "-o", f"s3.secret={options['secret']}",
             "-o", f"s3.config_kwargs={json.dumps(options.get('config_kwargs', {}))}"]
    samples = head_json(capsys, store.url("data/train-{000000..000001}.tar"), "-n", "1", *flags)
    assert samples[0]["url"] == store.url("data/train-000000.tar")
    assert samples[0]["members"]["png"] == {"size": len(MEMBERS["png"]),
                                            "type": "PNG image, 3x2"}
    code, out = head(capsys, store.url("data/train-*.tar"), "-n", "1", "--storage-options",
                     json.dumps(store.storage_options))
    assert code == 0 and out.startswith(f"#1 key 'train0-0' from {store.url('data/')}")


def test_describe_member() -> None:
    assert describe_member("txt", b"plain") == "plain"
    assert describe_member("weird", b"utf-8 text \xc3\xbc") == "utf-8 text ü"
    assert describe_member("weird", b"\x00\x01binary") == {"size": 8, "type": "binary data"}
    assert describe_member("txt", b"\xff\xfe") == {"size": 2, "type": "binary data"}
    assert describe_member("json", b"{not json") == "{not json"
    assert describe_member("seg.png", png(5, 7))["type"] == "PNG image, 5x7"  # type: ignore
    assert describe_member("pth", b"PK\x03\x04rest") == {
        "size": 8, "type": "PyTorch file (zip; not loaded)"}
    assert describe_member("npy", npy(np.ones(2, "<f8")))["type"] == (  # type: ignore
        "numpy array, float64, shape (2,)")


def test_unreadable_shards_are_named_and_skipped(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    paths = make(tmp_path, shards=1, per_shard=3)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(write_tar(tmp_path / "whole.tar", [(f"c{i}", {"txt": b"x" * 600})
                                                            for i in range(3)]))
                    .read_bytes()[:2 * 1536 + 700])  # inside c2's data
    code = main(["-q", "head", str(cut), paths[0], "-n", "3", "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err
    assert [s["key"] for s in json.loads(out)["samples"]] == ["c0", "c1", "train0-0"]
    assert err.startswith("wds-cloud head: error: truncated member") and str(cut) in err
    code = main(["-q", "head", f"{tmp_path}/absent.tar", paths[0], "-n", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and out.startswith("#1 key 'train0-0'") and "absent.tar" in err
