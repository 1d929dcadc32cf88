"""Elastic PyTorch training under torchrun, resuming from its newest checkpoint.

torchrun restarts every worker process at each membership change (a worker joins or leaves),
so the script starts over each time: it loads the newest checkpoint on the shared volume (the
model, the optimizer, the step, the position in the epoch), trains on at the new world size,
and saves atomically every --save-every steps and when it is stopped at a step's end (the
SIGTERM torchrun's agent sends before a restart). What a user's own script needs is the same
few lines: `load()` at start, `save()` every few steps and on SIGTERM, and a short wait for
the agent's stop when a collective fails (PEER_GRACE); under plain torchrun also the DDP model
kept for the process's life (LIVES_WITH_THE_PROCESS: etoperator's agent guards every script).

The data set is generated (a fixed random teacher network labels Gaussian inputs, sample i
from seed i), so it runs offline and every sample has a number: an epoch is samples
0..--epoch-size, each step takes the next global batch, split across the ranks. Lines printed
by rank 0, read by the tests and benchmarks:

    START size=<world> restarts=<failures torchrun's agent has restarted after>
    RESUMED step=<n> epoch=<e> position=<p> from=<path>
    STEP <n> size=<world> loss=<batch loss> first=<first sample> t=<unix time>
    DONE steps=<n> size=<world> eval_before=<loss> eval_after=<loss>

and by every rank, in its own pod's log: `RANK <rank>/<world> joined|ready t=<unix time>`
(joined: the process group formed; ready: DDP's first broadcast done).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from savepoint import SaveRequests, hold, write_whole  # examples/, beside this directory

FEATURES, CLASSES = 32, 4
CHECKPOINT = "checkpoint.pt"
PEER_GRACE = 5.0  # seconds a rank whose peer stopped waits for its own agent's stop
# The DDP model lives as long as the process: torch's teardown of it (its reducer, then gloo's
# process group) holds the GIL while it waits for gloo's threads, one of which may still be
# releasing the last step's work and need the GIL: the process hung at its end (the run never
# ended) or at a stop's SIGTERM. A process that ends frees it whole. etoperator's agent holds
# every worker's process groups to the same end (docs/torchrun.md); plain torchrun does not.
LIVES_WITH_THE_PROCESS: list[Any] = []


def samples(first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples first..first+count-1 of every epoch: the same numbers give the same samples."""
    teacher = torch.Generator().manual_seed(1234)
    w = torch.randn(FEATURES, CLASSES, generator=teacher)
    xs = [
        torch.randn(FEATURES, generator=torch.Generator().manual_seed(i))
        for i in range(first, first + count)
    ]
    x = torch.stack(xs) if xs else torch.zeros(0, FEATURES)
    return x, (x @ w).argmax(dim=1)


def model_() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES)
    )


class State:
    """What a checkpoint holds: enough to go on exactly where the last save was."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt
        self.step = self.epoch = self.position = 0
        # The model, the optimizer and the counters agree (all but while opt.step() and the
        # counters move on): a save now is consistent, mid-step too (a step not finished
        # has changed nothing saved).
        self.at_step_end = True

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, CHECKPOINT)
        saved = {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "position": self.position,
        }
        write_whole(path, lambda tmp: torch.save(saved, tmp))

    def load(self, directory: str) -> str | None:
        path = os.path.join(directory, CHECKPOINT)
        if not os.path.exists(path):
            return None
        saved: dict[str, Any] = torch.load(path, weights_only=True)
        self.model.load_state_dict(saved["model"])
        self.opt.load_state_dict(saved["opt"])
        self.step, self.epoch, self.position = saved["step"], saved["epoch"], saved["position"]
        return path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32, help="global batch (all ranks)")
    p.add_argument("--epoch-size", type=int, default=4096)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--checkpoints", default=os.environ.get("CHECKPOINT_DIR", "/checkpoints"))
    args = p.parse_args()
    # One thread: a model this small gains nothing from more, and each further OpenMP
    # thread spins between steps (a 1-process worker: about 15 % of a core more per rank).
    # torchrun sets OMP_NUM_THREADS=1 only for more than one process per node.
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # Every rank says where it is (its own pod's log): a run that hangs shows who never came.
    print(f"RANK {rank}/{world} joined t={time.time():.3f}", flush=True)
    model = model_()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = State(model, opt)
    found = state.load(args.checkpoints)
    if rank == 0:
        restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        print(f"START size={world} restarts={restarts}", flush=True)
    if rank == 0 and found:
        print(
            f"RESUMED step={state.step} epoch={state.epoch} position={state.position} from={found}",
            flush=True,
        )
    ddp = DistributedDataParallel(model)  # a broadcast: every rank of the round takes part
    LIVES_WITH_THE_PROCESS.append(ddp)
    print(f"RANK {rank}/{world} ready t={time.time():.3f}", flush=True)
    requests = SaveRequests(args.checkpoints if rank == 0 else "")

    def stopped(signum: int, _frame: Any) -> None:
        if rank == 0 and state.at_step_end:
            state.save(args.checkpoints)
            requests.report(state.step)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    held_x, held_y = samples(10**6, 256)
    with torch.no_grad():
        before = F.cross_entropy(model(held_x), held_y).item()
    share = args.batch // world
    while state.step < args.steps:
        if state.position + args.batch > args.epoch_size:
            state.epoch, state.position = state.epoch + 1, 0
        x, y = samples(state.position + rank * share, share)
        try:
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
        except RuntimeError:
            # A peer stopped mid-step. When a node joins or leaves, torchrun's agent stops
            # this process too (SIGTERM, within a moment): that restart is a membership
            # change, not one of --max-restarts. Only when no stop comes is it a failure.
            time.sleep(PEER_GRACE)
            raise
        first = state.position
        state.at_step_end = False
        opt.step()
        state.step, state.position = state.step + 1, state.position + share * world
        state.at_step_end = True
        if rank == 0:
            said = f"STEP {state.step} size={world} loss={loss.item():.4f} first={first}"
            print(f"{said} t={time.time():.3f}", flush=True)
            if state.step % args.save_every == 0:
                state.save(args.checkpoints)
            if requests.asked():  # the run is about to stop: save this step, train no further
                state.save(args.checkpoints)
                requests.report(state.step)
                print(f"SAVED step={state.step}", flush=True)
                hold()
        if args.step_sleep:
            time.sleep(args.step_sleep)
    with torch.no_grad():
        after = F.cross_entropy(model(held_x), held_y).item()
    if rank == 0:
        state.save(args.checkpoints)
        print(
            f"DONE steps={state.step} size={world} eval_before={before:.4f} eval_after={after:.4f}",
            flush=True,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
