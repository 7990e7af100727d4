"""Every module path of the installed webdataset 1.0.2 (``webdataset.X``) is importable as
``wds_cloud.X`` and holds every public name webdataset's module holds, as the same kind of
object. The difference is computed from the installed webdataset when the tests run, not from a
list kept here: a name webdataset has that wds_cloud lacks fails, unless it is listed below
with the reason.

What counts as a public name of ``webdataset.X`` (what a user sees there):

* a name of the module's namespace that does not start with ``_`` and is not a module;
* that is webdataset's: a class or function whose ``__module__`` is a webdataset module
  (defined in X, or imported into X from another webdataset module, as
  ``webdataset.filters.reraise_exception``), or a value that is not a class or function (a
  constant, table, flag or instance) assigned at the top level of X's source;
* foreign imports are not (``typing.Any``, ``functools.partial``, ``subprocess.PIPE``, torch's
  ``IterableDataset`` in ``webdataset.mix``...): they are the standard library's or a third
  party's, and users take them from there. The exception is ``webdataset.pytorch``, a module
  that consists of torch's names (or stand-ins), which users import from it.

A module that webdataset itself cannot import here (``webdataset.multi`` needs ``pyzmq``) is
read from its source instead: its top-level classes, functions and assignments.

The kind compared: ``class``, ``callable`` (functions, curried stages, callable instances),
``bool``, ``int``, ``float``, ``str``, ``bytes``, ``mapping``, ``sequence`` or ``object``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
import types
from collections.abc import Mapping
from typing import Any

import pytest
import webdataset

import wds_cloud

#: (module, name) -> why wds_cloud does not have it
DELIBERATE_OMISSIONS: dict[tuple[str, str], str] = {}

#: (module, name) -> why it is another kind of object in wds_cloud
DELIBERATE_KINDS: dict[tuple[str, str], str] = {
    ("autodecode", "pytorch_weights_only"):
        "None by default (follow WDS_PYTORCH_WEIGHTS_ONLY, read by the composition root, never "
        "at import time); True and False mean what they mean in webdataset",
    ("utils", "enforce_security"):
        "None by default (follow WDS_SECURE, read by the composition root, never at import "
        "time); True and False mean what they mean in webdataset (wds_cloud.utils docstring)",
}

#: modules whose foreign names are public: the module is made of them
FOREIGN_MODULES = frozenset({"pytorch"})

MODULES = sorted(m.name for m in pkgutil.iter_modules(webdataset.__path__))


def kind(obj: object) -> str:
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "callable"
    for name, types_ in (("bool", bool), ("int", int), ("float", float), ("str", str),
                         ("bytes", bytes), ("mapping", Mapping), ("sequence", (list, tuple))):
        if isinstance(obj, types_):
            return name
    return "object"


def _assigned(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _source_of(name: str) -> str:
    spec = importlib.util.find_spec(f"webdataset.{name}")
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def public_names(name: str) -> dict[str, str | None]:
    """webdataset.<name>'s public names -> their kind (``None``: known from the source only)."""
    tree = ast.parse(_source_of(name))
    assigned = _assigned(tree)
    try:
        module = importlib.import_module(f"webdataset.{name}")
    except ImportError:  # read it from its source: top-level definitions and assignments
        out: dict[str, str | None] = {n: None for n in assigned if not n.startswith("_")}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                out[node.name] = "class" if isinstance(node, ast.ClassDef) else "callable"
        return out
    out = {}
    for attr, value in vars(module).items():
        if attr.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value):
            origin = getattr(value, "__module__", "") or ""
            if not (origin.startswith("webdataset") or attr in assigned
                    or name in FOREIGN_MODULES):
                continue
        elif attr not in assigned and name not in FOREIGN_MODULES:
            continue
        out[attr] = kind(value)
    return out


def test_the_installed_webdataset_is_the_one_compared() -> None:
    from importlib.metadata import version

    assert version("webdataset") == "1.0.2"
    assert {"shardlists", "utils", "gopen", "typecheck", "multi"} <= set(MODULES)
    stale = [key for key in {**DELIBERATE_OMISSIONS, **DELIBERATE_KINDS}
             if key[0] not in MODULES or key[1] not in public_names(key[0])]
    assert stale == []


@pytest.mark.parametrize("name", MODULES)
def test_module_path_has_every_public_name(name: str) -> None:
    ours = importlib.import_module(f"wds_cloud.{name}")
    theirs = public_names(name)
    assert theirs, f"webdataset.{name}: no public names found (the rule above is broken)"
    have = set(dir(ours))
    missing = sorted(n for n in theirs if n not in have and (name, n) not in DELIBERATE_OMISSIONS)
    assert missing == [], f"wds_cloud.{name} lacks webdataset.{name}'s {missing}"
    wrong = {}
    for attr, expected in theirs.items():
        if attr not in have or expected is None or (name, attr) in DELIBERATE_KINDS:
            continue
        got = kind(getattr(ours, attr))
        if got != expected:
            wrong[attr] = f"{got}, webdataset's is a {expected}"
    assert wrong == {}, f"wds_cloud.{name}"


@pytest.mark.parametrize("name", MODULES)
def test_module_path_is_in_sys_modules(name: str) -> None:
    """``import wds_cloud.X`` gives the module in ``sys.modules``, which is also the package
    attribute, except ``gopen``: as in webdataset, that attribute is the function."""
    module = importlib.import_module(f"wds_cloud.{name}")
    assert sys.modules[f"wds_cloud.{name}"] is module
    if name == "gopen":
        from wds_cloud.router import gopen

        assert wds_cloud.gopen is gopen is module.gopen
    else:
        assert getattr(wds_cloud, name) is module


def test_gopen_module_and_function_as_in_webdataset() -> None:
    """``webdataset.gopen`` is the function (it shadows the module); ``import .gopen`` and
    ``from .gopen import ...`` reach the module. Checked in fresh interpreters, where the
    module is imported before anything else touches ``gopen``."""
    for package in ("webdataset", "wds_cloud"):
        code = (
            f"import {package}.gopen\n"
            f"import {package}.gopen as g\n"
            f"from {package}.gopen import gopen_schemes, Pipe\n"
            f"import {package}, inspect, sys\n"
            f"assert inspect.isfunction({package}.gopen), {package}.gopen\n"
            f"assert g is {package}.gopen\n"
            f"assert sys.modules['{package}.gopen'].gopen is {package}.gopen\n"
            f"from {package} import gopen\n"
            f"assert inspect.isfunction(gopen)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, (package, out.stderr)


def test_a_scheme_added_to_gopen_schemes_opens_urls(tmp_path: Any) -> None:
    """webdataset users add a scheme with ``gopen_schemes[name] = handler``; here that
    registers an opener, so ``gopen`` and the datasets open its URLs."""
    import io
    import tarfile

    from wds_cloud.gopen import gopen_schemes

    shard = io.BytesIO()
    with tarfile.open(fileobj=shard, mode="w") as tar:
        for key in ("a", "b"):
            data = key.encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    opened = []

    def handler(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        opened.append(url)
        return io.BytesIO(shard.getvalue())

    gopen_schemes["myscheme"] = handler
    try:
        assert "myscheme" in gopen_schemes
        with wds_cloud.gopen("myscheme://bucket/x.tar") as stream:
            assert stream.read() == shard.getvalue()
        ds = wds_cloud.WebDataset("myscheme://bucket/x.tar", shardshuffle=False)
        assert [s["txt"] for s in ds] == [b"a", b"b"]
        assert opened[0] == "myscheme://bucket/x.tar"
    finally:
        del gopen_schemes["myscheme"]
    assert "myscheme" not in gopen_schemes


def test_utils_is_one_module() -> None:
    """``wds.utils``, ``import wds_cloud.utils`` and the module the readers consult are one:
    a flag set through any of them is seen by all."""
    code = (
        "import sys, wds_cloud as wds\n"
        "import wds_cloud.utils\n"
        "from wds_cloud import utils\n"
        "from wds_cloud.utils import pytorch_worker_seed, PipelineStage\n"
        "assert wds.utils is wds_cloud.utils is utils is sys.modules['wds_cloud.utils']\n"
        "wds.utils.enforce_security = True\n"
        "assert utils.refuses_sources() and sys.modules['wds_cloud.utils'].enforce_security\n"
        "assert PipelineStage is wds.PipelineStage\n"
        "print(sorted(m for m in ('torch', 'numpy', 'fsspec') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_tenbin_is_webdatasets_format(tmp_path: Any) -> None:
    import io

    import numpy as np
    from webdataset import tenbin as theirs

    from wds_cloud.tenbin import load, save

    arrays = [np.arange(12, dtype="float32").reshape(3, 4), np.array([1, 2, 3], dtype="int16")]
    ours_file, their_file = str(tmp_path / "ours.ten"), str(tmp_path / "theirs.ten")
    save(ours_file, *arrays, infos=["img", "cls"])
    theirs.save(their_file, *arrays, infos=["img", "cls"])
    assert (tmp_path / "ours.ten").read_bytes() == (tmp_path / "theirs.ten").read_bytes()
    got, infos = load(their_file, infos=True)
    assert infos == ["img", "cls"] and all((a == b).all() for a, b in zip(got, arrays, strict=True))
    stream = io.BytesIO()
    wds_cloud.tenbin.write(stream, arrays)
    assert bytes(theirs.encode_buffer(arrays)) == stream.getvalue()
    with pytest.raises(ValueError):
        save(str(tmp_path / "x.npy"), *arrays)


def test_utils_helpers_do_what_webdatasets_do(tmp_path: Any, monkeypatch: Any) -> None:
    from webdataset import utils as theirs

    from wds_cloud import utils as ours

    for name in ("a", "b.tar", "c.tar"):
        (tmp_path / name).write_text("x")
    pattern = str(tmp_path / "{b,c}.tar")
    assert sorted(ours.glob_with_braces(pattern)) == sorted(theirs.glob_with_braces(pattern))
    assert ours.fnmatch_with_braces("x.tar", "*.{tar,tgz}")
    assert ours.make_seed(1, 2, 3) == theirs.make_seed(1, 2, 3)
    for value in ([1], "s", b"b", iter([]), 3, {}):
        assert ours.is_iterable(value) == theirs.is_iterable(value)
    assert ours.safe_eval("12") == 12
    with pytest.raises(ValueError):
        ours.safe_eval("__import__('os')")
    assert list(ours.repeatedly([1, 2, 3], nepochs=2)) == list(theirs.repeatedly([1, 2, 3],
                                                                                 nepochs=2))
    assert list(ours.repeatedly([1, 2, 3], nbatches=5)) == [1, 2, 3, 1, 2]
    batches = [([0, 1],), ([2, 3],)]
    assert list(ours.repeatedly(batches, nsamples=3)) == list(theirs.repeatedly(batches,
                                                                                nsamples=3))
    assert list(ours.repeatedly0([1, 2, 3], nepochs=2, nbatches=2)) == [1, 2, 1, 2]
    assert ours.lookup_sym("shuffle", [".filters"]) is wds_cloud.filters.shuffle
    assert list(ours.compute_sample_weights([(1, 2), (4, 1)])) == [0.5, 1.0]

    @ours.obsolete(reason="gone")
    def old() -> int:
        return 1

    monkeypatch.delenv("ALLOW_OBSOLETE", raising=False)
    with pytest.raises(ours.ObsoleteException, match="gone"):
        old()
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")
    assert old() == 1
    with pytest.warns(DeprecationWarning):
        assert ours.deprecated(lambda: 2)() == 2


def test_shardlists_helpers_do_what_webdatasets_do(monkeypatch: Any) -> None:
    import os

    from webdataset import shardlists as theirs

    from wds_cloud import shardlists as ours

    monkeypatch.setenv("WDS_BUCKET", "s3://b")
    spec = "${BUCKET}/a-{0..2}.tar::${BUCKET}/c.tar"
    assert ours.expand_urls(spec) == theirs.expand_urls(spec) == [
        "s3://b/a-0.tar", "s3://b/a-1.tar", "s3://b/a-2.tar", "s3://b/c.tar"]
    assert wds_cloud.expand_urls(spec) == ours.expand_urls(spec)
    assert ours.envsubst("${BUCKET}/x") == theirs.envsubst("${BUCKET}/x")
    assert ours.expand("~/$HOME") == theirs.expand("~/$HOME")
    assert ours.without_last_extension("a.b.tar") == theirs.without_last_extension("a.b.tar")
    assert ours.get_pid_from_filename("x.tar._12_") == theirs.get_pid_from_filename("x.tar._12_")
    assert ours.check_pid_is_running(os.getpid())
    assert ours.ResampledShardList is ours.ResampledShards
    assert ours.expand_urls("a-{0..2}.tar::c.tar") == theirs.expand_urls("a-{0..2}.tar::c.tar")
    assert ours.expand_source(["x"]) == ["x"]
    assert ours.MSSource(name="n").urls == []
    assert [x["url"] for x in wds_cloud.tariterators.shardlist("a{0..2}")] == ["a0", "a1", "a2"]


def test_filters_helpers_do_what_webdatasets_do() -> None:
    import pickle
    import random

    from webdataset import filters as theirs

    from wds_cloud import filters as ours

    def add(x: int, y: int) -> int:
        return x + y

    assert ours.RestCurried(add)(2)(1) == theirs.RestCurried(add)(2)(1) == 3
    assert ours.compose2(lambda x: x + 1, lambda x: x * 2)(3) == 8
    assert list(ours.pipeline([1, 2], lambda src: (x * 3 for x in src))) == [3, 6]
    assert ours.parse_field_spec("jpg;png cls") == theirs.parse_field_spec("jpg;png cls")
    assert ours.tuple2dict((4, 5)) == theirs.tuple2dict((4, 5))
    assert ours.dict2tuple({0: 4, 1: 5}) == theirs.dict2tuple({0: 4, 1: 5})
    buf_ours, buf_theirs = [1, 2, 3, 4], [1, 2, 3, 4]
    assert ours.pick(buf_ours, random.Random(5)) == theirs.pick(buf_theirs, random.Random(5))
    assert buf_ours == buf_theirs
    assert pickle.loads(pickle.dumps(ours.FilterFunction(max, 3)))(1) == 3


def test_cache_defaults_follow_the_environment(monkeypatch: Any, tmp_path: Any) -> None:
    import wds_cloud.cache as cache

    monkeypatch.delenv("WDS_CACHE", raising=False)
    monkeypatch.delenv("WDS_CACHE_SIZE", raising=False)
    assert cache.default_cache_dir == "./_cache" and cache.default_cache_size == 1e18
    monkeypatch.setenv("WDS_CACHE", str(tmp_path))
    monkeypatch.setenv("WDS_CACHE_SIZE", "1000")
    assert cache.default_cache_dir == str(tmp_path) and cache.default_cache_size == 1000.0
    src = tmp_path / "src.tar"
    src.write_bytes(b"\x1f\x8b rest")
    cache.download(str(src), str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == src.read_bytes()
    assert cache.magic_filetype(str(src)) == f"{src}: gzip compressed data"
    assert cache.islocal("file:///x") and not cache.islocal("s3://b/x")
    # set as webdataset users set it (not monkeypatch: it would store the computed value back)
    cache.default_cache_dir = str(tmp_path / "chosen")
    try:
        assert cache.FileCache().cache_dir == str(tmp_path / "chosen")
    finally:
        del cache.default_cache_dir
    assert "default_cache_dir" not in vars(cache)


def test_gopen_handlers_run_commands() -> None:

    gopen_module = importlib.import_module("wds_cloud.gopen")

    with gopen_module.gopen_pipe("pipe:echo hello") as stream:
        assert stream.read() == b"hello\n"
    assert gopen_module.set_options(gopen_module.Pipe("true", mode="rb", shell=True),
                                    timeout=1.0)
    assert not gopen_module.set_options(object())
    with pytest.raises(OSError), gopen_module.Pipe("exit 3", mode="rb", shell=True) as failing:
        failing.read()
    with pytest.raises(ValueError, match="no gopen handler"):
        gopen_module.gopen_error("x://y")


def test_multiloader_splits_the_shards_among_its_workers(tmp_path: Any) -> None:
    from wds_cloud.multi import MultiLoader

    urls = []
    for shard in range(4):
        url = str(tmp_path / f"s{shard}.tar")
        with wds_cloud.TarWriter(url) as sink:
            for i in range(3):
                sink.write({"__key__": f"{shard}-{i}", "txt": "x"})
        urls.append(url)
    ds = wds_cloud.WebDataset(urls, shardshuffle=False)
    keys = sorted(s["__key__"] for s in MultiLoader(ds, workers=2))
    assert keys == sorted(f"{s}-{i}" for s in range(4) for i in range(3))
