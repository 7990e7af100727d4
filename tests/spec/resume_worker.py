"""Training processes for tests/spec/test_resume.py: each reads a spec through two DataLoader
workers (WebLoader or torchdata's StatefulDataLoader) and writes the keys and sources of every
batch to ``OUT``:

- ``full``: two whole epochs;
- ``stop K1,K2,...``: first two whole epochs, as ``full`` (a loader of its own), then for each K
  in turn a new loader saves its state after K batches to ``STATE-K``; after the last K the job
  dies (``os._exit``, its workers killed), nothing closed or flushed;
- ``resume K1,K2,...``: for each K a new loader loads ``STATE-K`` and goes on to the end.

One process serves every K (a new loader, new workers, for each): the interpreter and torch
are started once, and each state is still restored in another process than the one that
saved it."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import sys
from typing import Any

import wds_cloud as wds

EPOCHS, BATCHES, BATCH, BUFFER = 2, 60, 16, 1000


def make_loader(spec: str, loader_kind: str) -> Any:
    dataset = (wds.WebDataset(spec).shuffle(BUFFER).to_tuple("__key__", "__source__")
               .batched(BATCH).with_epoch(nbatches=BATCHES))
    if loader_kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dataset, batch_size=None, num_workers=2)
    return wds.WebLoader(dataset, batch_size=None, num_workers=2)


def run(loader: Any, first_epoch: int, stop: int | None, state_file: str) -> dict[str, Any]:
    """The batches from ``first_epoch`` on; with ``stop``, the state saved after that many."""
    stream: list[list[list[Any]]] = []
    for epoch in range(first_epoch, EPOCHS):
        for keys, sources in loader:
            stream.append([list(keys), list(sources)])
            if stop is not None and len(stream) == stop:
                state = loader.state_dict()
                with open(state_file, "wb") as f:
                    pickle.dump({"loader": state, "epoch": epoch}, f)
                return {"stream": stream, "state_bytes": len(pickle.dumps(state))}
    return {"stream": stream, "io": wds.io_stats()}


def main(spec: str, loader_kind: str, mode: str, out: str, state_file: str, ks: str) -> None:
    stops = [int(k) for k in ks.split(",")]
    results: dict[str, Any] = {}
    if mode in ("full", "stop"):
        results["full"] = run(make_loader(spec, loader_kind), 0, None, state_file)
    for i, k in enumerate(stops if mode != "full" else []):
        loader, first_epoch = make_loader(spec, loader_kind), 0
        if mode == "resume":
            with open(f"{state_file}-{k}", "rb") as f:
                saved = pickle.load(f)
            loader.load_state_dict(saved["loader"])
            first_epoch = saved["epoch"]
        results[str(k)] = run(loader, first_epoch, k if mode == "stop" else None,
                              f"{state_file}-{k}")
        if mode == "stop" and i == len(stops) - 1:
            with open(out, "w") as f:
                json.dump(results, f)
            for child in multiprocessing.active_children():
                child.kill()  # the job is killed: its workers too
            os._exit(0)  # nothing is closed or flushed
        del loader  # its workers end before the next loader's start
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:7])
