"""What users' own tests can reuse: a local S3 server (rclone, :class:`LocalS3Server`) and the
contract suite every opener meets (:class:`OpenerContract`, for a third-party opener's tests).

The contract imports pytest, so it is loaded only when asked for.
"""

from __future__ import annotations

from typing import Any

from .locals3 import LocalS3Server, find_rclone

__all__ = ["ContractStore", "LocalS3Server", "OpenerContract", "find_rclone", "tar_bytes"]

_CONTRACT = frozenset({"ContractStore", "OpenerContract", "tar_bytes"})


def __getattr__(name: str) -> Any:
    if name in _CONTRACT:
        from . import contract

        return getattr(contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
