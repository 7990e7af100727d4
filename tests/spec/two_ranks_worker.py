"""One rank of the two-rank test (tests/spec/test_two_ranks.py), started by torchrun.

Arguments: SPEC OUT_DIR SEED EPOCHS BATCH BATCHES_PER_WORKER. Reads the spec with 2
DataLoader workers, records (key, source) per sample and the batches per epoch, and writes
them to OUT_DIR/rank<R>.json.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

import wds_cloud as wds


def main() -> None:
    spec, out_dir, seed, epochs, batch, per_worker = sys.argv[1:7]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = (wds.WebDataset(spec, seed=int(seed))
               .to_tuple("__key__", "__source__")
               .batched(int(batch))
               .with_epoch(int(per_worker)))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    record: dict[str, object] = {"rank": rank, "world": world, "epochs": []}
    for epoch in range(int(epochs)):
        stream: list[list[str]] = []
        steps = 0
        for keys, sources in loader:
            stream += [[k, s] for k, s in zip(keys, sources, strict=True)]
            steps += 1
        record["epochs"].append({"epoch": epoch, "steps": steps, "stream": stream})  # type: ignore[attr-defined]
    dist.barrier()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
