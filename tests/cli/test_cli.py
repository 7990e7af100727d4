"""The wds-cloud command line, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wds_cloud.cli", "-q", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_pack_then_inspect_and_bench(tmp_path: Path) -> None:
    src = tmp_path / "files"
    (src / "sub").mkdir(parents=True)
    for i in range(5):
        (src / f"a{i}.txt").write_text(f"text {i}")
        (src / f"a{i}.cls").write_text(str(i))
    (src / "sub" / "b0.txt").write_text("nested")
    (src / "README").write_text("no dot: not a sample member")
    out = cli("pack", str(src), "out/p-%06d.tar", "--maxcount", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "packed 6 samples into 3 shard(s)" in out.stdout
    shards = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in shards] == ["p-000000.tar", "p-000001.tar", "p-000002.tar"]
    with tarfile.open(shards[0]) as tf:
        assert tf.getnames() == ["a0.cls", "a0.txt", "a1.cls", "a1.txt"]

    out = cli("inspect", "out/p-{000000..000002}.tar", "-n", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("a0  [cls:1 B, txt:6 B]") and lines[1].startswith("a1  ")
    out = cli("inspect", "out/p-{000000..000002}.tar", "--all", "-n", "0", cwd=tmp_path)
    assert "6 samples, 41 B; members: .cls x5, .txt x6" in out.stdout

    out = cli("bench", "out/p-{000000..000002}.tar", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("throughput: 6 samples, 41 B in ")


def test_errors_name_the_url_and_exit_nonzero(tmp_path: Path) -> None:
    out = cli("inspect", "missing-{0..1}.tar", cwd=tmp_path)
    assert out.returncode == 1
    assert "missing-0.tar" in out.stderr and "Traceback" not in out.stderr


def test_demo_prints_a_throughput_line(tmp_path: Path) -> None:
    out = cli("demo", "--dir", str(tmp_path), "--shards", "2", "--per-shard", "100",
              "--workers", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "wrote 2 shards of 100 samples" in out.stdout
    assert "throughput: 200 samples" in out.stdout and "from s3://demo/train/" in out.stdout
    # forked workers clean up the parent's clients quietly (no asyncio errors, no tracebacks)
    assert "ERROR" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    # the embedded S3 server keeps bucket "demo" as a directory of --dir
    assert sorted(p.name for p in (tmp_path / "demo" / "train").glob("demo-*.tar")) == [
        "demo-000000.tar", "demo-000001.tar"]


def test_demo_through_the_example_spec(tmp_path: Path) -> None:
    """config/demo-mix.yaml, as the README runs it: three sources (a brace pattern, a list, a
    bucket glob) mixed by weight, each epoch's observed shares next to the expected ones."""
    spec = Path(__file__).resolve().parents[2] / "config" / "demo-mix.yaml"
    out = cli("demo", "--dir", str(tmp_path / "s3"), "--per-shard", "200", "--batch-size",
              "20", "--workers", "2", "--spec", str(spec), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "sources head, middle, tail" in out.stdout
    shares = [line for line in out.stdout.splitlines() if line.startswith("shares:")]
    assert len(shares) == 2 and shares[0] != shares[1]  # a scale drawn anew each epoch
    for line in shares:
        for part in line.removeprefix("shares: ").split(", "):
            got, want = (float(x.rstrip("%)")) for x in
                         part.split(" ", 1)[1].replace("(expected ", "").split())
            assert abs(got - want) < 5, line  # 1,600 samples per epoch
    assert "Traceback" not in out.stderr, out.stderr


def test_demo_on_local_disk(tmp_path: Path) -> None:
    out = cli("demo", "--local", "--dir", str(tmp_path), "--shards", "2", "--per-shard", "50",
              "--workers", "0", "--epochs", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "throughput: 100 samples" in out.stdout
    assert sorted(p.name for p in tmp_path.glob("demo-*.tar")) == ["demo-000000.tar",
                                                                  "demo-000001.tar"]
