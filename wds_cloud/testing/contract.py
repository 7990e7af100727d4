"""The contract every opener of wds_cloud meets, as a pytest class a third-party opener can reuse
(as zarr-python ships ``zarr.testing.store.StoreTests``).

Subclass :class:`OpenerContract` in a test module and give it fixtures that return a
:class:`ContractStore`: a fresh, private place (bucket, container, directory) on a running
server, seeded and read back through the server's own API, not through wds_cloud::

    class TestMemoryOpener(OpenerContract):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(...)          # a ContractStore

``store`` serves the tests every opener must pass (reads, exact sizes, missing objects).
``writable_store``, ``denying_store`` and ``listing_store`` serve the tests of a feature (writes
that appear only when complete, HTTP 401/403, listing globs); by default they are ``store``,
which must then name the feature in :attr:`ContractStore.features`. A store without a feature
turns its tests off by setting them to ``None`` in the subclass
(``test_access_denied = None``). wds_cloud's own suite runs this class against every built-in
opener, each on its real server.

This module imports pytest: import it only from tests.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

import wds_cloud as wds
from wds_cloud.errors import AccessDeniedError, ShardNotFoundError
from wds_cloud.router import resolve_url

__all__ = ["ContractStore", "OpenerContract", "tar_bytes"]

Samples = list[tuple[str, dict[str, bytes]]]


class ContractStore:
    """What the contract needs of a store; subclasses give ``url``, ``put`` and ``get``.

    ``features`` names what the store can do: ``write`` (wds_cloud can write to ``url()``),
    ``deny`` (``denied_url`` answers 401/403), ``list`` (globs over ``url()`` are listed).
    ``env`` is what a test must set in the environment to reach the store (``AIS_ENDPOINT``...).
    """

    features: frozenset[str] = frozenset()

    @property
    def storage_options(self) -> dict[str, dict[str, Any]]:
        """Per-scheme ``storage_options`` to hand wds_cloud for this store."""
        return {}

    @property
    def denied_storage_options(self) -> dict[str, dict[str, Any]]:
        """The ``storage_options`` with which ``denied_url`` is opened."""
        return self.storage_options

    @property
    def env(self) -> dict[str, str]:
        return {}

    def url(self, key: str) -> str:
        """The URL wds_cloud opens for ``key``."""
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` through the server's own API."""
        raise NotImplementedError

    def get(self, key: str) -> bytes | None:
        """The bytes of ``key`` read through the server's own API; ``None`` if missing."""
        raise NotImplementedError

    def denied_url(self, key: str) -> str:
        """A URL of ``key`` that the server answers with 401 or 403."""
        raise NotImplementedError(f"{self!r} cannot produce a 403")

    def apply_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Set :attr:`env` for the rest of the test."""
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)


def tar_bytes(samples: Samples) -> bytes:
    """A tar shard of ``samples`` (``(key, {extension: bytes})``), members in sample order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, fields in samples:
            for extension, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _samples(n: int, shard: int) -> Samples:
    return [(f"s{shard:02d}-{i:04d}", {"txt": f"sample {shard}/{i}".encode(),
                                        "bin": bytes([i % 256]) * (1000 + 37 * i)})
            for i in range(n)]


def _seed(store: ContractStore, tmp_path: Path, shards: int = 3,
          per_shard: int = 20) -> list[str]:
    """Shards ``train/shard-NNN.tar`` in the store, and the same bytes as ``local-N.tar``."""
    keys = []
    for k in range(shards):
        key = f"train/shard-{k:03d}.tar"
        data = tar_bytes(_samples(per_shard, k))
        (tmp_path / f"local-{k}.tar").write_bytes(data)
        store.put(key, data)
        keys.append(key)
    return keys


def _triples(dataset: Any) -> list[tuple[str, str, bytes]]:
    return [(s["__key__"], s["txt"].decode(), s["bin"]) for s in dataset]


def _needs(store: ContractStore, feature: str) -> ContractStore:
    assert feature in store.features, (
        f"{store!r} does not name the {feature!r} feature: give it, or set the tests of the "
        "feature to None in the subclass")
    return store


class OpenerContract:
    """The shared contract suite (see the module docstring)."""

    @pytest.fixture
    def store(self) -> ContractStore:
        raise NotImplementedError("give OpenerContract a `store` fixture")

    @pytest.fixture
    def writable_store(self, store: ContractStore) -> ContractStore:
        return _needs(store, "write")

    @pytest.fixture
    def denying_store(self, store: ContractStore) -> ContractStore:
        return _needs(store, "deny")

    @pytest.fixture
    def listing_store(self, store: ContractStore) -> ContractStore:
        return _needs(store, "list")

    def test_reads_the_same_samples_as_the_local_copy(
        self, store: ContractStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        store.apply_env(monkeypatch)
        keys = _seed(store, tmp_path)
        local = [str(tmp_path / f"local-{k}.tar") for k in range(len(keys))]
        expected = _triples(wds.WebDataset(local, shardshuffle=False))
        assert len(expected) == 60
        got = _triples(wds.WebDataset([store.url(k) for k in keys], shardshuffle=False,
                                      storage_options=store.storage_options))
        assert got == expected
        for sample in wds.WebDataset(store.url(keys[0]), shardshuffle=False,
                                     storage_options=store.storage_options):
            assert sample["__url__"] == store.url(keys[0])  # the URL as given, not as resolved

    def test_raw_bytes_and_exact_size(self, store: ContractStore,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
        store.apply_env(monkeypatch)
        data = bytes(range(256)) * 40_000 + b"tail"  # about 10 MB, not a multiple of any block
        store.put("blob.bin", data)
        with wds.gopen(store.url("blob.bin"), storage_options=store.storage_options) as stream:
            head = stream.read(1000)
            rest = stream.read()
        assert head + rest == data

    def test_missing_object_names_the_url_as_given_and_resolved(
        self, store: ContractStore, monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        store.apply_env(monkeypatch)
        url = store.url("no/such-shard.tar")
        with pytest.raises(ShardNotFoundError) as info:
            wds.gopen(url, storage_options=store.storage_options)
        err = info.value
        assert isinstance(err, FileNotFoundError) and err.url == url
        resolved = resolve_url(url) if store.env else url
        assert err.resolved_url == resolved
        seen: list[BaseException] = []  # and through a dataset, its handler gets the error

        def keep_going(exn: BaseException) -> bool:
            seen.append(exn)
            return True

        dataset = wds.WebDataset(url, shardshuffle=False, empty_check=False,
                                 storage_options=store.storage_options, handler=keep_going)
        assert list(dataset) == [] and isinstance(seen[0], ShardNotFoundError)

    def test_access_denied(self, denying_store: ContractStore,
                           monkeypatch: pytest.MonkeyPatch) -> None:
        store = denying_store
        store.apply_env(monkeypatch)
        store.put("secret.tar", tar_bytes(_samples(2, 0)))
        url = store.denied_url("secret.tar")
        with pytest.raises(AccessDeniedError) as info:
            wds.gopen(url, storage_options=store.denied_storage_options)
        assert isinstance(info.value, PermissionError) and info.value.url == url
        for options in store.denied_storage_options.values():  # no secret in the message
            for secret in ("secret", "key", "account_key", "connection_string"):
                value = options.get(secret)
                if isinstance(value, str) and len(value) > 6:
                    assert value not in str(info.value)

    def test_write_then_read_back(self, writable_store: ContractStore,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
        store = writable_store
        store.apply_env(monkeypatch)
        pattern = store.url("out/part-%03d.tar")
        with wds.ShardWriter(pattern, maxcount=5, storage_options=store.storage_options) as sink:
            for i in range(12):
                sink.write({"__key__": f"k{i:03d}", "txt": f"value {i}"})
        for shard, count in ((0, 5), (1, 5), (2, 2)):
            data = store.get(f"out/part-{shard:03d}.tar")
            assert data is not None
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                assert len(tar.getnames()) == count
        again = wds.WebDataset(pattern.replace("%03d", "{000..002}"), shardshuffle=False,
                               storage_options=store.storage_options)
        assert [s["txt"] for s in again.decode()] == [f"value {i}" for i in range(12)]

    def test_failed_write_leaves_no_object(self, writable_store: ContractStore,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
        store = writable_store
        store.apply_env(monkeypatch)
        url = store.url("out/broken.tar")
        with pytest.raises(RuntimeError, match="job died"), \
                wds.TarWriter(url, storage_options=store.storage_options) as sink:
            sink.write({"__key__": "a", "bin": b"x" * 100_000})
            raise RuntimeError("the job died")
        assert store.get("out/broken.tar") is None

    def test_prefix_glob_is_listed_once_and_sorted(
        self, listing_store: ContractStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        store = listing_store
        store.apply_env(monkeypatch)
        keys = _seed(store, tmp_path, shards=3, per_shard=4)
        store.put("train/other.txt", b"not a shard")
        dataset = wds.WebDataset(store.url("train/shard-*.tar"), shardshuffle=False,
                                 storage_options=store.storage_options)
        urls = [s["__url__"] for s in dataset]
        assert sorted(set(urls)) == [store.url(k) for k in keys] and len(urls) == 12
