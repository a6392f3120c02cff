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
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

import data    # noqa: E402
import train   # noqa: E402
from curves import log_ticks  # noqa: E402
from config import (MODELS, Parser, UsageError, build_model, check_value, model_module,  # noqa: E402
                    pick_device)

ROOT = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------
# Measuring: time, peak memory, FLOPs

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


def rss_mb(field):
    """VmRSS (resident now) or VmHWM (the peak since the last reset) of this process, in MiB (Linux)."""
    with open("/proc/self/status") as f:
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


def causal_share(flops, q, is_causal):
    """A causal kernel computes the scores on and below the diagonal only: (L + 1) / 2L of the L x L."""
    L = q.shape[-2]
    return flops * (L + 1) / (2 * L) if is_causal else flops


def cpu_attention_flops(q, k, v, dropout_p=0.0, is_causal=False, *args, out_val=None, **kwargs):
    return causal_share(sdpa_flop_count(q.shape, k.shape, v.shape), q, is_causal)


def cpu_attention_backward_flops(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal=False, *args, out_val=None,
                                 **kwargs):
    return causal_share(sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape), q, is_causal)


cpu_attention_flops._get_raw = cpu_attention_backward_flops._get_raw = True   # the counter passes the arguments


def count_flops(fn):
    """Floating-point operations of fn() by torch.utils.flop_counter (matrix products and attention; the
    CPU attention kernel, which the counter does not know, is registered here)."""
    aten = torch.ops.aten
    custom = {aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention_flops,
              aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_attention_backward_flops} \
        if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu") else {}
    with FlopCounterMode(display=False, custom_mapping=custom) as counter:
        fn()
    return counter.get_total_flops()


# ----------------------------------------------------------------------------------------------
# What is timed: a model's training step and inference forward, one attention alone, nanoGPT's GPT

# the models of train.py, and the softmax Transformer with its attention scores written out (TransJect's Table 4)
SPEED_MODELS = {**MODELS, "softmax_naive": ("simpletron", {"attention": "softmax_naive", "variant": "vanilla"})}


def speed_model(name, length, args, **extra):
    """The model `name` of SPEED_MODELS with the benchmark's shape (fields its Config lacks are left out); extra:
    fields set on top (checkpointing=True; head="lm" for generation). Built by its model file's name (a name in
    MODELS too), SPEED_MODELS' overrides in its settings."""
    module, overrides = SPEED_MODELS[name]
    fields = {f.name for f in dataclasses.fields(model_module(module).Config)}
    cfg = {**overrides, "vocab_size": args.vocab, "block_size": length, "n_layer": args.n_layer,
           "n_head": args.n_head, "n_embd": args.n_embd, "dropout": 0.0, "bias": True, "head": args.head,
           "n_classes": 10, **extra}
    if args.time_dim:
        cfg["time_dim"] = args.time_dim
    return build_model(module, {k: v for k, v in cfg.items() if k in fields})


# --models may also name one attention alone (simpletron.py's functions): q, k, v (batch, n_head, length, d)
ATTENTION = {"simple_attention": lambda m, q, k, v, mask: m.simple_attention(q, k, v, mask),
             "causal_simple_attention": lambda m, q, k, v, mask: m.causal_simple_attention(q, k, v),
             "softmax_attention": lambda m, q, k, v, mask: m.softmax_attention(q, k, v, mask, causal=False)}


def attention_steps(name, batch, length, args, device):
    """(train_step, infer_step) of one attention function alone: forward + backward, forward."""
    module = model_module("simpletron")
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


def random_batch(batch, length, vocab, head, device, seed):
    """A fixed random batch: token ids x, and next tokens (lm) or one of 10 classes (cls) y."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, vocab, (batch, length), generator=g).to(device)
    y = (torch.randint(0, vocab, (batch, length), generator=g) if head == "lm"
         else torch.randint(0, 10, (batch,), generator=g)).to(device)
    return x, y


def make_steps(model, batch, length, vocab, head, device):
    """(train_step, infer_step) closures on a fixed random batch."""
    x, y = random_batch(batch, length, vocab, head, device, seed=0)
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
    x, y = random_batch(batch, length, vocab, head, device, seed=1)
    losses, grads = [], []
    for m in (model, recomputing):
        m.train()
        _, loss = m(x, y)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
        m.zero_grad(set_to_none=True)
    return abs(losses[0] - losses[1]), max((a - b).abs().max().item() for a, b in zip(*grads, strict=True))


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


# ----------------------------------------------------------------------------------------------
# The benchmark: every configuration, timed in interleaved rounds, then its FLOPs and peak memory

def length_configs(args, device, models, lengths):
    """(record, steps, mode) of every model at every length: its training step and inference forward (only the
    forward with --infer_only), and with --checkpointing the training step of a copy that recomputes its blocks."""
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
            if args.checkpointing and m not in ATTENTION:
                configs.append(checkpointing_config(model, m, L, params, args, device))
    return configs


def checkpointing_config(model, name, length, params, args, device):
    """The training step of a copy of `model` (the same weights) that recomputes every block in the backward
    pass, with the largest loss and gradient differences between the two."""
    ck = speed_model(name, length, args, checkpointing=True).to(device)
    ck.load_state_dict(model.state_dict())
    loss_diff, grad_diff = checkpointing_difference(model, ck, args.batch, length, args.vocab, args.head, device)
    return ({"model": name, "length": length, "mode": "train", "batch": args.batch, "params": params,
             "config": "checkpointing", "loss_diff": loss_diff, "grad_diff": grad_diff},
            make_steps(ck, args.batch, length, args.vocab, args.head, device), "train")


def nanogpt_configs(args, device, lengths, nano):
    """The training step of our GPT, and of nanoGPT's with --nanogpt, at nanoGPT's CPU configuration. Left out
    with --infer_only, and for generation alone (--generate --lengths '' without --nanogpt)."""
    if args.infer_only or not (lengths or nano is not None or not args.generate):
        return []
    c = NANOGPT_CPU
    ours = build_model("softmax", dict(MODELS["softmax"][1], vocab_size=c["vocab"], block_size=c["block_size"],
                                       n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0,
                                       bias=c["bias"], head="lm", norm="pre"))
    pair = [("softmax", ours.to(device))]
    if nano is not None:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):   # it prints its parameter count
            theirs = nano.GPT(nano.GPTConfig(block_size=c["block_size"], vocab_size=c["vocab"], n_layer=c["n_layer"],
                                             n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0, bias=c["bias"]))
        pair.append(("nanogpt", theirs.to(device)))
    return [({"model": name, "length": c["block_size"], "mode": "train", "batch": c["batch"], "config": "nanogpt-cpu",
              "params": sum(p.numel() for p in model.parameters())},
             make_steps(model, c["batch"], c["block_size"], c["vocab"], "lm", device), "train")
            for name, model in pair]


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


def time_configs(configs, args, device):
    """Milliseconds of each configuration in each round (nanoGPT's configuration: the mean of --inner steps)."""
    for _, steps, mode in configs:                           # warm-up (allocations, AdamW state)
        steps[mode]()
    times = [[] for _ in configs]

    def measure(i):
        rec, steps, mode = configs[i]
        n = args.inner if rec.get("config") == "nanogpt-cpu" else 1
        times[i].append(timed(steps[mode], device, n, args.clock))
    interleaved_rounds(len(configs), args.repeats if configs else 0, measure)
    return times


def speed_records(configs, times, device):
    """One record per configuration: the median time, tokens/s, FLOPs, FLOP/s and peak memory."""
    records = []
    for (rec, steps, mode), ts in zip(configs, times):
        ms = statistics.median(ts)
        flops = count_flops(steps["flops_train" if mode == "train" else "infer"])
        mem = peak_memory(steps[mode], device)
        tokens = rec["batch"] * rec["length"]
        records.append({**rec, "ms": ms, "ms_all": ts, "peak_mem_mb": mem, "tokens_per_s": tokens / (ms / 1000),
                        "flops": flops, "flops_per_s": flops / (ms / 1000)})
    return records


def find(records, model, length, mode, config=None):
    return next((r for r in records if r["model"] == model and r["length"] == length and r["mode"] == mode
                 and r.get("config") == config), None)


def paired(a, b):
    """The median over rounds of a's time / b's time (a round's ratio is free of the machine's slow spells)."""
    return float(np.median(np.array(a["ms_all"]) / np.array(b["ms_all"])))


# the ratios of tokens per second reported: (the baseline, the models compared with it)
BASELINES = (("softmax", ("simpletron", "transject", "diffeqformer")),
             ("softmax_naive", ("simpletron", "transject", "softmax")),
             ("softmax_attention", ("simple_attention", "causal_simple_attention")))


def speed_ratios(records, models, lengths, infer_only):
    """Each model against its baseline at each length, checkpointing against the plain step, and the growth of
    each model's time from the first length to the last."""
    ratios = []
    for L in lengths:
        for mode in ("train", "infer"):
            for base, others in BASELINES:
                g = find(records, base, L, mode)
                for other in others:
                    o = find(records, other, L, mode)
                    if g and o:
                        ratios.append({"what": f"{other} / {base} tokens per second", "length": L, "mode": mode,
                                       "ratio": paired(g, o)})
    ratios += checkpointing_ratios(records, models, lengths)
    if len(lengths) >= 2:
        mode = "infer" if infer_only else "train"
        for m in models:
            a, b = find(records, m, lengths[0], mode), find(records, m, lengths[-1], mode)
            if a and b:
                ratios.append({"what": f"{m} {'inference forward' if infer_only else 'training step'}, ms at "
                                       f"{lengths[-1]} / ms at {lengths[0]} tokens", "ratio": b["ms"] / a["ms"]})
    return ratios


def checkpointing_ratios(records, models, lengths):
    ratios = []
    for L in lengths:
        for m in models:
            a, b = find(records, m, L, "train"), find(records, m, L, "train", "checkpointing")
            if a and b:
                ratios.append({"what": f"{m} checkpointing / plain training step, peak memory ({b['peak_mem_mb']:.0f} "
                                       f"/ {a['peak_mem_mb']:.0f} MiB)", "length": L, "mode": "train",
                               "ratio": b["peak_mem_mb"] / a["peak_mem_mb"]})
                ratios.append({"what": f"{m} checkpointing / plain training step, time (loss difference "
                                       f"{b['loss_diff']:.1e}, largest gradient difference {b['grad_diff']:.1e})",
                               "length": L, "mode": "train", "ratio": paired(b, a)})
    return ratios


def nanogpt_ratio(records):
    """[nanoGPT's time / ours at nanoGPT's configuration], or [] without --nanogpt."""
    block = NANOGPT_CPU["block_size"]
    ng = find(records, "nanogpt", block, "train", "nanogpt-cpu")
    og = find(records, "softmax", block, "train", "nanogpt-cpu")
    if not (ng and og):
        return []
    r = np.array(ng["ms_all"]) / np.array(og["ms_all"])
    return [{"what": "nanoGPT / our GPT ms per iteration (nanoGPT CPU configuration, median of per-round "
                     f"ratios; quartiles {np.quantile(r, 0.25):.3f}-{np.quantile(r, 0.75):.3f})",
             "ratio": paired(ng, og), "q25": float(np.quantile(r, 0.25)), "q75": float(np.quantile(r, 0.75))}]


def run(args, device, models, lengths, nano):
    torch.manual_seed(0)
    configs = length_configs(args, device, models, lengths) + nanogpt_configs(args, device, lengths, nano)
    print(f"speed on {device} ({torch.get_num_threads()} threads): {len(configs)} configurations, "
          f"{args.repeats} interleaved rounds", flush=True)
    records = speed_records(configs, time_configs(configs, args, device), device)
    ratios = speed_ratios(records, models, lengths, args.infer_only)
    if args.generate:
        gen_records, gen_ratios = speed_generate(args, device, [m for m in models if m in MODELS])
        records += gen_records
        ratios += gen_ratios
    write_results(args, device, records, ratios + nanogpt_ratio(records))


def machine_of(device, clock):
    kind = torch.device(device).type
    return {"device": device, "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "clock": clock, "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "cpus": os.cpu_count(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(device) if kind == "cuda" else "Apple MPS" if kind == "mps" else None}


PEAK_MEM_NOTE = {
    "cpu": "CPU: peak resident memory of the process during the step minus the resident memory just before it "
           "(Linux VmHWM reset via /proc/self/clear_refs, freed heap returned with malloc_trim first): what the "
           "step itself needs on top of the model and optimizer state, in MiB",
    "cuda": "CUDA: torch.cuda.max_memory_allocated during the step minus memory_allocated before it, in MiB",
    "mps": "MPS: not measured (no peak statistic)"}


def write_json(out, name, obj):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    data.atomic_write_text(path, json.dumps(obj, indent=1, default=float) + "\n")
    return path


def write_results(args, device, records, ratios):
    """speed.json, speed_summary.json, speed.md and the plots; the table printed."""
    machine = machine_of(device, args.clock)
    path = write_json(args.out, "speed", records)
    write_json(args.out, "speed_summary", {"machine": machine, "ratios": ratios, "settings": vars(args),
                                           "peak_mem_mb": PEAK_MEM_NOTE[torch.device(device).type]})
    md = speed_table(records, ratios, machine)
    data.atomic_write_text(os.path.join(args.out, "speed.md"), md)
    pngs = [plot_speed(records, args.out, machine)] if any(
        "config" not in r and r["mode"] != "generate" for r in records) else []
    if any(r["mode"] == "generate" for r in records):
        pngs.append(plot_generate(records, args.out, machine))
    print(md)
    print(f"wrote {path}, {os.path.join(args.out, 'speed.md')}" + "".join(f", {p}" for p in pngs))


# ----------------------------------------------------------------------------------------------
# --generate: milliseconds per new token against the context length

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
            model = speed_model(m, L + args.new_tokens, args, head="lm").to(device).eval()
            configs.append(({"model": m, "length": L, "mode": "generate", "batch": args.batch,
                             "new_tokens": args.new_tokens, "params": sum(p.numel() for p in model.parameters())},
                            generation_steps(model, args.batch, L, args.new_tokens, args.vocab, device)))
    print(f"generation on {device} ({torch.get_num_threads()} threads): {len(configs)} configurations, "
          f"{args.repeats} interleaved rounds of {args.new_tokens} new tokens", flush=True)
    per_token, prefill_ms = [[] for _ in configs], [[] for _ in configs]

    def measure(i):
        prefill, decode, _ = configs[i][1]
        prefill_ms[i].append(timed(prefill, device, 1, args.clock))
        per_token[i].append(timed(decode, device, 1, args.clock) / args.new_tokens)
    with torch.no_grad():
        for _, (prefill, decode, _) in configs:              # warm-up
            prefill()
            decode()
        interleaved_rounds(len(configs), args.repeats, measure)
    records = []
    for (rec, (_, _, holder)), ts, ps in zip(configs, per_token, prefill_ms):
        ms = statistics.median(ts)
        records.append({**rec, "ms": ms, "ms_all": ts, "tokens_per_s": rec["batch"] / (ms / 1000),
                        "prefill_ms": statistics.median(ps), "state_mb": holder["size"] / 2 ** 20})
    return records, generation_ratios(records, models, args.context_list)


def generation_ratios(records, models, contexts):
    """Each model's time per new token at the longest context over the shortest, and against softmax's."""
    ratios = []
    if len(contexts) >= 2:
        for m in models:
            ratios.append({"what": f"{m} ms per new token at a {contexts[-1]}-token context / at {contexts[0]} (median "
                                   "of per-round ratios)",
                           "ratio": paired(find(records, m, contexts[-1], "generate"),
                                           find(records, m, contexts[0], "generate"))})
    if "softmax" in models:
        for L in contexts:
            for m in models:
                if m != "softmax":
                    ratios.append({"what": f"{m} / softmax ms per new token", "length": L, "mode": "generate",
                                   "ratio": paired(find(records, m, L, "generate"),
                                                   find(records, "softmax", L, "generate"))})
    return ratios


# ----------------------------------------------------------------------------------------------
# The table and the plots

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


def length_axes(ax, lengths, ys, xlabel, ylabel):
    """Log-log axes: the lengths measured as the x ticks, readable y ticks around the values drawn."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(v) for v in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    if len(lengths) == 1:
        ax.set_xlim(lengths[0] / 1.5, lengths[0] * 1.5)
    if ys:
        log_ticks(ax, "y", ys)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


def finish_figure(fig, handles, ncol, what, machine, batch, out, name):
    """One legend under the panels, where it hides no line; the machine in the title; saved as OUT/NAME.png."""
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(f"{what} on {machine['device']}" + (f" ({machine['gpu']})" if machine["gpu"] else
                                                     f", {machine['threads']} torch thread(s), "
                                                     f"{'CPU' if machine['clock'] == 'cpu' else 'wall'} time") +
                 f"; batch {batch}, medians of interleaved rounds")
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_speed(records, out, machine):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    rows = [r for r in records if "config" not in r and r["mode"] in ("train", "infer")]
    names = list(dict.fromkeys(r["model"] for r in rows))
    for ax, key, ylabel in ((axes[0], "ms", "milliseconds per step"), (axes[1], "peak_mem_mb", "peak memory (MiB)")):
        ys = []
        for n_i, name in enumerate(names):
            for mode, ls in (("train", "-"), ("infer", "--")):
                rs = sorted((r for r in rows if r["model"] == name and r["mode"] == mode), key=lambda r: r["length"])
                if rs:
                    y = [max(r[key], 1e-3) for r in rs]
                    ys += y
                    ax.plot([r["length"] for r in rs], y, ls, marker="o", color=plt.cm.tab10(n_i))
        length_axes(ax, sorted({r["length"] for r in rows}), ys, "sequence length (tokens)", ylabel)
    axes[0].set_title("time per training step and inference forward")
    axes[1].set_title("peak memory of the step above the model's")
    handles = [Line2D([], [], color=plt.cm.tab10(i), marker="o", label=name) for i, name in enumerate(names)]
    handles += [Line2D([], [], color="0.3", ls="-", label="solid: training step (forward, backward, AdamW)"),
                Line2D([], [], color="0.3", ls="--", label="dashed: inference forward")]
    return finish_figure(fig, handles, min(len(handles), 4), "Speed", machine, rows[0]["batch"], out, "speed")


LOOKS = (("o", "-"), ("s", "--"), ("D", ":"), ("^", "-."))   # marker and dashes of model 1, 2, ...


def same_lines(lines):
    """The pairs (later, earlier) of lines {name: (x, y)} that are drawn one over the other: the same x, and y
    within 1% (on a log axis, closer than a line's width)."""
    names = list(lines)
    return [(b, a) for j, b in enumerate(names) for a in names[:j]
            if lines[a][0] == lines[b][0] and np.allclose(lines[a][1], lines[b][1], rtol=0.01)]


def plot_generate(records, out, machine):
    rows = [r for r in records if r["mode"] == "generate"]
    names = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, ylabel in ((axes[0], "ms", "milliseconds per new token"),
                            (axes[1], "state_mb", "state kept between tokens (MiB)")):
        lines = {}
        for n_i, name in enumerate(names):
            rs = sorted((r for r in rows if r["model"] == name), key=lambda r: r["length"])
            lines[name] = ([r["length"] for r in rs], [max(r[key], 1e-4) for r in rs])
            marker, dashes = LOOKS[n_i % 4]                  # a later line smaller, hollow and dashed, drawn on
            ax.plot(*lines[name], dashes, marker=marker, color=plt.cm.tab10(n_i), lw=2.5 - 0.4 * n_i,
                    ms=9 - 1.5 * n_i, mfc="none" if n_i else None, mew=1.5, zorder=2 + n_i)  # top: equal ones show
        same = same_lines(lines)
        if same:
            ax.text(0.02, 0.98, "; ".join(f"{b} lies on {a} (within 1%)" for b, a in same), transform=ax.transAxes,
                    va="top", fontsize=8, color="0.3")
        length_axes(ax, sorted({r["length"] for r in rows}), [y for _, ys in lines.values() for y in ys],
                    "context: tokens before the new one", ylabel)
    axes[0].set_title(f"time per new token (mean of {rows[0]['new_tokens']} decode steps)")
    axes[1].set_title("recurrent state (fixed) or KV cache (grows)")
    handles = [Line2D([], [], color=plt.cm.tab10(i), marker=LOOKS[i % 4][0], ls=LOOKS[i % 4][1],
                      mfc="none" if i else None, label=name) for i, name in enumerate(names)]
    return finish_figure(fig, handles, len(names), "Generation", machine, rows[0]["batch"], out, "speed_generate")


# ----------------------------------------------------------------------------------------------
# Command line

def parse(argv):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/analysis", help="folder for speed.json, speed.md and the plots")
    p.add_argument("--models", default=",".join(MODELS),
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


def int_list(flag, text):
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--{flag} takes integers separated by commas, not {text!r}") from None


def read_lists(args, device):
    """What the flags name, checked: (models, lengths, nanoGPT's model.py or None); args.context_list."""
    models = [m.strip() for m in args.models.split(",") if m.strip()] if not args.compare_only else []
    for m in models:
        if m not in SPEED_MODELS and m not in ATTENTION:
            raise UsageError(f"unknown model {m!r} in --models; choose from {', '.join([*SPEED_MODELS, *ATTENTION])}")
        model_module(SPEED_MODELS[m][0] if m in SPEED_MODELS else "simpletron")  # UsageError if absent
    lengths = int_list("lengths", args.lengths) if not args.compare_only else []
    args.context_list = int_list("contexts", args.contexts) if args.generate else []
    if args.generate and (not args.context_list or min(args.context_list) < 1):
        raise UsageError("--generate needs --contexts of at least 1 token and --new_tokens of at least 1")
    nano = load_nanogpt(args.nanogpt) if args.nanogpt else None
    if args.clock == "cpu" and device != "cpu":
        raise UsageError("--clock is wall, or cpu (CPU time; on a CPU device only)")
    return models, lengths, nano


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    device = pick_device(args.device)
    models, lengths, nano = read_lists(args, device)
    os.makedirs(args.out, exist_ok=True)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        run(args, device, models, lengths, nano)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    data.run_main(main, UsageError)
