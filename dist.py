"""Data parallelism for sft.py, rl.py, distill.py and evaluate.py: one process per GPU under `accelerate launch`.

    accelerate launch --multi_gpu --num_processes 4 rl.py ...      # 4 GPUs, one process each
    python -m torch.distributed.run --nproc_per_node 2 rl.py ...    # the same on CPU (gloo; the tests)

Every process holds the whole base model and the LoRA adapter. A step's work is split by rank
(shard: a contiguous block of the prompts or rows), its results are gathered back to every rank
(gather), and after backward the trainable gradients are SUMMED over the ranks (sync_grads) before
clipping and the optimizer step. The scripts normalise their losses by the GLOBAL token count, so the
summed gradient is exactly the gradient of one process on the whole batch, and every rank applies the
same update. Rank 0 alone writes files (rundir.py asks is_main()); the other ranks print nothing.

One process (no WORLD_SIZE, or WORLD_SIZE=1) needs no process group: every function here is then a
no-op or the identity, and accelerate is not even imported.
"""
import atexit
import os
import sys

import torch

_state = None


def world_size():
    """Processes in the run (1 unless launched by accelerate / torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init():
    """Join the process group through accelerate's PartialState (NCCL on GPUs, each rank on its own
    GPU; gloo on CPU). A no-op for one process. Call it before the model is loaded, so that 'cuda'
    means this rank's GPU."""
    global _state
    if _state is None and world_size() > 1:
        from accelerate import PartialState           # heavy import: only when several processes run
        cpu = not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
        _state = PartialState(cpu=cpu)
        if _state.num_processes != world_size():
            raise RuntimeError(f"accelerate sees {_state.num_processes} processes, WORLD_SIZE is {world_size()}")
        if _state.process_index > 0:                  # one console: rank 0 speaks (errors still reach stderr)
            sys.stdout = open(os.devnull, "w")
        atexit.register(shutdown)
    return _state


def shutdown():
    """Leave the process group (at exit: a process that ends with the group still up can abort in its
    communication threads' destructors, 'terminate called without an active exception')."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()      # no barrier: a rank that failed must still exit


def rank():
    return init().process_index if world_size() > 1 else 0


def world():
    return init().num_processes if world_size() > 1 else 1


def is_main():
    return rank() == 0


def cpu_share():
    """This process's share of the machine's cores (all of them for one process): the default size of
    its simulator pool."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, (os.cpu_count() or 1) // max(1, local))


def shard_range(n):
    """[lo, hi) of this rank's contiguous block of n items (sizes differ by at most one; a rank may get
    none when n < world)."""
    r, w = rank(), world()
    return n * r // w, n * (r + 1) // w


def shard(items):
    """This rank's contiguous block of a list; gather(shard(x)) concatenated in rank order is x again."""
    lo, hi = shard_range(len(items))
    return items[lo:hi]


def gather(obj):
    """[rank 0's obj, rank 1's obj, ...] on every rank (picklable python objects); [obj] for one process."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    torch.distributed.all_gather_object(out, obj)
    return out


def gather_lists(items):
    """The rank-ordered concatenation of every rank's list (the inverse of shard)."""
    return [x for part in gather(list(items)) for x in part]


def all_sum(values):
    """Sum of a float or of a list/dict of floats over the ranks (one fp64 all-reduce)."""
    if world() == 1:
        return values
    keys = list(values) if isinstance(values, dict) else None
    flat = [values[k] for k in keys] if keys is not None else (values if isinstance(values, list) else [values])
    t = torch.tensor([float(v) for v in flat], dtype=torch.float64, device=_device())
    torch.distributed.all_reduce(t)
    out = t.tolist()
    if keys is not None:
        return dict(zip(keys, out))
    return out if isinstance(values, list) else out[0]


def sync_grads(params):
    """Sum the gradients of `params` over the ranks, in place (a rank that had no rows contributes
    zeros). One flat fp32 all-reduce: the trainable LoRA tensors are small."""
    if world() == 1:
        return
    params = list(params)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1).float() for p in params])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def broadcast_params(params):
    """Copy rank 0's values of `params` to every rank (start of a run: the same adapter everywhere,
    whatever each rank's initialisation or checkpoint read did)."""
    if world() == 1:
        return
    with torch.no_grad():
        for p in params:
            torch.distributed.broadcast(p.data, src=0)


def barrier():
    if world() > 1:
        torch.distributed.barrier()


def _device():
    return init().device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
