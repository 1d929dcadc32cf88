"""The digits example (../digits_train.py) under torchrun: scikit-learn's 8x8 digits and the
same small CNN, learning rate and schedule, elastic through checkpoints instead of Horovod's
committed state.

torchrun restarts every worker process at each membership change, so the script starts over
each time from the newest checkpoint on the shared volume: the model, the optimizer, the epoch
and how far into the epoch's order training got. Each epoch has one order of the samples (a
permutation seeded by the epoch), and each step takes the next `--batch-size` samples a rank,
so a resumed run goes on with the samples no rank has trained yet, shared out among however
many ranks there are now: none repeated within an epoch, none skipped. A checkpoint is saved
atomically every --save-every steps, at a step's end when torchrun's agent stops the process
(the SIGTERM of a membership change, held until the step in progress ends: nothing is
trained twice), and when the operator asks before a stop
(examples/savepoint.py); a killed worker rolls training back to the last save.

Rank 0 prints the lines ../digits_train.py does and train.py's STEP and START lines, read by
the tests and benchmarks:
    START size=<workers> restarts=<failures torchrun's agent has restarted after>
    STEP <n> size=<workers> loss=<batch loss> first=<position in the epoch> t=<unix time>
    EPOCH <n> size=<workers> test_accuracy=<fraction> t=<unix time>
    DONE epochs=<n> size=<workers> test_accuracy=<fraction> resets=<restarts of this run>
With --log-samples DIR every rank appends each batch's sample indices to a file of its own,
`<epoch> <position> <start> <t> <index> ...` (`position`: the step's place in the epoch's
order, `start`: when this process started, in ms): a later run that resumed from a save at
or before a batch's place trained it again, and that batch's update was lost with its run.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import sys
import time
from typing import IO, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from digits_data import accuracy, data, model_  # the Horovod example's data and model
from savepoint import SaveRequests, hold, write_whole

CHECKPOINT = "digits.pt"
PEER_GRACE = 5.0  # seconds a rank whose peer stopped waits for its own agent's stop
LIVES_WITH_THE_PROCESS: list[Any] = []  # train.py says why


class State:
    """What a checkpoint holds: enough to go on exactly where the last save was."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt
        self.step = self.epoch = self.position = 0
        # A step, from its batch to its record (the update, the sample log, the counters): a
        # stop meanwhile waits for its end (ms; a collective cut by a stopped peer raises at
        # once), so that what the log says was trained is what the saved model holds.
        self.busy = self.stopping = False

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, CHECKPOINT)
        saved = {"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                 "step": self.step, "epoch": self.epoch, "position": self.position}  # fmt: skip
        write_whole(path, lambda tmp: torch.save(saved, tmp))

    def load(self, directory: str) -> bool:
        path = os.path.join(directory, CHECKPOINT)
        if not os.path.exists(path):
            return False
        saved: dict[str, Any] = torch.load(path, weights_only=True)
        self.model.load_state_dict(saved["model"])
        self.opt.load_state_dict(saved["opt"])
        self.step, self.epoch, self.position = saved["step"], saved["epoch"], saved["position"]
        return True


def order(epoch: int, n: int) -> list[int]:
    """The epoch's order of the n samples: the same on every rank and in every run."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(1 + epoch)).tolist()


def share(order_: list[int], position: int, per_rank: int, rank: int, world: int) -> list[int]:
    """This rank's samples of the step at `position`. The epoch's last step splits what is
    left evenly, padded from the epoch's start so that every rank has as many (at most
    world - 1 repeats, as a distributed sampler's padding)."""
    left = len(order_) - position
    if left >= per_rank * world:
        at = position + rank * per_rank
        return order_[at : at + per_rank]
    each = math.ceil(left / world)
    padded = order_[position:] + order_[: each * world - left]
    return padded[rank * each : (rank + 1) * each]


def learning_rate(lr: float, world: int, epoch: int, epochs: int) -> float:
    """As ../digits_train.py: linear in the number of workers, cosine over the epochs."""
    return lr * world * 0.5 * (1 + math.cos(math.pi * epoch / epochs))


def sample_log(directory: str) -> IO[str] | None:
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    return open(os.path.join(directory, f"{socket.gethostname()}-{os.getpid()}.log"), "a")


class Run:
    """This process's part of the run: its rank, the model and its checkpoint, its stops."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.train, self.x_test, self.y_test = data()
        model = model_()
        self.state = State(model, torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
        self.state.load(args.checkpoints)
        self.ddp = DistributedDataParallel(model)
        LIVES_WITH_THE_PROCESS.append(self.ddp)  # as train.py's: no teardown mid-flight
        self.requests = SaveRequests(args.checkpoints if self.rank == 0 else "")
        self.log, self.started = sample_log(args.log_samples), int(time.time() * 1000)
        signal.signal(signal.SIGTERM, self.stopped)

    def save(self) -> None:
        """Rank 0's save, reported to a save request (if any comes)."""
        self.state.save(self.args.checkpoints)
        self.requests.report(self.state.step)

    def stop_now(self) -> None:
        if self.rank == 0:
            self.save()
        sys.exit(128 + signal.SIGTERM)

    def stopped(self, _signum: int, _frame: Any) -> None:
        if self.state.busy:
            self.state.stopping = True
        else:
            self.stop_now()

    def step(self, order_: list[int]) -> None:
        """One step: this rank's share of the batch at the epoch's position."""
        s, x, y = self.state, *self.train.tensors
        mine = share(order_, s.position, self.args.batch_size, self.rank, self.world)
        s.busy = True
        try:
            loss = F.cross_entropy(self.ddp(x[mine]), y[mine])
            s.opt.zero_grad()
            loss.backward()
        except RuntimeError:
            s.busy = False
            if s.stopping:
                self.stop_now()
            time.sleep(PEER_GRACE)  # a peer stopped: the agent's stop of this one comes
            raise
        if self.log is not None:
            print(s.epoch, s.position, self.started, f"{time.time():.3f}", *mine,
                  file=self.log, flush=True)  # fmt: skip
        s.opt.step()
        first, s.step = s.position, s.step + 1
        s.position += min(self.args.batch_size * self.world, len(order_) - s.position)
        if self.rank == 0:
            said = f"STEP {s.step} size={self.world} loss={loss.item():.4f} first={first}"
            print(f"{said} t={time.time():.3f}", flush=True)
        self.step_ends()

    def step_ends(self) -> None:
        self.state.busy = False
        if self.state.stopping:
            self.stop_now()

    def epoch(self) -> None:
        s, args = self.state, self.args
        for group in s.opt.param_groups:
            group["lr"] = learning_rate(args.lr, self.world, s.epoch, args.epochs)
        order_ = order(s.epoch, len(self.train))
        while s.position < len(order_):
            self.step(order_)
            # by the step's number, not this epoch's count: a count restarted at each epoch
            # and each resume left up to twice --save-every steps unsaved
            if self.rank == 0 and s.step % args.save_every == 0:
                s.save(args.checkpoints)
            if self.rank == 0 and self.requests.asked():  # the run stops: save, go no further
                self.save()
                hold()
            time.sleep(args.step_sleep)
        if self.rank == 0:
            acc = accuracy(s.model, self.x_test, self.y_test)
            print(f"EPOCH {s.epoch} size={self.world} test_accuracy={acc:.4f} "
                  f"t={time.time():.3f}", flush=True)  # fmt: skip
        s.busy = True
        s.epoch, s.position = s.epoch + 1, 0
        self.step_ends()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per worker (scaled by their number)")
    p.add_argument("--save-every", type=int, default=5, help="steps between checkpoints")
    p.add_argument("--checkpoints", default=os.environ.get("CHECKPOINT_DIR", "/checkpoints"))
    p.add_argument("--log-samples", default="", help="a directory: log the indices trained")
    p.add_argument("--step-sleep", type=float, default=0.0, help="a demo's pace (seconds)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    run = Run(args)
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if run.rank == 0:
        print(f"START size={run.world} restarts={restarts}", flush=True)
    while run.state.epoch < args.epochs:
        run.epoch()
    if run.rank == 0:
        run.state.save(args.checkpoints)
        acc = accuracy(run.state.model, run.x_test, run.y_test)
        print(f"DONE epochs={args.epochs} size={run.world} test_accuracy={acc:.4f} "
              f"resets={restarts}", flush=True)  # fmt: skip
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
