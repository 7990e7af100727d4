"""Dataset specs: parse and validate a YAML/JSON file or a dict into a frozen
:class:`DatasetSpec`.

Layer 2: stdlib, pyyaml and braceexpand; no I/O but reading the spec file itself (bucket globs
are listed later, by the composition root). The format (README, "Dataset specs")::

    prefix: s3://bucket/            # joined to relative shard patterns
    seed: 1234                      # argument > WDS_SEED > spec > random
    storage_options: {s3: {...}}    # defaults for every source, per scheme
    datasets:
      - name: ia1                   # unique; default from the pattern
        shards: ia1-{000000..000033}.tar   # brace pattern, list, or bucket glob
        weight: 0.3                 # relative share in the mix (default 1), or a schedule:
                                    # {schedule: linear, points: {0: 1.0, 10000: 0.2}}
        scale: [0.4, 1.0]           # scalar or [lo, hi]: a factor drawn per epoch
        extensions: nrm.jpg txt     # keep only these members of each sample
        storage_options: {...}      # per-source override
        resample: 10                # webdataset: 10 shards with replacement per epoch
        choose: 5                   # webdataset: 5 shards without replacement per epoch

That is webdataset's dialect (:mod:`.parse`); Megatron-Energon's metadatasets (:mod:`.energon`)
and Mosaic's / llm-foundry's ``streams:`` (:mod:`.mosaic`) are read into the same schema.
Aliases in webdataset's dialect (:data:`ALIASES`): ``dataset`` for ``datasets``; ``scaleprob``
(webdataset's docs), ``prob``, ``proportion`` for ``weight``; ``urls``, ``path`` for
``shards``; webdataset's ``buckets`` (top level or per source, one bucket) is joined between
the prefix and the pattern. ``${VAR}`` in string values comes from ``environ``; a file may be
a section of a larger config (``train.yaml#train_loader.dataset``, :mod:`.files`).

Every error is a :class:`~wds_cloud.errors.SpecError` whose message starts with the file
and the key path (``config/x.yaml: datasets[2].scale: ...``); ``pipe:`` shards are refused
with :class:`~wds_cloud.errors.UnsafeURLError` unless ``allow_pipe``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import braceexpand

from ..errors import SpecError, UnsafeURLError
from .files import OpenStream
from .schedule import WeightSchedule

__all__ = ["ALIASES", "DatasetSpec", "SourceSpec", "is_spec_path", "load_spec"]

#: alias -> canonical key, at the top level and in a source
ALIASES = {
    "top": {"dataset": "datasets"},
    "source": {"scaleprob": "weight", "prob": "weight", "proportion": "weight",
               "urls": "shards", "path": "shards"},
}
TOP_KEYS = ("prefix", "seed", "storage_options", "datasets", "buckets")
SOURCE_KEYS = ("name", "shards", "weight", "scale", "extensions", "storage_options",
               "resample", "choose", "buckets")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_GLOB = re.compile(r"[*?\[]")
#: names that are shards (or sample files) rather than directories
_SHARD_NAME = re.compile(r"\.(tar|tgz|tar\.gz|tar\.bz2|tar\.xz|tar\.zst|cbor|msgpack|mp)$|[?]")
_ABSOLUTE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:|/|-$)")


@dataclass(frozen=True)
class SourceSpec:
    """One source of a spec (see the module docstring); ``urls`` are brace-expanded, a glob
    stays one entry; ``key`` is its key path for messages (``datasets[2]``)."""

    name: str
    pattern: str
    urls: tuple[str, ...]
    weight: float = 1.0
    scale: tuple[float, float] = (1.0, 1.0)
    extensions: tuple[str, ...] | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    resample: int | None = None
    choose: int | None = None
    key: str = ""
    #: samples per epoch as a multiple of the source's samples (Mosaic's ``repeat``, Energon's
    #: ``repetitions``), in a spec of mode ``"samples"``
    repeat: float | None = None
    #: samples per epoch, absolute (Mosaic's ``choose``), in a spec of mode ``"samples"``
    samples: int | None = None
    #: carried into each sample as ``__subflavors__`` (Energon)
    subflavors: Mapping[str, Any] | None = None
    #: the split of an Energon-prepared directory (``.nv-meta/split.yaml``) to read
    split_part: str | None = None
    #: the split file in ``.nv-meta/`` (Energon's ``split_config``; default ``split.yaml``)
    split_config: str | None = None
    #: this source's shard cache directory (Mosaic's ``local``)
    cache_dir: str | None = None
    #: the weight over training (:mod:`.schedule`); ``weight`` is then its value at 0
    schedule: WeightSchedule | None = None
    #: the keys as the user wrote them, canonical -> spelled (for messages)
    spelled: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_glob(self) -> bool:
        """Whether some shard entry is a glob, listed when the dataset is built."""
        return any(_GLOB.search(u) for u in self.urls)

    @property
    def is_directory(self) -> bool:
        """Whether the source names a directory or prefix (one entry, neither a glob nor a
        shard file): its shards are found when the dataset is built, from ``.nv-meta/`` if
        it has one (Energon), else every ``*.tar``/``*.tgz`` under it."""
        return (len(self.urls) == 1 and not self.has_glob
                and not self.urls[0].startswith("pipe:") and self.urls[0] != "-"
                and not _SHARD_NAME.search(self.urls[0]))

    def weight_at(self, position: float) -> float:
        """The weight at ``position`` of the schedule (the weight itself without one)."""
        return self.weight if self.schedule is None else self.schedule.at(position)

    def spelling(self, key: str) -> str:
        """``key`` as the user wrote it (``scaleprob`` for ``weight``)."""
        return self.spelled.get(key, key)


@dataclass(frozen=True)
class DatasetSpec:
    """A validated dataset spec: load it with :meth:`from_yaml`, :meth:`from_json`,
    :meth:`from_dict` or :func:`load_spec`; read it with ``WebDataset(spec)`` or
    :meth:`to_pipeline`."""

    sources: tuple[SourceSpec, ...]
    seed: int | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    origin: str = "<dict>"
    #: how an epoch is made: ``"mix"`` (an endless mix of samples by weight), ``"shards"``
    #: (webdataset's per-epoch shard lists: every shard once, or ``resample``/``choose``),
    #: ``"samples"`` (a count of samples per source per epoch: Mosaic, Energon's
    #: ``blend_epochized``)
    mode: str = "mix"
    #: the format the file was read as: ``"webdataset"``, ``"energon"`` or ``"mosaic"``
    dialect: str = "webdataset"
    #: the split read (Energon's ``splits:``)
    split: str = "train"
    #: samples per epoch over all sources (Mosaic's ``epoch_size``), for ``proportion``
    epoch_size: int | None = None
    #: in mode ``"samples"``, how the samples of an epoch are counted per source: ``"counts"``
    #: (``repeat``/``samples``, or all of them), ``"proportion"`` (the weights share
    #: ``epoch_size``, default all the samples) or ``"size"`` (sources share ``epoch_size`` by
    #: their sizes)
    shares: str = "counts"
    #: whether shards are permuted each epoch (Mosaic's ``shuffle: false`` keeps their order)
    shuffle: bool = True
    #: settings the spec gives (``retries``, ``timeout``, ``cache_size``), from its own keys
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: keys read but not used here, as ``(key path as written, why)``
    unused: tuple[tuple[str, str], ...] = ()

    @property
    def counted(self) -> bool:
        """Whether the epochs are webdataset's per-epoch shard lists (``resample``/``choose``,
        or every shard once), rather than a mix by weight or counts of samples."""
        return self.mode == "shards"

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None,
                  allow_pipe: bool = False, split: str | None = None,
                  strict: bool = False,
                  open_stream: OpenStream | None = None) -> DatasetSpec:
        """Load a YAML spec file (``FILE`` or ``FILE#key.path``: see :func:`load_spec`)."""
        return _load_file(path, environ, allow_pipe, split, strict, open_stream)

    @classmethod
    def from_json(cls, path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None,
                  allow_pipe: bool = False, split: str | None = None,
                  strict: bool = False,
                  open_stream: OpenStream | None = None) -> DatasetSpec:
        """Load a JSON spec file (``FILE`` or ``FILE#key.path``)."""
        return _load_file(path, environ, allow_pipe, split, strict, open_stream)

    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "<dict>",
                  environ: Mapping[str, str] | None = None, allow_pipe: bool = False,
                  split: str | None = None, strict: bool = False,
                  base: str | os.PathLike[str] | None = None,
                  open_stream: OpenStream | None = None) -> DatasetSpec:
        """Validate a spec given as a dict (as YAML or JSON would load it); relative paths of
        Energon's and Mosaic's sources are taken from ``base`` (default: the working
        directory); ``open_stream`` reads the spec files it names at URLs."""
        from .parse import parse

        return parse(data, origin=origin, environ=environ, allow_pipe=allow_pipe, split=split,
                     strict=strict, base=os.fspath(base) if base is not None else None,
                     open_stream=open_stream)

    # ------------------------------------------------------------------ shares
    def scale_factors(self, epoch: int, seed: int) -> tuple[float, ...]:
        """Each source's scale factor in ``epoch``: ``lo`` when ``lo == hi``, else drawn from
        ``KeyedRandom(seed, epoch, -1, SCALE, i)``: the same on every rank and worker."""
        from ..pipeline.rng import SCALE, KeyedRandom

        return tuple(lo if lo == hi else KeyedRandom(seed, epoch, -1, SCALE, i).uniform(lo, hi)
                     for i, (lo, hi) in enumerate(s.scale for s in self.sources))

    @property
    def schedule_by(self) -> str | None:
        """What the weight schedules count (``"samples"`` or ``"step"``), None without any."""
        return next((s.schedule.by for s in self.sources if s.schedule is not None), None)

    def probabilities(self, epoch: int = 0, seed: int | None = None, *,
                      at: float = 0) -> dict[str, float]:
        """Each source's share of the samples in ``epoch``: ``weight * scale(epoch)`` over the
        sum across sources (``seed``: default the spec's, else 0); ``at``: the position on
        the weight schedules (samples or steps, :attr:`schedule_by`)."""
        self._weighted("probabilities")
        seed = (self.seed or 0) if seed is None else seed
        raw = [s.weight_at(at) * f for s, f in zip(self.sources,
                                                   self.scale_factors(epoch, seed), strict=True)]
        total = sum(raw)
        return {s.name: r / total for s, r in zip(self.sources, raw, strict=True)}

    def probability_bounds(self) -> dict[str, tuple[float, float, float]]:
        """Each source's ``(min, expected, max)`` share over the scale ranges: min with its own
        scale low and the others' high, max the other way round, expected at the midpoints."""
        self._weighted("probability_bounds")
        lo = [s.weight * s.scale[0] for s in self.sources]
        hi = [s.weight * s.scale[1] for s in self.sources]
        mid = [(a + b) / 2 for a, b in zip(lo, hi, strict=True)]
        out = {}
        for i, s in enumerate(self.sources):
            least = lo[i] / (lo[i] + sum(hi) - hi[i]) if lo[i] else 0.0
            most = hi[i] / (hi[i] + sum(lo) - lo[i]) if hi[i] else 0.0
            out[s.name] = (least, mid[i] / sum(mid), most)
        return out

    def _weighted(self, what: str) -> None:
        if self.counted:
            raise SpecError(f"{self.origin}: {what}() is for weighted specs; this one counts "
                            "shards per epoch (resample/choose), so its shares follow the counts")

    # ------------------------------------------------------------------ use
    def describe(self) -> dict[str, Any]:
        """The spec in canonical keys, aliases resolved (``wds-cloud spec check``)."""
        sources = []
        for s in self.sources:
            entry: dict[str, Any] = {"name": s.name, "shards": s.pattern, "weight": s.weight,
                                     "scale": list(s.scale)}
            if s.schedule is not None:
                entry["weight"] = s.schedule.describe()
            if s.extensions is not None:
                entry["extensions"] = list(s.extensions)
            if s.storage_options:
                entry["storage_options"] = {k: sorted(v) for k, v in s.storage_options.items()}
            for name in ("resample", "choose", "repeat", "samples", "subflavors", "split_part",
                         "cache_dir"):
                if getattr(s, name) is not None:
                    entry[name] = getattr(s, name)
            sources.append(entry)
        out: dict[str, Any] = {"origin": self.origin, "dialect": self.dialect,
                               "mode": self.mode, "seed": self.seed, "datasets": sources}
        if self.dialect == "energon":
            out["split"] = self.split
        if self.epoch_size is not None:
            out["epoch_size"] = self.epoch_size
        if self.mode == "samples":
            out["shares"] = self.shares
        if not self.shuffle:
            out["shuffle"] = False
        if self.settings:
            out["settings"] = dict(self.settings)
        if self.unused:
            out["unused"] = [{"key": key, "why": why} for key, why in self.unused]
        return out

    def to_pipeline(self, **kw: Any) -> Any:
        """``WebDataset(self, **kw)``: the mix as a pipeline to add stages to."""
        from ..dataset import WebDataset

        return WebDataset(self, **kw)


def _load_file(path: str | os.PathLike[str], environ: Mapping[str, str] | None,
               allow_pipe: bool, split: str | None, strict: bool,
               open_stream: OpenStream | None) -> DatasetSpec:
    from .files import read_document
    from .parse import parse

    if environ is None:
        from ..settings import Settings

        environ = Settings.from_env().environ
    doc = read_document(path, environ, open_stream)
    return parse(doc.data, origin=doc.origin, environ=environ, allow_pipe=allow_pipe,
                 split=split, strict=strict, base=os.path.dirname(doc.path) or ".",
                 open_stream=open_stream)


def is_spec_path(spec: object) -> bool:
    """Whether ``spec`` names a spec file: ``.yaml``/``.yml``/``.json``, optionally followed
    by ``#key.path`` (a section of a larger config)."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        return False
    from .files import split_section

    return split_section(spec)[0].endswith((".yaml", ".yml", ".json"))


def load_spec(spec: Any, *, environ: Mapping[str, str] | None = None,
              allow_pipe: bool = False, split: str | None = None,
              strict: bool = False,
              open_stream: OpenStream | None = None) -> DatasetSpec:
    """A :class:`DatasetSpec` from a ``.yaml``/``.yml``/``.json`` path (``FILE#key.path`` names
    a section of a larger config, e.g. ``train.yaml#train_loader.dataset``), a dict, or a spec.

    The dialect is the file's: webdataset's ``datasets:``, Megatron-Energon's metadatasets
    (``__module__: megatron.energon``, ``splits:``; ``split`` picks one, default ``train``),
    Mosaic's / llm-foundry's ``streams:``. ``strict``: keys read but not used here (e.g.
    Energon's ``sample_type``) are errors instead of notes in :attr:`DatasetSpec.unused`.
    ``open_stream`` (e.g. ``wds.gopen``; ``WebDataset`` and the CLI give their own openers)
    reads a spec at a URL (``s3://bucket/specs/train.yaml``) and those it names."""
    if isinstance(spec, DatasetSpec):
        return spec
    if isinstance(spec, Mapping):
        return DatasetSpec.from_dict(spec, environ=environ, allow_pipe=allow_pipe, split=split,
                                     strict=strict, open_stream=open_stream)
    if is_spec_path(spec):
        return _load_file(spec, environ, allow_pipe, split, strict, open_stream)
    if isinstance(spec, (str, os.PathLike)):
        from .files import split_section

        path = split_section(os.fspath(spec))[0]
        if not os.path.exists(path):  # as for a .yaml path: not there, rather than not a spec
            raise SpecError(f"{path}: cannot read the spec: no such file (a spec is a "
                            ".yaml/.yml/.json file)") from FileNotFoundError(path)
    raise SpecError(f"cannot load a dataset spec from {spec!r}: give a .yaml/.yml/.json path "
                    "(FILE#key.path for a section of a larger config), a dict or a DatasetSpec")


def close_key(key: str, known: tuple[str, ...], aliases: Mapping[str, str]) -> str:
    """``"; did you mean 'x'?"`` for an unknown ``key``, or ``""``."""
    found = difflib.get_close_matches(key, [*known, *aliases], n=1)
    return f"; did you mean {found[0]!r}?" if found else ""


def expand_vars(text: str, environ: Mapping[str, str], where: str) -> str:
    """``text`` with each ``${VAR}`` replaced from ``environ`` (a SpecError names ``where``)."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise SpecError(f"{where}: ${{{name}}} is not set in the environment")
        return environ[name]

    return _VAR.sub(value, text)


def join_pattern(prefix: str, bucket: str, pattern: str) -> str:
    """webdataset's join: ``prefix + os.path.join(bucket, pattern)`` for a relative pattern;
    a URL with a scheme or an absolute path is taken as is."""
    if _ABSOLUTE.match(pattern):
        return pattern
    return prefix + (os.path.join(bucket, pattern) if bucket else pattern)


def expand_braces(pattern: str) -> list[str]:
    """The URLs of a brace pattern (a glob stays one entry, listed later)."""
    return list(braceexpand.braceexpand(pattern))


def refuse_pipe(urls: list[str], where: str, allow_pipe: bool) -> None:
    """:class:`UnsafeURLError` for a ``pipe:`` URL unless allowed."""
    if allow_pipe:
        return
    for url in urls:
        if url.startswith("pipe:"):
            raise UnsafeURLError(
                f"{where}: {url[:60]!r} is a pipe: URL, which runs a shell command; a spec may "
                "name one only when the caller allows it (WebDataset(spec, allow_pipe=True), "
                "DatasetSpec.from_yaml(path, allow_pipe=True))")
