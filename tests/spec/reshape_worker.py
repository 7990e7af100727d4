"""One rank of the change-of-shape test (tests/spec/test_reshape_torchrun.py), under torchrun.

Arguments: EXACT_SPEC MIX_SPEC OUT_DIR PHASE WORKERS BATCH EXACT_STEPS MIX_STEPS [STATE].
Reads two loaders, one after the other: ``EXACT_SPEC`` (webdataset's semantics: every shard
once per epoch) through a shuffle buffer, with DataLoader batches of BATCH, for EXACT_STEPS
batches (-1: to the epoch's end), and the weighted ``MIX_SPEC`` for MIX_STEPS batches of 50;
each resumed from STATE (a merged state of every rank of the phase before) when given. Writes
the keys (and sources) it yielded to OUT_DIR/PHASE-rank<R>.json; then rank 0 saves the merged
states of every rank's loaders to OUT_DIR/PHASE.state, and with EXACT_STEPS >= 0 every rank
is killed (SIGKILL), DataLoader workers still running, as a preempted job is.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import signal
import sys

import torch.distributed as dist

import wds_cloud as wds


def _keys(batch: list[tuple[str, str]]) -> list[list[str]]:
    return [[key, source] for key, source in batch]


def _loaders(exact: str, mix: str, workers: int, batch: int) -> tuple[wds.WebLoader, ...]:
    first = wds.WebDataset(exact, seed=3).shuffle(50).to_tuple("__key__", "__source__")
    second = (wds.WebDataset(mix, seed=4).to_tuple("__key__", "__source__")
              .with_epoch(100_000))
    return (wds.WebLoader(first, batch_size=batch, num_workers=workers, collate_fn=list),
            wds.WebLoader(second, batch_size=50, num_workers=workers, collate_fn=list))


def main() -> None:
    exact, mix, out, phase, workers, batch, exact_steps, mix_steps = sys.argv[1:9]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loaders = _loaders(exact, mix, int(workers), int(batch))
    if len(sys.argv) > 9:
        with open(sys.argv[9], "rb") as f:
            saved = pickle.load(f)
        for loader, state in zip(loaders, saved, strict=True):
            loader.load_state_dict(state)
    record: dict[str, list[list[str]]] = {"exact": [], "mix": []}
    states = []
    for name, loader, steps in (("exact", loaders[0], int(exact_steps)),
                                ("mix", loaders[1], int(mix_steps))):
        it = iter(loader)
        for batch_ in itertools.islice(it, steps if steps >= 0 else None):
            record[name] += _keys(batch_)
        states.append(loader.state_dict())
    with open(f"{out}/{phase}-rank{rank}.json", "w") as f:
        json.dump(record, f)
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, states)
    if rank == 0:
        merged = [wds.merge_state_dicts([g[i] for g in gathered])  # type: ignore[index]
                  for i in range(2)]
        with open(f"{out}/{phase}.state", "wb") as f:
            pickle.dump(merged, f)
    dist.barrier()
    if int(exact_steps) >= 0:
        os.kill(os.getpid(), signal.SIGKILL)  # preempted, mid-epoch
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
