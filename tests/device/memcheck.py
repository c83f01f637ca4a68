"""The CPU tier under valgrind's memcheck: every host copy holds what its CPU kernel touches.

``make memcheck`` runs this file under valgrind (``python -m tests.device.memcheck``, which
re-runs itself as the child ``--exercise``) and fails on any invalid read or write outside the
dynamic loader's own (glibc's ld.so reads past strings on purpose; memcheck reports those in
every process). AddressSanitizer cannot prove this: the overruns the tier must prevent happen
inside PyTorch's CPU kernels, which are not instrumented, while memcheck checks every access
against the heap blocks' bounds. The exercise is the tier's mechanism (``host.run``) on the
layouts that once overran the host copy: expanded and stride-0 parameters and gradients of the
fused optimizers, and out= tensors the kernel grows and restrides (rank-deficient lstsq).
About 30 minutes on a busy 2-core machine (valgrind runs torch's import 50x slower).
"""

import os
import re
import subprocess
import sys

LOADER = re.compile(r"\b(dl-load\.c|dl-open\.c|dl-deps\.c|rtld\.c|_dl_\w+)")


def exercise():
    import torch

    from eagerdecomp.device.refdev import reference_device
    from eagerdecomp.runtime import library

    dev = reference_device()
    run = library.load().host.run
    aten = torch.ops.aten
    kw = dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    for where in ("param", "grad"):
        # the expanded row inside a (6, 8) base, and alone in its storage: there eager's own kernel
        # reads and writes past the block (its undefined behaviour); the tier's host copy has room
        for base_rows in (6, 1):
            base = torch.randn(base_rows, 8).to(dev)
            exp = base[:1].expand(6, 8)
            p = exp if where == "param" else torch.randn(6, 8).to(dev)
            g = exp if where == "grad" else torch.ones(6, 8).to(dev)
            ea, es = torch.ones(6, 8).to(dev), torch.ones(6, 8).to(dev)
            run(aten._fused_adamw_.default, ([p], [g], [ea], [es], [], [torch.tensor(1.0).to(dev)]), kw, dev)
    A = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0], [4.0, 8.0]]).to(dev)
    B = torch.arange(12.0).view(4, 3).to(dev)
    for driver in ("gelsd", "gelsy", "gelss"):
        outs = dict(solution=torch.empty(0), residuals=torch.empty(0), rank=torch.empty(0, dtype=torch.long))
        outs["singular_values"] = torch.empty(0)
        run(aten.linalg_lstsq.out, (A, B), dict(driver=driver, **{k: v.to(dev) for k, v in outs.items()}), dev)
    out = torch.empty(2, 8).to(dev)[:, ::2]  # an out= grown and restrided by cumsum
    run(aten.cumsum.out, (torch.randn(12, 8).to(dev), 0), dict(out=out), dev)
    print("exercise done", flush=True)
    os._exit(0)  # NOTE: torch's teardown under valgrind takes minutes and checks nothing of ours


def errors(log: str) -> list:
    """memcheck's invalid accesses, each as its block of lines, the loader's own left out."""
    blocks = re.split(r"==\d+== \n", log)
    return [b for b in blocks if re.search(r"Invalid (read|write)", b) and not LOADER.search(b)]


def main() -> int:
    cmd = ["valgrind", "--tool=memcheck", "--leak-check=no", "--undef-value-errors=no", "--error-limit=no"]
    env = dict(os.environ, PYTHONMALLOC="malloc")  # every Python object a heap block memcheck knows
    proc = subprocess.run([*cmd, sys.executable, __file__, "--exercise"], env=env, capture_output=True, text=True)
    found = errors(proc.stderr)
    print(proc.stdout.strip())
    for b in found:
        print(b)
    ok = proc.returncode == 0 and "exercise done" in proc.stdout and not found
    verdict = "ok" if ok else "FAILED"
    print(f"memcheck: {len(found)} invalid accesses outside the loader; exit {proc.returncode}: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    if "--exercise" in sys.argv:
        exercise()
    else:
        sys.exit(main())
