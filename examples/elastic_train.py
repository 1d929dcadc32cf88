"""Elastic PyTorch training under `horovodrun --host-discovery-script ...`.

The data set is generated (a fixed random teacher network labels Gaussian inputs), so it works
offline and every run is comparable. Progress lines, printed by rank 0, are what the tests and
benchmarks read:

    STEP <n> size=<workers> loss=<batch loss> t=<unix time>
    DONE steps=<n> size=<workers> eval_before=<loss> eval_after=<loss> resets=<n>
    RESUMED step=<n> from <path>
    SAVED step=<n> (asked by the launcher before a stop)

With a checkpoint directory (the job's sharedVolume: CHECKPOINT_DIR, which the operator gives
the launcher and horovodrun passes on), rank 0 saves the committed state there at each commit,
and a fresh run (a resume, an eviction, a new launcher) goes on from it: at most one commit's
steps are lost to a stop, as Horovod's own resets go back to the last commit; none where the
stop asks for a save first (savepoint.py: the operator's launcher does).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

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
from savepoint import SaveRequests, hold

gc.freeze()
gc.enable()

FEATURES, CLASSES = 32, 4
CHECKPOINT = "elastic_train.pt"
SAVED = ("model", "optimizer", "step", "eval_before")  # what a checkpoint holds


def teacher_batch(gen: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels from a fixed random teacher: learnable, never downloaded."""
    teacher = torch.Generator().manual_seed(1234)
    w = torch.randn(FEATURES, CLASSES, generator=teacher)
    x = torch.randn(size, FEATURES, generator=gen)
    return x, (x @ w).argmax(dim=1)


def model_() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES)
    )


def evaluate(model: torch.nn.Module) -> float:
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in teacher_batch(torch.Generator().manual_seed(99), 2048))
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02, help="per-worker learning rate")
    p.add_argument("--commit-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.0, help="simulated extra compute")
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR", ""))
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    # One GPU a rank when there are GPUs (examples/training_job_gpu.yaml), else the CPU.
    device = torch.device("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    model = model_().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    eval_before = evaluate(model) if hvd.rank() == 0 else 0.0
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, step=0, eval_before=eval_before, resets=0
    )

    def on_reset() -> None:
        # The learning rate follows the number of workers (linear scaling rule).
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        state.resets += 1

    state.register_reset_callbacks([on_reset])
    found = hvd_state.load(args.checkpoint_dir, CHECKPOINT, state, SAVED)
    if found and hvd.rank() == 0:
        print(f"RESUMED step={state.step} from {found}", flush=True)
    saves = os.path.join(args.checkpoint_dir, CHECKPOINT)
    # Every rank watches (rank 0 answers): after a reset another process may be rank 0.
    requests = SaveRequests(args.checkpoint_dir)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        gen = torch.Generator().manual_seed(10_000 * state.step + hvd.rank())
        while state.step < args.steps:
            x, y = (t.to(device) for t in teacher_batch(gen, args.batch_size))
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            state.step += 1
            if hvd.rank() == 0:
                print(
                    f"STEP {state.step} size={hvd.size()} loss={loss.item():.4f} "
                    f"t={time.time():.3f}",
                    flush=True,
                )
            if state.step % args.commit_every == 0:
                state.commit()
                if hvd.rank() == 0 and args.checkpoint_dir:
                    hvd_state.save(saves, state, SAVED)
            if hvd.rank() == 0 and requests.asked():  # the run stops: save this step, no more
                hvd_state.save(saves, state, SAVED)
                requests.report(state.step)
                print(f"SAVED step={state.step}", flush=True)
                hold()
            time.sleep(args.step_sleep)

    train(state)
    if hvd.rank() == 0:
        print(
            f"DONE steps={state.step} size={hvd.size()} eval_before={state.eval_before:.4f} "
            f"eval_after={evaluate(model):.4f} resets={state.resets}",
            flush=True,
        )


if __name__ == "__main__":
    main()
