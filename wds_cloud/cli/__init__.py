"""The ``wds-cloud`` command: ``main.py`` builds the parser; one module per command (``inspect``,
``bench``, ``pack``, ``demo``, ``cache``), each with ``add_parser(subparsers)`` and its ``cmd_*``;
``common.py`` holds what they share (the progress line, shard specs)."""

from __future__ import annotations

from .main import build_parser, main

__all__ = ["build_parser", "main"]
