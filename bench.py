"""
Speed and memory benchmark of the models (nanoGPT's bench.py): time, peak memory, FLOPs, generation.

    python bench.py --out out/analysis --lengths 1024,4096 [--nanogpt /tmp/nanogpt/model.py]
    python bench.py --out out/generate --lengths '' --generate --contexts 256,1024,4096
    python bench.py --loop [--wall] [--compile]     # train.py's loop on the README's commands; --wall: their parts
    python bench.py --compile --lengths 1024        # torch.compile: compiling time, speed-up, steps to pay it back

Writes OUT/speed.json, OUT/speed_summary.json (machine, ratios, settings), OUT/speed.md, OUT/speed.png (--generate:
OUT/speed_generate.png) and prints the table (--loop, --wall, --compile: OUT/user.{json,md}).

The training step (forward, backward, gradient clipping, AdamW) and the inference forward of each model at each length,
in interleaved rounds (medians; ratios as medians of per-round ratios) beside the machine's matmul rate, measured
each round: peak memory, tokens/s, FLOPs (torch.utils.flop_counter), FLOP/s as a share of the matmul rate (MFU on a
GPU) and against the baseline's (softmax); our GPT beside nanoGPT's model.py at nanoGPT's CPU configuration (--nanogpt
PATH, a file outside this project). --models may also name an attention function alone (simple_attention,
causal_simple_attention, softmax_attention, causal_softmax_attention). Lengths and sizes that would not fit in memory
or --max_minutes are refused. --generate: milliseconds per new token after a prompt of each --contexts length
(model.prefill, then --new_tokens model.decode steps, timed) and the state the model keeps (SimpleTRON, TransJect:
fixed; the GPT, DiffEqFormer: a KV cache). --checkpointing: each model's training step with every block recomputed in
the backward pass, its peak memory and time beside the plain step's, and the loss and gradient differences."""

import argparse
import contextlib
import dataclasses
import itertools
import importlib.machinery
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types

if __name__ == "__main__":                                   # Ctrl-C while torch loads: stop at once, quietly
    signal.signal(signal.SIGINT, signal.SIG_DFL)             # (data.run_main reports it in one line once running)

import numpy as np  # noqa: E402
os.environ["MPLBACKEND"] = "Agg"                            # files only (an unknown backend would stop the import)
import matplotlib.pyplot as plt  # noqa: E402

import data  # noqa: E402  (data first: it loads torch, and a TORCH_* setting torch refuses is one line there)
import torch  # noqa: E402
import train   # noqa: E402
from curves import log_ticks  # noqa: E402
from measure import (count_flops, crossover, interleaved_rounds, matmul_rate, matmul_size, md_table,  # noqa: E402
                     peak_flops, peak_memory, quadratic, rss_mb, step_cost, timed)
from runsetup import precision  # noqa: E402
from config import (MODELS, Parser, UsageError, build_model, check_device, check_value, int_list,  # noqa: E402
                    load_checkpoint, machine as machine_name, model_call, model_module, pick_device, unused_fields)

ROOT = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------
# What is timed: a model's training step and inference forward, one attention alone, nanoGPT's GPT
# the models of train.py, and the softmax Transformer with its attention scores written out (TransJect's Table 4)
SPEED_MODELS = {**MODELS, "softmax_naive": ("simpletron", {"attention": "softmax_naive", "variant": "vanilla"})}


def speed_model(name, length, args, **extra):
    """The model `name` of SPEED_MODELS (built by its model file's name, its overrides in its settings) with the
    benchmark's shape (fields its Config lacks left out); extra: fields set on top (checkpointing=True; head="lm")."""
    module, overrides = SPEED_MODELS[name]
    fields = {f.name for f in dataclasses.fields(model_module(module).Config)}
    cfg = {**overrides, "vocab_size": args.vocab, "block_size": length, "n_layer": args.n_layer, "n_head": args.n_head,
           "n_embd": args.n_embd, "dropout": 0.0, "bias": True, "head": args.head, "n_classes": 10,
           **({"time_dim": args.time_dim} if args.time_dim else {}), **extra}
    return build_model(module, {k: v for k, v in cfg.items() if k in fields})


# --models may also name one attention alone (simpletron.py's functions): q, k, v (batch, n_head, length, d)
ATTENTION = {"simple_attention": lambda m, q, k, v, mask: m.simple_attention(q, k, v, mask),
             "causal_simple_attention": lambda m, q, k, v, mask: m.causal_simple_attention(q, k, v),
             "softmax_attention": lambda m, q, k, v, mask: m.softmax_attention(q, k, v, mask, causal=False),
             "causal_softmax_attention": lambda m, q, k, v, mask: m.softmax_attention(q, k, v, None, causal=True)}


def autocast(device, dtype):
    """bfloat16: the forward under autocast, as train.py runs on CUDA; float32: as it is."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)


def attention_steps(name, batch, length, args, device):
    """(train_step, infer_step) of one attention function alone: forward + backward, forward."""
    module = model_module("simpletron")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, args.n_head, length, args.n_embd // args.n_head, generator=g).to(device)
               .requires_grad_() for _ in range(3))
    mask = torch.ones(batch, length, dtype=torch.bool, device=device)

    def train_step():
        with autocast(device, args.dtype):
            y = ATTENTION[name](module, q, k, v, mask)
        y.float().sum().backward()
        q.grad = k.grad = v.grad = None

    def infer_step():
        with torch.no_grad(), autocast(device, args.dtype):
            ATTENTION[name](module, q, k, v, mask)
    return {"train": train_step, "infer": infer_step, "flops_train": train_step}


def random_batch(batch, length, vocab, head, device, seed):
    """A fixed random batch: token ids x, and next tokens (lm) or one of 10 classes (cls) y."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, vocab, (batch, length), generator=g).to(device)
    y = (torch.randint(0, vocab, (batch, length), generator=g) if head == "lm"
         else torch.randint(0, 10, (batch,), generator=g)).to(device)
    return x, y


def forward(model, name, x, y=None):
    """model(x, y) of SPEED_MODELS' `name` or nanoGPT's; a failure in a model file or a bad loss is one line."""
    out = (model_call(name if name in MODELS else SPEED_MODELS[name][0], "forward", model, x, y) if name in SPEED_MODELS
           else model(x, y))
    return out if y is None else train.forward_output(out, name)


def make_steps(model, batch, length, vocab, head, device, dtype=torch.float32, name=None):
    """(train_step, infer_step) closures on a fixed random batch; the forward (see forward) in `dtype` (autocast)."""
    x, y = random_batch(batch, length, vocab, head, device, seed=0)
    # train.py's AdamW (decay on matrices and embeddings only: nanoGPT's groups too), nanoGPT's CPU betas
    opt = train.make_optimizer(model, types.SimpleNamespace(weight_decay=0.1, lr=1e-3, beta1=0.9, beta2=0.99,
                                                            eps=1e-8, gate_lr_scale=30.0), device)

    def forward_backward():                                  # what the FLOP counter sees of a train step
        model.train()
        with autocast(device, dtype):
            _, loss = forward(model, name, x, y)
        loss.backward()

    def train_step():
        forward_backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer_step():
        model.eval()
        with torch.no_grad(), autocast(device, dtype):
            forward(model, name, x)
    return {"train": train_step, "infer": infer_step, "flops_train": lambda: (forward_backward(), opt.zero_grad())}


def load_nanogpt(path):
    """nanoGPT's GPT at its CPU configuration, from its model.py outside this project (never copied into it)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UsageError(f"--nanogpt {path}: no such file (bring karpathy/nanoGPT's model.py beside the project)")
    if os.path.commonpath([path, ROOT]) == ROOT:
        raise UsageError("--nanogpt: keep nanoGPT's model.py outside this project (e.g. /tmp/nanogpt/model.py)")
    try:                                                     # (SystemExit: a script, not a module)
        loader = importlib.machinery.SourceFileLoader("nanogpt_model", path)     # (whatever the file's name)
        mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("nanogpt_model", loader))
        loader.exec_module(mod)
        c = NANOGPT_CPU
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):   # it prints its parameter count
            gpt = mod.GPT(mod.GPTConfig(block_size=c["block_size"], vocab_size=c["vocab"], n_layer=c["n_layer"],
                                        n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0, bias=c["bias"]))
        _, loss = gpt(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long))   # (logits, loss)
        if not (torch.is_tensor(loss) and loss.dim() == 0):
            raise ValueError(f"its loss is {type(loss).__name__}, not one number")
    except (Exception, SystemExit) as e:
        raise UsageError(f"--nanogpt {path} is not nanoGPT's model.py: its GPT(GPTConfig(...)) is not built or does "
                         f"not return (logits, loss) ({type(e).__name__}: {data.one_line(e, 150)})") from None
    return gpt


# nanoGPT's README CPU run (shakespeare_char; bias False is its train.py's default)
NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12, vocab=65, bias=False)


# ----------------------------------------------------------------------------------------------
# The benchmark: every configuration, timed in interleaved rounds, then its FLOPs and peak memory
def length_configs(args, device, models, lengths):
    """(record, steps, mode) of every model at every length: its training step and inference forward (only the
    forward with --infer_only), and with --checkpointing the training step of a copy that recomputes its blocks."""
    configs = []
    for L, m in itertools.product(lengths, models):
        if m in ATTENTION:
            steps, params = attention_steps(m, args.batch, L, args, device), 0
        else:
            model = speed_model(m, L, args).to(device)
            steps = make_steps(model, args.batch, L, args.vocab, args.head, device, args.dtype, m)
            params = sum(p.numel() for p in model.parameters())
        for mode in ("infer",) if args.infer_only else ("train", "infer"):
            configs.append((dict(model=m, length=L, mode=mode, batch=args.batch, params=params), steps, mode))
        if args.checkpointing and m not in ATTENTION:
            configs.append(checkpointing_config(model, m, L, params, args, device))
    return configs


def checkpointing_config(model, name, length, params, args, device):
    """The training step of a copy of `model` (the same weights) that recomputes every block in the backward
    pass, with the largest |difference| of the loss and of any gradient between the two."""
    ck = speed_model(name, length, args, checkpointing=True).to(device)
    ck.load_state_dict(model.state_dict())
    (x, y), losses, grads = random_batch(args.batch, length, args.vocab, args.head, device, seed=1), [], []
    for m in (model, ck):
        m.train()
        _, loss = forward(m, name, x, y)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
        m.zero_grad(set_to_none=True)
    return ({"model": name, "length": length, "mode": "train", "batch": args.batch, "params": params,
             "config": "checkpointing", "loss_diff": abs(losses[0] - losses[1]),
             "grad_diff": max((a - b).abs().max().item() for a, b in zip(*grads, strict=True))},
            make_steps(ck, args.batch, length, args.vocab, args.head, device, args.dtype, name), "train")


def nanogpt_configs(args, device, lengths, nano):
    """The training step of our GPT, and of nanoGPT's with --nanogpt, at nanoGPT's CPU configuration. Left out
    with --infer_only, and for generation alone (--generate --lengths '' without --nanogpt)."""
    if args.infer_only or not (lengths or nano is not None or not args.generate):
        return []
    c = NANOGPT_CPU
    ours = build_model("softmax", dict(MODELS["softmax"][1], vocab_size=c["vocab"], block_size=c["block_size"],
                                       n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0,
                                       bias=c["bias"], head="lm", norm="pre"))
    pair = [("softmax", ours)] + [("nanogpt", nano)] * (nano is not None)   # (load_nanogpt: nanoGPT's model, built)
    return [({"model": name, "length": c["block_size"], "mode": "train", "batch": c["batch"], "config": "nanogpt-cpu",
              "params": sum(p.numel() for p in model.parameters())}, make_steps(model.to(device), c["batch"],
             c["block_size"], c["vocab"], "lm", device, args.dtype, name), "train") for name, model in pair]


def training_cost(name, length, args, device):
    """(FLOPs, bytes) of one training step of `name` at a short `length` (measure.step_cost)."""
    if name in ATTENTION:
        return step_cost(attention_steps(name, args.batch, length, args, device)["flops_train"])
    model = speed_model(name, length, args).to(device)
    steps = make_steps(model, args.batch, length, args.vocab, args.head, device, args.dtype, name)
    return step_cost(steps["flops_train"], list(model.parameters()))


def check_sizes(args, device, models, lengths):
    """Before any work, one line if the benchmark cannot run: the largest training step's memory, from step_cost at
    three short lengths (a + b L + c L^2), against the memory free here, and the whole benchmark's FLOPs at this
    machine's matmul rate against --max_minutes (--compare_only: nanoGPT's configuration's alone)."""
    steps, lengths = lengths, sorted({*lengths, *(contexts := getattr(args, "context_list", []))})
    kind = torch.device(device).type
    free = (torch.cuda.mem_get_info(device)[0] if kind == "cuda" else
            rss_mb("MemAvailable", "/proc/meminfo") * 2 ** 20 if kind == "cpu" else math.nan)
    runs = (args.repeats + 3) * (1 if args.infer_only else 2)   # timed, warm-up, FLOP count, peak memory
    work = 0.0                                               # the models first: one refusing its settings, or too
    for m in models:                                         # large, is refused before this machine's matmuls are timed
        (f1, m1), (f2, m2), (f4, m4) = (training_cost(m, n, args, device) for n in (128, 256, 512))
        flops, memory = quadratic(128, f1, f2, f4), quadratic(128, m1, m2, m4)
        work += runs * sum(flops(n) for n in lengths)
        if (need := memory(lengths[-1])) > free:
            fits = [2 ** k for k in range(6, 40) if memory(2 ** k) <= free]
            raise UsageError(f"--{'contexts' if lengths[-1] in contexts else 'lengths'} {lengths[-1]:,}: {m}'s "
                             f"training step there needs about {need / 2 ** 30:,.0f} GiB and {free / 2 ** 30:,.0f} GiB "
                             f"are free here: use lengths up to about {fits[-1] if fits else 0:,} (or a smaller "
                             "--batch or model)")
    matmul_rate(device, args.dtype, "wall", n=(side := min(1024, matmul_size(device, args.dtype))), count=1)  # warm-up
    seconds = work / (rate := matmul_rate(device, args.dtype, "wall", n=side, count=4))
    seconds += args.repeats * 2 * matmul_size(device, args.dtype) ** 3 * 20 / rate     # each round's matmul_rate (20 products)
    # --generate's decode steps: >= 0.1 ms a layer each (~20 operations at >= 5 us; 0.5 ms measured, 1 thread)
    seconds += (args.repeats + 1) * len(contexts) * len(models) * args.new_tokens * 1e-4 * args.n_layer
    if not args.infer_only and (steps or args.nanogpt or not args.generate):   # nanoGPT's configuration (as timed):
        c = NANOGPT_CPU                                      # --inner steps of 6 x params x tokens FLOPs a round
        seconds += (args.repeats + 1) * args.inner * (1 + bool(args.nanogpt)) * 6 * c["batch"] * c["block_size"] * (
            12 * c["n_layer"] * c["n_embd"] ** 2 + c["vocab"] * c["n_embd"]) / rate
    if seconds > 60 * args.max_minutes:
        raise UsageError(f"this benchmark would take about {seconds / 60:,.{0 if seconds >= 60 else 2}f} minutes here "
                         f"(--max_minutes {args.max_minutes:g}): use " + ("fewer --repeats or --inner" if not models
                         else "shorter --lengths, fewer --models or --repeats" + " or --new_tokens" * bool(contexts)))


def time_configs(configs, args, device):
    """Milliseconds of each configuration in each round (nanoGPT's configuration: the mean of --inner steps), and
    the machine's matrix-product rate (FLOP/s) measured once a round among them."""
    for _, steps, mode in configs:                           # warm-up (allocations, AdamW state)
        steps[mode]()
    times, rates = [[] for _ in configs], []

    def measure(i):
        if i == len(configs):
            return rates.append(matmul_rate(device, args.dtype, args.clock))
        rec, steps, mode = configs[i]
        n = args.inner if rec.get("config") == "nanogpt-cpu" else 1
        times[i].append(timed(steps[mode], device, n, args.clock))
    if configs:
        matmul_rate(device, args.dtype, args.clock, count=2)  # warm-up
    interleaved_rounds(len(configs) + 1, args.repeats if configs else 0, measure)
    return times, rates


def matmul_summary(rates, device, dtype):
    """The matmul rate of a run: the median of its measurements, each measurement, the products' side."""
    return {"flops_per_s": statistics.median(rates), "all": rates, "n": matmul_size(device, dtype)} if rates else None


def speed_records(configs, times, device):
    """One record per configuration: the median time, tokens/s, FLOPs, FLOP/s and peak memory."""
    records = []
    for (rec, steps, mode), ts in zip(configs, times):
        ms, flops = statistics.median(ts), count_flops(steps["flops_train" if mode == "train" else "infer"])
        records.append({**rec, "ms": ms, "ms_all": ts, "peak_mem_mb": peak_memory(steps[mode], device),
                        "tokens_per_s": rec["batch"] * rec["length"] / (ms / 1000), "flops": flops,
                        "flops_per_s": flops / (ms / 1000)})
    return records


def flop_shares(records, rate, peak):
    """Each record's FLOP/s as a share of the run's matmul rate (matmul_summary; and of the card's peak, when known),
    and against its baseline's FLOP/s at the same shape (the median of per-round ratios)."""
    for r in records:
        r["matmul_share"] = r["flops_per_s"] / rate["flops_per_s"]
        if peak:
            r["mfu"] = r["flops_per_s"] / peak
        base = next((b for name, others in BASELINES if r["model"] in others
                     for b in [find(records, name, r["length"], r["mode"], r.get("config"))] if b), None)
        if base is not None and base["flops"]:
            r["flops_vs_base"], r["base"] = r["flops"] / base["flops"] * paired(base, r), base["model"]


def find(records, model, length, mode, config=None):
    return next((r for r in records if r["model"] == model and r["length"] == length and r["mode"] == mode
                 and r.get("config") == config), None)


def paired(a, b):
    """The median over rounds of a's time / b's time (a round's ratio is free of the machine's slow spells)."""
    return float(np.median(np.array(a["ms_all"]) / np.array(b["ms_all"])))


# the ratios of tokens per second reported: (the baseline, the models compared with it)
BASELINES = (("softmax", ("simpletron", "transject", "diffeqformer")),
             ("softmax_naive", ("simpletron", "transject", "softmax")),
             ("causal_softmax_attention", ("causal_simple_attention",)),
             ("softmax_attention", ("simple_attention", "causal_simple_attention")))


def speed_ratios(records, models, lengths, infer_only):
    """Each model against its baseline at each length, checkpointing against the plain step, and the growth of
    each model's time from the first length to the last."""
    ratios = [{"what": f"{other} / {base} tokens per second", "length": L, "mode": mode, "ratio": paired(g, o)}
              for L, mode, (base, others) in itertools.product(lengths, ("train", "infer"), BASELINES)
              for other in others for g, o in [(find(records, base, L, mode), find(records, other, L, mode))]
              if g and o]
    ratios += checkpointing_ratios(records, models, lengths) + crossovers(records, lengths)
    mode, what = ("infer", "inference forward") if infer_only else ("train", "training step")
    return ratios + [{"what": f"{m} {what}, ms at {lengths[-1]} / ms at {lengths[0]} tokens",
                      "ratio": b["ms"] / a["ms"]} for m in models if len(lengths) >= 2
                     for a, b in [[find(records, m, n, mode) for n in (lengths[0], lengths[-1])]] if a and b]


def crossovers(records, lengths):
    """Where each model's training step overtakes its baseline's (measure.crossover of the per-round ratios)."""
    pts = {(base, m): [(L, paired(b, o)) for L in lengths for b, o in [(find(records, base, L, "train"),
                                                                      find(records, m, L, "train"))] if b and o]
           for base, others in BASELINES for m in others}
    return [{"what": f"{m}'s training step overtakes {base}'s", **crossover(p)} for (base, m), p in pts.items()
            if len(p) >= 2]


def checkpointing_ratios(records, models, lengths):
    ratios = []
    for L, m in itertools.product(lengths, models):
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
    ng, og = (find(records, m, NANOGPT_CPU["block_size"], "train", "nanogpt-cpu") for m in ("nanogpt", "softmax"))
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
    times, rates = time_configs(configs, args, device)
    records = speed_records(configs, times, device)
    args.matmul = matmul_summary(rates, device, args.dtype)
    flop_shares(records, args.matmul, args.peak)
    ratios = speed_ratios(records, models, lengths, args.infer_only)
    gen_records, gen_ratios = (speed_generate(args, device, [m for m in models if m in MODELS]) if args.generate
                               else ([], []))
    records, ratios = records + gen_records, ratios + gen_ratios + nanogpt_ratio(records)
    gen = {r["mode"] == "generate" for r in records if "config" not in r}   # the plots: of the steps, of generation
    md = speed_table(records, ratios, machine := machine_of(device, args))
    figures = {f"speed{'_generate' * g}.png": (plot_generate if g else plot_speed)(records, machine) for g in gen}
    write_all(args.out, {"speed.json": records, "speed_summary.json": {"machine": machine, "ratios": ratios,
              "settings": vars(args), "peak_mem_mb": PEAK_MEM_NOTE[torch.device(device).type]}, "speed.md": md,
              **figures}, md)


def machine_of(device, args):
    kind = torch.device(device).type
    return {"device": device, "machine": machine_name(device), "threads": torch.get_num_threads(),
            "clock": args.clock, "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "cpus": os.cpu_count(), "torch": torch.__version__, "dtype": str(args.dtype).split(".")[-1],
            "matmul": getattr(args, "matmul", None), "peak_flops": args.peak,
            "gpu": torch.cuda.get_device_name(device) if kind == "cuda" else "Apple MPS" if kind == "mps" else None}


PEAK_MEM_NOTE = {
    "cpu": "CPU: peak resident memory of the process during the step minus the resident memory just before it "
           "(Linux VmHWM reset via /proc/self/clear_refs, freed heap returned with malloc_trim first): what the "
           "step itself needs on top of the model and optimizer state, in MiB",
    "cuda": "CUDA: torch.cuda.max_memory_allocated during the step minus memory_allocated before it, in MiB",
    "mps": "MPS: not measured (no peak statistic)"}


def write_all(out, files, table):
    """OUT/NAME of each of files {NAME: a text, a figure (its PNG) or what JSON holds}, all written beside their copies
    before any replaces its copy (a full disk leaves each as it was, in one line naming the file); the table printed."""
    staged = {os.path.join(out, name): data.temp_path(os.path.join(out, name)) for name in files}
    try:
        for (path, tmp), v in zip(staged.items(), files.values()):
            with open(tmp, "wb") as f:
                if hasattr(v, "savefig"):                    # a figure: its PNG
                    v.savefig(f, format="png", dpi=110, bbox_inches="tight")
                else:                                        # (a torch.dtype in the settings: its name)
                    f.write((v if isinstance(v, str) else json.dumps(v, indent=1, default=lambda o: (
                        str if isinstance(o, torch.dtype) else float)(o)) + "\n").encode())
        for path, tmp in staged.items():
            os.replace(tmp, path)
    except OSError as e:
        raise data.DataError(f"cannot write {path}: {e.strerror or e}; it and the others are as they were") from None
    finally:
        plt.close("all")
        for tmp in (t for t in staged.values() if os.path.lexists(t)):   # (none once replaced)
            os.remove(tmp)
    print(f"{table}\nwrote {', '.join(staged)}")


def compile_records(args, device, models, lengths):
    """--compile: each model's training step eager and under torch.compile (a copy with the same weights): the first
    compiled step (compiling) and the first at half the length (the recompile that a batch of another length makes),
    less the eager steps, then --repeats interleaved rounds of both: the steady speed-up, the steps to pay it back."""
    records, rates = [], []
    for L, m in itertools.product(lengths, models):
        torch.manual_seed(0)
        eager, twin = speed_model(m, L, args).to(device), speed_model(m, L, args).to(device)
        twin.load_state_dict(eager.state_dict())
        steps = [make_steps(model, args.batch, n, args.vocab, args.head, device, args.dtype, m)["train"]
                 for model in (eager, torch.compile(twin)) for n in (L, max(1, L // 2))]
        first, ts = [timed(step, device) for step in steps], [[], []]   # eager: warm-up; compiled: compiling
        interleaved_rounds(3, args.repeats, lambda i: rates.append(matmul_rate(device, args.dtype, args.clock))
                           if i == 2 else ts[i].append(timed(steps[2 * i], device, 1, args.clock)))
        eager_ms, compiled_ms = statistics.median(ts[0]), statistics.median(ts[1])
        compile_s = (first[2] - eager_ms + first[3] - first[1]) / 1000
        records.append({"model": m, "length": L, "batch": args.batch, "eager_ms": eager_ms, "compiled_ms": compiled_ms,
                        "speedup": float(np.median(np.array(ts[0]) / np.array(ts[1]))), "compile_s": compile_s,
                        "break_even": 1000 * compile_s / (eager_ms - compiled_ms) if eager_ms > compiled_ms else None})
        torch._dynamo.reset()                                # the next model compiles afresh
    args.matmul = matmul_summary(rates, device, args.dtype)
    return records


# ----------------------------------------------------------------------------------------------
# --loop and --wall: the user's path. train.py's own loop beside the bare step of the same model on the same
# batches; the wall time of the README's commands, split into its parts
# the README's quickstart (its recipe) and main command (tests/test_bench.py holds them to the README)
USER_RUNS = {"quickstart": "@recipes/quickstart.txt", "main": "--model simpletron --task listops"}
RUN_STEPS = {"quickstart": 1000, "main": 1500}               # their --max_iters (the main command's: its preset's)
# what --loop times: (name, the run, its flags on top, steps left out first, steps timed; together a multiple of
# the log interval, 10, whose progress line tells when to stop it)
LOOPS = (("quickstart", "quickstart", "", 20, 300),
         ("main command, its 64-token prefixes", "main", "--short_steps 1000000", 10, 100),
         ("main command, full length", "main", "--short_steps 0", 10, 30))


def run_train(run, extra, out_dir, args, stop_at=None):
    """`python train.py` with a README command's flags, in a process of its own as a user runs it: its stdout lines,
    each with the seconds since the start when it came. stop_at: Ctrl-C once the progress line of that step is out
    (train.py stops after the step, writes ckpt.pt and log.jsonl, exit 130)."""
    flags = [f"@{ROOT}/{f[1:]}" if f.startswith("@") else f for f in USER_RUNS[run].split()]   # the recipe here
    argv = [sys.executable, os.path.join(ROOT, "train.py"), *flags, *extra.split(),
            "--out_dir", out_dir, "--cache_dir", args.cache_dir, "--device", args.device]
    t0, lines = time.perf_counter(), []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as p:
        for line in p.stdout:
            lines.append((time.perf_counter() - t0, line.rstrip("\n")))
            if stop_at and line.startswith(f"step {stop_at}/"):
                p.send_signal(signal.SIGINT)
        _, status, usage = os.wait4(p.pid, 0)                # its exit status and peak memory
        p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != (130 if stop_at else 0):
        raise UsageError(f"train.py {USER_RUNS[run]} {extra} stopped with exit status {p.returncode}: "
                         f"{lines[-1][1] if lines else 'no output'}")
    return lines + [(time.perf_counter() - t0, f"(exit; peak RSS {usage.ru_maxrss} kB)")]


def log_records(out_dir):
    """log.jsonl's step records {step: seconds of the run when it ended} and evaluation records {step: seconds}."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return tuple({r["step"]: r["time"] for r in records if key in r} for key in ("loss", "val_loss"))


def bare_steps(out_dir, first, last, device):
    """The bare training step (forward, backward, clipping, AdamW at the scheduled rate) of the run's model in
    out_dir, from train.py's first weights, on the batches train.py drew for its steps first + 1 .. last, one after
    the other: (the function, which returns the losses, the tokens)."""
    ckpt = load_checkpoint(os.path.join(out_dir, "ckpt.pt"))
    a = types.SimpleNamespace(**ckpt["args"])
    task = train.open_task(a, ckpt["config"], types.SimpleNamespace(on=False))
    split, batches = task.split("train"), []
    for it in range(first, last):                            # train.train_step's draw for step it + 1
        x, y = split.sample(a.batch_size, np.random.default_rng([a.seed, it]))
        batches.append((x[..., :a.short_len] if it < a.short_steps and task.kind != "lm" else x, y))
    torch.manual_seed(a.seed)                                # train.py's first weights
    model = build_model(ckpt["model_name"], ckpt["config"]).to(device)
    opt = train.make_optimizer(model, a, device)
    _, autocast_, scaler = precision(getattr(a, "dtype", "auto"), device)   # train.py's --dtype (float16: scaled)

    def steps():                                             # the losses, read as train.py reads them
        losses = []
        for it, (x, y) in enumerate(batches, first):
            for group in opt.param_groups:                   # train.py's learning-rate schedule
                group["lr"] = train.learning_rate(a, it + 1) * group["lr_scale"]
            with autocast_:
                _, loss = model(x.to(device), y.to(device))
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip or math.inf)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses
    return steps, sum(split.tokens_in(x) for x, _ in batches)


def loop_records(args, device):
    """--loop: each of LOOPS (and with --compile, each again with train.py --compile true) in --repeats rounds:
    train.py's steps (log.jsonl's clock), then the bare steps on the same batches; ms per step and tokens/s of both,
    their ratio (the median of per-round ratios), and the run's seconds up to the first step timed."""
    records, rates = [], []
    for (name, run, extra, skip, n), flag in itertools.product(LOOPS, ["", "--compile true"][:1 + args.compile]):
        loop_s, bare_s, start_s = [], [], []
        with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
            for r in range(args.repeats):
                out = os.path.join(tmp, str(r))
                run_train(run, f"{extra} {flag} --eval_interval 1000000 --max_iters {skip + n + 1000}", out, args,
                          skip + n)
                steps = log_records(out)[0]
                loop_s.append(steps[skip + n] - steps[skip])
                start_s.append(steps[skip])
                if r == 0:
                    bare, tokens = bare_steps(out, skip, skip + n, device)
                    bare()                                   # warm-up
                bare_s.append(timed(bare, device, 1, "wall") / 1000)
                rates.append(matmul_rate(device, args.dtype, "wall"))
                print(f"  {name} {flag}: round {r + 1}/{args.repeats} done", flush=True)
        records.append({"what": f"{name}{', ' + flag if flag else ''}", "steps": n, "tokens": tokens,
                        "run_steps": RUN_STEPS[run],
                        "command": f"python train.py {USER_RUNS[run]} {extra} {flag}".strip(),
                        "loop_ms": 1000 * statistics.median(loop_s) / n, "loop_s_all": loop_s,
                        "bare_ms": 1000 * statistics.median(bare_s) / n, "bare_s_all": bare_s,
                        "start_s": statistics.median(start_s), "skipped": skip,
                        "ratio": float(np.median(np.array(bare_s) / np.array(loop_s)))})
    args.matmul = matmul_summary(rates, device, args.dtype)
    return records


def wall_split(args, device):
    """--wall: the README's commands from an empty cache, each in full, their wall time split by their output
    lines and log.jsonl: start-up, data generation and loading, training steps, evaluations, exit."""
    records = []
    for run in USER_RUNS:
        with tempfile.TemporaryDirectory(prefix="bench-wall-") as tmp:
            own, out = types.SimpleNamespace(cache_dir=os.path.join(tmp, "data"), device=args.device), f"{tmp}/run"
            lines = run_train(run, "", out, own)
            steps, evals = log_records(out)
            first = min(steps, key=lambda s: s if s % 10 == 0 else math.inf)  # its progress line: the two clocks
            offset = next(t for t, text in lines if text.startswith(f"step {first}/")) - steps[first]
            at = {key: next((t for t, text in lines if test(text)), None) for key, test in (
                ("data", lambda text: text.startswith("generating")), ("model", lambda text: " params, " in text),
                ("wrote", lambda text: text.startswith("wrote ") and text.endswith("metrics.json")))}
            last = offset + steps[max(steps)]
            in_training = sum(evals[s] - steps[s] for s in evals if s < max(steps))
            records.append({"what": run, "command": f"python train.py {USER_RUNS[run]}", "wall": lines[-1][0],
                            "peak_rss_kb": int(lines[-1][1].split()[-2]),
                            "phases": {"start-up (Python, torch, the flags)": at["data"] or at["model"],
                                       "data generation and loading": at["model"] - (at["data"] or at["model"]),
                                       "training steps": last - at["model"] - in_training,
                                       "evaluations during training (val, ckpt.pt, loss.png)": in_training,
                                       "the last evaluation and the final one on all of val and test":
                                           at["wrote"] - last,
                                       "exit": lines[-1][0] - at["wrote"]}})
        print(f"  {run}: {records[-1]['wall']:.1f} s", flush=True)
    return records


def user_tables(loops, walls, compiled, machine):
    """--loop, --wall and --compile's tables, under the machine's lines."""
    lines = machine_lines(machine)
    if loops:
        lines += ["train.py's loop (its log.jsonl's clock over the steps timed: the batches, the step, the log, the "
                  "progress line) beside the bare step (forward, backward, clipping, AdamW) on the same batches:", ""]
        lines += md_table(["run", "steps timed", "train.py ms/step", "bare step ms/step", "train.py tokens/s",
                           "bare tokens/s", "train.py / bare (tokens/s)"],
                          [[r["what"], r["steps"], f"{r['loop_ms']:.2f}", f"{r['bare_ms']:.2f}",
                            f"{r['tokens'] / r['loop_ms'] / r['steps'] * 1000:,.0f}",
                            f"{r['tokens'] / r['bare_ms'] / r['steps'] * 1000:,.0f}", f"{r['ratio']:.3f}"]
                           for r in loops]) + [""] + [f"- {r['what']}: `{r['command']}`" for r in loops]
        for r, e in ((r, e) for r in loops for e in loops if r["what"] == e["what"] + ", --compile true"):
            gain, cost = e["loop_ms"] - r["loop_ms"], r["start_s"] - e["start_s"]
            lines.append(f"- {r['what']}: {cost:.1f} s more up to step {r['skipped']}, then "
                         f"{e['loop_ms'] / r['loop_ms']:.2f}x the steps' pace: " +
                         (f"paid back after {1000 * cost / gain:,.0f} steps" if gain > 0 else "never paid back") +
                         f" (the run: {r['run_steps']:,} steps)")
        lines.append("")
    for r in walls:
        lines += [f"`{r['command']}` from an empty cache: {r['wall']:.1f} s of wall time, peak RSS "
                  f"{r['peak_rss_kb']:,} kB", ""]
        lines += md_table(["part", "seconds", "share"], [[k, f"{v:.1f}", f"{100 * v / r['wall']:.1f}%"]
                                                         for k, v in r["phases"].items()]) + [""]
    if compiled:
        lines += ["torch.compile: the training step eager and compiled (default mode), medians of interleaved rounds; "
                  "compiling: the first compiled step and the first at half the length, less the eager steps:", ""]
        lines += md_table(["model", "batch x tokens", "eager ms", "compiled ms", "speed-up", "compiling s",
                           "steps to pay it back"],
                          [[r["model"], f"{r['batch']} x {r['length']}", f"{r['eager_ms']:.1f}",
                            f"{r['compiled_ms']:.1f}", f"{r['speedup']:.2f}", f"{r['compile_s']:.1f}",
                            f"{r['break_even']:,.0f}" if r["break_even"] else "never"] for r in compiled]) + [""]
    return "\n".join(lines)


def run_user(args, device, models, lengths):
    """--loop, --wall, --compile: their records and tables, OUT/user.{json,md}."""
    loops = loop_records(args, device) if args.loop else []
    walls = wall_split(args, device) if args.wall else []
    compiled = compile_records(args, device, models, lengths) if args.compile and not args.loop else []
    md = user_tables(loops, walls, compiled, machine := machine_of(device, args))
    write_all(args.out, {"user.json": {"machine": machine, "loop": loops, "wall": walls, "compile": compiled,
                                       "settings": vars(args)}, "user.md": md}, md)


# ----------------------------------------------------------------------------------------------
# --generate: milliseconds per new token against the context length
def generation_steps(model, batch, context, new_tokens, vocab, device, name):
    """(prefill, decode) closures of the model `name` (config.model_call): prefill reads a fixed random prompt of
    `context` tokens into a new state; decode runs new_tokens model.decode steps on it (fixed random tokens)."""
    g = torch.Generator().manual_seed(0)
    prompt, tokens = (torch.randint(1, vocab, (batch, n), generator=g).to(device) for n in (context, new_tokens))
    holder = {}

    def prefill():
        holder["state"] = model_call(name, "prefill", model.prefill, prompt, capacity=context + new_tokens)[1]

    def decode():
        state = holder.pop("state")
        for i in range(new_tokens):
            model_call(name, "decode", model.decode, tokens[:, i:i + 1], state)
        if not (sizes := state_sizes(name, state)):
            raise UsageError(f"model {name!r} ({os.path.relpath(model_module(name).__file__)}): its prefill's state, "
                             f"a {type(state).__name__}, holds no tensor (in dicts, lists, tuples) and has no nbytes()")
        holder["size"] = sum(sizes)
    return prefill, decode, holder


def state_sizes(name, x):
    """The bytes of each tensor in x, a model's generation state, and of each object there with nbytes()
    (docs/architecture.md, Add a model), in any nesting of dicts, lists and tuples."""
    if isinstance(x, (dict, list, tuple)):
        return [n for v in (x.values() if isinstance(x, dict) else x) for n in state_sizes(name, v)]
    if torch.is_tensor(x):
        return [x.nbytes]
    return [model_call(name, "its state's nbytes", x.nbytes)] if callable(getattr(x, "nbytes", None)) else []


def speed_generate(args, device, models):
    """Generation benchmark: for each model and context, in interleaved rounds, a prefill of the prompt (timed
    on its own) and then new_tokens decode steps timed together: ms per new token. Records and ratios."""
    configs = []
    for L, m in itertools.product(args.context_list, models):
        model = speed_model(m, L + args.new_tokens, args, head="lm").to(device).eval()
        configs.append(({"model": m, "length": L, "mode": "generate", "batch": args.batch,
                         "new_tokens": args.new_tokens, "params": sum(p.numel() for p in model.parameters())},
                        generation_steps(model, args.batch, L, args.new_tokens, args.vocab, device, m)))
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
    records = [{**rec, "ms": (ms := statistics.median(ts)), "ms_all": ts, "tokens_per_s": rec["batch"] / (ms / 1000),
                "prefill_ms": statistics.median(ps), "state_mb": holder["size"] / 2 ** 20}
               for (rec, (_, _, holder)), ts, ps in zip(configs, per_token, prefill_ms)]
    return records, generation_ratios(records, models, args.context_list)


def generation_ratios(records, models, contexts):
    """Each model's time per new token at the longest context over the shortest, and against softmax's."""
    growth = [{"what": f"{m} ms per new token at a {contexts[-1]}-token context / at {contexts[0]} (median "
                       "of per-round ratios)",
               "ratio": paired(find(records, m, contexts[-1], "generate"), find(records, m, contexts[0], "generate"))}
              for m in models if len(contexts) >= 2]
    return growth + [{"what": f"{m} / softmax ms per new token", "length": L, "mode": "generate",
                      "ratio": paired(find(records, m, L, "generate"), find(records, "softmax", L, "generate"))}
                     for L in contexts for m in models if "softmax" in models and m != "softmax"]


# ----------------------------------------------------------------------------------------------
# The table and the plots
def machine_lines(machine):
    """The machine, the clock and the matmul rate measured in the run: the lines above every table."""
    clock = "CPU time of the process" if machine["clock"] == "cpu" else "wall time"
    load, mm = machine.get("load_average"), machine.get("matmul")
    lines = [f"Machine: {machine['machine']}, {machine['threads']} torch threads, {machine['dtype']}; {clock}, "
             "medians of interleaved rounds" + (f"; load average at the end {load[0]:.1f}" if load else "") + "."]
    if mm:
        lines.append(f"Sustained {machine['dtype']} matmul rate, measured in this run (20 back-to-back {mm['n']} x "
                     f"{mm['n']} products, once a round): {mm['flops_per_s'] / 1e9:,.1f} GFLOP/s (range "
                     f"{min(mm['all']) / 1e9:,.1f}-{max(mm['all']) / 1e9:,.1f})" +
                     (f"; the card's peak {machine['peak_flops'] / 1e12:,.0f} TFLOP/s (MFU)" if machine["peak_flops"]
                      else "") + ".")
    return lines + [""]


def speed_table(records, ratios, machine):
    mfu = machine.get("peak_flops") is not None
    gen, records = [r for r in records if r["mode"] == "generate"], [r for r in records if r["mode"] != "generate"]
    lines = machine_lines(machine) + (md_table(
        ["model", "config", "batch x tokens", "mode", "ms", "tokens/s", "peak MiB", "GFLOP", "GFLOP/s",
         "share of matmul", "GFLOP/s / baseline's"] + ["MFU"] * mfu,
        [[r["model"], r.get("config", "speed"), f"{r['batch']} x {r['length']}", r["mode"], f"{r['ms']:.1f}",
          f"{r['tokens_per_s']:,.0f}", f"{r['peak_mem_mb']:.0f}", f"{r['flops'] / 1e9:.2f}",
          f"{r['flops_per_s'] / 1e9:.1f}", f"{100 * r['matmul_share']:.0f}%",
          f"{r['flops_vs_base']:.2f} ({r['base']})" if "base" in r else ""] +
         ([f"{100 * r['mfu']:.1f}%"] if mfu else []) for r in records], left=4) if records else [])
    if gen:
        lines += ["", f"Generation: milliseconds per new token after a prompt of `context` tokens (median over "
                      f"rounds of the mean of {gen[0]['new_tokens']} decode steps), the prefill of the prompt, and the "
                      "size of the state kept between tokens.", ""]
        lines += md_table(["model", "batch x context", "ms per new token", "new tokens/s", "prefill ms", "state MiB"],
                          [[r["model"], f"{r['batch']} x {r['length']}", f"{r['ms']:.2f}", f"{r['tokens_per_s']:,.0f}",
                            f"{r['prefill_ms']:.1f}", f"{r['state_mb']:.2f}"] for r in gen], left=2)
    lines.append("")
    for q in ratios:
        where = f" at {q['length']} tokens ({q['mode']})" if "length" in q else ""
        lines.append(f"- {q['what']}{where}: {q['text'] if 'text' in q else format(q['ratio'], '.2f')}")
    return "\n".join(lines) + "\n"


def length_axes(ax, lengths, ys, xlabel, ylabel):
    """Log-log axes: the lengths measured as the x ticks, readable y ticks around the values drawn."""
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel=xlabel, ylabel=ylabel)
    ax.set_xticks(lengths, [str(v) for v in lengths])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    if len(lengths) == 1:
        ax.set_xlim(lengths[0] / 1.5, lengths[0] * 1.5)
    if ys:
        log_ticks(ax, "y", ys)
    ax.grid(True, which="major", alpha=0.3)


def finish_figure(fig, handles, ncol, what, machine, batch):
    """One legend under the panels, where it hides no line; the machine in the title (written by write_all)."""
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(f"{what} on {machine['device']}" + (f" ({machine['gpu']})" if machine["gpu"] else
                                                     f", {machine['threads']} torch thread(s), "
                                                     f"{'CPU' if machine['clock'] == 'cpu' else 'wall'} time") +
                 f"; batch {batch}, medians of interleaved rounds")
    return fig


def plot_speed(records, machine):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    rows = [r for r in records if "config" not in r and r["mode"] in ("train", "infer")]
    names = list(dict.fromkeys(r["model"] for r in rows))
    for ax, key, ylabel in ((axes[0], "ms", "milliseconds per step"), (axes[1], "peak_mem_mb", "peak memory (MiB)")):
        ys = []
        for n_i, name in enumerate(names):
            for mode, ls in (("train", "-"), ("infer", "--")):
                rs = sorted((r for r in rows if r["model"] == name and r["mode"] == mode), key=lambda r: r["length"])
                if rs:
                    ys += (y := [max(r[key], 1e-3) for r in rs])
                    ax.plot([r["length"] for r in rs], y, ls, marker="o", color=plt.cm.tab10(n_i))
        length_axes(ax, sorted({r["length"] for r in rows}), ys, "sequence length (tokens)", ylabel)
    axes[0].set_title("time per training step and inference forward")
    axes[1].set_title("peak memory of the step above the model's")
    handles = [plt.Line2D([], [], color=plt.cm.tab10(i), marker="o", label=name) for i, name in enumerate(names)]
    handles += [plt.Line2D([], [], color="0.3", ls="-", label="solid: training step (forward, backward, AdamW)"),
                plt.Line2D([], [], color="0.3", ls="--", label="dashed: inference forward")]
    return finish_figure(fig, handles, min(len(handles), 4), "Speed", machine, rows[0]["batch"])


LOOKS = (("o", "-"), ("s", "--"), ("D", ":"), ("^", "-."))   # marker and dashes of model 1, 2, ...


def same_lines(lines):
    """The pairs (later, earlier) of lines {name: (x, y)} that are drawn one over the other: the same x, and y
    within 1% (on a log axis, closer than a line's width)."""
    return [(b, a) for j, b in enumerate(lines) for a in list(lines)[:j]
            if lines[a][0] == lines[b][0] and np.allclose(lines[a][1], lines[b][1], rtol=0.01)]


def plot_generate(records, machine):
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
        if same := same_lines(lines):
            ax.text(0.02, 0.98, "; ".join(f"{b} lies on {a} (within 1%)" for b, a in same), transform=ax.transAxes,
                    va="top", fontsize=8, color="0.3")
        length_axes(ax, sorted({r["length"] for r in rows}), [y for _, ys in lines.values() for y in ys],
                    "context: tokens before the new one", ylabel)
    axes[0].set_title(f"time per new token (mean of {rows[0]['new_tokens']} decode steps)")
    axes[1].set_title("recurrent state (fixed) or KV cache (grows)")
    handles = [plt.Line2D([], [], color=plt.cm.tab10(i), marker=LOOKS[i % 4][0], ls=LOOKS[i % 4][1],
                          mfc="none" if i else None, label=name) for i, name in enumerate(names)]
    return finish_figure(fig, handles, len(names), "Generation", machine, rows[0]["batch"])


# ----------------------------------------------------------------------------------------------
# Command line
def parse(argv):
    p = Parser(description=__doc__ or "Benchmark of the models.", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/analysis", help="folder for speed.json, speed.md and the plots")
    p.add_argument("--models", default=",".join(MODELS),
                   help="models of train.py, or one attention alone: " + ", ".join(ATTENTION))
    p.add_argument("--lengths", default="1024,4096")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (the median is reported)")
    p.add_argument("--inner", type=int, default=10, help="nanoGPT configuration: steps per timing")
    for name, default in (("batch", 1), ("n_layer", 4), ("n_head", 4), ("n_embd", 128), ("vocab", 256)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--head", default="lm", choices=("lm", "cls"), help="lm (causal) or cls")
    p.add_argument("--time_dim", type=int, help="DiffEqFormer's d_t (default: its Config's)")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    p.add_argument("--clock", default="wall", help="wall (elapsed) or cpu (CPU time of the process: with "
                   "--threads 1, robust to other programs sharing the CPU)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"), help="bfloat16: the forward "
                   "under autocast, as train.py on CUDA; auto: bfloat16 on CUDA, float32 elsewhere")
    p.add_argument("--peak_tflops", type=float, help="the device's peak TFLOP/s for MFU (default: by the name of "
                   "an NVIDIA card, bfloat16; none on a CPU, where the matmul rate measured in the run stands beside)")
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
    p.add_argument("--compile", action="store_true", help="instead: each model's training step eager and under "
                   "torch.compile: compiling time, steady speed-up, the steps to pay it back (OUT/user.md); with "
                   "--loop: train.py --compile true beside train.py")
    p.add_argument("--loop", action="store_true", help="instead: train.py's loop on the README's quickstart and main "
                   "command beside the bare step on the same batches (OUT/user.md; data from --cache_dir)")
    p.add_argument("--wall", action="store_true", help="instead (with --loop: too): the README's two commands in "
                   "full from an empty cache, their wall time split into its parts (the main command: minutes)")
    p.add_argument("--cache_dir", default="data", help="--loop: train.py's --cache_dir")
    p.add_argument("--max_minutes", type=float, default=60, help="refuse a benchmark estimated to take longer")
    args = p.parse_typed(argv)                               # (args.typed: recorded in speed.json)
    user, steps = args.loop or args.wall, args.lengths.strip() != ""    # a flag honoured or refused, never dropped:
    mode = "--loop or --wall" if user else "--compile" if args.compile else None
    alone = args.compare_only and not (mode or args.infer_only)    # --compare_only: nanoGPT's configuration alone
    acts = {"contexts": (args.generate, "--generate"), "new_tokens": (args.generate, "--generate"),
            "cache_dir": (user, "--loop or --wall"),
            "clock": (not user, "the step benchmark, --generate or --compile, not --loop or --wall (the wall clock)"),
            **dict.fromkeys(("repeats", "dtype", "threads"), (args.loop or not args.wall, "bench.py's own steps, not "
                            "--wall alone (each README command runs once, in a train.py process of its own)")),
            "peak_tflops": (not mode, f"the step benchmark's FLOP/s (MFU), not {mode}"),
            "max_minutes": (not user, "the benchmarks it estimates, not --loop or --wall"),
            "lengths": (not (user or alone), "the step benchmark or --compile (--loop: the README's runs; "
                        "--compare_only: nanoGPT's configuration alone)"),
            "checkpointing": (steps and not (mode or args.infer_only or alone),
                              "training steps at --lengths (not --infer_only or --compare_only)"),
            "compare_only": (not (mode or args.infer_only), "training steps of the step benchmark (not --infer_only)"),
            "inner": (not (mode or args.infer_only) and (steps or args.nanogpt or not args.generate),
                      "nanoGPT's configuration's training step, in the step benchmark"),
            **{f: (not mode and ok, f"the step benchmark, not {mode or why}") for f, ok, why in (
                ("generate", not alone, "--compare_only (nanoGPT's configuration alone)"),
                ("infer_only", steps, "generation alone (--lengths '')"),
                ("nanogpt", not args.infer_only, "--infer_only (nanoGPT's row is a training step)"))},
            **{f: (not (user or alone), "the benchmarks of --models, not " + ("--compare_only (nanoGPT's configuration "
                   "alone)" if alone else "--loop or --wall (the README's commands as they are)"))
               for f in ("models", "n_layer", "n_head", "n_embd", "vocab", "batch", "head", "time_dim")}}
    if moot := next((f for f, (used, _) in acts.items() if not used and f in args.typed), None):
        raise UsageError(f"--{moot}{'' if getattr(args, moot) is True else f' {getattr(args, moot)}'}: it acts only "
                         f"with {acts[moot][1]}; leave it out")
    for name, value in vars(args).items():                   # every flag, before any work: one line naming it
        check_value(name, value)
    check_device(args.device)
    outputs = ("user.json", "user.md") if mode else ("speed.json", "speed_summary.json", "speed.md", "speed.png",
                                                     "speed_generate.png")
    folder = next((f"its {f} is a folder, where a file is written: move it away or give another --out"
                   for f in outputs if os.path.isdir(os.path.join(args.out, f))), None)
    if problem := data.writable_problem(args.out) or folder:
        raise UsageError(f"--out {args.out}: {problem}")
    return args


def read_lists(args, device):
    """What the flags name, checked: (models, lengths, nanoGPT's model.py or None); args.context_list."""
    models, choices = [m.strip() for m in args.models.split(",") if m.strip()], ", ".join([*SPEED_MODELS, *ATTENTION])
    models = models if not args.compare_only else []
    for m in models:
        if m not in SPEED_MODELS and m not in ATTENTION:
            raise UsageError(f"unknown model {m!r} in --models; choose from {choices}")
        model_module(m if m in MODELS else SPEED_MODELS[m][0] if m in SPEED_MODELS else "simpletron")  # (checked)
    lengths = int_list("lengths", args.lengths) if not args.compare_only else []
    if not models and not (args.compare_only or args.loop or args.wall):
        raise UsageError(f"--models {args.models!r} names no model; choose from {choices}")
    if not lengths and not (args.compare_only or args.loop or args.wall or args.generate):
        raise UsageError(f"--lengths {args.lengths!r} names no length (only --generate runs without one)")
    whole, alone = [m for m in models if m in SPEED_MODELS], "whole models (an attention alone has no "
    if moot := next((f"--{f}{'' if getattr(args, f) is True else f' {getattr(args, f)}'}: it acts only with {what}, "
                     f"which --models {args.models} has not; leave it out" for f, used, what in (   # (no model has it)
                         ("checkpointing", whole, alone + "blocks)"), ("n_layer", whole, alone + "layers)"),
                         ("vocab", whole, alone + "embedding)"), ("head", whole, alone + "head)"),
                         ("n_head", [m for m in models if "n_head" not in unused_fields(SPEED_MODELS.get(m, (m,))[0])],
                          "heads (TransJect has none)"),
                         ("time_dim", set(models) & {"diffeqformer"}, "--models diffeqformer"))
                     if models and f in args.typed and not used), None):
        raise UsageError(moot)
    args.context_list = int_list("contexts", args.contexts) if args.generate else []
    if twice := next((f"--{f} {getattr(args, f)} names {v} twice: name each once" for f, vs in (("models", models),
                      ("lengths", lengths), ("contexts", args.context_list)) for v in vs if vs.count(v) > 1), None):
        raise UsageError(twice)
    if args.generate and (not args.context_list or min(args.context_list) < 1):
        raise UsageError("--generate needs --contexts of at least 1 token and --new_tokens of at least 1")
    if args.generate and args.head != "lm":
        raise UsageError(f"--generate times language models, not --head {args.head}: time it in a command of its own")
    if set(models) & set(ATTENTION) and args.n_embd % args.n_head:
        raise UsageError(f"--n_embd {args.n_embd} is not a multiple of --n_head {args.n_head} (the heads' width)")
    if args.compile and (alone := [m for m in models if m in ATTENTION]):
        raise UsageError(f"--compile times whole models; --models names {alone[0]}, an attention alone: leave it out")
    if args.generate and (odd := [m for m in models if m not in MODELS]) and (not lengths or odd == models):
        raise UsageError(f"--generate times whole models ({', '.join(MODELS)}), not {odd[0]}, which only the step "
                         "benchmark times (--lengths): leave it out")
    if lacking := [m for m in models if args.generate and m in MODELS and not {"prefill", "decode"} <= set(dir(
            model_module(m).Model))]:                        # (a fork's model: docs/architecture.md, Add a model)
        raise UsageError(f"--generate times model.prefill and model.decode, which {lacking[0]} has not: leave it out")
    nano = load_nanogpt(args.nanogpt) if args.nanogpt else None
    if args.clock == "cpu" and device != "cpu":
        raise UsageError("--clock is wall, or cpu (CPU time; on a CPU device only)")
    cuda = device.startswith("cuda")
    args.dtype = torch.bfloat16 if args.dtype == "bfloat16" or args.dtype == "auto" and cuda else torch.float32
    args.peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(torch.cuda.get_device_name(device)) \
        if cuda and args.dtype == torch.bfloat16 else None
    return models, lengths, nano


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    models, lengths, nano = read_lists(args, device := pick_device(args.device))
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    try:
        if not (args.loop or args.wall):                     # (the README's commands: run as they are)
            check_sizes(args, device, models, lengths)
        os.makedirs(args.out, exist_ok=True)
        if args.loop or args.wall or args.compile:
            run_user(args, device, models, lengths)
        else:
            run(args, device, models, lengths, nano)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    data.run_main(main, UsageError)
