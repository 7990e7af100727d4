"""One training process for tests/spec/test_resume.py: reads a spec through two DataLoader
workers (WebLoader or torchdata's StatefulDataLoader), writes the keys and sources of every
batch; ``stop K`` saves the state after K batches and dies (``os._exit``), ``resume`` loads it
and goes on to the end."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import sys

import wds_cloud as wds

EPOCHS, BATCHES, BATCH, BUFFER = 2, 60, 16, 1000


def main(spec: str, loader_kind: str, mode: str, out: str, state_file: str, k: int) -> None:
    dataset = (wds.WebDataset(spec).shuffle(BUFFER).to_tuple("__key__", "__source__")
               .batched(BATCH).with_epoch(nbatches=BATCHES))
    if loader_kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(dataset, batch_size=None, num_workers=2)
    else:
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    first_epoch, stream = 0, []
    if mode == "resume":
        with open(state_file, "rb") as f:
            saved = pickle.load(f)
        loader.load_state_dict(saved["loader"])
        first_epoch = saved["epoch"]
    for epoch in range(first_epoch, EPOCHS):
        for keys, sources in loader:
            stream.append([list(keys), list(sources)])
            if mode == "stop" and len(stream) == k:
                state = loader.state_dict()
                with open(state_file, "wb") as f:
                    pickle.dump({"loader": state, "epoch": epoch}, f)
                with open(out, "w") as f:
                    json.dump({"stream": stream, "state_bytes": len(pickle.dumps(state))}, f)
                for child in multiprocessing.active_children():
                    child.kill()  # the job is killed: its workers too
                os._exit(0)  # nothing is closed or flushed
    with open(out, "w") as f:
        json.dump({"stream": stream, "io": wds.io_stats()}, f)


if __name__ == "__main__":
    main(*sys.argv[1:6], int(sys.argv[6]))
