"""webdataset's module path ``webdataset.utils``, for its one public, mutable flag:
``enforce_security``.

A small module of its own rather than an alias: what reads the flag lives in several rooms
(the decoders in :mod:`wds_cloud.codecs`, the router), so the flag sits at the bottom layer,
where all of them can read it. Nothing else of webdataset's ``utils`` grab bag is here.

``enforce_security`` (set it as ``wds.utils.enforce_security = True``, as with webdataset):

``None`` (the default)
    As ``WDS_SECURE`` says, read once by the composition root (``Settings.secure``: the
    ``WebDataset``, ``gopen``, a ``Decoder`` built on its own) or given as ``secure=``:
    when on, what can run code is refused: unpickling (``.pyd``, ``.pickle``, ``.pkl``),
    ``torch.load`` (``.pth``) and ``pipe:`` URLs. Local paths and URL rewriting stay allowed,
    so datasets on local disk keep working under ``WDS_SECURE=1``.
``True``
    Everything webdataset 1.0.2 refuses: the above, plus local paths and ``file:`` URLs
    (through ``gopen`` and the datasets, reading or writing) and URL rewriting
    (``WDS_REWRITE``/``GOPEN_REWRITE``). Only remote stores (and ``-``) can be read.
``False``
    Nothing is refused, even with ``WDS_SECURE=1`` or ``secure=True``.

webdataset initialised the flag from ``WDS_SECURE`` when imported; here nothing reads the
environment at import time (only :mod:`wds_cloud.settings` reads it), hence ``None``.
The flag is read at the point of use, each time, so setting it takes effect at once in this
process. It is a plain module attribute: DataLoader workers started by ``fork`` inherit it,
workers started by ``spawn`` or ``forkserver`` import the module afresh and see ``None``
(set it in ``worker_init_fn``, or use ``WDS_SECURE=1``, which every process reads).
A refusal raises a ``ValueError`` subclass (as webdataset's ``ValueError``) saying what was
refused and why.
"""

from __future__ import annotations

__all__ = ["enforce_security", "refuses_code", "refuses_sources", "why_refused"]

#: ``None``: as ``WDS_SECURE``/``secure=`` say; ``True``: refuse all webdataset refuses;
#: ``False``: refuse nothing (see the module docstring)
enforce_security: bool | None = None


def refuses_code(secure: bool) -> bool:
    """Whether to refuse what can run code (unpickling, ``torch.load``, ``pipe:``), given the
    ``secure`` setting of the caller (``Settings.secure`` or a ``secure=`` argument): the
    module flag when it is set, else ``secure``."""
    flag = enforce_security
    return bool(secure) if flag is None else bool(flag)


def refuses_sources() -> bool:
    """Whether to refuse local paths, ``file:`` URLs and URL rewriting: only when the module
    flag is set to a true value (webdataset's secure mode)."""
    flag = enforce_security
    return flag is not None and bool(flag)


def why_refused(*, source: str = "secure=True or WDS_SECURE=1",
                undo: str = "pass secure=False or unset WDS_SECURE") -> str:
    """The reason given in refusal messages: which switch is on, and how to turn it off
    (``source`` and ``undo`` name the caller's own switch, for when the flag is not set)."""
    if enforce_security is not None and enforce_security:
        return ("wds_cloud.utils.enforce_security (webdataset.utils.enforce_security) is True; "
                "if you trust this data, set it to False, or to None to follow WDS_SECURE")
    return f"secure mode is on ({source}); if you trust this data, {undo}"
