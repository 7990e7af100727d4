"""wds_cloud.codecs.decoder against webdataset 1.0.2's autodecode, on data the tests generate."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import sys
from typing import Any

import cbor2
import msgpack
import numpy as np
import PIL.Image
import pytest
import torch
import webdataset.autodecode as wa
import webdataset.tenbin as wtenbin
from hypothesis import given, settings
from hypothesis import strategies as st

import wds_cloud.codecs.decoder as ad
from wds_cloud.codecs import tenbin
from wds_cloud.codecs.basic import json_loads
from wds_cloud.errors import MissingDependencyError


def _npy(a: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, a)
    return stream.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.savez(stream, **arrays)
    return stream.getvalue()


def _pth(x: Any) -> bytes:
    stream = io.BytesIO()
    torch.save(x, stream)
    return stream.getvalue()


def _image(mode: str, fmt: str = "PNG", size: tuple[int, int] = (7, 5)) -> bytes:
    rng = np.random.default_rng(len(mode))
    channels = {"L": (), "RGB": (3,), "RGBA": (4,)}[mode]
    array = rng.integers(0, 256, size=(size[1], size[0], *channels), dtype=np.uint8)
    stream = io.BytesIO()
    PIL.Image.fromarray(array, mode).save(stream, format=fmt)
    return stream.getvalue()


def _assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, PIL.Image.Image):
        assert a.mode == b.mode and a.size == b.size
        assert a.tobytes() == b.tobytes()
    else:
        assert a == b


ARRAY = np.arange(12, dtype=np.float32).reshape(3, 4)
BASIC = {
    "__key__": b"sample0", "__url__": "shard.tar",
    "txt": "héllo".encode(), "text": b"text", "transcript": b"words",
    "cls": b"7", "cls2": b" 12\n", "index": b"3", "inx": b"4", "id": b"99",
    "json": json.dumps({"a": [1, 2.5, None], "b": "é"}).encode(), "jsn": b" [1, 2] \n",
    "pyd": pickle.dumps({"x": (1, 2)}), "pickle": pickle.dumps([1, "a"]), "pkl": pickle.dumps(3),
    "npy": _npy(ARRAY), "npz": _npz(a=ARRAY, b=np.arange(3)),
    "mp": msgpack.packb({"k": b"v", "n": 3}), "msg": msgpack.packb([1, 2]),
    "ten": bytes(wtenbin.encode_buffer([ARRAY, np.arange(5, dtype=np.int16)])),
    "tb": bytes(wtenbin.encode_buffer([np.zeros((2, 2), dtype=np.uint8)])),
    "txt.gz": gzip.compress(b"zipped"), "json.gz": gzip.compress(b'{"z": 1}'),
    "seg.txt": b"dotted", "TXT": b"upper case is not basic", "bin": b"\x00\x01",
    "foo.gz": gzip.compress(b"unknown inside"), "jpg": _image("RGB", "JPEG"),
    "pth": _pth({"w": torch.arange(4)}),
}


def test_basic_types_match_webdataset() -> None:
    ours = ad.Decoder([])(dict(BASIC))
    theirs = wa.Decoder([])(dict(BASIC))
    _assert_same(ours, theirs)
    assert list(ours) == list(BASIC)
    assert ours["__key__"] == "sample0" and ours["jpg"] == BASIC["jpg"]


def test_extensions_webdataset_cannot_decode() -> None:
    sample = {
        "class": b"5", "count": b"6", "msgpack": msgpack.packb({"a": 1}),
        "tenbin": bytes(wtenbin.encode_buffer([ARRAY])), "cbor": cbor2.dumps({"c": [1, b"x"]}),
    }
    out = ad.Decoder([])(sample)
    assert out["class"] == 5 and out["count"] == 6
    assert out["msgpack"] == msgpack.unpackb(sample["msgpack"])
    assert out["cbor"] == cbor2.loads(sample["cbor"])
    _assert_same(out["tenbin"], wtenbin.decode_buffer(sample["tenbin"]))


def test_default_decoder_and_make_decoder_without_args() -> None:
    expected = wa.default_decoder(dict(BASIC))
    _assert_same(ad.default_decoder(dict(BASIC)), expected)
    _assert_same(ad.make_decoder()(dict(BASIC)), expected)


@pytest.mark.parametrize("spec", sorted(wa.imagespecs))
@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
def test_image_specs_match_webdataset(spec: str, mode: str) -> None:
    sample = {"__key__": "k", "png": _image(mode), "jpeg": _image("RGB", "JPEG"),
              "seg.PNG": _image(mode), "txt": b"t"}
    ours = ad.make_decoder(spec)(dict(sample))
    theirs = wa.Decoder([wa.imagehandler(spec)])(dict(sample))
    _assert_same(ours, theirs)
    assert ours["txt"] == "t"


def test_image_handler_extensions_and_unknown_spec() -> None:
    handler = ad.imagehandler("rgb8", extensions=["PNG"])
    assert handler(".x.jpg", _image("RGB", "JPEG")) is None
    assert handler(".x.png", _image("RGB")).shape == (5, 7, 3)
    with pytest.raises(ValueError, match="unknown image spec 'nope'"):
        ad.imagehandler("nope")


def test_an_unknown_image_spec_fails_where_the_pipeline_is_built() -> None:
    """As in webdataset: ``.decode("nope")`` and ``wds.decode("nope")`` raise when called,
    not at the first sample (which, in a DataLoader, is in a worker)."""
    import wds_cloud as wds

    with pytest.raises(ValueError, match="unknown image spec 'nope'"):
        wds.WebDataset("never-opened.tar", shardshuffle=False).decode("pil", "nope")
    with pytest.raises(ValueError, match="unknown image spec 'nope'"):
        wds.decode("nope")
    assert wds.DataPipeline(iter([{"__key__": "k", "x.png": _image("RGB")}]),
                            wds.decode("rgb8")) is not None


def test_missing_pillow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _image("RGB")
    for name in [m for m in sys.modules if m == "PIL" or m.startswith("PIL.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ad.DecodingError) as info:
        ad.make_decoder("rgb8")({"__key__": "k", "png": data})
    cause = info.value.__cause__
    assert isinstance(cause, MissingDependencyError) and cause.extra == "image"
    assert "wds-cloud[image]" in str(info.value)


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ad.DecodingError) as info:
        ad.make_decoder("torchrgb")({"__key__": "k", "png": _image("RGB")})
    assert isinstance(info.value.__cause__, MissingDependencyError)
    assert info.value.__cause__.extra == "torch"


def test_video_and_audio_need_their_packages() -> None:
    assert ad.torch_video(".x.txt", b"") is None and ad.torch_audio(".x.txt", b"") is None
    for fn, ext, package in [(ad.torch_video, ".mp4", "torchvision"),
                             (ad.torch_audio, ".wav", "torchaudio")]:
        try:
            __import__(package)
        except ImportError:
            with pytest.raises(MissingDependencyError, match=package):
                fn(ext, b"\0")


def _upper(key: str, data: bytes) -> Any:
    return data.decode().upper() if key.endswith(".txt") else None


def _rename_foo(key: str, data: bytes) -> Any:
    return wa.Continue(key[:-4] + ".txt", data) if key.endswith(".foo") else None


def _rename_foo_ours(key: str, data: bytes) -> Any:
    return ad.Continue(key[:-4] + ".txt", data) if key.endswith(".foo") else None


def _none(key: str, data: bytes) -> Any:
    return None


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ([_upper], [_upper]),
        ([_none, _upper], [_none, _upper]),
        ([_rename_foo_ours], [_rename_foo]),
        ([_rename_foo_ours, _upper], [_rename_foo, _upper]),
        ([ad.handle_extension("seg.txt", bytes.upper)],
         [wa.handle_extension("seg.txt", bytes.upper)]),
        ([ad.handle_extension("TXT jsn", len)], [wa.handle_extension("TXT jsn", len)]),
    ],
)
def test_handler_chain_semantics_match_webdataset(ours: list[Any], theirs: list[Any]) -> None:
    sample = {"__key__": "k", "txt": b"abc", "seg.txt": b"seg", "x.foo": b"foo",
              "jsn": b"[1]", "TXT": b"up", "foo.gz": gzip.compress(b"g"), "y.foo.gz":
              gzip.compress(b"yfoo")}
    _assert_same(ad.Decoder(ours)(dict(sample)), wa.Decoder(theirs)(dict(sample)))
    _assert_same(ad.Decoder(ours, pre=[], post=[])(dict(sample)),
                 wa.Decoder(theirs, pre=[], post=[])(dict(sample)))


@pytest.mark.parametrize("only", ["txt cls", ["json"], []])
@pytest.mark.parametrize("partial", [False, True])
def test_only_and_partial_match_webdataset(only: Any, partial: bool) -> None:
    sample = {"__key__": "k", "txt": b"a", "cls": b"1", "json": b"{}", "jpg": b"raw"}
    _assert_same(ad.Decoder([], only=only, partial=partial)(dict(sample)),
                 wa.Decoder([], only=only, partial=partial)(dict(sample)))
    decoded = {"__key__": "k", "txt": "already", "cls": 3, "json": b"{}"}
    if partial:
        _assert_same(ad.Decoder([], partial=True)(dict(decoded)),
                     wa.Decoder([], partial=True)(dict(decoded)))
    else:
        with pytest.raises(wa.DecodingError):
            wa.Decoder([])(dict(decoded))
        with pytest.raises(ad.DecodingError, match="partial=True"):
            ad.Decoder([])(dict(decoded))


def test_decoding_error_names_sample_url_and_field() -> None:
    sample = {"__key__": "s1", "__url__": "s3://bucket/shard.tar?X-Amz-Signature=secret",
              "json": b"{not json", "txt": b"ok"}
    with pytest.raises(ad.DecodingError) as info:
        ad.Decoder([])(sample)
    err = info.value
    assert (err.key, err.k, err.sample) == ("s1", "json", sample)
    assert "'json'" in str(err) and "'s1'" in str(err) and "shard.tar" in str(err)
    assert "secret" not in str(err)
    assert isinstance(err.__cause__, json.JSONDecodeError)
    assert isinstance(err, ValueError)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_meta_fields_are_text_and_never_decoded() -> None:
    sample = {"__key__": b"k", "__weird__": b"\xff\xfe", "__cls__": b"3"}
    _assert_same(ad.Decoder([])(dict(sample)), {"__key__": "k", "__weird__": b"\xff\xfe",
                                                "__cls__": "3"})


UNSAFE = {"__key__": "k", "pyd": pickle.dumps([1]), "pickle": pickle.dumps(2),
          "pkl": pickle.dumps(3), "pth": _pth(torch.ones(2)), "txt": b"safe"}


@pytest.mark.parametrize("field", ["pyd", "pickle", "pkl", "pth"])
def test_secure_mode_refuses_pickle_and_torch(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sample = {"__key__": "k", field: UNSAFE[field], "txt": b"safe"}
    with pytest.raises(ad.DecodingError, match="secure") as info:
        ad.Decoder([], secure=True)(dict(sample))
    assert info.value.k == field and f"'{field}'" in str(info.value)
    assert "secure=False" in str(info.value)
    assert ad.Decoder([], secure=True, only=["txt"])(dict(sample))["txt"] == "safe"
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(ad.DecodingError, match="WDS_SECURE"):
        ad.Decoder([])(dict(sample))
    with pytest.raises(ad.DecodingError, match="secure"):
        ad.basichandlers("." + field, UNSAFE[field])
    # an explicit argument beats the environment
    _assert_same(ad.Decoder([], secure=False)(dict(sample)), wa.Decoder([])(dict(sample)))


class Custom:
    """A class that torch.load with weights_only=True refuses to rebuild."""


def test_pytorch_weights_only_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _pth({"obj": Custom()})
    assert "obj" in ad.torch_loads(data)
    monkeypatch.setattr(ad, "pytorch_weights_only", True)
    with pytest.raises(pickle.UnpicklingError):
        ad.torch_loads(data)


def test_decoder_pickles() -> None:
    decoder = ad.make_decoder("rgb8", ad.handle_extension("seg.txt", bytes.upper), only=None)
    sample = {"__key__": "k", "png": _image("RGB"), "seg.txt": b"a", "txt": b"b"}
    first = decoder(dict(sample))
    clone = pickle.loads(pickle.dumps(decoder))
    _assert_same(clone(dict(sample)), first)
    assert pickle.loads(pickle.dumps(ad.gzfilter)) is ad.gzfilter


def test_decoder_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="not callable"):
        ad.Decoder(["rgb8"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="must be a list"):
        ad.Decoder("rgb8")  # type: ignore[arg-type]
    with pytest.raises(ad.DecodingError, match="must be a dict"):
        ad.Decoder([])([1, 2])  # type: ignore[arg-type]


def test_gzfilter_and_decode1() -> None:
    result = ad.gzfilter(".a.txt.gz", gzip.compress(b"hi"))
    assert isinstance(result, ad.Continue) and (result.key, result.data) == (".a.txt", b"hi")
    assert ad.gzfilter(".a.txt", b"hi") is None
    decoder = ad.Decoder([])
    assert decoder.decode1("x.txt.gz", gzip.compress(b"hi")) == "hi"
    assert decoder.decode1("cls", b"4") == wa.Decoder([]).decode1("cls", b"4")


def test_tenbin_interoperates_with_webdataset() -> None:
    arrays = [np.arange(24, dtype=np.float64).reshape(2, 3, 4), np.array([1, -2], dtype=np.int8),
              np.zeros((0, 3), dtype=np.uint16), np.ones((3, 3), dtype=np.float32)[:, ::2]]
    ours = tenbin.encode_buffer(arrays)
    _assert_same(list(wtenbin.decode_buffer(ours)), [np.ascontiguousarray(a) for a in arrays])
    contiguous = [np.ascontiguousarray(a) for a in arrays]
    _assert_same(tenbin.decode_buffer(bytes(wtenbin.encode_buffer(contiguous))), contiguous)
    assert bytes(wtenbin.encode_buffer(contiguous)) == ours
    labelled = tenbin.decode_buffer(tenbin.encode_buffer(arrays[:2], ["a", "bb"]), infos=True)
    assert labelled[1] == ["a", "bb"]
    with pytest.raises(ValueError, match="truncated"):
        tenbin.decode_buffer(ours[:100])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(value=JSON, pad=st.sampled_from(["", " ", "\n", " \t\r\n"]),
       encoding=st.sampled_from(["utf-8", "utf-16", "utf-8-sig"]))
def test_fast_json_matches_json_loads(value: Any, pad: str, encoding: str) -> None:
    data = (pad + json.dumps(value, ensure_ascii=False) + pad).encode(encoding)
    assert json_loads(data) == json.loads(data)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=20) | st.text(max_size=20).map(str.encode))
def test_fast_json_fails_like_json_loads(data: bytes) -> None:
    try:
        expected: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        with pytest.raises(type(exc)):
            json_loads(data)
    else:
        assert json_loads(data) == expected or (expected != expected)


@pytest.mark.parametrize("array", [
    np.arange(12).reshape(3, 4),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.array(5),
    np.zeros((0, 3)),
    np.array([b"ab", b"c"]),
    np.array(["x", "yz"]),
    np.arange(6, dtype=">i4").reshape(2, 3),
    np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]),
], ids=["int", "fortran", "0-d", "empty", "bytes", "str", "big-endian", "structured"])
def test_npy_fast_path_matches_numpy_load(array: np.ndarray) -> None:
    from wds_cloud.codecs.basic import npy_loads

    for version in ((1, 0), (2, 0)):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, array, version=version)
        for _ in range(2):  # the second read takes the cached header
            ours, theirs = npy_loads(buf.getvalue()), np.load(io.BytesIO(buf.getvalue()))
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
            assert np.array_equal(ours, theirs)
            assert ours.flags.writeable and ours.flags.f_contiguous == theirs.flags.f_contiguous
    if array.size:
        with pytest.raises(ValueError, match="expected"):
            npy_loads(buf.getvalue()[:-1])
