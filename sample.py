"""
Sample text from a language model trained by train.py (nanoGPT's sample.py).

    python sample.py --ckpt out/softmax-ptb/ckpt.pt --start "the company said" --num_samples 3 --max_new_tokens 40
    python sample.py --ckpt out/x/ckpt.pt --start FILE:prompt.txt --temperature 0.8 --top_k 200 --seed 1337

Each sample is the prompt followed by its continuation, samples separated by a line of dashes. The text is
encoded and decoded with the checkpoint's own tokenizer, that of its task:
    ptb                       the word vocabulary the checkpoint records (one of a run before it recorded it:
                              rebuilt from the run's ptb.train.txt, its --data_dir or the copy under its
                              --cache_dir; --data_dir here if the files moved). Words are split on spaces, a line
                              break is <eos>; a word outside the vocabulary is an error (PTB is lower case, rare
                              words are <unk>, numbers N); with --tokenizer char its characters
    wikitext103, openwebtext  the run's --tokenizer (gpt2 by default, or byte) by tiktoken
    textfile                  the run's characters (--tokenizer char: the checkpoint records them) or its tiktoken
                              encoding
SimpleTRON and TransJect generate recurrently (a state of fixed size per layer), the softmax GPT and
DiffEqFormer with a KV cache; a model sees at most its block_size last tokens (see model.generate).
"""

import argparse
import inspect
import math
import os
import signal
import sys

if __name__ == "__main__":                                   # Ctrl-C while torch loads: stop at once, quietly
    signal.signal(signal.SIGINT, signal.SIG_DFL)             # (data.run_main reports it in one line once running)

import data  # noqa: E402  (data first: it loads torch, and a TORCH_* setting torch refuses is one line there)
import torch  # noqa: E402
import tasks  # noqa: E402, F401  (registers every task)
from config import (Parser, Refusal, UsageError, check_device, check_value, load_checkpoint,  # noqa: E402
                    model_call, model_of_checkpoint, pick_device)

WORD_HELP = "PTB is lower case, rare words are <unk> and numbers N"
# What one call may ask for. Each new token is one step of the model after the last (about 10 ms a token for a
# 4-layer, 128-wide model with 10 samples on a 2-core CPU) and the samples are printed when all are done: 100,000
# tokens, some 20 minutes there, are more than a sample is read for. A prompt file is read whole (the model sees its
# last block_size tokens). Below a temperature of 0.001 sampling is greedy but for rounding: --top_k 1 is greedy.
MAX_NEW_TOKENS, MAX_PROMPT_MB, MIN_TEMPERATURE = 100_000, 10, 1e-3
# The whole sampling is bounded too, by its operations: for each sample and new token the model's weights once (its
# parameters), its attention to the tokens it holds (2 x layers x tokens x n_embd), the ids so far (copied at each
# step) and the step's small operations (sampling, norms: STEP_OPS, what a step of a 1-layer, 16-wide model costs a
# sample here). The most above, 10 samples of 100,000 tokens from a 4-layer, 128-wide model, is 1.2e12 of them; a
# GPU is allowed GPU_SPEEDUP times as many.
MAX_WORK, STEP_OPS, GPU_SPEEDUP = 2e12, 50_000, 100


def parse(argv):
    p = Parser(description=__doc__ or "Sample text from a language model trained by train.py.",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="a ckpt.pt written by train.py for a language-model task")
    p.add_argument("--start", default="\n", help='the prompt, or FILE:path to read it from a file (default "\\n": '
                   "a line break, for PTB the start of a sentence)")
    p.add_argument("--num_samples", type=int, default=10, help="samples to draw (default 10)")
    p.add_argument("--max_new_tokens", type=int, default=500, help=f"tokens generated per sample (default 500, at "
                   f"most {MAX_NEW_TOKENS:,})")
    p.add_argument("--temperature", type=float, default=0.8, help="< 1 sharper, > 1 more random (default 0.8; at "
                   f"least {MIN_TEMPERATURE:g})")
    p.add_argument("--top_k", type=int, default=200, help="sample from the k most likely tokens only; 1 is greedy "
                   "(default 200; 0: all)")
    p.add_argument("--seed", type=int, default=1337, help="random seed of the samples (default 1337)")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, cuda:N, mps or cpu "
                   "(default auto)")
    p.add_argument("--data_dir", help="where the run's data is now, if it moved (rebuilds a word vocabulary)")
    return p.parse_typed(argv)


def check(args):
    """Everything a sampling needs, checked before it begins: (model, tokenizer, prompt ids, device). A bad flag,
    prompt, checkpoint or device, or more than MAX_NEW_TOKENS, MAX_WORK or the device's memory, is one line."""
    for name, value in vars(args).items():                  # config.LIMITS: what each flag allows
        if name != "typed":
            check_value(name, value)
    moot = (("temperature", "seed") if args.top_k == 1 else ("temperature", "top_k", "seed")
            if not args.max_new_tokens else ())
    if flag := next((k for k in moot if k in args.typed), None):   # (a flag is honoured or refused)
        raise UsageError(f"--{flag} {getattr(args, flag)}: " + ("--top_k 1 draws the most likely token, whatever the "
                         "temperature or seed" if args.top_k == 1 else "--max_new_tokens 0 draws nothing")
                         + f"; leave out --{flag}")
    if args.max_new_tokens > MAX_NEW_TOKENS:
        raise UsageError(f"--max_new_tokens {args.max_new_tokens:,}: allowed is at most {MAX_NEW_TOKENS:,} (each "
                         "token is one step after the last: about 20 minutes for a small model on a CPU)")
    if args.temperature < MIN_TEMPERATURE:
        raise UsageError(f"--temperature {args.temperature:g}: allowed is at least {MIN_TEMPERATURE:g} (below, "
                         "sampling is greedy but for rounding); --top_k 1 samples greedily")
    check_device(args.device)
    prompt = read_prompt(args.start)
    ckpt = load_checkpoint(args.ckpt)                        # UsageError if missing, unreadable or not train.py's
    head = ckpt["config"].get("head")
    if head != "lm":
        raise UsageError(f"{args.ckpt} is a classifier (head {head}, task {ckpt['args'].get('task')}); sample.py "
                         "needs a language model: a checkpoint of ptb, wikitext103, openwebtext or textfile")
    model = model_of_checkpoint(ckpt, args.ckpt)             # (its config checked before the tokenizer reads it)
    generate = getattr(model, "generate", None)              # (a fork's model without it, or without top_k)
    takes = inspect.signature(generate).parameters.values() if callable(generate) else []
    if not ({"temperature", "top_k"} <= {p.name for p in takes} or any(p.kind == p.VAR_KEYWORD for p in takes)):
        raise UsageError(f"model {ckpt['model_name']!r} has no generate(idx, max_new_tokens, temperature, top_k), "
                         "which sample.py calls (docs/architecture.md, Add a model)")
    tok, n = tokenizer_of(ckpt, args.data_dir)
    args.model, args.n_ids = ckpt["model_name"], n           # (what main checks generate's ids against)
    never = [*([0] if tok.padding else []), *range(n, model.config.vocab_size)]   # the padding id 0 of a data
    if never:                                                # vocabulary, and ids no text has (--vocab_size 50304)
        mask = lambda logits: logits.index_fill(-1, torch.tensor(never, device=logits.device),  # noqa: E731
                                                float("-inf"))
        if isinstance(getattr(model, "lm_head", None), torch.nn.Module):
            model.lm_head.register_forward_hook(lambda m, i, logits: mask(logits))
        else:                                                # (a fork's output layer of another name: its forward's)
            model.register_forward_hook(lambda m, i, out: (mask(out[0]), *out[1:]))
    ids = tok.encode(prompt)
    if not ids:
        raise UsageError("--start is empty: give at least one token of text")
    device = pick_device(args.device)
    check_memory(args, model.config, len(ids), device)
    check_work(args, model, len(ids), device)
    return model, tok, ids, device


def check_work(args, model, prompt, device):
    """A UsageError if the samples would take hours: their operations (MAX_WORK above) beyond the device's share."""
    c, tokens = model.config, prompt + args.max_new_tokens
    weights = sum(p.numel() for p in model.parameters())
    per_token = (weights + 2 * c.n_layer * min(tokens, c.block_size) * c.n_embd + prompt + args.max_new_tokens / 2
                 + STEP_OPS)
    work = args.num_samples * args.max_new_tokens * per_token
    allowed = MAX_WORK * (GPU_SPEEDUP if device.startswith("cuda") else 1)
    if work > allowed:
        raise UsageError(f"--num_samples {args.num_samples:,} x --max_new_tokens {args.max_new_tokens:,} from a model "
                         f"of {weights:,} weights are about {work:.1e} operations; allowed on {device} are "
                         f"{allowed:.0e} (some 30 minutes): lower --num_samples or --max_new_tokens")


def check_memory(args, c, prompt, device):
    """A UsageError if the samples would not fit the device's memory: per sample the ids (int64, copied at each
    step), the logits and probabilities of a step, and a KV cache's worth of decoding state (2 x layers x the
    tokens it holds x n_embd floats: the recurrent models keep less, DiffEqFormer's stages more)."""
    tokens = prompt + args.max_new_tokens
    need = args.num_samples * (2 * 8 * tokens + 3 * 4 * c.vocab_size + 2 * 4 * c.n_layer * min(tokens, c.block_size) *
                               c.n_embd)
    have = (torch.cuda.get_device_properties(device).total_memory if device.startswith("cuda") else
            os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else math.inf)
    if need > have:
        raise UsageError(f"--num_samples {args.num_samples:,} of {tokens:,} tokens (the prompt's {prompt:,} and "
                         f"--max_new_tokens {args.max_new_tokens:,}) need about {need / 2**30:,.1f} GiB for their "
                         f"ids and the model's decoding state; {device} has {have / 2**30:,.1f} GiB of memory: draw "
                         "fewer or shorter samples")


def read_prompt(start):
    """--start, or the text of the file it names (FILE:path): UTF-8, at most MAX_PROMPT_MB."""
    if not start.startswith("FILE:"):
        return start
    path = start[len("FILE:"):]
    problem = data.file_problem(path) if path else "is no path"
    if not problem and os.path.getsize(path) > MAX_PROMPT_MB * 2**20:
        problem = f"is {os.path.getsize(path) / 2**20:,.0f} MB, more than a prompt's {MAX_PROMPT_MB} MB"
    if problem:
        raise UsageError(f"--start FILE:{path}: cannot read it, it {problem}")
    return data.read_text(path)


# ----------------------------------------------------------------------------------------------
# The checkpoint's tokenizer: encode(text) -> ids, decode(ids) -> text

class Words:
    """PTB's word vocabulary, numbered as tasks.lm.ptb numbers it: the sorted words of the training file from 1."""
    padding = True                                           # id 0 stands for nothing: never drawn

    def __init__(self, words, source):
        self.itos = ["<pad>", *words]                        # id 0 is padding
        self.stoi = {w: i for i, w in enumerate(self.itos) if i}
        self.source = source

    def encode(self, text):
        words = []
        for i, line in enumerate(text.split("\n")):          # a line break is <eos>, as in tasks.lm.read_words
            if i:
                words.append("<eos>")
            words += line.split()
        unknown = next((w for w in words if w not in self.stoi), None)
        if unknown is not None:
            raise UsageError(f"word {unknown!r} of --start is not in the vocabulary of {len(self.stoi):,} words "
                             f"of {self.source} ({WORD_HELP})")
        return [self.stoi[w] for w in words]

    def decode(self, ids):
        lines = [[]]
        for i in ids:
            if self.itos[i] == "<eos>":
                lines.append([])
            else:
                lines[-1].append(self.itos[i])
        return "\n".join(" ".join(line) for line in lines)


class Chars:
    """textfile --tokenizer char: the distinct characters of the text numbered from 1 (tasks.lm.textfile)."""
    padding = True

    def __init__(self, chars):
        self.chars = chars
        self.stoi = {ch: i for i, ch in enumerate(chars, start=1)}

    def encode(self, text):
        unknown = next((ch for ch in text if ch not in self.stoi), None)
        if unknown is not None:
            raise UsageError(f"character {unknown!r} of --start does not occur in the training text")
        return [self.stoi[ch] for ch in text]

    def decode(self, ids):
        return "".join(self.chars[i - 1] for i in ids if i > 0)   # id 0 (padding) prints as nothing


class Tiktoken:
    padding = False                                          # (id 0 is a token: gpt2's '!', the byte 0)

    def __init__(self, enc):
        self.enc = enc

    def encode(self, text):
        return self.enc.encode(text, allowed_special={"<|endoftext|>"})

    def decode(self, ids):
        return self.enc.decode(ids)


def word_vocabulary(run_args, data_dir):
    """PTB's vocabulary from the training file the run read: --data_dir given here, the run's --data_dir, or
    the copy of the Hugging Face data under the run's --cache_dir."""
    folder = data_dir or run_args.get("data_dir") or os.path.join(run_args.get("cache_dir") or "data", "ptb")
    try:
        _, paths = data.release("ptb", folder, "pass --data_dir DIR, the folder of the run's ptb.train.txt",
                                ["ptb.train.txt"], ["simple-examples/data", "ptb"])
        return Words(sorted(set(tasks.lm.read_words(paths["ptb.train.txt"]))), paths["ptb.train.txt"])
    except data.DataError as e:
        raise UsageError(f"cannot rebuild the word vocabulary: {e}") from None


def char_vocabulary(run_args, data_dir, task):
    """The characters of a --tokenizer char run (textfile, ptb), from meta.json of the run's token cache (built
    again from the text if absent)."""
    loaded = data.load_task(task, cache_dir=run_args.get("cache_dir") or "data",
                            data_dir=data_dir or run_args.get("data_dir"), tokenizer="char")   # DataError if no text
    return Chars(loaded.meta["chars"])


def tokenizer_of(ckpt, data_dir=None):
    """The encoder/decoder of the checkpoint's task (one config.load_checkpoint read), checked against the model's
    vocabulary."""
    run_args, vocab_size = ckpt.get("args", {}), ckpt["config"]["vocab_size"]
    task, name, recorded = run_args.get("task"), run_args.get("tokenizer") or "gpt2", ckpt.get("vocabulary")
    if recorded and data_dir is not None:                    # (honoured or refused: nothing is rebuilt here)
        raise UsageError("--data_dir: the checkpoint records its vocabulary (the characters or words its ids stand "
                         "for); leave it out")
    if recorded:                                             # (train.py records them, checked on loading)
        tok = Chars(recorded) if isinstance(recorded, str) else Words(recorded, "the checkpoint's training file")
        n = len(recorded) + 1
    elif task == "ptb" and name != "char":
        tok = word_vocabulary(run_args, data_dir)
        n = len(tok.itos)
    elif name == "char" and task in ("textfile", "ptb"):
        tok = char_vocabulary(run_args, data_dir, task)
        n = len(tok.chars) + 1
    elif task in ("wikitext103", "openwebtext", "textfile"):
        if data_dir is not None:                             # (honoured or refused: nothing is rebuilt here)
            raise UsageError(f"--data_dir: the run's {name} tokenizer needs no data to rebuild; leave it out")
        tok = Tiktoken(tasks.sources.get_tokenizer(name, task))
        n = tok.enc.n_vocab
    else:
        raise UsageError(f"no tokenizer for task {task!r} here; sample.py knows ptb, wikitext103, openwebtext, textfile")
    if n > vocab_size:                                       # (fewer: a --vocab_size above the task's, ids unused)
        raise UsageError(f"the {task} vocabulary rebuilt here has {n:,} ids but the checkpoint's model has "
                         f"{vocab_size:,}: the data changed since training (or pass --data_dir, the run's data)")
    return tok, n


# ----------------------------------------------------------------------------------------------

def check_generated(y, args):
    """What the model's generate returned (a fork's may return anything): a Refusal line unless it is the integer
    ids (num_samples, tokens) of the tokenizer's args.n_ids, which decode reads."""
    what = f"model {args.model!r}: its generate returned"
    if not (torch.is_tensor(y) and y.dim() == 2 and len(y) == args.num_samples and not y.is_floating_point()
            and not y.is_complex() and y.dtype != torch.bool):
        shape = f"a {y.dtype} tensor of shape {tuple(y.shape)}" if torch.is_tensor(y) else type(y).__name__
        raise Refusal(f"{what} {shape}, not the integer ids of the samples ({args.num_samples}, tokens) that "
                      "sample.py decodes (docs/architecture.md, Add a model)")
    outside = y[(y < 0) | (y >= args.n_ids)]
    if outside.numel():
        raise Refusal(f"{what} id {outside[0].item()} outside the vocabulary (ids 0 to {args.n_ids - 1:,} of the "
                      "checkpoint's tokenizer), which sample.py cannot decode")


def main(argv=None, out=sys.stdout):
    args = parse(sys.argv[1:] if argv is None else argv)
    model, tok, ids, device = check(args)
    model.to(device).eval()
    torch.manual_seed(args.seed)                             # every device's generator, CUDA's too
    x = torch.tensor([ids], dtype=torch.long, device=device).repeat(args.num_samples, 1)   # (N, L)
    y = model_call(args.model, "generate", model.generate, x, args.max_new_tokens, temperature=args.temperature,
                   top_k=args.top_k or None)                 # (a fork's failure: one line naming its file and line)
    check_generated(y, args)
    for row in y.tolist():
        print(tok.decode(row), file=out)
        print("---------------", file=out)
    return y


if __name__ == "__main__":
    data.run_main(main, UsageError)
