"""
Speed and memory benchmark of the models (nanoGPT's bench.py): time, peak memory, FLOPs, generation.

    python bench.py --out out/analysis --lengths 1024,4096 [--nanogpt /tmp/nanogpt/model.py]
    python bench.py --out out/generate --lengths '' --generate --contexts 256,1024,4096

Writes OUT/speed.json (every configuration), OUT/speed_summary.json (the machine, the ratios, the settings),
OUT/speed.md (a table), OUT/speed.png and, with --generate, OUT/speed_generate.png, and prints the table.

The training step (forward, backward, gradient clipping, AdamW) and the inference forward of each model at each
length, measured in interleaved rounds (medians; ratios as medians of per-round ratios); peak memory, tokens/s,
FLOPs (torch.utils.flop_counter) and FLOP/s; our GPT beside nanoGPT's model.py at nanoGPT's CPU configuration
(--nanogpt PATH, a file outside this project). --models may also name an attention function alone
(simple_attention, causal_simple_attention, softmax_attention). On a shared CPU, --threads 1 --clock cpu measures
CPU time, which other programs disturb far less than wall time.
--generate adds generation: milliseconds per new token after a prompt of each --contexts length (model.prefill,
untimed, then --new_tokens model.decode steps, timed), and the size of the state the model keeps (SimpleTRON,
TransJect: fixed; softmax GPT, DiffEqFormer: the KV cache). With --lengths '' generation alone.
--checkpointing adds each model's training step with Config.checkpointing (every block recomputed in the backward
pass): its peak memory and time beside the plain step's, and the loss and gradient differences between the two
(zero: recomputation repeats the same operations).
"""

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
import types

import numpy as np
import torch

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import data    # noqa: E402
import train   # noqa: E402
from config import Parser, UsageError, check_value, pick_device  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))


def write_json(out, name, obj):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    data.atomic_write_text(path, json.dumps(obj, indent=1, default=float) + "\n")
    return path


def save_fig(fig, out, name):
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# Measuring: time, peak memory, FLOPs

_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
        except OSError:
            _LIBC = False
    return _LIBC


def _rss_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_memory(fn, device):
    """MiB that fn() needs at its peak above what was in use just before it.
    CUDA: torch.cuda.max_memory_allocated (tensors). CPU (Linux): the peak resident set size of the process
    (VmHWM, reset through /proc/self/clear_refs) minus the resident size before, after handing freed heap
    memory back to the system (malloc_trim) so that a reused allocation counts when it is touched again."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    gc.collect()
    libc = _libc()
    if libc:
        libc.malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _rss_mb("VmRSS")
        fn()
        return _rss_mb("VmHWM") - base
    except OSError:
        return float("nan")                                 # not Linux: no cheap peak RSS


def _sdpa_flops(q, k, v, dropout_p=0.0, is_causal=False, *args, **kwargs):
    from torch.utils.flop_counter import sdpa_flop_count
    f = sdpa_flop_count(q.shape, k.shape, v.shape)
    return f * (q.shape[-2] + 1) / (2 * q.shape[-2]) if is_causal else f


def _sdpa_backward_flops(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal=False, *args, **kwargs):
    from torch.utils.flop_counter import sdpa_backward_flop_count
    f = sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)
    return f * (q.shape[-2] + 1) / (2 * q.shape[-2]) if is_causal else f


def count_flops(fn):
    """Floating-point operations of fn() by torch.utils.flop_counter (matrix products and attention; the
    CPU attention kernel is registered here, a causal one counted for the half it computes)."""
    from torch.utils.flop_counter import FlopCounterMode
    aten = torch.ops.aten
    custom = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        def fwd(*a, out_val=None, **kw):
            return _sdpa_flops(*a, **kw)

        def bwd(*a, out_val=None, **kw):
            return _sdpa_backward_flops(*a, **kw)
        fwd._get_raw = bwd._get_raw = True
        custom = {aten._scaled_dot_product_flash_attention_for_cpu: fwd,
                  aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd}
    with FlopCounterMode(display=False, custom_mapping=custom) as counter:
        fn()
    return counter.get_total_flops()


# the models of train.py, and the softmax Transformer with its attention scores written out (TransJect's Table 4)
SPEED_MODELS = {**train.MODELS, "softmax_naive": ("simpletron", {"attention": "softmax_naive", "variant": "vanilla"})}


def speed_model(name, length, args, **extra):
    """The model `name` of SPEED_MODELS with the benchmark's shape (fields a model lacks are left out)."""
    fields = {f.name for f in dataclasses.fields(train.model_module(SPEED_MODELS[name][0]).Config)}
    cfg = dict(SPEED_MODELS[name][1], vocab_size=args.vocab, block_size=length, n_layer=args.n_layer, n_head=args.n_head,
               n_embd=args.n_embd, dropout=0.0, bias=True, head=args.head, n_classes=10, **extra)
    if args.time_dim:
        cfg["time_dim"] = args.time_dim
    if name == "softmax_naive":
        return train.model_module("simpletron").Model(train.model_module("simpletron").Config(
            **{k: v for k, v in cfg.items() if k in fields}))
    return train.build_model(name, {k: v for k, v in cfg.items() if k in fields})


# --models may also name one attention alone (simpletron.py's functions): q, k, v (batch, n_head, length, d)
ATTENTION = {"simple_attention": lambda m, q, k, v, mask: m.simple_attention(q, k, v, mask),
             "causal_simple_attention": lambda m, q, k, v, mask: m.causal_simple_attention(q, k, v),
             "softmax_attention": lambda m, q, k, v, mask: m.softmax_attention(q, k, v, mask, causal=False)}


def attention_steps(name, batch, length, args, device):
    """(train_step, infer_step) of one attention function alone: forward + backward, forward."""
    module = train.model_module("simpletron")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, args.n_head, length, args.n_embd // args.n_head, generator=g).to(device)
               .requires_grad_() for _ in range(3))
    mask = torch.ones(batch, length, dtype=torch.bool, device=device)

    def train_step():
        ATTENTION[name](module, q, k, v, mask).sum().backward()
        q.grad = k.grad = v.grad = None

    def infer_step():
        with torch.no_grad():
            ATTENTION[name](module, q, k, v, mask)
    return {"train": train_step, "infer": infer_step, "flops_train": train_step}


def make_steps(model, batch, length, vocab, head, device):
    """(train_step, infer_step) closures on a fixed random batch."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, vocab, (batch, length), generator=g).to(device)
    y = (torch.randint(0, vocab, (batch, length), generator=g) if head == "lm"
         else torch.randint(0, 10, (batch,), generator=g)).to(device)
    # train.py's AdamW (decay on matrices and embeddings only: nanoGPT's groups too), nanoGPT's CPU betas
    opt = train.make_optimizer(model, types.SimpleNamespace(weight_decay=0.1, lr=1e-3, beta1=0.9, beta2=0.99,
                                                            eps=1e-8, gate_lr_scale=30.0), device)

    def train_step():
        model.train()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer_step():
        model.eval()
        with torch.no_grad():
            model(x)

    def forward_backward():                                  # what the FLOP counter sees of a train step
        model.train()
        _, loss = model(x, y)
        loss.backward()
        opt.zero_grad(set_to_none=True)
    return {"train": train_step, "infer": infer_step, "flops_train": forward_backward}


def checkpointing_difference(model, recomputing, batch, length, vocab, head, device):
    """Largest |difference| of the loss and of any gradient between a model and its copy with checkpointing."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, vocab, (batch, length), generator=g).to(device)
    y = (torch.randint(0, vocab, (batch, length), generator=g) if head == "lm"
         else torch.randint(0, 10, (batch,), generator=g)).to(device)
    losses, grads = [], []
    for m in (model, recomputing):
        m.train()
        _, loss = m(x, y)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
        m.zero_grad(set_to_none=True)
    return abs(losses[0] - losses[1]), max((a - b).abs().max().item() for a, b in zip(*grads, strict=True))


def timed(fn, device, n=1, clock="wall"):
    """Milliseconds per call of fn, over n calls. clock "wall": elapsed time (CUDA: synchronised);
    "cpu": CPU time of this process (with one thread: the time on a core of its own, whatever else runs)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = now()
    for _ in range(n):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (now() - t0) * 1000 / n


def load_nanogpt(path):
    """nanoGPT's model.py, imported from a path outside this project (never copied into it)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UsageError(f"--nanogpt {path}: no such file (bring karpathy/nanoGPT's model.py beside the project)")
    if os.path.commonpath([path, ROOT]) == ROOT:
        raise UsageError("--nanogpt: keep nanoGPT's model.py outside this project (e.g. /tmp/nanogpt/model.py)")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise UsageError(f"--nanogpt {path} does not import ({type(e).__name__}: {e})") from None
    if not hasattr(mod, "GPT") or not hasattr(mod, "GPTConfig"):
        raise UsageError(f"--nanogpt {path} has no GPT and GPTConfig: is it nanoGPT's model.py?")
    return mod


# nanoGPT's README CPU run (shakespeare_char; bias False is its train.py's default)
NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12, vocab=65, bias=False)


def cmd_speed(args):
    device = pick_device(args.device)
    models = [m.strip() for m in args.models.split(",") if m.strip()] if not args.compare_only else []
    for m in models:
        if m not in SPEED_MODELS and m not in ATTENTION:
            raise UsageError(f"unknown model {m!r} in --models; choose from {', '.join([*SPEED_MODELS, *ATTENTION])}")
        train.model_module(SPEED_MODELS[m][0] if m in SPEED_MODELS else "simpletron")  # UsageError if absent
    try:
        lengths = [int(v) for v in args.lengths.split(",") if v.strip()] if not args.compare_only else []
    except ValueError:
        raise UsageError(f"--lengths takes integers separated by commas, not {args.lengths!r}") from None
    try:
        args.context_list = [int(v) for v in args.contexts.split(",") if v.strip()] if args.generate else []
    except ValueError:
        raise UsageError(f"--contexts takes integers separated by commas, not {args.contexts!r}") from None
    if args.generate and (not args.context_list or min(args.context_list) < 1 or args.new_tokens < 1):
        raise UsageError("--generate needs --contexts of at least 1 token and --new_tokens of at least 1")
    nano = load_nanogpt(args.nanogpt) if args.nanogpt else None
    if args.clock not in ("wall", "cpu") or (args.clock == "cpu" and device == "cuda"):
        raise UsageError("--clock is wall, or cpu (CPU time; on a CPU device only)")
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        _speed(args, device, models, lengths, nano)
    finally:
        torch.set_num_threads(threads)


def _speed(args, device, models, lengths, nano):
    torch.manual_seed(0)

    # every configuration: (record, steps)
    configs = []
    for L in lengths:
        for m in models:
            if m in ATTENTION:
                steps, params = attention_steps(m, args.batch, L, args, device), 0
            else:
                model = speed_model(m, L, args).to(device)
                steps = make_steps(model, args.batch, L, args.vocab, args.head, device)
                params = sum(p.numel() for p in model.parameters())
            for mode in ("infer",) if args.infer_only else ("train", "infer"):
                configs.append(({"model": m, "length": L, "mode": mode, "batch": args.batch, "params": params},
                                steps, mode))
            if args.checkpointing and m not in ATTENTION:    # the same weights, every block recomputed
                ck = speed_model(m, L, args, checkpointing=True).to(device)
                ck.load_state_dict(model.state_dict())
                loss_diff, grad_diff = checkpointing_difference(model, ck, args.batch, L, args.vocab, args.head, device)
                configs.append(({"model": m, "length": L, "mode": "train", "batch": args.batch, "params": params,
                                 "config": "checkpointing", "loss_diff": loss_diff, "grad_diff": grad_diff},
                                make_steps(ck, args.batch, L, args.vocab, args.head, device), "train"))
    c = NANOGPT_CPU
    ours = train.build_model("softmax", dict(train.MODELS["softmax"][1], vocab_size=c["vocab"], block_size=c["block_size"],
                                             n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0,
                                             bias=c["bias"], head="lm", norm="pre")).to(device)
    # the comparison with nanoGPT runs unless this is generation alone (--generate --lengths '')
    pair = [("softmax", ours)] if (lengths or nano is not None or not args.generate) and not args.infer_only else []
    if nano is not None:
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            theirs = nano.GPT(nano.GPTConfig(block_size=c["block_size"], vocab_size=c["vocab"], n_layer=c["n_layer"],
                                             n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0, bias=c["bias"])).to(device)
        pair.append(("nanogpt", theirs))
    for name, model in pair:
        steps = make_steps(model, c["batch"], c["block_size"], c["vocab"], "lm", device)
        configs.append(({"model": name, "length": c["block_size"], "mode": "train", "batch": c["batch"],
                         "config": "nanogpt-cpu", "params": sum(p.numel() for p in model.parameters())},
                        steps, "train"))

    print(f"speed on {device} ({torch.get_num_threads()} threads): {len(configs)} configurations, "
          f"{args.repeats} interleaved rounds", flush=True)
    for _, steps, mode in configs:                           # warm-up (allocations, AdamW state)
        steps[mode]()
    times = [[] for _ in configs]
    for r in range(args.repeats if configs else 0):          # interleaved: every round times everything once
        order = list(range(len(configs)))
        if r % 2:
            order.reverse()
        for i in order:
            rec, steps, mode = configs[i]
            n = args.inner if rec.get("config") == "nanogpt-cpu" else 1
            times[i].append(timed(steps[mode], device, n, args.clock))
        print(f"  round {r + 1}/{args.repeats} done", flush=True)
    records = []
    for (rec, steps, mode), ts in zip(configs, times):
        ms = statistics.median(ts)
        flops = count_flops(steps["flops_train" if mode == "train" else "infer"])
        mem = peak_memory(steps[mode], device)
        tokens = rec["batch"] * rec["length"]
        records.append({**rec, "ms": ms, "ms_all": ts, "peak_mem_mb": mem, "tokens_per_s": tokens / (ms / 1000),
                        "flops": flops, "flops_per_s": flops / (ms / 1000)})

    def find(model, L, mode, config=None):
        return next((r for r in records if r["model"] == model and r["length"] == L and r["mode"] == mode
                     and r.get("config") == config), None)
    def paired(a, b):                                        # median over rounds of a's time / b's time
        return float(np.median(np.array(a["ms_all"]) / np.array(b["ms_all"])))
    ratios = []
    for L in lengths:
        for mode in ("train", "infer"):
            for base, others in (("softmax", ("simpletron", "transject", "diffeqformer")),
                                 ("softmax_naive", ("simpletron", "transject", "softmax")),
                                 ("softmax_attention", ("simple_attention", "causal_simple_attention"))):
                g = find(base, L, mode)
                for other in others:
                    o = find(other, L, mode)
                    if g and o:
                        ratios.append({"what": f"{other} / {base} tokens per second", "length": L, "mode": mode,
                                       "ratio": paired(g, o)})
    for L in lengths:
        for m in models:
            a, b = find(m, L, "train"), find(m, L, "train", "checkpointing")
            if a and b:
                ratios.append({"what": f"{m} checkpointing / plain training step, peak memory ({b['peak_mem_mb']:.0f} "
                                       f"/ {a['peak_mem_mb']:.0f} MiB)", "length": L, "mode": "train",
                               "ratio": b["peak_mem_mb"] / a["peak_mem_mb"]})
                ratios.append({"what": f"{m} checkpointing / plain training step, time (loss difference "
                                       f"{b['loss_diff']:.1e}, largest gradient difference {b['grad_diff']:.1e})",
                               "length": L, "mode": "train", "ratio": paired(b, a)})
    if len(lengths) >= 2:
        mode = "infer" if args.infer_only else "train"
        for m in models:
            a, b = find(m, lengths[0], mode), find(m, lengths[-1], mode)
            if a and b:
                ratios.append({"what": f"{m} {'inference forward' if args.infer_only else 'training step'}, ms at "
                                       f"{lengths[-1]} / ms at {lengths[0]} tokens", "ratio": b["ms"] / a["ms"]})
    ng, og = find("nanogpt", c["block_size"], "train", "nanogpt-cpu"), find("softmax", c["block_size"], "train", "nanogpt-cpu")
    if args.generate:
        gen_records, gen_ratios = speed_generate(args, device, [m for m in models if m in train.MODELS])
        records += gen_records
        ratios += gen_ratios
    if ng:
        r = np.array(ng["ms_all"]) / np.array(og["ms_all"])
        ratios.append({"what": "nanoGPT / our GPT ms per iteration (nanoGPT CPU configuration, median of per-round "
                               f"ratios; quartiles {np.quantile(r, 0.25):.3f}-{np.quantile(r, 0.75):.3f})",
                       "ratio": paired(ng, og), "q25": float(np.quantile(r, 0.25)), "q75": float(np.quantile(r, 0.75))})

    machine = {"device": device, "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
               "clock": args.clock, "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
               "cpus": os.cpu_count(), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name() if device == "cuda" else None}
    os.makedirs(args.out, exist_ok=True)
    path = write_json(args.out, "speed", records)
    write_json(args.out, "speed_summary", {"machine": machine, "ratios": ratios, "settings": vars(args),
                                           "peak_mem_mb": PEAK_MEM_NOTE[device == "cuda"]})
    md = speed_table(records, ratios, machine)
    data.atomic_write_text(os.path.join(args.out, "speed.md"), md)
    pngs = [plot_speed(records, args.out, machine)] if lengths else []
    if any(r["mode"] == "generate" for r in records):
        pngs.append(plot_generate(records, args.out, machine))
    print(md)
    print(f"wrote {path}, {os.path.join(args.out, 'speed.md')}" + "".join(f", {p}" for p in pngs))


PEAK_MEM_NOTE = {
    False: "CPU: peak resident memory of the process during the step minus the resident memory just before it "
           "(Linux VmHWM reset via /proc/self/clear_refs, freed heap returned with malloc_trim first): what the "
           "step itself needs on top of the model and optimizer state, in MiB",
    True: "CUDA: torch.cuda.max_memory_allocated during the step minus memory_allocated before it, in MiB"}


def speed_table(records, ratios, machine):
    clock = "CPU time of the process" if machine["clock"] == "cpu" else "wall time"
    load = machine.get("load_average")
    lines = [f"Machine: {machine['device']}" + (f" ({machine['gpu']})" if machine["gpu"] else
                                                 f", {machine['cpus']} CPU cores, {machine['threads']} torch threads") +
             f", torch {machine['torch']}; {clock}, medians of interleaved rounds" +
             (f"; load average at the end {load[0]:.1f}" if load else "") + ".", "",
             "| model | config | batch x tokens | mode | ms | tokens/s | peak MiB | GFLOP | GFLOP/s |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    gen = [r for r in records if r["mode"] == "generate"]
    records = [r for r in records if r["mode"] != "generate"]
    if not records:
        lines = lines[:2]
    for r in records:
        lines.append(f"| {r['model']} | {r.get('config', 'speed')} | {r['batch']} x {r['length']} | {r['mode']} | "
                     f"{r['ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['peak_mem_mb']:.0f} | {r['flops'] / 1e9:.2f} | "
                     f"{r['flops_per_s'] / 1e9:.1f} |")
    if gen:
        lines += ["", f"Generation: milliseconds per new token after a prompt of `context` tokens (median over rounds "
                      f"of the mean of {gen[0]['new_tokens']} decode steps), the prefill of the prompt, and the size of "
                      "the state kept between tokens.", "",
                  "| model | batch x context | ms per new token | new tokens/s | prefill ms | state MiB |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in gen:
            lines.append(f"| {r['model']} | {r['batch']} x {r['length']} | {r['ms']:.2f} | {r['tokens_per_s']:,.0f} | "
                         f"{r['prefill_ms']:.1f} | {r['state_mb']:.2f} |")
    lines.append("")
    for q in ratios:
        where = f" at {q['length']} tokens ({q['mode']})" if "length" in q else ""
        lines.append(f"- {q['what']}{where}: {q['ratio']:.2f}")
    return "\n".join(lines) + "\n"


def log_ticks(ax, axis, values):
    """Readable ticks on a log axis: at least two labelled values of 1-2-5 (or 1-1.5-2-3-...-8) times a power of
    ten inside the data's range, widened to the nearest such values when the data span less than that."""
    lo, hi = min(values) / 1.15, max(values) * 1.15
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8)):
        cands = sorted(m * 10.0 ** e for e in decades for m in mantissas)
        ticks = [v for v in cands if lo <= v <= hi]
        if len(ticks) >= 3 or mantissas[-1] == 8:
            break
    if len(ticks) < 2:                                       # a narrow range: the candidates just outside
        lo, hi = max(v for v in cands if v <= lo), min(v for v in cands if v >= hi)
        ticks = [v for v in cands if lo <= v <= hi]
    getattr(ax, f"set_{axis}lim")(lo, hi)
    getattr(ax, f"set_{axis}ticks")(ticks, [f"{v:g}" for v in ticks])
    getattr(ax, f"{axis}axis").set_minor_locator(matplotlib.ticker.NullLocator())


def legend_below(fig, handles, ncol):
    """One legend for the figure, under its panels, where it hides no line."""
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=ncol, fontsize=8, frameon=False)


def plot_speed(records, out, machine):
    from matplotlib.lines import Line2D
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    rows = [r for r in records if "config" not in r and r["mode"] in ("train", "infer")]
    names = list(dict.fromkeys(r["model"] for r in rows))
    Ls = sorted({r["length"] for r in rows})
    for ax, key, ylabel in ((axes[0], "ms", "milliseconds per step"), (axes[1], "peak_mem_mb", "peak memory (MiB)")):
        ys = []
        for n_i, name in enumerate(names):
            for mode, ls in (("train", "-"), ("infer", "--")):
                rs = sorted((r for r in rows if r["model"] == name and r["mode"] == mode), key=lambda r: r["length"])
                if rs:
                    y = [max(r[key], 1e-3) for r in rs]
                    ys += y
                    ax.plot([r["length"] for r in rs], y, ls, marker="o", color=plt.cm.tab10(n_i))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ls, [str(v) for v in Ls])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if len(Ls) == 1:
            ax.set_xlim(Ls[0] / 1.5, Ls[0] * 1.5)
        if ys:
            log_ticks(ax, "y", ys)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_title("time per training step and inference forward")
    axes[1].set_title("peak memory of the step above the model's")
    handles = [Line2D([], [], color=plt.cm.tab10(i), marker="o", label=name) for i, name in enumerate(names)]
    handles += [Line2D([], [], color="0.3", ls="-", label="solid: training step (forward, backward, AdamW)"),
                Line2D([], [], color="0.3", ls="--", label="dashed: inference forward")]
    legend_below(fig, handles, ncol=min(len(handles), 4))
    fig.suptitle(f"Speed on {machine['device']}" + (f" ({machine['gpu']})" if machine["gpu"] else
                                                     f", {machine['threads']} torch thread(s), "
                                                     f"{'CPU' if machine['clock'] == 'cpu' else 'wall'} time") +
                 f"; batch {rows[0]['batch']}, medians of interleaved rounds")
    return save_fig(fig, out, "speed")


# ----------------------------------------------------------------------------------------------
# speed --generate: milliseconds per new token against the context length

def generation_steps(model, batch, context, new_tokens, vocab, device):
    """(prefill, decode) closures: prefill reads a fixed random prompt of `context` tokens into a new state;
    decode runs new_tokens steps of model.decode on that state (fixed random tokens: the cost is what counts)."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, vocab, (batch, context), generator=g).to(device)
    tokens = torch.randint(1, vocab, (batch, new_tokens), generator=g).to(device)
    holder = {}

    def prefill():
        holder["state"] = model.prefill(prompt, capacity=context + new_tokens)[1]

    def decode():
        state = holder.pop("state")
        for i in range(new_tokens):
            model.decode(tokens[:, i:i + 1], state)
        holder["size"] = state.nbytes()
    return prefill, decode, holder


def speed_generate(args, device, models):
    """Generation benchmark: for each model and context, in interleaved rounds, a prefill of the prompt (timed
    on its own) and then new_tokens decode steps timed together: ms per new token. Records and ratios."""
    configs = []
    for L in args.context_list:
        for m in models:
            fields = {f.name for f in dataclasses.fields(train.model_module(m).Config)}
            cfg = dict(train.MODELS[m][1], vocab_size=args.vocab, block_size=L + args.new_tokens, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, dropout=0.0, bias=True, head="lm")
            if args.time_dim:
                cfg["time_dim"] = args.time_dim
            model = train.build_model(m, {k: v for k, v in cfg.items() if k in fields}).to(device).eval()
            configs.append(({"model": m, "length": L, "mode": "generate", "batch": args.batch,
                             "new_tokens": args.new_tokens, "params": sum(p.numel() for p in model.parameters())},
                            generation_steps(model, args.batch, L, args.new_tokens, args.vocab, device)))
    print(f"generation on {device} ({torch.get_num_threads()} threads): {len(configs)} configurations, "
          f"{args.repeats} interleaved rounds of {args.new_tokens} new tokens", flush=True)
    with torch.no_grad():
        for _, (prefill, decode, _) in configs:              # warm-up
            prefill()
            decode()
        per_token = [[] for _ in configs]
        prefill_ms = [[] for _ in configs]
        for r in range(args.repeats):                        # interleaved: every round times everything once
            order = list(range(len(configs)))
            if r % 2:
                order.reverse()
            for i in order:
                prefill, decode, _ = configs[i][1]
                prefill_ms[i].append(timed(prefill, device, 1, args.clock))
                per_token[i].append(timed(decode, device, 1, args.clock) / args.new_tokens)
            print(f"  round {r + 1}/{args.repeats} done", flush=True)
    records = []
    for (rec, (_, _, holder)), ts, ps in zip(configs, per_token, prefill_ms):
        ms = statistics.median(ts)
        records.append({**rec, "ms": ms, "ms_all": ts, "tokens_per_s": rec["batch"] / (ms / 1000),
                        "prefill_ms": statistics.median(ps), "state_mb": holder["size"] / 2 ** 20})

    def find(model, L):
        return next((r for r in records if r["model"] == model and r["length"] == L), None)

    def paired(a, b):                                        # median over rounds of a's time / b's time
        return float(np.median(np.array(a["ms_all"]) / np.array(b["ms_all"])))
    ratios, Ls = [], args.context_list
    if len(Ls) >= 2:
        for m in models:
            ratios.append({"what": f"{m} ms per new token at a {Ls[-1]}-token context / at {Ls[0]} (median of "
                                   "per-round ratios)", "ratio": paired(find(m, Ls[-1]), find(m, Ls[0]))})
    if "softmax" in models:
        for L in Ls:
            for m in models:
                if m != "softmax":
                    ratios.append({"what": f"{m} / softmax ms per new token", "length": L, "mode": "generate",
                                   "ratio": paired(find(m, L), find("softmax", L))})
    return records, ratios


MARKERS = "osD^"


def plot_generate(records, out, machine):
    from matplotlib.lines import Line2D
    rows = [r for r in records if r["mode"] == "generate"]
    names = list(dict.fromkeys(r["model"] for r in rows))
    Ls = sorted({r["length"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, ylabel in ((axes[0], "ms", "milliseconds per new token"),
                            (axes[1], "state_mb", "state kept between tokens (MiB)")):
        ys = []
        for n_i, name in enumerate(names):
            rs = sorted((r for r in rows if r["model"] == name), key=lambda r: r["length"])
            y = [max(r[key], 1e-4) for r in rs]
            ys += y                                          # later lines thinner: equal ones stay visible
            ax.plot([r["length"] for r in rs], y, "-", marker=MARKERS[n_i % 4], color=plt.cm.tab10(n_i),
                    lw=2.5 - 0.4 * n_i, ms=9 - 1.5 * n_i, alpha=0.85)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ls, [str(v) for v in Ls])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if len(Ls) == 1:
            ax.set_xlim(Ls[0] / 1.5, Ls[0] * 1.5)
        log_ticks(ax, "y", ys)
        ax.set_xlabel("context: tokens before the new one")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_title(f"time per new token (mean of {rows[0]['new_tokens']} decode steps)")
    axes[1].set_title("recurrent state (fixed) or KV cache (grows)")
    legend_below(fig, [Line2D([], [], color=plt.cm.tab10(i), marker=MARKERS[i % 4], label=name)
                       for i, name in enumerate(names)], ncol=len(names))
    fig.suptitle(f"Generation on {machine['device']}" + (f" ({machine['gpu']})" if machine["gpu"] else
                                                          f", {machine['threads']} torch thread(s), "
                                                          f"{'CPU' if machine['clock'] == 'cpu' else 'wall'} time") +
                 f"; batch {rows[0]['batch']}, medians of interleaved rounds")
    return save_fig(fig, out, "speed_generate")


# ==============================================================================================
# Command line

def parse(argv):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/analysis", help="folder for speed.json, speed.md and the plots")
    p.add_argument("--models", default="simpletron,softmax,transject,diffeqformer",
                   help="models of train.py, or one attention alone: " + ", ".join(ATTENTION))
    p.add_argument("--lengths", default="1024,4096")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (the median is reported)")
    p.add_argument("--inner", type=int, default=10, help="nanoGPT configuration: steps per timing")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--head", default="lm", choices=("lm", "cls"), help="lm (causal) or cls")
    p.add_argument("--time_dim", type=int, help="DiffEqFormer's d_t (default: its Config's)")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    p.add_argument("--clock", default="wall", help="wall (elapsed) or cpu (CPU time of the process: with "
                   "--threads 1, robust to other programs sharing the CPU)")
    p.add_argument("--nanogpt", help="path of karpathy/nanoGPT's model.py, outside this project")
    p.add_argument("--infer_only", action="store_true", help="only the inference forward of each model (no training "
                   "step, no nanoGPT comparison): TransJect's Table 4 with --models transject,softmax,softmax_naive")
    p.add_argument("--compare_only", action="store_true", help="only our GPT vs nanoGPT at nanoGPT's CPU config")
    p.add_argument("--generate", action="store_true", help="also measure generation: ms per new token against the "
                   "context length (with --lengths '': generation alone)")
    p.add_argument("--contexts", default="256,1024,4096", help="--generate: prompt lengths before the new tokens")
    p.add_argument("--new_tokens", type=int, default=32, help="--generate: decode steps timed per round")
    p.add_argument("--checkpointing", action="store_true", help="also each model's training step with activation "
                   "checkpointing (Config.checkpointing): peak memory, time, loss and gradient differences")
    args = p.parse_args(argv)
    check(args)
    return args


def check(args):
    """Every flag, before any work: one line naming the flag, its value and what is allowed."""
    for name, value in vars(args).items():
        check_value(name, value)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: no CUDA device here; use --device cpu (or auto)")
    if args.device == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps: Apple's MPS is not available here; use --device cpu (or auto)")
    path = os.path.abspath(args.out)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--out {args.out}: {path} is not a folder this command can write in")


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    return cmd_speed(args)


if __name__ == "__main__":
    try:
        main()
    except (UsageError, data.DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
