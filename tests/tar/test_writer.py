"""TarWriter, ShardWriter and the encoders: output checked with webdataset 1.0.2, tarfile and
GNU tar, and round trips through the decoders."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import cbor2
import msgpack
import numpy as np
import PIL.Image
import pytest
import torch
import webdataset as wds_ref
from webdataset import autodecode as wa

import wds_cloud.codecs.decoder as ad
from wds_cloud.codecs import encoder as encode
from wds_cloud.codecs.encoder import EncodingError
from wds_cloud.errors import ConfigError
from wds_cloud.tar.shardloop import samples_from_shards
from wds_cloud.tar.writer import ShardWriter, TarWriter

GNU_TAR = shutil.which("tar") or "tar"  # a missing tar fails the tests that need it


def _raw_samples(n: int = 12) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [
        {"__key__": f"dir/s{i:04d}", "txt": f"sample {i} é".encode(), "cls": str(i).encode(),
         "seg.bin": rng.bytes(int(rng.integers(0, 2000))), "empty": b""}
        for i in range(n)
    ]


def _read_ref(url: str) -> list[dict[str, Any]]:
    """Samples as webdataset 1.0.2 reads them, without its metadata fields."""
    out = []
    for sample in wds_ref.WebDataset(url, shardshuffle=False):
        out.append({k: v for k, v in sample.items() if k not in ("__url__", "__local_path__")})
    return out


def _write(path: Any, samples: list[dict[str, Any]], **kw: Any) -> None:
    with TarWriter(str(path), **kw) as sink:
        for sample in samples:
            sink.write(sample)


@pytest.mark.parametrize("name", ["a.tar", "a.tgz", "a.tar.gz", "a.tar.bz2", "a.tar.xz"])
def test_webdataset_reads_what_we_write(tmp_path: Path, name: str) -> None:
    samples = _raw_samples()
    _write(tmp_path / name, samples)
    assert _read_ref(str(tmp_path / name)) == samples


def test_tarfile_sees_sorted_reproducible_members(tmp_path: Path) -> None:
    samples = _raw_samples(3)
    _write(tmp_path / "a.tar", samples, user="alice", group="staff", mode=0o640)
    with tarfile.open(tmp_path / "a.tar") as tf:
        members = tf.getmembers()
        names = [m.name for m in members]
        expected = [f"{s['__key__']}.{k}" for s in samples for k in sorted(s) if k != "__key__"]
        assert names == expected
        for m, (sample, k) in zip(members, [(s, k) for s in samples for k in sorted(s)
                                            if k != "__key__"], strict=True):
            assert (m.uid, m.gid, m.uname, m.gname, m.mode, m.mtime) == (
                0, 0, "alice", "staff", 0o640, 0)
            assert m.isreg()
            extracted = tf.extractfile(m)
            assert extracted is not None and extracted.read() == sample[k]
    assert os.path.getsize(tmp_path / "a.tar") % 10240 == 0


@pytest.mark.parametrize("fmt", [None, "pax", "gnu"])
def test_gnu_tar_lists_and_extracts(tmp_path: Path, fmt: str | None) -> None:
    samples = [
        *_raw_samples(3),
        {"__key__": "d/" * 70 + "deep", "txt": b"long with slashes"},
        {"__key__": "x" * 150, "txt": b"long without slashes"},
        {"__key__": "ünïcode", "txt": b"utf-8 name"},
    ]
    _write(tmp_path / "a.tgz", samples, format=fmt)
    listing = subprocess.run([GNU_TAR, "tzf", str(tmp_path / "a.tgz")], check=True,
                             capture_output=True, text=True)
    expected = [f"{s['__key__']}.{k}" for s in samples for k in sorted(s) if k != "__key__"]
    assert listing.stdout.splitlines() == expected
    assert listing.stderr == ""
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run([GNU_TAR, "xzf", str(tmp_path / "a.tgz"), "-C", str(out)], check=True)
    for sample in samples:
        for k in sample:
            if k != "__key__":
                assert (out / f"{sample['__key__']}.{k}").read_bytes() == sample[k]
    assert _read_ref(str(tmp_path / "a.tgz")) == samples
    with tarfile.open(tmp_path / "a.tgz") as tf:
        assert tf.getnames() == expected


def test_output_is_reproducible(tmp_path: Path) -> None:
    samples = [
        {"__key__": f"k{i}", "txt": f"t{i}", "json": {"i": i}, "npz": {"a": np.arange(i + 2)},
         "npy": np.arange(3), "txt.gz": "zipped", "png": np.full((3, 4), i, np.uint8)}
        for i in range(5)
    ]
    outputs = []
    for name in ["one.tgz", "two.tgz"]:
        _write(tmp_path / name, samples)
        outputs.append((tmp_path / name).read_bytes())
        assert outputs[-1][4:8] == b"\0\0\0\0"  # gzip header mtime
    assert outputs[0] == outputs[1]
    stream = io.BytesIO()  # fields given in another order: same archive
    with TarWriter(stream, compress=False) as sink:
        for sample in samples:
            sink.write({k: sample[k] for k in reversed(list(sample))})
    assert gzip.decompress(outputs[0]) == stream.getvalue()
    assert _read_ref(str(tmp_path / "one.tgz"))[0]["txt"] == b"t0"


def test_file_objects_stay_open_and_compress_argument(tmp_path: Path) -> None:
    stream = io.BytesIO()
    with TarWriter(stream, compress=True) as sink:
        assert sink.write({"__key__": "a", "txt": b"x"}) == 1024
    assert not stream.closed
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(stream.getvalue()))) as tf:
        assert tf.getnames() == ["a.txt"]
    with pytest.raises(ConfigError, match="compress"):
        TarWriter(io.BytesIO(), compress="zip")


def test_pipe_url_goes_through_gopen(tmp_path: Path) -> None:
    target = tmp_path / "piped.tar"
    samples = _raw_samples(2)
    _write(f"pipe:cat > {target}", samples)
    assert _read_ref(str(target)) == samples


def test_keep_meta_and_metadata_rules(tmp_path: Path) -> None:
    stream = io.BytesIO()
    with TarWriter(stream, keep_meta=True) as sink:
        sink.write({"__key__": "a", "__url__": "src.tar", "txt": "x"})
    with tarfile.open(fileobj=io.BytesIO(stream.getvalue())) as tf:
        assert tf.getnames() == ["a.__url__", "a.txt"]
    with pytest.raises(EncodingError, match="__key__"):
        TarWriter(io.BytesIO()).write({"txt": b"no key"})
    with pytest.raises(EncodingError, match="__url__"):
        TarWriter(io.BytesIO()).write({"__key__": "a", "__url__": 3})
    with pytest.raises(EncodingError, match=r"'cls'.*bytes"):
        TarWriter(io.BytesIO(), encoder=False).write({"__key__": "a", "cls": 3})
    with pytest.raises(EncodingError, match="no encoder for field 'weird'"):
        TarWriter(io.BytesIO()).write({"__key__": "a", "weird": object()})
    with pytest.raises(EncodingError, match="'json'"):
        TarWriter(io.BytesIO()).write({"__key__": "a", "json": {1, 2}})


def test_encoder_dict_and_callable() -> None:
    def upper(sample: dict[str, Any]) -> dict[str, Any]:
        return {k: v.upper() if k == "txt" else str(v) for k, v in sample.items()}

    for encoder, expected in [({"cls": lambda x: b"<%d>" % x}, b"<3>"), (upper, b"ABC")]:
        stream = io.BytesIO()
        with TarWriter(stream, encoder=encoder) as sink:
            sink.write({"__key__": "a", "cls": 3, "txt": "abc"})
        with tarfile.open(fileobj=io.BytesIO(stream.getvalue())) as tf:
            member = "a.cls" if isinstance(encoder, dict) else "a.txt"
            extracted = tf.extractfile(member)
            assert extracted is not None and extracted.read() == expected
    with pytest.raises(ConfigError, match="encoder"):
        TarWriter(io.BytesIO(), encoder="yes")


VALUES: dict[str, Any] = {
    "txt": "héllo", "text": "t", "transcript": "words", "html": "<p>",
    "cls": 3, "cls2": 4, "class": 5, "count": 6, "index": 7, "inx": 8, "id": 9,
    "json": {"a": [1, 2.5, None]}, "jsn": [1, "x"], "pyd": {"p": (1, 2)}, "pickle": [3],
    "pkl": {"q": 1}, "npy": np.arange(6).reshape(2, 3), "npz": {"a": np.ones(3), "b": np.arange(2)},
    "ten": [np.arange(4, dtype=np.float32)], "tb": [np.zeros((2, 2), np.uint8)],
    "mp": {"m": b"v"}, "msgpack": [1, 2], "msg": {"x": 1}, "cbor": {"c": [1, b"b"]},
    "pth": {"w": torch.arange(3)}, "txt.gz": "compressed", "json.gz": {"z": 1},
}


def _same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)) and not isinstance(b, str):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b or a == type(a)(b)


def test_encoders_round_trip_through_decoders() -> None:
    encoded = encode.encode_based_on_extension({"__key__": "k", **VALUES}, encode.default_handlers)
    assert all(isinstance(v, bytes) for k, v in encoded.items() if k != "__key__")
    decoded = ad.Decoder([])(encoded)
    for k, value in VALUES.items():
        if k == "html":
            assert decoded[k] == value.encode()  # html is stored but not decoded, as webdataset
        elif k in ("pyd", "pickle", "pkl"):
            assert decoded[k] == value
        else:
            _same(value, decoded[k])
    # webdataset decodes the same bytes to the same values where it knows the extension
    theirs = wa.Decoder([])({k: v for k, v in encoded.items() if k not in ("cbor",)})
    for k in theirs:
        if k not in ("class", "count", "msgpack", "cbor", "html", "__key__"):
            _same(decoded[k], theirs[k])


@pytest.mark.parametrize("ext", ["png", "jpg", "jpeg", "ppm", "pgm", "pbm", "pnm", "tiff", "bmp",
                                 "webp", "img"])
def test_image_encoders(ext: str) -> None:
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, size=(6, 9, 3), dtype=np.uint8)
    if ext in ("jpg", "jpeg", "img", "webp"):  # smooth, so that lossy codecs stay close
        image = np.broadcast_to(np.arange(9, dtype=np.uint8)[None, :, None] * 20, (6, 9, 3))
    if ext == "pbm":
        image = np.repeat(np.where(image[:, :, :1] > 127, 255, 0).astype(np.uint8), 3, axis=2)
    data = encode.default_handlers[ext](image)
    decoded = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    assert decoded.shape == image.shape
    if ext in ("png", "ppm", "pnm", "tiff", "bmp", "pbm"):
        np.testing.assert_array_equal(decoded, image)
    elif ext == "pgm":
        expected = np.asarray(PIL.Image.fromarray(image).convert("L").convert("RGB"))
        np.testing.assert_array_equal(decoded, expected)
    else:  # lossy ("img" is JPEG, as in webdataset)
        assert np.abs(decoded.astype(int) - image).mean() < 8
    gray = encode.imageencoder(PIL.Image.fromarray(image[:, :, 0]), "png")
    assert PIL.Image.open(io.BytesIO(gray)).mode == "L"


def test_float_images_round_trip_exactly() -> None:
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16)
    rgb8 = np.stack([levels, levels[::-1], levels.T], axis=2)
    floats = ad.imagehandler("rgb")(".png", encode.imageencoder(rgb8, "png"))
    again = encode.imageencoder(floats, "png")
    np.testing.assert_array_equal(ad.imagehandler("rgb8")(".png", again), rgb8)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        encode.imageencoder(floats * 2, "png")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_images_are_the_pixels_webdataset_writes(dtype: Any) -> None:
    """A float image (values in [0, 1]) becomes the pixels webdataset 1.0.2 writes (x * 255
    truncated), so the same arrays give the same shards (rounding moved half the pixels)."""
    image = np.random.default_rng(3).random((12, 10, 3)).astype(dtype)
    for ext in ("png", "ppm"):
        ours = encode.default_handlers[ext](image)
        theirs = wds_ref.writer.default_handlers[ext](image)
        assert ours == theirs, ext


def _open_local(url: str) -> Any:
    return open(url, "rb")  # the reader closes it


def test_webdataset_writer_output_reads_with_our_tario(tmp_path: Path) -> None:
    samples = _raw_samples(5)
    path = str(tmp_path / "ref.tar")
    with wds_ref.TarWriter(path) as sink:
        for sample in samples:
            sink.write(sample)
    ours = list(samples_from_shards([{"url": path}], open_stream=_open_local))
    assert [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            for s in ours] == samples


def _shard_sizes(paths: list[str]) -> list[int]:
    return [len(_read_ref(p)) for p in paths]


def test_shardwriter_maxcount_post_and_start_shard(tmp_path: Path) -> None:
    samples = _raw_samples(25)
    closed: list[str] = []
    pattern = str(tmp_path / "part-%03d.tar")
    with ShardWriter(pattern, maxcount=10, post=closed.append, start_shard=4) as sink:
        for sample in samples:
            sink.write(sample)
        assert (sink.count, sink.total, sink.shard) == (5, 25, 7)
        assert sink.fname == pattern % 6
    assert closed == [pattern % i for i in (4, 5, 6)]
    assert sorted(os.listdir(tmp_path)) == [f"part-{i:03d}.tar" for i in (4, 5, 6)]
    assert _shard_sizes(closed) == [10, 10, 5]
    assert [s for p in closed for s in _read_ref(p)] == samples


@pytest.mark.parametrize("n", [0, 10, 20])
def test_shardwriter_never_leaves_an_empty_shard(tmp_path: Path, n: int) -> None:
    pattern = str(tmp_path / "s-%06d.tgz")
    with ShardWriter(pattern, maxcount=10) as sink:
        for sample in _raw_samples(n):
            sink.write(sample)
    names = sorted(os.listdir(tmp_path))
    assert names == [f"s-{i:06d}.tgz" for i in range(n // 10)]
    assert _shard_sizes([str(tmp_path / x) for x in names]) == [10] * (n // 10)


def test_shardwriter_maxsize(tmp_path: Path) -> None:
    samples = [{"__key__": f"k{i}", "bin": bytes(1000 * (i % 4))} for i in range(30)]
    samples.insert(10, {"__key__": "big", "bin": bytes(9000)})
    pattern = str(tmp_path / "m-%02d.tar")
    with ShardWriter(pattern, maxsize=5000) as sink:
        for sample in samples:
            sink.write(sample)
        assert sink.size <= 5000
    paths = sorted(str(p) for p in tmp_path.iterdir())
    assert [s for p in paths for s in _read_ref(p)] == samples
    for p in paths:
        with tarfile.open(p) as tf:
            content = sum(512 + (m.size + 511) // 512 * 512 for m in tf.getmembers())
        assert content <= 5000 or _read_ref(p) == [samples[10]]


def test_shardwriter_opener_and_options(tmp_path: Path) -> None:
    opened: list[Any] = []

    def opener(fname: str) -> Any:
        opened.append(open(fname, "wb"))  # noqa: SIM115
        return opened[-1]

    pattern = str(tmp_path / "o-%d.tar.gz")
    with ShardWriter(pattern, maxcount=3, opener=opener, mtime=7, user="u") as sink:
        for sample in _raw_samples(5):
            sink.write(sample)
    assert len(opened) == 2 and all(f.closed for f in opened)
    with tarfile.open(pattern % 0) as tf:  # compressed although the opener made the stream
        assert {(m.mtime, m.uname) for m in tf.getmembers()} == {(7, "u")}
    with pytest.raises(ConfigError, match="%d"):
        ShardWriter(str(tmp_path / "fixed.tar"))
    with pytest.raises(TypeError, match="colour"):
        ShardWriter(pattern, colour="red")


def test_dumps_helpers() -> None:
    array = np.arange(5.0)
    np.testing.assert_array_equal(np.load(io.BytesIO(encode.numpy_dumps(array))), array)
    tensor = torch.arange(3)
    assert torch.equal(torch.load(io.BytesIO(encode.torch_dumps(tensor))), tensor)
    assert encode.mp_dumps({"a": 1}) == msgpack.packb({"a": 1})
    assert encode.cbor_dumps([1]) == cbor2.dumps([1])
    assert encode.bytestr(12) == b"12" and encode.bytestr(b"x") == b"x"
    assert pickle.loads(encode.default_handlers["pyd"]((1, 2))) == (1, 2)
