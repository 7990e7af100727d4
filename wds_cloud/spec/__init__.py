"""L2 dataset specs: YAML/JSON/dict specs that mix shard collections (schema: parse and
validate; build: spec -> pipeline source). ``WebDataset(spec)`` reads them."""

from __future__ import annotations

from .schema import DatasetSpec, SourceSpec, load_spec

__all__ = ["DatasetSpec", "SourceSpec", "load_spec"]
