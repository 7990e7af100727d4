"""Reading a spec document: YAML or JSON, a section of a larger config (``FILE#key.path``), and
the interpolations of training configs.

Layer 2: stdlib and pyyaml; the only I/O is reading the spec file itself: a local path here,
a URL (``s3://``, ``gs://``, ``https://``, ...) through the stream-opening callable the caller
gives (the dataset's and the CLI's openers).

- ``train.yaml#train_loader.dataset`` names the mapping at that key path (dots; ``[i]`` or a
  number for a list item), so an llm-foundry or Hydra training YAML is used as it is. A whole
  llm-foundry training YAML named without ``#`` is read at ``train_loader.dataset`` (logged).
- ``${variables.data_local}`` (OmegaConf's interpolation, as llm-foundry's YAMLs write them) is
  replaced by the value at that key path of the same document, the value itself (a number stays
  a number) when it is the whole string; ``${oc.env:NAME}`` / ``${oc.env:NAME,default}`` by the
  environment. Any other ``${NAME}`` is left for the dialect's reader, which takes it from the
  environment.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import OpenError, ShardNotFoundError, SpecError

__all__ = ["Document", "OpenStream", "is_url", "read_document", "split_section"]

#: opens a URL for reading (the dataset's router, :func:`wds_cloud.gopen`)
OpenStream = Callable[[str], BinaryIO]

log = logging.getLogger(__name__)

_REF = re.compile(r"\$\{([^${}]+)\}")
_INDEX = re.compile(r"\[(\d+)\]")
_SUFFIXES = (".yaml", ".yml", ".json")
_NOT_OURS = object()  # a ${NAME} that is no key path of the document
#: a training config's dataset section, read when the file names no section
_TRAINING = ("train_loader", "dataset")


class Document:
    """A loaded spec document: ``data`` (the section named, interpolated), ``origin`` (the
    file, and ``#section`` when one was named: messages start with it) and ``path`` (the
    file, for relative paths inside it)."""

    def __init__(self, data: Any, origin: str, path: str) -> None:
        self.data = data
        self.origin = origin
        self.path = path


def split_section(spec: str) -> tuple[str, str]:
    """``("train.yaml", "train_loader.dataset")`` for ``"train.yaml#train_loader.dataset"``;
    ``(spec, "")`` when it names no section."""
    path, sep, section = spec.partition("#")
    if sep and path.endswith(_SUFFIXES):
        return path, section
    return spec, ""


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL a store serves (``s3://...``), not a local path."""
    return "://" in path and not path.startswith("file://")


def read_document(spec: str | os.PathLike[str], environ: Mapping[str, str],
                  open_stream: OpenStream | None = None) -> Document:
    """Load the spec file (``FILE`` or ``FILE#key.path``) named by ``spec``; a URL is read
    with ``open_stream``."""
    path, section = split_section(os.fspath(spec))
    text = _read(path, open_stream)
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}: not valid JSON (line {exc.lineno}, column "
                            f"{exc.colno}): {exc.msg}") from exc
    else:
        data = _yaml(text, path)
    root = data
    if section:
        data = _at(data, section, path)
    elif _is_training_config(data):
        section = ".".join(_TRAINING)
        log.info("%s: a training config: reading its dataset section %s (name it as %s#%s)",
                 path, section, path, section)
        data = data[_TRAINING[0]][_TRAINING[1]]
    origin = f"{path}#{section}" if section else path
    return Document(_interpolate(data, root, environ, origin), origin, path)


def _read(path: str, open_stream: OpenStream | None) -> str:
    if is_url(path):
        return _read_url(path, open_stream)
    try:
        return Path(path.removeprefix("file://")).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SpecError(f"{path}: cannot read the spec: no such file") from exc
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc.strerror or exc}") from exc


def _read_url(url: str, open_stream: OpenStream | None) -> str:
    if open_stream is None:
        raise SpecError(f"{url}: a spec at a URL is read with the dataset's openers: "
                        "WebDataset(url) and wds-cloud read it, or load_spec(url, "
                        "open_stream=wds.gopen)")
    try:
        with open_stream(url) as stream:
            data = stream.read()
    except (ShardNotFoundError, FileNotFoundError) as exc:
        raise SpecError(f"{url}: cannot read the spec: no such object") from exc
    except (OpenError, OSError) as exc:
        raise SpecError(f"{url}: cannot read the spec: {exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{url}: cannot read the spec: not UTF-8 text ({exc})") from exc


def _yaml(text: str, path: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpecError(f"{path}: not valid YAML{where}: "
                        f"{getattr(exc, 'problem', None) or exc}") from exc


def _steps(section: str) -> list[str]:
    return [s for s in _INDEX.sub(r".\1", section).split(".") if s]


def _at(data: Any, section: str, path: str) -> Any:
    """The value at key path ``section`` of ``data``; a SpecError names what is missing."""
    here = data
    done: list[str] = []
    for step in _steps(section):
        if isinstance(here, Mapping) and step in here:
            here = here[step]
        elif isinstance(here, list) and step.isdigit() and int(step) < len(here):
            here = here[int(step)]
        else:
            where = ".".join(done) or "the top level"
            known = (f" (keys there: {', '.join(map(str, here))})"
                     if isinstance(here, Mapping) else "")
            raise SpecError(f"{path}#{section}: no key {step!r} at {where}{known}")
        done.append(step)
    return here


def _is_training_config(data: Any) -> bool:
    if not isinstance(data, Mapping) or any(k in data for k in (
            "datasets", "dataset", "streams", "splits", "__module__", "remote", "local")):
        return False
    loader = data.get(_TRAINING[0])
    return isinstance(loader, Mapping) and isinstance(loader.get(_TRAINING[1]), Mapping)


def _interpolate(value: Any, root: Any, environ: Mapping[str, str], origin: str,
                 depth: int = 0) -> Any:
    """``value`` with the document's ``${a.b}`` and ``${oc.env:...}`` references replaced."""
    if depth > 20:
        raise SpecError(f"{origin}: interpolations nest more than 20 deep (a cycle?)")
    if isinstance(value, Mapping):
        return {k: _interpolate(v, root, environ, origin, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, root, environ, origin, depth) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def lookup(ref: str) -> Any:
        ref = ref.strip()
        if ref.startswith("oc.env:"):
            name, _, default = ref[len("oc.env:"):].partition(",")
            if name.strip() in environ:
                return environ[name.strip()]
            if default:
                return default.strip().strip("'\"")
            raise SpecError(f"{origin}: ${{{ref}}}: {name.strip()} is not set in the "
                            "environment")
        steps = _steps(ref)
        if len(steps) < 2 or not isinstance(root, Mapping) or steps[0] not in root:
            return _NOT_OURS  # an environment variable: the dialect's reader expands it
        found = _at(root, ref, origin.split("#")[0])
        return _interpolate(found, root, environ, origin, depth + 1)

    whole = _REF.fullmatch(value)
    if whole:
        found = lookup(whole.group(1))
        return value if found is _NOT_OURS else found  # a blank value stays None

    def text(match: re.Match[str]) -> str:
        found = lookup(match.group(1))
        return match.group(0) if found is _NOT_OURS else "" if found is None else str(found)

    return _REF.sub(text, value)
