"""Elastic training on a real data set: scikit-learn's 8x8 digits (1,797 images, shipped inside
the package, so nothing is downloaded) with a small CNN, run under
`horovodrun --host-discovery-script ...`.

Each epoch is sharded across the ranks by `hvd.elastic.ElasticSampler`, whose progress is part
of the committed `TorchState`: after a resize the epoch goes on with the samples not yet seen
(none repeated, none skipped); after a worker failure training rolls back to the last commit
and only what came after it is trained again. The learning rate follows the number of workers
(and a cosine schedule over the epochs, so that where a run ends does not hang on its last
few batches).

With a checkpoint directory (the job's sharedVolume: CHECKPOINT_DIR) rank 0 also saves the
committed state there (model, optimizer, epoch, the sampler's position in it) every
--save-every commits, and answers the launcher's save request before a stop (savepoint.py):
a fresh run (a resume, an eviction, a new launcher) goes on from the sample where the last
one stopped.

Rank 0 prints, for the tests and benchmarks:
    EPOCH <n> size=<workers> test_accuracy=<fraction> t=<unix time>
    RESUMED step=<n> epoch=<n> position=<samples done in it> from <path>
    SAVED step=<n> (asked by the launcher before a stop)
    DONE epochs=<n> size=<workers> test_accuracy=<fraction> resets=<n>
With --log-samples DIR every worker process appends the sample indices it trained to its own
file in DIR, a line a batch: `<epoch> <commit> <attempt> <t> <index> ...`, where `commit` is
the number of commits before the batch, `attempt` counts this process's resets and `t` is the
time (tests/support/samples.py reads them).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import socket
import time
from typing import IO

# A rank's start is mostly its imports, and a third of theirs was Python's cycle collector
# sweeping what they made (3.2 -> 2.2 CPU-s here): off while they load, their objects then
# frozen out of its sweeps.
gc.disable()
import horovod.torch as hvd
import hvd_state
import torch

# Making the first optimizer imports PyTorch's compiler stack (torch._dynamo: 2-3 s of CPU, far
# more on a busy node). Imported here, before hvd.init(): a rank joining a running job pays it
# before its rendezvous while the ranks already training go on (after it, they would wait for
# it in their first sync).
import torch._dynamo
import torch.nn.functional as F
from digits_data import accuracy, data, model_
from savepoint import SaveRequests, hold

gc.freeze()
gc.enable()

CHECKPOINT = "digits_train.pt"
# What a checkpoint holds; `steps` counts the job's batches (every rank's i-th batch once).
SAVED = ("model", "optimizer", "sampler", "epoch", "commits", "steps")


def learning_rate(args: argparse.Namespace, epoch: int) -> float:
    """Linear in the number of workers, cosine over the epochs."""
    return args.lr * hvd.size() * 0.5 * (1 + math.cos(math.pi * epoch / args.epochs))


def sample_log(directory: str) -> IO[str] | None:
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    # One file a process: ranks are renumbered at each resize, processes are not.
    name = f"{socket.gethostname()}-{os.getpid()}.log"
    return open(os.path.join(directory, name), "a")


class Saves:
    """Rank 0's saves to the checkpoint directory (none without one): every `every` commits
    (a save is about 1 MB written and synced: at each commit it cost 6 % of the speed here),
    and when the launcher asks before a stop (then no further step: it would be lost)."""

    def __init__(self, directory: str, every: int) -> None:
        self.path = os.path.join(directory, CHECKPOINT) if directory else ""
        self.every = every
        # Every rank watches (rank 0 answers): after a reset another process may be rank 0.
        self.requests = SaveRequests(directory)

    def commit(self, state: hvd.elastic.TorchState) -> None:
        """`state` committed (also where Horovod notices a host change: no rollback), and
        saved every `every` commits."""
        state.commits += 1
        state.commit()
        if state.commits % self.every == 0:
            self.save(state)

    def save(self, state: hvd.elastic.TorchState) -> None:
        if self.path and hvd.rank() == 0:
            hvd_state.save(self.path, state, SAVED)

    def answer(self, state: hvd.elastic.TorchState) -> None:
        if self.path and hvd.rank() == 0 and self.requests.asked():
            self.save(state)
            self.requests.report(state.steps)
            print(f"SAVED step={state.steps}", flush=True)
            hold()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per worker (scaled by their number)")
    p.add_argument("--commit-every", type=int, default=5, help="batches between commits")
    p.add_argument("--log-samples", default="", help="a directory: log the indices trained")
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR", ""))
    p.add_argument("--save-every", type=int, default=5, help="commits between saves")
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    # One GPU a rank when there are GPUs (examples/training_job_gpu.yaml), else the CPU.
    device = torch.device("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    train, x_test, y_test = data()
    x_test, y_test = x_test.to(device), y_test.to(device)
    model = model_().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate(args, 0), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train, shuffle=True, seed=1)
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, sampler=sampler, epoch=0, commits=0, steps=0, resets=0
    )
    attempt = 0

    def on_reset() -> None:
        nonlocal attempt
        attempt += 1
        state.resets += 1
        # Horovod skips its state sync when workers were only removed, and with it the
        # sampler's re-partitioning: it would go on striding by the old number of ranks and
        # skip the shares of the ranks that left (horovod/horovod#3143). Re-partition here;
        # the committed progress (processed_num) is the same on every rank.
        state.sampler.reset()

    state.register_reset_callbacks([on_reset])
    found = hvd_state.load(args.checkpoint_dir, CHECKPOINT, state, SAVED)
    if found and hvd.rank() == 0:
        done = state.sampler.processed_num
        print(f"RESUMED step={state.steps} epoch={state.epoch} position={done} from {found}",
              flush=True)  # fmt: skip
    log = sample_log(args.log_samples)
    saves = Saves(args.checkpoint_dir, args.save_every)

    @hvd.elastic.run
    def run(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(args, state.epoch)
            # The sampler's order for what is left of this epoch on this rank (after a resize:
            # the samples no rank has trained yet, shared out anew).
            loader = torch.utils.data.DataLoader(
                train, batch_size=args.batch_size, sampler=state.sampler
            )
            order = list(iter(state.sampler)) if log is not None else []  # for the log only
            for i, (x, y) in enumerate(loader):
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                if log is not None:
                    batch = order[i * args.batch_size : (i + 1) * args.batch_size]
                    when = f"{time.time():.3f}"
                    print(state.epoch, state.commits, attempt, when, *batch, file=log, flush=True)
                state.sampler.record_batch(i, args.batch_size)
                state.steps += 1
                if (i + 1) % args.commit_every == 0:
                    saves.commit(state)
                saves.answer(state)
            if hvd.rank() == 0:
                acc = accuracy(model, x_test, y_test)
                print(
                    f"EPOCH {state.epoch} size={hvd.size()} test_accuracy={acc:.4f} "
                    f"t={time.time():.3f}",
                    flush=True,
                )
            # The epoch ends: a new order, nothing processed yet (set at the end, not the start,
            # so that a restart mid-epoch keeps what was done).
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            saves.commit(state)

    run(state)
    if hvd.rank() == 0:
        print(
            f"DONE epochs={args.epochs} size={hvd.size()} "
            f"test_accuracy={accuracy(model, x_test, y_test):.4f} resets={state.resets}",
            flush=True,
        )


if __name__ == "__main__":
    main()
