"""
Measuring a step: its time (wall or CPU, a GPU synchronised), the memory it needs at its peak, its FLOPs (with
the fused attention kernels' causal share), the machine's sustained matrix-product rate beside it, and the small
helpers of bench.py's tables. torch and numpy only.
"""

import contextlib
import ctypes
import gc
import math
import time

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count


# ----------------------------------------------------------------------------------------------
# Time, peak memory, FLOPs, the matmul rate

def synchronize(device):
    """Wait for the work queued on a GPU, so that a time or a memory peak covers all of it (CPU: nothing queued)."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def timed(fn, device, n=1, clock="wall"):
    """Milliseconds per call of fn, over n calls. clock "wall": elapsed time (a GPU: synchronised);
    "cpu": CPU time of this process (with one thread: the time on a core of its own, whatever else runs)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    synchronize(device)
    t0 = now()
    for _ in range(n):
        fn()
    synchronize(device)
    return (now() - t0) * 1000 / n


def trim_heap():
    """Hand the heap's free memory back to the system (glibc's malloc_trim). Without it, a step that allocates
    what the last one freed reuses pages that are already resident, and its peak goes unseen (a step of 30 MiB
    measured 10, 10, 0 and 20 MiB in a row; with it 30 each time)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):                        # not glibc: nothing to hand back this way
        pass


def keep_freed_memory(threshold=32 * 2 ** 20):
    """Keep freed blocks up to `threshold` bytes in the heap for the next training step (glibc's mallopt; elsewhere
    nothing). By default glibc maps a large block afresh for each allocation and unmaps it when it is freed, so the
    step's tensors are faulted in page by page at every step: 9,000 page faults a step for SimpleTRON at 2,048
    tokens (4 layers x 128), 8 with this, at the same peak memory."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)                          # M_MMAP_THRESHOLD: larger blocks are still mapped
        libc.mallopt(-1, 8 * threshold)                      # M_TRIM_THRESHOLD: free heap kept before trimming


def rss_mb(field, path="/proc/self/status"):
    """VmRSS (resident now) or VmHWM (the peak since the last reset) of this process, in MiB (Linux; from
    /proc/meminfo: MemAvailable)."""
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_memory(fn, device):
    """MiB that fn() needs at its peak above what was in use just before it.
    CUDA: torch.cuda.max_memory_allocated (tensors). CPU (Linux): the peak resident set size of the process
    (VmHWM) minus the resident size before. MPS keeps no peak: nan."""
    kind = torch.device(device).type
    if kind == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20
    if kind != "cpu":
        return float("nan")
    gc.collect()
    trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:      # "5": the peak VmHWM starts again from the size now
            f.write("5")
        base = rss_mb("VmRSS")
        fn()
        return rss_mb("VmHWM") - base
    except OSError:
        return float("nan")                                 # not Linux: no cheap peak RSS


def attention_flops(op):
    """The FLOP count of one fused attention kernel (forward or backward; CPU, FlashAttention, memory-efficient,
    cuDNN), read from its arguments by name: torch's formula, times the causal share (L + 1) / 2L when the kernel
    computes the scores on and below the diagonal only (torch's formula counts the whole L x L)."""
    names = [a.name for a in op.default._schema.arguments]
    backward = names[0].startswith("grad_out")

    def count(*args, out_val=None, **kwargs):
        a = {**dict(zip(names, args)), **kwargs}
        q, k, v = a["query"].shape, a["key"].shape, a["value"].shape
        flops = sdpa_backward_flop_count(args[0].shape, q, k, v) if backward else sdpa_flop_count(q, k, v)
        return flops * (q[-2] + 1) / (2 * q[-2]) if a.get("is_causal") else flops
    count._get_raw = True                                    # the counter passes the arguments
    return count


ATTENTION_KERNELS = [f"_scaled_dot_product_{kind}{part}" for part in ("", "_backward") for kind in
                     ("flash_attention_for_cpu", "flash_attention", "efficient_attention", "cudnn_attention")]


def count_flops(fn):
    """Floating-point operations of fn() by torch.utils.flop_counter (matrix products and attention; the fused
    attention kernels counted with their causal share, the CPU one, which the counter does not know, added)."""
    aten = torch.ops.aten
    custom = {getattr(aten, k): attention_flops(getattr(aten, k)) for k in ATTENTION_KERNELS if hasattr(aten, k)}
    with FlopCounterMode(display=False, custom_mapping=custom) as counter:
        fn()
    return counter.get_total_flops()


def step_cost(step, weights=()):
    """(FLOPs, bytes) of step(), a forward and backward pass: the bytes of the tensors it keeps for the backward
    pass (each storage once, the weights' own left out), and four times the weights' (the weights, gradients and
    AdamW's two moments)."""
    own = {p.untyped_storage().data_ptr() for p in weights}
    kept = {}

    def keep(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        flops = count_flops(step)
    return flops, 4 * sum(p.numel() * p.element_size() for p in weights) + sum(
        n for ptr, n in kept.items() if ptr not in own)


def matmul_size(device, dtype=torch.float32):
    """The side of matmul_rate's products: 8192 on a GPU (a 2048 product takes it microseconds); on a CPU 2048 in
    float32, 512 in a half type (a CPU without bfloat16 units emulates it: 1.3 GFLOP/s measured on an AMD EPYC
    Zen 3, 25x slower than float32, where 20 products of 2048 took 4 minutes)."""
    if torch.device(device).type != "cpu":
        return 8192
    return 2048 if dtype in (torch.float32, torch.float64) else 512


def matmul_rate(device, dtype, clock, n=None, count=20):
    """The machine's sustained matrix-product rate, FLOP/s: `count` back-to-back n x n products (2 n^3 each; n:
    matmul_size) in `dtype`, on the clock the models are timed with."""
    n = n or matmul_size(device, dtype)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))   # (what they hold does not matter)
    out = torch.empty_like(a)

    def products():
        for _ in range(count):
            torch.mm(a, b, out=out)
    return 2 * n ** 3 * count / (timed(products, device, 1, clock) / 1000)


def interleaved_rounds(n, repeats, measure):
    """measure(i) for every configuration i once per round, in reverse order every other round: a slow spell of
    the machine (another program, a clock change) falls on every configuration alike."""
    for r in range(repeats):
        order = list(range(n))
        if r % 2:
            order.reverse()
        for i in order:
            measure(i)
        print(f"  round {r + 1}/{repeats} done", flush=True)


# dense bfloat16 tensor-core peaks, TFLOP/s, by the device name's words (the first that matches)
PEAK_BF16_TFLOPS = (("H100 PCIe", 756), ("H100 NVL", 835), ("H100", 989), ("H200", 989), ("B200", 2250),
                    ("A100", 312), ("L40S", 362), ("L4", 121))


def peak_flops(device_name):
    """The dense bfloat16 peak FLOP/s of the GPU so named (torch.cuda.get_device_name), or None if not known."""
    return next((t * 1e12 for key, t in PEAK_BF16_TFLOPS if key in device_name), None)


def md_table(header, rows, left=1):
    """Markdown lines of a table: the first `left` columns flush left, the others (numbers) right."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * left + "---:|" * (len(header) - left),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def crossover(points):
    """Where a ratio (speed-up) crosses 1 going up, from points [(length, ratio)]: {"text", "crossover": the length
    by log-log interpolation between the two measured around it, or None}."""
    faster = [L for L, r in points if r >= 1]
    if len(faster) in (0, len(points)):
        return {"text": f"at {'every length' if faster else 'none of the lengths'} measured ({points[0][0]:,}-"
                        f"{points[-1][0]:,})", "crossover": None}
    if faster != [L for L, _ in points[-len(faster):]]:       # not slower below a length and faster from there on
        return {"text": "at " + ", ".join(f"{L:,}" for L in faster) + " tokens only", "crossover": None}
    (L1, r1), (L2, r2) = points[-len(faster) - 1:][:2]
    at = L1 * (L2 / L1) ** (math.log(1 / r1) / math.log(r2 / r1))
    return {"text": f"between {L1:,} and {L2:,} tokens (about {at:,.0f})", "crossover": at}


def quadratic(n, f1, f2, f4):
    """The function a + b L + c L^2 through (n, f1), (2n, f2), (4n, f4) (exact: a linear cost keeps c = 0)."""
    c = (f4 - 3 * f2 + 2 * f1) / (6 * n * n)
    b = (f2 - f1) / n - 3 * c * n
    return lambda L: f1 + b * (L - n) + c * (L * L - n * n)
