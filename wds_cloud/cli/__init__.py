"""The ``wds-cloud`` command: ``main.py`` builds the parser from one module per command (``ls``,
``inspect``, ``head``, ``bench``, ``create``, ``mapshards``, ``cache``, ``spec``, ``serve_s3``,
``demo``), each with ``add_parser(subparsers)``; ``common.py`` holds what they share (options,
inputs, progress bars, ``--json``, exit codes)."""

from __future__ import annotations

from .main import build_parser, main

__all__ = ["build_parser", "main"]
