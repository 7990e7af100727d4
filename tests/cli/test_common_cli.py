"""What every command shares: options after the command, help text, storage options, what a
command reads (``Inputs``), the words it prints; and ``serve-s3``, run as a user runs it."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from shardgen import write_tar
from stores import default_sigint

import wds_cloud as wds
from wds_cloud.cli.common import Inputs, plural, size_arg, storage_options
from wds_cloud.cli.main import COMMANDS, build_parser
from wds_cloud.errors import ConfigError


def _parsers(parser: argparse.ArgumentParser, path: str = "wds-cloud"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_command_is_listed_and_every_option_has_help() -> None:
    parser = build_parser()
    names = {path.split()[1] for path, _ in _parsers(parser) if " " in path}
    assert names == {c.replace("_", "-") if c != "mapshards" else "map-shards" for c in COMMANDS}
    for path, p in _parsers(parser):
        text = p.format_help()
        assert "``" not in text and ":func:" not in text and ":class:" not in text, path
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{path} {action.option_strings[0]} has no help text"


def test_verbose_and_quiet_work_before_and_after_the_command() -> None:
    parser = build_parser()
    after = parser.parse_args(["cache", "du", "--dir", "x", "-q", "-vv"])
    assert after.quiet is True and after.verbose == 2
    before = parser.parse_args(["-q", "-v", "cache", "du", "--dir", "x"])
    assert before.quiet is True and before.verbose == 1
    plain = parser.parse_args(["cache", "du"])
    assert plain.quiet is False and plain.verbose == 0


def _options(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    from wds_cloud.cli.common import add_input_options

    add_input_options(parser)
    return storage_options(parser.parse_args(["x.tar", *argv]))


def test_storage_options_from_the_command_line() -> None:
    assert _options("-o", "endpoint_url=http://127.0.0.1:9", "-o", "anon=true") == {
        "endpoint_url": "http://127.0.0.1:9", "anon": True}
    assert _options("-o", "s3.client_kwargs.region_name=eu-west-1", "-o", "s3.key=k",
                    "-o", "gs.token=anon") == {
        "s3": {"client_kwargs": {"region_name": "eu-west-1"}, "key": "k"},
        "gs": {"token": "anon"}}
    assert _options("--storage-options", '{"s3": {"key": "a", "secret": "b"}}',
                    "-o", "s3.key=c") == {"s3": {"key": "c", "secret": "b"}}
    with pytest.raises(ConfigError, match="-o 'endpoint_url': expected KEY=VALUE"):
        _options("-o", "endpoint_url")
    with pytest.raises(ConfigError, match="--storage-options: not valid JSON"):
        _options("--storage-options", "{s3:")


def test_words_and_sizes() -> None:
    assert [plural(1, "sample"), plural(2, "sample"), plural(1, "entry", "entries"),
            plural(1200, "entry", "entries")] == ["1 sample", "2 samples", "1 entry",
                                                  "1,200 entries"]
    assert size_arg("1MB") == 10**6 and size_arg("500MiB") == 500 * 2**20
    with pytest.raises(argparse.ArgumentTypeError, match="1MB"):
        size_arg("lots")


def _shards(root: Path, name: str, n: int) -> None:
    (root / name).mkdir(parents=True)
    for s in range(n):
        write_tar(root / name / f"{name}-{s:03d}.tar",
                  [(f"{name}{s}-{i}", {"txt": b"x"}) for i in range(2)])


def test_inputs_take_globs_braces_lists_and_specs(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _shards(tmp_path, "a", 3)
    _shards(tmp_path, "b", 2)
    monkeypatch.chdir(tmp_path)
    urls = [s.url for s in Inputs(["a/a-*.tar"]).shards()]
    assert urls == ["a/a-000.tar", "a/a-001.tar", "a/a-002.tar"]
    urls = [s.url for s in Inputs(["a/a-{000..001}.tar::b/b-000.tar", "b/b-001.tar"]).shards()]
    assert urls == ["a/a-000.tar", "a/a-001.tar", "b/b-000.tar", "b/b-001.tar"]
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump({"datasets": [
        {"name": "left", "shards": "a/a-{000..002}.tar"},
        {"name": "right", "shards": "b/b-*.tar", "weight": 2}]}))
    inputs = Inputs(["mix.yaml"])
    shards = inputs.shards()
    assert [(s.source, s.url) for s in shards] == [
        ("left", "a/a-000.tar"), ("left", "a/a-001.tar"), ("left", "a/a-002.tar"),
        ("right", "b/b-000.tar"), ("right", "b/b-001.tar")]
    assert [s["__key__"] for s in inputs.samples(shards[-1:])] == ["b1-0", "b1-1"]
    with pytest.raises(wds.ShardNotFoundError, match=r"no shard matches 'c/\*.tar'"):
        Inputs(["c/*.tar"]).shards()


def test_serve_s3_prints_what_a_client_needs_and_serves(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "wds_cloud.cli", "serve-s3", str(tmp_path / "buckets"),
         "--port", "0", "--bucket", "shards"], stdout=subprocess.PIPE, text=True, env=env,
        preexec_fn=default_sigint)
    try:
        lines = []
        assert server.stdout is not None
        for line in server.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("serving until"):
                break
        assert lines[0].startswith("S3 server (rclone) at http://127.0.0.1:"), lines
        assert lines[1] == "buckets: shards"
        exports = dict(item.split("=", 1) for line in lines if line.startswith("export ")
                       for item in line.split()[1:])
        port = int(re.search(r":(\d+)", exports["AWS_ENDPOINT_URL"]).group(1))
        assert port > 0
        # the printed lines, pasted into a shell, are enough for wds_cloud (and s3fs)
        script = ("import wds_cloud as wds\n"
                  "with wds.ShardWriter('s3://shards/t-%06d.tar', maxcount=2) as sink:\n"
                  "    for i in range(3): sink.write({'__key__': f'k{i}', 'txt': 'hi'})\n"
                  "print(sum(1 for _ in wds.WebDataset('s3://shards/t-*.tar', "
                  "shardshuffle=False)))\n")
        done = subprocess.run([sys.executable, "-c", script], env={**env, **exports},
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == "3", done.stderr
        assert sorted(p.name for p in (tmp_path / "buckets" / "shards").iterdir()) == [
            "t-000000.tar", "t-000001.tar"]
        # the -o line works as given, with the Python options line naming the same keys
        o_line = next(line for line in lines if line.startswith("-o "))
        options = _options(*_split(o_line))
        py_line = next(line for line in lines if line.startswith("storage_options = "))
        assert options == eval(py_line.split("=", 1)[1])  # our own output
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(20) == 0


def _split(line: str) -> list[str]:
    import shlex

    return shlex.split(line)


def test_serve_s3_json(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "wds_cloud.cli", "serve-s3", str(tmp_path), "--port", "0",
         "--json"], stdout=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        assert server.stdout is not None
        text = ""
        for line in server.stdout:
            text += line
            if line.startswith("}"):
                break
        doc = json.loads(text)
        assert doc["endpoint_url"].startswith("http://127.0.0.1:")
        fs_options = doc["storage_options"]["s3"]
        ds = wds.WebDataset(f"s3://{tmp_path.name}-nothing/x.tar", shardshuffle=False,
                            storage_options={"s3": fs_options})
        with pytest.raises(wds.ShardNotFoundError):
            next(iter(ds))
    finally:
        server.terminate()
        assert server.wait(20) == 0


def test_an_error_in_a_dataloader_worker_is_one_clean_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """torch puts the worker's traceback into the message of the error it re-raises; the
    CLI shows the original message, the shard and offset, and which worker."""
    from wds_cloud.cli import main

    good = write_tar(tmp_path / "good.tar", [(f"k{i}", {"txt": b"x" * 600}) for i in range(4)])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(good).read_bytes()[:2000])
    code = main(["bench", str(cut), "--workers", "1", "--no-baseline", "-q"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("wds-cloud bench: error: truncated") and str(cut) in err, err
    assert err.rstrip().endswith("(in DataLoader worker process 0)"), err


def test_directories_and_bucket_prefixes_are_their_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_server: object,
) -> None:
    """``ls s3://bucket/train/`` lists what ``aws s3 ls`` would: the shards directly in it."""
    _shards(tmp_path, "a", 2)
    (tmp_path / "a" / "notes.txt").write_text("not a shard")
    (tmp_path / "a" / "z.tar.gz").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    expected = ["a/a-000.tar", "a/a-001.tar", "a/z.tar.gz"]
    assert [s.url for s in Inputs(["a"]).shards()] == expected
    assert [s.url for s in Inputs(["a/"]).shards()] == expected
    store = s3_server.new_store()  # type: ignore[attr-defined]
    for name in ("train/x-0.tar", "train/x-1.tgz", "train/deeper/y.tar", "train/readme.md"):
        store.put(name, b"")
    inputs = Inputs([store.url("train/")], options=store.storage_options)
    assert [s.url for s in inputs.shards()] == [store.url("train/x-0.tar"),
                                                store.url("train/x-1.tgz")]
    with pytest.raises(wds.ShardNotFoundError, match=r"no shards \(\*.tar, \*.tgz, \*.tar.gz\)"):
        Inputs([store.url("nothing/")], options=store.storage_options).shards()


def test_serve_s3_on_a_port_in_use_says_so_before_any_client_line(tmp_path: Path) -> None:
    """With ``--port`` taken by another server, ``serve-s3`` fails first, printing no export
    lines (a user copying them would have pointed the SDK at that other server)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "wds_cloud.cli", "serve-s3", str(tmp_path), "--port",
             str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "export" not in done.stdout and "serving" not in done.stdout, done.stdout
    assert f"cannot listen on 127.0.0.1:{port}: something else listens there" in done.stderr
