"""What the commands share: a progress line, shard specs, raw samples."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import wds_cloud as wds
from wds_cloud.settings import human_size

__all__ = ["Progress", "expand", "raw_samples", "sample_bytes"]


class Progress:
    """A small progress line on stderr: count, rate and bytes, redrawn at most 5 times a second."""

    def __init__(self, label: str, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.created = self.start = time.perf_counter()
        self.startup: float | None = None  # seconds until the first item (imports, workers)
        self.count = 0
        self.nbytes = 0
        self._last = 0.0

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        """Count ``n`` items of ``nbytes``; rates are measured from the first item on."""
        now = time.perf_counter()
        if self.startup is None:
            self.startup = now - self.created
            self.start = now
        self.count += n
        self.nbytes += nbytes
        if self.enabled and now - self._last > 0.2:
            self._last = now
            self.stream.write(f"\r{self.label}: {self.summary()}   ")
            self.stream.flush()

    def summary(self) -> str:
        dt = max(time.perf_counter() - self.start, 1e-9)
        size = f", {human_size(self.nbytes)}" if self.nbytes else ""
        rate = f", {self.nbytes / dt / 1e6:,.1f} MB/s" if self.nbytes else ""
        startup = f" (first after {self.startup:.2f} s)" if self.startup is not None else ""
        return (f"{self.count} samples{size} in {dt:.2f} s{startup}: "
                f"{self.count / dt:,.0f} samples/s{rate}")

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


def sample_bytes(sample: dict[str, Any]) -> int:
    """Payload bytes of a raw sample (meta keys excluded)."""
    return sum(len(v) for k, v in sample.items() if not k.startswith("__") and
               isinstance(v, (bytes, bytearray)))


def expand(specs: Sequence[str]) -> list[str]:
    """Each command-line shard spec expanded (braces, ``::``, ``${NAME}``), in order."""
    url_vars = wds.Settings.from_env().url_vars
    return [url for spec in specs for url in wds.expand_urls(spec, url_vars=url_vars)]


def raw_samples(specs: Sequence[str]) -> Iterator[dict[str, Any]]:
    return iter(wds.DataPipeline(wds.SimpleShardList(expand(specs)), wds.tarfile_to_samples()))
