"""Whether a Triton kernel may stand in for its torch form on this machine (fastgen's kernels: two_part.py's
attention, lora_stack.py's LoRA term, decode_fuse.py's rotary + K/V write and SiLU-mul). Both forms run on a small
random case and must agree within a tolerance; where they do not, or the kernel does not run on this GPU or build,
one line on stderr says why and the torch form runs.
Nothing here imports project files.
"""
import sys

import torch


def agrees(what, run, dtype):
    """run() -> (the kernel's output, the torch form's output) on the same case. True when they agree within 1e-4
    (fp32) or 3e-2 (bf16/fp16); False, with the reason on stderr, when they differ or run() raises."""
    try:
        got, want = run()
    except Exception as e:     # no kernel for this GPU or build
        print(f"[fastgen] Triton {what} unavailable ({str(e)[:120]})", file=sys.stderr)
        return False
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    if torch.allclose(got.float(), want.float(), atol=tol, rtol=tol):
        return True
    err = (got.float() - want.float()).abs().max().item()
    print(f"[fastgen] Triton {what} differs from the torch form by {err:.3g}; the torch form runs", file=sys.stderr)
    return False
