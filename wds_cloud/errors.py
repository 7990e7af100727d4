"""The whole exception tree of wds_cloud.

Every error mixes in the builtin a caller would already catch, so plain ``except OSError``
or ``except ValueError`` keeps working::

    WdsCloudError
    ├── ConfigError(ValueError) ── SpecError
    ├── UnsupportedSchemeError(ValueError)      lists the registered schemes
    ├── MissingDependencyError(ImportError)     names the pip extra to install
    ├── UnsafeURLError(PermissionError, ValueError)  e.g. pipe: refused in secure mode
    ├── OpenError(OSError)                      .url, .resolved_url (after rewrite/AIS)
    │   ├── ShardNotFoundError(FileNotFoundError)
    │   ├── AccessDeniedError(PermissionError)
    │   ├── TransferError                       .offset, .attempts: retries ran out mid-shard
    │   └── PipeError                           .command, .returncode, stderr tail
    ├── CacheError(OSError) ── CacheValidationError
    ├── ShardFormatError(ValueError, tarfile.ReadError)  .url, .member, .offset
    ├── DecodingError(ValueError)               .url, .key, .k (field), .sample
    ├── EncodingError(ValueError)               a field that cannot be turned into bytes
    └── ShardTaskError(RuntimeError)            .failed {shard: error}, .report: per-shard
                                                tasks that failed after their retries

Messages say what went wrong, why, and how to fix it. URLs are shown through
:func:`wds_cloud.urls.redact` so signed query strings and keys never reach a message.
Chain with ``raise ... from exc``.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable
from functools import partial
from typing import Any

__all__ = [
    "AccessDeniedError",
    "CacheError",
    "CacheValidationError",
    "ConfigError",
    "DecodingError",
    "EncodingError",
    "MissingDependencyError",
    "OpenError",
    "PipeError",
    "ResumeError",
    "ShardFormatError",
    "ShardNotFoundError",
    "ShardTaskError",
    "SpecError",
    "TransferError",
    "UnsafeURLError",
    "UnsupportedSchemeError",
    "WdsCloudError",
]


class WdsCloudError(Exception):
    """Base of every error raised by wds_cloud."""


class ConfigError(WdsCloudError, ValueError):
    """A setting, argument or environment variable has a value we cannot use."""


class SpecError(ConfigError):
    """A YAML dataset spec is malformed; the message names the file and key path."""


class UnsupportedSchemeError(WdsCloudError, ValueError):
    """No opener is registered for a URL's scheme."""

    def __init__(self, url: str, scheme: str, registered: Iterable[str]) -> None:
        self.url = url
        self.scheme = scheme
        self.registered = sorted(registered)
        super().__init__(
            f"no opener for scheme {scheme!r} in {url!r}; registered schemes: "
            f"{', '.join(self.registered)} (register one with wds_cloud.register_opener)"
        )


class MissingDependencyError(WdsCloudError, ImportError):
    """An optional dependency is not installed; the message names the pip extra."""

    def __init__(self, what: str, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"{what} needs the Python package {module!r}, which is not installed; "
            f"install it with: pip install 'wds-cloud[{extra}]'"
        )


class UnsafeURLError(WdsCloudError, PermissionError, ValueError):
    """A URL was refused because of what it would do (e.g. run a command); also a
    ``ValueError``, what webdataset raises for the refusals of its secure mode."""


class OpenError(WdsCloudError, OSError):
    """A shard could not be opened or read.

    ``url`` is the URL as the caller gave it, ``resolved_url`` the one actually opened after
    rewriting and proxying (both redacted).
    """

    def __init__(self, message: str, *, url: str = "", resolved_url: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.resolved_url = resolved_url or url

    def __str__(self) -> str:
        message = str(self.args[0]) if self.args else ""
        # the router learns the URL as given after the opener raised: name it too
        if self.url and self.resolved_url and self.url != self.resolved_url \
                and self.url not in message:
            message += f" (opening {self.url!r}, resolved to {self.resolved_url!r})"
        return message


class ShardNotFoundError(OpenError, FileNotFoundError):
    """The shard does not exist."""


class AccessDeniedError(OpenError, PermissionError):
    """The store refused access to the shard."""


class TransferError(OpenError):
    """Reading or writing a remote object failed for good: retries ran out, or the object
    changed while it was being read. ``offset`` is the byte where the transfer stopped and
    ``attempts`` how many requests were made."""

    def __init__(
        self, message: str, *, url: str = "", resolved_url: str = "", offset: int = 0,
        attempts: int = 0,
    ) -> None:
        super().__init__(message, url=url, resolved_url=resolved_url)
        self.offset = offset
        self.attempts = attempts


class PipeError(OpenError):
    """A ``pipe:`` command failed; carries its command, exit status and the tail of stderr."""

    def __init__(
        self, message: str, *, url: str = "", command: str = "", returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        super().__init__(message, url=url)
        self.command = command
        self.returncode = returncode
        self.stderr = stderr


class CacheError(WdsCloudError, OSError):
    """The shard cache could not store or serve an entry."""


class CacheValidationError(CacheError):
    """A cache entry does not match what was recorded for it."""


class ResumeError(WdsCloudError, ValueError):
    """A saved state does not fit the dataset or loader it is loaded into, or the objects it
    points to changed; ``field`` names what differs (``seed``, ``world_size``, ``version``...).
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class ShardFormatError(WdsCloudError, ValueError, tarfile.ReadError):
    """A shard's bytes are not a valid archive, or its samples break webdataset's rules.

    ``url`` names the shard, ``member`` the tar member (if known) and ``offset`` the byte
    offset in the uncompressed stream where the problem was found. It is also a
    :class:`tarfile.ReadError`, which is what webdataset users catch around broken shards
    (webdataset reads them with :mod:`tarfile`).
    """

    def __init__(
        self, message: str, *, url: str | None = None, member: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.url = url
        self.member = member
        self.offset = offset
        where = []
        if url is not None:
            where.append(f"url={url!r}")
        if member is not None:
            where.append(f"member={member!r}")
        if offset is not None:
            where.append(f"offset={offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)


class DecodingError(WdsCloudError, ValueError):
    """A field could not be decoded; ``url``, ``key``, ``k`` (the field) and ``sample`` say where.

    Positional arguments are webdataset's (``DecodingError(url, key, k, sample)``).
    """

    def __init__(
        self, url: str | None = None, key: str | None = None, k: str | None = None,
        sample: dict[str, Any] | None = None, *, reason: str = "",
    ) -> None:
        from .urls import redact  # urls imports this module

        self.url, self.key, self.k, self.sample, self.reason = url, key, k, sample, reason
        # name what is known: a decoder function called on its own knows only the field
        parts = [f"field {k!r}"] if k is not None else []
        if key is not None or (url is not None and k is None):
            parts.append(f"sample {key!r}" if key is not None else "a sample")
        where = " of ".join(parts)
        if url is not None:
            where += f" from {redact(str(url))!r}"
        head = f"cannot decode {where}" if where else "cannot decode"
        super().__init__(f"{head}: {reason}" if reason else head)

    def __reduce__(self) -> Any:
        return (partial(DecodingError, reason=self.reason), (self.url, self.key, self.k))


class EncodingError(WdsCloudError, ValueError):
    """A field of a sample could not be turned into bytes."""


class ShardTaskError(WdsCloudError, RuntimeError):
    """Per-shard tasks (``create_shards``, ``map_shards``) failed after their retries; all the
    other tasks completed. ``failed`` maps each failed shard (its input URL, or its output
    when it has no input) to the last error; ``report`` is the run's whole report."""

    def __init__(self, message: str, *, failed: dict[str, str] | None = None,
                 report: Any = None) -> None:
        super().__init__(message)
        self.failed = dict(failed or {})
        self.report = report

    def __reduce__(self) -> Any:
        return (partial(ShardTaskError, failed=self.failed, report=self.report),
                (str(self.args[0]) if self.args else "",))
