"""Benchmark: how long the CLI takes for a first look at a local shard, and whether it loads torch.

    python tests/bench/bench_startup.py [--quick] [--rounds R]

Writes one local shard (20,000 samples of two small members), then runs, R rounds taking them
in turn, each in a fresh interpreter: ``wds-cloud head -n 1``, ``wds-cloud ls``, ``wds-cloud
inspect -n 1`` (which reads the whole shard), and ``python -c "import torch"`` for scale.
Prints the median wall time of each (target for ``head -n 1``: ≤ 0.3 s), and which of the
commands loaded torch or numpy (none should load torch). It is a report, not a test: it
always exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for shardgen

from shardgen import write_tar

# runs a command in-process and says which heavy modules it loaded
_PROBE = """
import contextlib, io, sys
from wds_cloud.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    main(sys.argv[1:])
print(" ".join(m for m in ("torch", "numpy", "fsspec") if m in sys.modules) or "-")
"""


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, for a smoke run")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    cli = str(Path(sys.executable).with_name("wds-cloud"))
    with tempfile.TemporaryDirectory(prefix="bench_startup-") as tmp:
        shard = write_tar(Path(tmp) / "x.tar", [(f"k{i:06d}", {"txt": b"x" * 100, "cls": b"1"})
                                               for i in range(20_000)])
        runs = {
            "head -n 1": [cli, "head", "-n", "1", shard],
            "ls": [cli, "ls", shard],
            "inspect -n 1": [cli, "inspect", shard, "-n", "1"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        timed(runs["head -n 1"])  # compiles what is not compiled yet
        for r in range(rounds):
            names = list(runs)[r % len(runs):] + list(runs)[:r % len(runs)]
            for name in names:
                times[name].append(timed(runs[name]))
        print(f"# medians of {rounds} interleaved rounds, each in a fresh interpreter")
        for name, values in times.items():
            line = f"{name}: {statistics.median(values):.3f} s"
            if name.startswith(("head", "ls", "inspect")):
                loaded = subprocess.run(
                    [sys.executable, "-c", _PROBE, *runs[name][1:]], capture_output=True,
                    text=True, check=False).stdout.strip().splitlines()
                line += f"; loads: {loaded[-1] if loaded else '?'}"
            if name == "head -n 1":
                line += " (target ≤ 0.3 s, and no torch)"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
