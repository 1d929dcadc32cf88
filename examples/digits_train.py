"""Elastic training on a real data set: scikit-learn's 8x8 digits (1,797 images, shipped inside
the package, so nothing is downloaded), run under `horovodrun --host-discovery-script ...`.

Each epoch is sharded across the ranks by `hvd.elastic.ElasticSampler`, whose progress is part
of the committed `TorchState`: after a resize the epoch goes on with the samples not yet seen
(none repeated, none skipped); after a worker failure training rolls back to the last commit
and only what came after it is trained again. The learning rate follows the number of workers.

Rank 0 prints, for the tests and benchmarks:
    EPOCH <n> size=<workers> test_accuracy=<fraction> t=<unix time>
    DONE epochs=<n> size=<workers> test_accuracy=<fraction> resets=<n> samples_per_s=<rate>
With --log-samples DIR each rank appends the sample indices it trained to DIR/rank-<r>.log as
`<epoch> <commit> <index> ...` lines (a test checks every sample of every epoch was trained).
"""

from __future__ import annotations

import argparse
import os
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def data() -> tuple[torch.utils.data.TensorDataset, torch.Tensor, torch.Tensor]:
    """The digits, scaled to [0, 1], split 80/20 with a fixed seed (the same split everywhere)."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=0, stratify=y
    )
    train = torch.utils.data.TensorDataset(
        torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train)
    )
    return train, torch.tensor(x_test, dtype=torch.float32), torch.tensor(y_test)


def model_() -> torch.nn.Module:
    torch.manual_seed(7)  # every rank starts from the same weights
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="per worker (scaled by their number)")
    p.add_argument("--commit-every", type=int, default=5, help="batches between commits")
    p.add_argument("--log-samples", default="", help="a directory: log the indices trained")
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    train, x_test, y_test = data()
    model = model_()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train, shuffle=True, seed=1)
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, sampler=sampler, epoch=0, commits=0, resets=0
    )

    def on_reset() -> None:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        state.resets += 1

    state.register_reset_callbacks([on_reset])
    log = None
    if args.log_samples:
        os.makedirs(args.log_samples, exist_ok=True)
        log = open(os.path.join(args.log_samples, f"rank-{hvd.rank()}.log"), "a")  # noqa: SIM115

    started = time.time()
    trained = 0

    @hvd.elastic.run
    def run(state: hvd.elastic.TorchState) -> None:
        nonlocal trained
        while state.epoch < args.epochs:
            # The sampler's order for what is left of this epoch on this rank (after a resize:
            # the samples no rank has trained yet, shared out anew).
            loader = torch.utils.data.DataLoader(
                train, batch_size=args.batch_size, sampler=state.sampler
            )
            order = list(iter(state.sampler))
            for i, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                done, order = order[: len(x)], order[len(x) :]
                trained += len(x)
                if log is not None:
                    print(state.epoch, state.commits, *done, file=log, flush=True)
                state.sampler.record_batch(i, args.batch_size)
                if (i + 1) % args.commit_every == 0:
                    state.commits += 1
                    state.commit()  # also where a host change is noticed (no rollback)
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
            state.commits += 1
            state.commit()

    run(state)
    if hvd.rank() == 0:
        rate = trained * hvd.size() / max(time.time() - started, 1e-9)
        print(
            f"DONE epochs={args.epochs} size={hvd.size()} "
            f"test_accuracy={accuracy(model, x_test, y_test):.4f} resets={state.resets} "
            f"samples_per_s={rate:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
