"""One rank of the two-rank test (tests/spec/test_two_ranks.py), started by torchrun.

Arguments: SPEC OUT_DIR SEED EPOCHS BATCH BATCHES_PER_WORKER [stop:K | resume]. Reads the
spec with 2 DataLoader workers, records (key, source) per sample and the batches per epoch,
and writes them to OUT_DIR/rank<R>.json. ``stop:K`` saves the loader's state after K steps
to OUT_DIR/state<R>.pkl and ends there, and then records the first K batches of a new
loader with the next seed (as ``other_seed``); ``resume`` loads the state (from the OUT_DIR
given) and goes on. A whole run records ``loader.stats()`` too (over both ranks).
"""

from __future__ import annotations

import itertools
import json
import pickle
import sys

import torch.distributed as dist

import wds_cloud as wds


def make_loader(spec: str, seed: int, batch: int, per_worker: int) -> wds.WebLoader:
    dataset = (wds.WebDataset(spec, seed=seed)
               .to_tuple("__key__", "__source__")
               .batched(batch)
               .with_epoch(per_worker))
    return wds.WebLoader(dataset, batch_size=None, num_workers=2)


def main() -> None:
    spec, out_dir, seed, epochs, batch, per_worker = sys.argv[1:7]
    mode = sys.argv[7] if len(sys.argv) > 7 else ""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = make_loader(spec, int(seed), int(batch), int(per_worker))
    record: dict[str, object] = {"rank": rank, "world": world, "epochs": []}
    first, stop = 0, -1
    if mode == "resume":
        with open(f"{out_dir}/state{rank}.pkl", "rb") as f:
            saved = pickle.load(f)
        loader.load_state_dict(saved["loader"])
        first = saved["epoch"]
    elif mode.startswith("stop:"):
        stop = int(mode[5:])
    done = 0
    for epoch in range(first, int(epochs)):
        stream: list[list[str]] = []
        steps = 0
        for keys, sources in loader:
            stream += [[k, s] for k, s in zip(keys, sources, strict=True)]
            steps += 1
            done += 1
            if done == stop:
                with open(f"{out_dir}/state{rank}.pkl", "wb") as f:
                    pickle.dump({"loader": loader.state_dict(), "epoch": epoch}, f)
                break
        record["epochs"].append({"epoch": epoch, "steps": steps, "stream": stream})  # type: ignore[attr-defined]
        if done == stop:
            break
    if not mode:  # summed over both ranks: a collective, on every rank
        record["stats"] = loader.stats()
    if stop > 0:  # streams are a function of the seed
        other = make_loader(spec, int(seed) + 1, int(batch), int(per_worker))
        record["other_seed"] = [[[k, s] for k, s in zip(keys, sources, strict=True)]
                                for keys, sources in itertools.islice(other, stop)]
    dist.barrier()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
