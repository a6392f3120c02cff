"""A flag is honoured or refused (runsetup.py): under --resume, one that a run may change on its way is applied and
said in one line, one that would change the model, its shape or weights, or the task is refused in one line before
any data is read; --init_from takes the checkpoint's model and lays the Config flags given over its settings."""

import dataclasses
import os
import re
import sys
import threading

import numpy as np
import pytest
import torch

import config
import data
import runsetup
import train
from tasks import recall
from test_faults import one_line
from test_train import TINY, run, write_listops


@pytest.fixture(scope="module")
def lra(tmp_path_factory):
    return write_listops(tmp_path_factory.mktemp("lra"), 16, seed=1)


@pytest.fixture(scope="module")
def done(lra, tmp_path_factory):
    """A finished 2-step SimpleTRON run on ListOps (dropout 0, n_embd 16, block_size 60)."""
    out = tmp_path_factory.mktemp("run") / "o"
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--block_size", "60", "--out_dir", out)
    return out


@pytest.fixture
def no_data(monkeypatch):
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))


@pytest.mark.parametrize("flags, shown", [
    (["--n_embd", "32"], "--n_embd 32: {out} holds a simpletron run on listops with n_embd 16"),
    (["--block_size", "40"], "--block_size 40: {out} holds a simpletron run on listops with block_size 60"),
    (["--attention", "softmax"], "--attention softmax: {out} holds a simpletron run on listops with attention simple"),
    (["--listops_len", "5,50"], "--listops_len 5,50: {out} holds a simpletron run on listops with listops_len"),
    (["--tokenizer", "byte"], "--tokenizer byte: {out} holds a simpletron run on listops with tokenizer gpt2"),
    (["--data_dir", "elsewhere"], "--data_dir elsewhere: {out} holds a simpletron run on listops with data_dir"),
    (["--preset", "paper"], "--preset paper: {out} holds a simpletron run on listops with preset cpu"),
    (["--init_from", "{out}/ckpt.pt"], "--init_from {out}/ckpt.pt: {out} holds a simpletron run on listops with "
                                       "init_from None"),
    (["--overwrite"], "--overwrite with --resume: --resume continues the run in {out}, --overwrite would start a "
                      "new one over it; give one of them"),
])
def test_resume_refuses_what_would_change_the_model_or_the_task(done, no_data, flags, shown):
    with pytest.raises(train.UsageError) as e:
        runsetup.settings(["--resume", "--out_dir", str(done), *[f.format(out=done) for f in flags]])
    one_line(e, shown.format(out=done), *(["which --resume continues as it is", "another --out_dir"]
                                          if flags != ["--overwrite"] else []))


def test_resume_applies_and_says_what_a_run_may_change(done, capsys):
    args, _, _, ckpt, _, config_dict = runsetup.settings([
        "--resume", "--out_dir", str(done), "--max_iters", "5", "--lr", "0.01", "--dropout", "0.25",
        "--n_embd", "16", "--data_dir", f"{ckpt_args(done)['data_dir']}/", "--eval_iters", "2"])
    assert (args.max_iters, args.lr, config_dict["dropout"], config_dict["n_embd"]) == (5, 0.01, 0.25, 16)
    said = capsys.readouterr().out.splitlines()
    assert said == [f"resuming {done} with --dropout 0.25 (the run had 0.0), --lr 0.01 (the run had 0.0005), "
                    "--max_iters 5 (the run had 2)"]       # the same values given again (a path with a /): unsaid
    assert args.batch_size == 4 and ckpt["iter"] == 2       # the run's own, where not given


def test_resume_takes_the_runs_own_data_however_its_path_is_written(done, tmp_path, monkeypatch, capsys):
    data_dir = ckpt_args(done)["data_dir"]
    os.symlink(data_dir, tmp_path / "link")
    monkeypatch.chdir(os.path.dirname(data_dir))
    for given in (os.path.basename(data_dir), str(tmp_path / "link")):     # relative; through a link
        args = runsetup.settings(["--resume", "--out_dir", str(done), "--data_dir", given])[0]
        assert args.data_dir == given and capsys.readouterr().out == ""       # the same data: nothing to say
    with pytest.raises(train.UsageError) as e:                                 # other data: refused
        runsetup.settings(["--resume", "--out_dir", str(done), "--data_dir", str(tmp_path)])
    one_line(e, f"--data_dir {tmp_path}: {done} holds a simpletron run on listops with data_dir")


def ckpt_args(out):
    return train.load_checkpoint(str(out / "ckpt.pt"))["args"]


def test_a_resumed_run_trains_with_the_changes(done, tmp_path):
    import shutil
    out = tmp_path / "o"
    shutil.copytree(done, out)
    m = run("--resume", "--out_dir", out, "--max_iters", "3", "--dropout", "0.5")
    assert m["iters"] == 3 and m["config"]["dropout"] == 0.5 and m["args"]["max_iters"] == 3


def test_init_from_lays_the_config_flags_given_over_the_checkpoints(done, lra, tmp_path):
    """The checkpoint's dropout is 0 and its norm "post" (the cpu preset's): the flags given win, the rest is the
    checkpoint's (n_embd 16), not the preset's (64)."""
    _, _, source, _, _, config_dict = runsetup.settings(["--init_from", str(done / "ckpt.pt"), "--dropout", "0.3",
                                                         "--norm", "pre", "--out_dir", str(tmp_path / "a")])
    assert source["config"]["dropout"] == 0.0 and source["config"]["norm"] == "post"
    assert (config_dict["dropout"], config_dict["norm"], config_dict["n_embd"]) == (0.3, "pre", 16)
    m = run("--init_from", done / "ckpt.pt", "--dropout", "0.3", "--max_iters", "1", "--eval_iters", "1",
            "--out_dir", tmp_path / "b")
    assert m["config"]["dropout"] == 0.3 and m["config"]["n_embd"] == 16


def test_init_from_takes_the_checkpoints_task_unless_one_is_given(done, lra, tmp_path):
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text("a text of its own\n" * 200, encoding="utf-8")
    args = runsetup.settings(["--init_from", str(done / "ckpt.pt"), "--out_dir", str(tmp_path / "a")])[0]
    assert (args.task, args.data_dir) == ("listops", str(lra))       # the checkpoint's task, from its files
    args = runsetup.settings(["--init_from", str(done / "ckpt.pt"), "--task", "textfile", "--tokenizer", "byte",
                              "--data_dir", str(tmp_path / "txt"), "--out_dir", str(tmp_path / "b")])[0]
    assert (args.task, args.data_dir) == ("textfile", str(tmp_path / "txt"))   # the task given wins
    with pytest.raises(train.UsageError, match=r"the checkpoint's model has vocab_size=\d+ but task textfile needs"):
        run("--init_from", done / "ckpt.pt", "--task", "textfile", "--tokenizer", "byte", "--data_dir",
            tmp_path / "txt", "--cache_dir", tmp_path / "cache", "--out_dir", tmp_path / "c")   # its model must fit


def test_init_from_with_a_shape_flag_says_which_flags_the_weights_do_not_fit(done, tmp_path):
    ckpt = done / "ckpt.pt"
    for flags, said in ((["--n_embd", "32"], "--n_embd 32: the weights of --init_from {} (n_embd 16) do not fit that "
                         "model; leave it out"),
                        (["--n_layer", "2", "--dropout", "0.3", "--n_embd", "32"], "--n_layer 2, --n_embd 32: the "
                         "weights of --init_from {} (n_layer 1, n_embd 16) do not fit that model; leave them out")):
        with pytest.raises(train.UsageError) as e:
            run("--init_from", ckpt, *flags, "--max_iters", "1", "--out_dir", tmp_path / "a")
        one_line(e, said.format(ckpt), "to fine-tune the checkpoint's model, or train a new one without --init_from")
        assert not (tmp_path / "a" / "ckpt.pt").exists()


def test_init_from_refuses_another_model(done, no_data, tmp_path):
    for model in ("transject", "softmax"):                   # softmax: the same weights' shapes, another model
        with pytest.raises(train.UsageError) as e:
            runsetup.settings(["--init_from", str(done / "ckpt.pt"), "--model", model, "--out_dir", str(tmp_path)])
        one_line(e, f"--model {model}: --init_from {done / 'ckpt.pt'} holds a simpletron model, whose weights the "
                 f"run would train instead; leave out --model, or train a {model} without --init_from")
    runsetup.settings(["--init_from", str(done / "ckpt.pt"), "--model", "simpletron", "--out_dir", str(tmp_path)])


def test_a_config_field_named_like_a_flag_is_refused_in_one_line(monkeypatch):
    import dataclasses
    import sys
    import types

    import config

    @dataclasses.dataclass
    class Config:
        n_layer: int = 1
        warmup: int = 3                                      # a Linear Transformer's own warm-up: --warmup's name

    monkeypatch.setitem(sys.modules, "shadowing", types.SimpleNamespace(Config=Config))
    monkeypatch.setitem(config.MODELS, "shadowing", ("shadowing", {}))
    with pytest.raises(train.UsageError) as e:
        config.parse_args(["--model", "shadowing"])
    one_line(e, "model 'shadowing': its Config field warmup has the name of train.py's flag --warmup; rename the field")
    for name in set(config.MODELS) - {"shadowing"}:         # the registered models take none
        config.model_module(name)


def test_flags_from_a_fifo_or_a_folder_are_one_line_not_a_wait(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    writer = threading.Thread(target=lambda: (tmp_path / "fifo").write_text("--max_iters 1\n"), daemon=True)
    writer.start()                                           # were it read, it would end: a failure, not a hang
    for name, why in (("fifo", "is not a regular file (a pipe, socket or device)"), (".", "is a folder, not a file")):
        path = os.path.join(tmp_path, name)
        with pytest.raises(config.UsageError, match=rf"^@{re.escape(path)}: {re.escape(path)} {re.escape(why)}; a file of flags"):
            config.parse_args([f"@{path}"])


@pytest.mark.parametrize("flags, shown", [
    (["--batch_size", str(10**9)], "--batch_size 1000000000 x --grad_accum 1 x --block_size 60 is 6e+10 tokens a step, "
                                   "more than 2**30: lower --batch_size or --grad_accum"),
    (["--grad_accum", str(10**9)], "--batch_size 4 x --grad_accum 1000000000 x --block_size 60 is 2.4e+11 tokens"),
    (["--n_layer", str(10**6)], "--batch_size 4 --block_size 60 --n_layer 1000000 --n_embd 16: the training needs at "
                                "least "),
    (["--n_embd", str(2**20), "--n_head", "1"], "--n_embd 1048576: the training needs at least "),
])
def test_a_run_too_large_for_the_machine_is_refused_before_any_data(lra, no_data, tmp_path, flags, shown):
    with pytest.raises(config.UsageError) as e:
        run("--data_dir", lra, *TINY, "--block_size", "60", *flags, "--out_dir", tmp_path / "o")
    one_line(e, shown)


@pytest.mark.parametrize("eval_only", [False, True])
def test_the_memory_bound_is_the_weights_with_adam_and_a_float_per_position_width_and_layer(monkeypatch, eval_only):
    """Weights counted on a real model of 3 layers (not extrapolated from 1 and 2), times 4 when training (gradients
    and Adam's two moments), and B x T x d x L floats (evaluating: B x T x d), 4 bytes each."""
    shape = dict(n_layer=3, n_embd=16, n_head=2, block_size=60, vocab_size=40, head="lm")
    weights = sum(p.numel() for p in config.build_model("simpletron", shape).parameters())
    B, T, d, L = 5, 60, 16, 3
    need = 4 * (weights + B * T * d if eval_only else 4 * weights + B * T * d * L)
    args = type("Args", (), dict(batch_size=B, grad_accum=7, eval_only=eval_only, device="cpu", steps=None, lora_rank=0))
    fits_exactly(monkeypatch, args, "simpletron", shape, need, "needs at least")


@pytest.mark.parametrize("flags, shown", [
    (["--listops_sizes", "9,9,9"], "--listops_sizes 9,9,9: it sets the generated listops examples, and --data_dir's "
                                   "files are read instead; leave out one of them"),
    (["--listops_depth", "4"], "--listops_depth 4: it sets the generated listops examples"),
    (["--listops_args", "2,4"], "--listops_args 2,4: it sets the generated listops examples"),
    (["--lora_alpha", "4"], "--lora_alpha 4 scales LoRA adapters, and there are none without --lora_rank r: give "
                            "both, or neither"),
    (["--listops_len", "5,20", "--block_size", "16"], "--listops_len 5,20: with --data_dir's files it sets only the "
                                                      "default block size, and the block size is set to 16"),
])
def test_a_flag_that_would_be_ignored_is_refused_before_any_data(lra, no_data, tmp_path, flags, shown):
    with pytest.raises(config.UsageError) as e:
        run("--data_dir", lra, *TINY, *flags, "--out_dir", tmp_path / "o")
    one_line(e, shown)


def test_a_recall_files_flags_are_refused_but_a_checkpoints_are_not(tmp_path, no_data):
    """--recall_pairs and --recall_sizes given with --data_dir's files are refused; the same values inherited from
    an --init_from checkpoint (trained on generated examples) are not."""
    for flag, value in (("--recall_pairs", "2"), ("--recall_sizes", "8,4,4")):
        with pytest.raises(config.UsageError) as e:
            run("--task", "mqar", "--data_dir", tmp_path, flag, value, *TINY, "--out_dir", tmp_path / "o")
        one_line(e, f"{flag} {value}: it sets the generated mqar examples, and --data_dir's files are read instead")
    with pytest.raises(config.UsageError):                   # (the refusal: before the data is read)
        run("--task", "mqar", "--data_dir", tmp_path, "--recall_pairs", "2", "--init_from", "x.pt")
    args = runsetup.settings(["--task", "mqar", "--recall_pairs", "2", "--out_dir", str(tmp_path / "o")])[0]
    assert args.recall_pairs == 2                            # (no --data_dir: the generator's)


def test_an_evaluation_on_files_keeps_the_generated_runs_settings(tmp_path):
    setting = ["--recall_len", "16", "--recall_pairs", "2", "--recall_vocab", "16"]
    run("--task", "mqar", *setting, "--recall_sizes", "16,8,8", *TINY, "--max_iters", "1", "--cache_dir",
        tmp_path / "c", "--out_dir", tmp_path / "o")
    files = tmp_path / "files"
    files.mkdir()
    recall.write_examples(str(files / "test.txt"), *recall.mqar(8, 16, 2, 16, seed=5))
    m = run("--init_from", tmp_path / "o" / "ckpt.pt", "--eval_only", "--data_dir", files, "--out_dir", tmp_path / "e")
    assert m["n_test"] == 8 and m["args"]["recall_pairs"] == 2 and m["args"]["data_dir"] == str(files)


def test_resume_with_fewer_steps_than_the_run_has_taken_is_refused(done, no_data, capsys):
    """(Else it evaluated again, rewrote metrics.json, and recorded a --max_iters below its step in ckpt.pt.)"""
    with pytest.raises(config.UsageError) as e:
        run("--resume", "--out_dir", done, "--max_iters", "1")
    one_line(e, f"--max_iters 1: {done} is at step 2 already; give more steps to train on, or --init_from "
                f"{done}/ckpt.pt --eval_only to evaluate it")


def test_an_ode_made_into_too_many_blocks_is_refused_before_any_data(tmp_path, no_data, monkeypatch):
    """--steps N makes a DiffEqFormer checkpoint N blocks of its own: their weights count (10**6 of them hung)."""
    ckpt = tmp_path / "deq.pt"
    model = config.build_model("diffeqformer", dict(config.MODELS["diffeqformer"][1], vocab_size=16, block_size=16,
                                                    n_layer=2, n_embd=16, n_head=2, time_dim=4, time_freqs=4))
    torch.save({"model_name": "diffeqformer", "config": dataclasses.asdict(model.config), "model": model.state_dict(),
                "args": {"task": "listops", "data_dir": None, "cache_dir": "data", "tokenizer": "gpt2"}}, ckpt)
    with pytest.raises(config.UsageError) as e:
        run("--init_from", ckpt, "--steps", str(10**6), "--out_dir", tmp_path / "o")
    one_line(e, "--n_layer 1000000 --n_embd 16: the training needs at least ")
    monkeypatch.setattr(os, "sysconf", lambda name: 1 if name == "SC_PAGE_SIZE" else 2**40)
    assert runsetup.settings(["--init_from", str(ckpt), "--steps", "4", "--out_dir", str(tmp_path / "o")])[0].steps == 4


def test_a_lora_rank_above_the_width_and_a_transfer_from_another_model_are_refused(done, tmp_path, no_data):
    with pytest.raises(config.UsageError) as e:
        run("--init_from", done / "ckpt.pt", "--lora_rank", "17", "--out_dir", tmp_path / "o")
    one_line(e, "--lora_rank 17: above the width n_embd 16 an adapter is no longer of low rank")
    softmax = tmp_path / "softmax.pt"
    ckpt = torch.load(done / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "model_name": "softmax", "config": {**ckpt["config"], "attention": "softmax"}}, softmax)
    with pytest.raises(config.UsageError) as e:
        run("--model", "softmax", "--transfer_from", softmax, "--out_dir", tmp_path / "o")
    one_line(e, f"--transfer_from {softmax} holds a softmax model: the transfer copies a SimpleTRON's q/k/v")


@pytest.mark.parametrize("flags, said", [
    (["--gate_lr_scale", "2"], "--gate_lr_scale 2.0: it acts only with scalar gates, which --model transject and "
                               "--norm rezero have"),
    (["--schedule", "rsqrt", "--min_lr", "0.5"], "--min_lr 0.5: it acts only with --schedule cosine"),
    (["--schedule", "rsqrt", "--lr_decay_iters", "9"], "--lr_decay_iters 9: it acts only with --schedule cosine"),
    (["--short_steps", "0", "--short_len", "8"], "--short_len 8: it acts only with --short_steps N"),
    (["--model", "softmax", "--causal_scale", "t"], "--causal_scale t: it acts only with simple attention"),
    (["--model", "softmax", "--chunk", "8"], "--chunk 8: it acts only with simple attention"),
    (["--model", "transject", "--sigma", "random", "--sigma_loss_weight", "1"],
     "--sigma_loss_weight 1.0: it acts only with --sigma learned"),
    (["--mlp_hidden", "32", "--mlp_ratio", "2"], "--mlp_ratio 2: it acts only with --mlp_hidden 0"),
    (["--model", "diffeqformer", "--weights", "shared", "--time_dim", "4"], "--time_dim 4: it acts only with W(t) by "
                                                                           "hypernetworks"),
    (["--model", "diffeqformer", "--discrete", "true", "--time_freqs", "4"], "--time_freqs 4: it acts only with W(t)"),
    (["--model", "diffeqformer", "--lora_scale", "2"], "--lora_scale 2.0: it acts only with --lora_r r"),
    (["--norm", "rezero", "--final_norm", "true"], "--final_norm True: it acts only with --norm post or pre"),
    (["--norm", "rezero", "--layer_norm_eps", "1e-6"], "--layer_norm_eps 1e-06: it acts only with a LayerNorm"),
])
def test_a_flag_that_would_change_nothing_is_refused(no_data, tmp_path, flags, said):
    with pytest.raises(train.UsageError) as e:
        runsetup.settings([*flags, "--out_dir", str(tmp_path / "a")])
    one_line(e, said, "which this run has not; leave it out")


def test_a_causal_flag_on_a_classifiers_checkpoint_is_refused(done, no_data, tmp_path):
    for start in (["--init_from", str(done / "ckpt.pt"), "--out_dir", str(tmp_path / "a")], ["--resume", "--out_dir",
                                                                                                  str(done)]):
        for flag, value in (("--chunk", "8"), ("--causal_scale", "t"))[:2 - (start[0] == "--resume")]:
            with pytest.raises(train.UsageError) as e:    # (a resumed run refuses a new causal_scale: its own)
                runsetup.settings([*start, flag, value])
            one_line(e, f"{flag} {value}: it acts only with a language model's causal attention, and this model is "
                        "a classifier (head cls); leave it out")


def test_training_flags_with_eval_only_are_refused(done, no_data, tmp_path):
    for flag, value in (("time_limit", "5"), ("lr", "0.1"), ("max_iters", "9"), ("dropout", "0.2"),
                        ("eval_iters", "5"), ("checkpointing", "true"), ("seed", "3"), ("compile", "true")):
        with pytest.raises(train.UsageError) as e:
            runsetup.settings(["--init_from", str(done / "ckpt.pt"), "--eval_only", f"--{flag}", value,
                               "--out_dir", str(tmp_path / "a")])
        one_line(e, f"--{flag} ", ": a setting of training, and --eval_only trains nothing; leave it out")


def test_the_same_flags_where_they_act_are_taken(no_data, tmp_path):
    for flags in (["--model", "transject", "--gate_lr_scale", "2"], ["--norm", "rezero", "--gate_lr_scale", "2"],
                  ["--schedule", "cosine", "--min_lr", "0.5", "--lr_decay_iters", "9"],
                  ["--short_steps", "3", "--short_len", "8"], ["--causal_scale", "t", "--chunk", "8"],
                  ["--mlp_ratio", "2"], ["--model", "diffeqformer", "--time_dim", "4", "--time_freqs", "3"],
                  ["--norm", "rezero", "--emb_norm", "true", "--layer_norm_eps", "1e-6"],
                  ["--model", "diffeqformer", "--discrete", "true", "--lora_r", "2", "--lora_scale", "2"]):
        runsetup.settings([*flags, "--out_dir", str(tmp_path / "a")])


@pytest.mark.parametrize("flags, said", [
    (["--n_classes", "4"], "--n_classes 4: task listops sets it to 10; leave it out"),     # was an IndexError
    (["--vocab_size", "8"], "--vocab_size 8: task listops sets it to 16; leave it out (or give more ids)"),
    (["--head", "lm"], "--head lm: task listops sets it to cls; leave it out"),
    (["--chunk", "8"], "--chunk 8: it acts only with a language model's causal attention, and task listops is a "
                       "classifier"),
    (["--causal_scale", "t"], "--causal_scale t: it acts only with a language model's causal attention"),
])
def test_a_model_field_the_task_sets_is_the_tasks_or_refused(lra, tmp_path, monkeypatch, flags, said):
    monkeypatch.setattr(train, "train_session", lambda *a: pytest.fail("a step was taken"))
    with pytest.raises(train.UsageError) as e:
        run("--data_dir", lra, *TINY, *flags, "--out_dir", tmp_path / "a")
    one_line(e, said)
    monkeypatch.undo()
    assert run("--data_dir", lra, *TINY, "--max_iters", "1", "--vocab_size", "40", "--n_classes", "10",
               "--out_dir", tmp_path / "b")["config"]["vocab_size"] == 40                # more ids: taken


def test_a_classifiers_field_on_a_language_model_is_refused(tmp_path, monkeypatch):
    (tmp_path / "t.txt").write_text("to be, or not to be: that is the question.\n" * 40)
    common = ["--task", "textfile", "--data_dir", tmp_path / "t.txt", "--tokenizer", "char", "--cache_dir",
              tmp_path / "c", *TINY[:4], *TINY[6:], "--max_iters", "1", "--block_size", "16"]   # (no --n_head)
    run(*common, "--out_dir", tmp_path / "lm")
    monkeypatch.setattr(train, "train_session", lambda *a: pytest.fail("a step was taken"))
    for flags, said in ((["--learned_cls", "false"], "--learned_cls False: it acts only with a classifier's CLS token"),
                        (["--model", "transject", "--pool", "max"], "--pool max: it acts only with a classifier's "
                                                                    "pooling of its tokens")):
        with pytest.raises(train.UsageError) as e:
            run(*common, *flags, "--out_dir", tmp_path / "a")
        one_line(e, said, "and task textfile is a language model; leave it out")
    with pytest.raises(train.UsageError) as e:
        run(*common, "--init_from", tmp_path / "lm" / "ckpt.pt", "--learned_cls", "false", "--out_dir", tmp_path / "b")
    one_line(e, "--learned_cls False: it acts only with a classifier's CLS token, and this model is a language model")


@pytest.mark.parametrize("flags, shown", [
    (["--model", "transject", "--transfer_from", "{ckpt}"],
     "--transfer_from copies a SimpleTRON's attention into --model softmax, not transject"),
    (["--model", "softmax", "--transfer_from", "{missing}"], "--transfer_from {missing} "),
])
def test_a_transfer_into_another_model_or_from_no_file_is_refused(flags, shown, done, tmp_path, no_data):
    names = {"ckpt": done / "ckpt.pt", "missing": tmp_path / "none.pt"}
    with pytest.raises(config.UsageError) as e:
        run(*[f.format(**names) for f in flags], "--out_dir", tmp_path / "o")
    one_line(e, shown.format(**names))


COMMON = ("    vocab_size: int = 10\n    block_size: int = 8\n    n_layer: int = 1\n    n_head: int = 1\n"
          "    n_embd: int = 8\n    dropout: float = 0.0\n    bias: bool = True\n    head: str = \"lm\"\n"
          "    n_classes: int = 0\n")


@pytest.fixture
def forkmodel(tmp_path, monkeypatch):
    """tmp_path/forkmodel.py, imported afresh by the test and forgotten after it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("forkmodel", None)
    yield tmp_path / "forkmodel.py"
    sys.modules.pop("forkmodel", None)


@pytest.mark.parametrize("fields,overrides,help,words", [
    (COMMON + "    scale: float | None = None\n", {}, True,
     "its Config field scale is of type float | None; a field is a flag too: bool, int, float or str"),
    (COMMON.replace("    n_head: int = 1\n", ""), {}, True, "its Config has no field n_head (every model's has "
     "vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias, head, n_classes)"),
    (COMMON.replace("    n_head: int = 1\n", ""), {"n_head": 4}, True, "its Config has no field n_head (every "
     "model's has"),                                   # (the missing field named first, not the override of it)
    (COMMON, {}, False, "config.FIELD_HELP has no entry 'forkmodel', its fields' help for --help"),
    (COMMON, {"attenton": "softmax"}, True, "config.MODELS sets attenton, which its Config has no field of"),
    (COMMON + "    window: int\n", {}, True, "forkmodel.py line 6 fails on import: TypeError: non-default "
     "argument 'window' follows default argument"),                              # (the decorator's line)
    (COMMON + "    window: int = (\n", {}, True, "forkmodel.py line 17 fails on import: SyntaxError: "),
    (COMMON + "    window: int = 1 / 0\n", {}, True, "forkmodel.py line 17 fails on import: ZeroDivisionError: "
     "division by zero"),
    (COMMON + "\n\nclass GPT:\n    pass\n", {}, True, "forkmodel.py has no class Model (a model file holds Config, a "
     "dataclass, and Model(config): docs/architecture.md)"),                     # (nanoGPT's class name kept)
])
def test_a_forks_model_that_breaks_the_interface_is_refused_at_registration_in_one_line(
        forkmodel, monkeypatch, fields, overrides, help, words):
    forkmodel.write_text("import dataclasses\n\n\n\n\n@dataclasses.dataclass\nclass Config:\n" + fields   # (fields: line 8)
                         + "\n\n\nclass Model:\n    pass\n" * ("class GPT" not in fields))
    monkeypatch.setitem(config.MODELS, "fork", ("forkmodel", overrides))
    if help:
        monkeypatch.setitem(config.FIELD_HELP, "forkmodel", {})
    with pytest.raises(config.UsageError) as e:
        config.parse_args(["--model", "fork"])
    one_line(e, "model 'fork': ", words)
    assert not str(e.value).endswith(": ")


def test_a_forks_model_that_keeps_the_interface_is_taken(forkmodel, monkeypatch):
    forkmodel.write_text("import dataclasses\n\n\n@dataclasses.dataclass\nclass Config:\n" + COMMON + "    window: int = 3\n"
                         "\n\nclass Model:\n    pass\n")
    monkeypatch.setitem(config.MODELS, "fork", ("forkmodel", {"window": 4}))
    monkeypatch.setitem(config.FIELD_HELP, "forkmodel", {"window": "tokens seen"})
    args, given, names = config.parse_args(["--model", "fork", "--window", "5"])
    assert args.window == 5 and names[-1] == "window" and config.model_module("fork").Config().window == 3


REFUSING = ("import dataclasses\n\nimport torch\n\n\n@dataclasses.dataclass\nclass Config:\n" + COMMON +
            "\n\nclass Model(torch.nn.Module):\n    def __init__(self, config):\n        super().__init__()\n"
            "        self.config = config\n        if config.n_embd % 8:\n"
            "            raise ValueError(f\"n_embd must be a multiple of 8, not {config.n_embd}\")\n"
            "        assert config.n_head <= 4\n"
            "        self.w = torch.nn.Linear(config.n_embd, config.n_embd * config.n_layer)\n")


@pytest.mark.parametrize("flags, why", [
    (["--n_embd", "12"], "n_embd must be a multiple of 8, not 12"),
    (["--n_head", "8"], "assert config.n_head <= 4"),        # (a bare assert: its line)
])
def test_a_forks_model_that_refuses_its_settings_is_refused_in_its_own_words_before_any_data(
        forkmodel, monkeypatch, no_data, tmp_path, flags, why):
    """A fork's Model(config) with a check of its own (a ValueError, an assert): not the overflow that the memory
    bound counts as infinitely many weights ("more weights than torch can count"), but the model's own reason."""
    forkmodel.write_text(REFUSING)
    monkeypatch.setitem(config.MODELS, "fork", ("forkmodel", {}))
    monkeypatch.setitem(config.FIELD_HELP, "forkmodel", {})
    with pytest.raises(config.UsageError) as e:
        runsetup.settings(["--model", "fork", *flags, "--out_dir", str(tmp_path / "o")])
    one_line(e, f"model 'fork' refuses these settings: {why}")
    assert "torch can count" not in str(e.value) and not (tmp_path / "o").exists()
    args = type("Args", (), dict(batch_size=1, grad_accum=1, eval_only=False, device="cpu", steps=None, lora_rank=0))
    shape = dict(n_layer=3, n_embd=16, n_head=2)
    config.check_size(args, "fork", shape)                   # settings it takes: counted
    with pytest.raises(config.UsageError, match="refuses these settings: n_embd must be a multiple of 8, not 12"):
        config.check_size(args, "fork", {**shape, "n_embd": 12})


def test_a_model_that_refuses_one_or_two_layers_but_takes_the_runs_is_counted_whole(forkmodel, monkeypatch):
    """The bound counts the weights at 1 and 2 layers; a model that takes 3 and not 1 is counted at its 3."""
    forkmodel.write_text(REFUSING + "        if config.n_layer < 3:\n"
                         "            raise ValueError(f\"n_layer must be at least 3, not {config.n_layer}\")\n")
    monkeypatch.setitem(config.MODELS, "fork", ("forkmodel", {}))
    monkeypatch.setitem(config.FIELD_HELP, "forkmodel", {})
    shape = dict(n_layer=3, n_embd=16, n_head=2, block_size=8)
    need = 4 * (4 * (16 * 48 + 48) + 1 * 8 * 16 * 3)             # a Linear 16 -> 48, trained with Adam; one batch
    args = type("Args", (), dict(batch_size=1, grad_accum=1, eval_only=False, device="cpu", steps=None, lora_rank=0))
    fits_exactly(monkeypatch, args, "fork", shape, need, "the training needs at least")
    with pytest.raises(config.UsageError, match="refuses these settings: n_layer must be at least 3, not 2"):
        config.check_size(args, "fork", {**shape, "n_layer": 2})


def test_a_preset_row_that_names_no_flag_or_field_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(config.PRESETS["cpu"], ("simpletron", "*"), {**config.PRESETS["cpu"].get(
        ("simpletron", "*"), {}), "n_layr": 2})
    with pytest.raises(config.UsageError) as e:
        runsetup.settings(["--out_dir", str(tmp_path / "o")])
    one_line(e, "config.PRESETS['cpu'] for simpletron on listops sets n_layr: a row sets train.py's flags (but model, "
             "task, preset) and simpletron's Config fields")


@pytest.mark.parametrize("value", ["5,x", "5,20,", "x"])
def test_a_listops_length_that_is_no_number_is_one_line_also_in_help(value, tmp_path, capsys):
    assert config.help_values("simpletron", "listops", "cpu", value)["block_size"] == "from --listops_len"
    assert config.help_values("simpletron", "listops", "cpu", "5,77")["block_size"] == 77
    with pytest.raises((config.UsageError, data.DataError)) as e:
        train.main(["--listops_len", value, "--out_dir", str(tmp_path / "o")])
    one_line(e, f"--listops_len expects MIN,MAX tree lengths, e.g. 500,2000, not {value!r}")
    with pytest.raises(SystemExit):
        train.main(["--listops_len", value, "--help"])
    assert "the longest input sequence, idx.shape[-1] [from --listops_len]" in " ".join(capsys.readouterr().out.split())


def test_a_folder_named_like_the_default_tokenizer_is_no_matter_to_a_task_without_one(tmp_path, monkeypatch):
    """A ./gpt2 folder where train.py starts: listops reads no tokenizer (the default gpt2 is not checked); textfile,
    which reads one, still takes the folder for a BERT WordPiece and refuses it in one line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    for task, refused in (("listops", False), ("mqar", False), ("textfile", True)):
        args, given, names = config.parse_args(["--task", task, "--out_dir", "o"])
        config.resolve(args, given, names)
        if refused:
            with pytest.raises(data.DataError, match="textfile: --tokenizer gpt2 is a folder"):
                config.check_args(args, set(given))
        else:
            config.check_args(args, set(given))


def test_a_cache_dir_with_files_read_as_they_are_is_refused_and_a_listops_len_alone_sets_the_block(lra, no_data,
                                                                                                    tmp_path):
    """mqar's --data_dir files are read as they are (nothing cached): --cache_dir would act on nothing. With LRA's
    files, --listops_len sets the block size where none is given: taken."""
    with pytest.raises(config.UsageError) as e:
        run("--task", "mqar", "--data_dir", tmp_path, "--cache_dir", tmp_path / "c", *TINY, "--out_dir", tmp_path / "o")
    one_line(e, f"--cache_dir {tmp_path / 'c'}: task mqar reads --data_dir's files as they are and caches nothing")
    for split in ("train", "valid", "test"):                 # PTB's words too; as characters they are cached
        (tmp_path / "p").mkdir(exist_ok=True)
        (tmp_path / "p" / f"ptb.{split}.txt").write_text(" the cat sat \n a dog ran \n" * 20)
    ptb = ("--task", "ptb", "--data_dir", tmp_path / "p", "--cache_dir", tmp_path / "c", *TINY)
    with pytest.raises(config.UsageError) as e:
        run(*ptb, "--out_dir", tmp_path / "o")
    one_line(e, f"--cache_dir {tmp_path / 'c'}: task ptb reads --data_dir's files as they are and caches nothing")
    assert not (tmp_path / "c").exists()
    assert runsetup.settings([*map(str, ptb), "--tokenizer", "char", "--out_dir", str(tmp_path / "o")])[0].cache_dir \
        == str(tmp_path / "c")
    args, _, _, _, _, config_dict = runsetup.settings(["--data_dir", str(lra), "--listops_len", "5,20", "--out_dir",
                                                       str(tmp_path / "o")])
    assert args.listops_len == "5,20" and "block_size" not in config_dict     # (the loader's block: 20)


def edited(done, folder, **changes):
    """A copy of the run `done` in `folder`, its ckpt.pt's records changed (args: a dict of its flags changed)."""
    import shutil
    shutil.copytree(done, folder)
    ckpt = torch.load(folder / "ckpt.pt", weights_only=True)
    ckpt["args"].update(changes.pop("args", {}))
    torch.save({**ckpt, **changes}, folder / "ckpt.pt")
    return folder


SCALER = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 3}


@pytest.mark.parametrize("scaler", [{**SCALER, "scale": float("nan")}, {**SCALER, "scale": 0.0}, [65536.0, 2.0],
                                    {"scale": 65536.0}, {**SCALER, "growth_interval": 2.5}])
def test_a_damaged_gradient_scaler_record_is_refused_before_any_data(done, no_data, tmp_path, scaler):
    """(A nan scale skipped every float16 step, silently; a list was a TypeError's traceback.)"""
    out = edited(done, tmp_path / "o", scaler=scaler)
    with pytest.raises(config.UsageError) as e:
        runsetup.settings(["--resume", "--out_dir", str(out), "--max_iters", "4"])
    one_line(e, f"{out}/ckpt.pt: its record 'scaler' is damaged")


@pytest.mark.parametrize("scaler", [SCALER, {}])
def test_a_gradient_scaler_record_as_torch_writes_it_is_taken(done, no_data, tmp_path, scaler):
    out = edited(done, tmp_path / "o", scaler=scaler)       # ({}: a run of another --dtype)
    assert runsetup.settings(["--resume", "--out_dir", str(out), "--max_iters", "4"])[3]["scaler"] == scaler


def test_a_classifiers_best_record_must_hold_its_val_accuracy(done, tmp_path):
    """A classifier keeps its best by val_acc: a record of val_loss is damaged, refused before any step (it was a
    KeyError at the first evaluation)."""
    out = edited(done, tmp_path / "o", best={"step": 2, "val_loss": 0.5})
    log = (out / "log.jsonl").read_text()
    with pytest.raises(config.UsageError) as e:
        run("--resume", "--out_dir", out, "--max_iters", "4")
    one_line(e, f"{out}/ckpt.pt: its record 'best' is damaged", "keeps its best by val_acc")
    assert (out / "log.jsonl").read_text() == log


def test_the_best_record_a_run_keeps_follows_its_splits():
    """A language model's windows: val_loss; a recall task's answers (a language model's head too): val_acc."""
    lm = data.LMSplit(np.arange(50), 4, "t.txt")
    answers = data.AnswerSplit(np.ones((3, 5), dtype=np.int64), np.full((3, 5), -1))
    for split, kept, damaged in ((lm, "val_loss", "val_acc"), (answers, "val_acc", "val_loss")):
        runsetup.check_best_record({"best": {"step": 1, kept: 0.5}}, split, "o")
        runsetup.check_best_record({"best": None}, split, "o")
        with pytest.raises(config.UsageError) as e:
            runsetup.check_best_record({"best": {"step": 1, damaged: 0.5}}, split, "o")
        one_line(e, "o/ckpt.pt: its record 'best' is damaged", f"keeps its best by {kept}")


def test_a_resumed_optimiser_takes_the_weight_decay_and_betas_given(done, tmp_path, capsys):
    """--weight_decay and --beta2 are said to be applied on --resume: the restored optimiser state must not put the
    run's (0.1 and 0.999, the cpu preset's) back."""
    out = edited(done, tmp_path / "o")
    before = torch.load(out / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]
    assert before[0]["weight_decay"] != 0.5 and before[0]["betas"][1] != 0.9
    run("--resume", "--out_dir", out, "--max_iters", "3", "--weight_decay", "0.5", "--beta2", "0.9", "--eps", "1e-6")
    assert "--weight_decay 0.5 (the run had" in capsys.readouterr().out
    groups = torch.load(out / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0, 0.0]      # decay on matrices and embeddings alone
    assert all(tuple(g["betas"]) == (before[0]["betas"][0], 0.9) and g["eps"] == 1e-6 for g in groups)


def test_started_in_is_the_folder_a_relative_out_dir_was_written_from():
    assert config.started_in("out/x", "/home/u/proj/out/x") == "/home/u/proj"
    assert config.started_in("./r/", "/w/A/r") == "/w/A"
    assert config.started_in(".", "/w/A") == "/w/A"
    assert config.started_in("out/x", "/home/u/proj/out/y") is None      # renamed since
    assert config.started_in("/abs/x", "/abs/x") is None                 # absolute: nothing to tell
    assert config.started_in("../x", "/w/x") is None
    assert config.started_in(None, "/w/x") is None


def test_a_relative_data_dir_is_placed_by_the_recorded_folder_whatever_the_out_dir(done, lra, no_data, tmp_path,
                                                                                    monkeypatch):
    """A run started in A with --data_dir lra and an absolute --out_dir, which tells nothing of A: its checkpoint's
    record of the folder it was written from (cwd) places lra, for --resume, --init_from and analyze.py started in
    B, where another lra/ is. Without that record (an older checkpoint) --resume is refused in one line, not run on
    B's lra. (It resumed on B's data, silently.)"""
    import shutil
    a, b = tmp_path / "A", tmp_path / "B"
    shutil.copytree(lra, a / "lra")
    shutil.copytree(lra, b / "lra")                          # another folder of the same name and files
    out = tmp_path / "abs"
    edited(done, out, args={"data_dir": "lra", "out_dir": str(out)}, cwd=str(a))
    monkeypatch.chdir(b)
    assert runsetup.settings(["--resume", "--out_dir", str(out), "--max_iters", "4"])[0].data_dir == str(a / "lra")
    args = runsetup.settings(["--init_from", f"{out}/ckpt.pt", "--eval_only", "--out_dir", "e"])[0]
    assert args.data_dir == str(a / "lra")
    assert config.load_checkpoint(f"{out}/ckpt.pt")["args"]["data_dir"] == str(a / "lra")     # (analyze.py's read)
    monkeypatch.chdir(a)                                     # where it was started: as recorded
    assert runsetup.settings(["--resume", "--out_dir", str(out), "--max_iters", "4"])[0].data_dir == "lra"
    old = edited(done, tmp_path / "old", args={"data_dir": "lra", "out_dir": str(tmp_path / "old")}, cwd=None)
    for where in (a, b):                                     # (nothing tells which of them it was started in)
        monkeypatch.chdir(where)
        with pytest.raises(config.UsageError) as e:
            runsetup.settings(["--resume", "--out_dir", str(old), "--max_iters", "4"])
        one_line(e, f"{old}/ckpt.pt: its run read --data_dir lra relative to the folder it was started in, which",
                 f"--init_from {old}/ckpt.pt with --task and --data_dir")
    bad = edited(done, tmp_path / "bad", cwd="A")            # a record that is no absolute folder: damaged
    with pytest.raises(config.UsageError) as e:
        config.load_checkpoint(f"{bad}/ckpt.pt")
    one_line(e, f"{bad}/ckpt.pt is damaged: its record 'cwd'")


def test_a_runs_relative_data_dir_is_its_own_from_another_working_folder(done, lra, no_data, tmp_path,
                                                                         monkeypatch, capsys):
    """A run started in A with --data_dir lra --cache_dir c --out_dir r (as typed, relative): --resume and
    --init_from started in B, where another lra/ is, read A's; gone, it is refused in one line."""
    import shutil
    a, b = tmp_path / "A", tmp_path / "B"
    shutil.copytree(lra, a / "lra")
    shutil.copytree(lra, b / "lra")                          # another folder of the same name and files
    edited(done, a / "r", args={"data_dir": "lra", "cache_dir": "c", "out_dir": "r"})
    monkeypatch.chdir(b)
    args = runsetup.settings(["--resume", "--out_dir", "../A/r", "--max_iters", "4"])[0]
    assert (args.data_dir, args.cache_dir) == (str(a / "lra"), str(a / "c"))
    args = runsetup.settings(["--init_from", "../A/r/ckpt.pt", "--eval_only", "--out_dir", "e"])[0]
    assert (args.data_dir, args.cache_dir) == (str(a / "lra"), str(a / "c"))
    monkeypatch.chdir(a)                                     # where it was started: as recorded
    assert runsetup.settings(["--resume", "--out_dir", "r", "--max_iters", "4"])[0].data_dir == "lra"
    monkeypatch.chdir(b)
    shutil.rmtree(a / "lra")
    with pytest.raises(config.UsageError) as e:
        runsetup.settings(["--resume", "--out_dir", "../A/r", "--max_iters", "4"])
    one_line(e, f"../A/r/ckpt.pt: its run read --data_dir {a / 'lra'}, which is not there")
    with pytest.raises(config.UsageError) as e:
        runsetup.settings(["--init_from", "../A/r/ckpt.pt", "--eval_only", "--out_dir", "e"])
    one_line(e, f"--init_from ../A/r/ckpt.pt: its run read --data_dir {a / 'lra'}, which is not there")


def fits_exactly(monkeypatch, args, model, shape, need, words):
    """check_size takes `need` bytes of memory exactly: a machine of `need` bytes passes, one byte less is refused."""
    for have, refused in ((need, False), (need - 1, True)):
        monkeypatch.setattr(os, "sysconf", lambda name, have=have: 1 if name == "SC_PAGE_SIZE" else have)
        if refused:
            with pytest.raises(config.UsageError, match=words):
                config.check_size(args, model, shape)
        else:
            config.check_size(args, model, shape)


@pytest.mark.parametrize("port", ["99999", "0", "65536", "²", "1" * 5000])
def test_a_master_port_that_is_no_port_number_is_one_line_before_any_work(port, no_data, monkeypatch, tmp_path):
    """Battery: MASTER_PORT=99999 with torchrun's other variables passed the isdigit() check and was a ValueError
    traceback from init_process_group ('²': isdigit, and no int). A port is 1 .. 65535."""
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(config.UsageError) as e:
        train.main(["--max_iters", "1", "--out_dir", str(tmp_path / "o")])
    one_line(e, "RANK is set but MASTER_ADDR or MASTER_PORT (a port number 1 .. 65535) is not (MASTER_ADDR="
                "'127.0.0.1', MASTER_PORT=")
    assert len(str(e.value)) < 300


@pytest.mark.parametrize("read", ["np.outer(torch.arange(config.block_size).numpy(), np.ones(config.n_embd))",
                                  "torch.arange(config.block_size).tolist()", "torch.ones(1).sum().item()"])
def test_a_model_whose_constructor_reads_a_tensors_values_is_counted_as_unknown_not_as_too_large(
        forkmodel, monkeypatch, tmp_path, read):
    """On the meta device a tensor has no values: a constructor that reads some (a sinusoid table made with numpy)
    cannot be counted there; such a model is built as usual, not refused as "more weights than torch can count"."""
    forkmodel.write_text("import numpy as np\n" + REFUSING.replace("assert config.n_head <= 4", f"table = {read}"))
    monkeypatch.setitem(config.MODELS, "fork", ("forkmodel", {}))
    monkeypatch.setitem(config.FIELD_HELP, "forkmodel", {})
    shape = dict(n_layer=3, n_embd=16, n_head=2, block_size=8)
    assert config.count_weights("fork", shape) == 0
    args = type("Args", (), dict(batch_size=1, grad_accum=1, eval_only=False, device="cpu", steps=None, lora_rank=0))
    config.check_size(args, "fork", shape)
    assert sum(p.numel() for p in config.build_model("fork", shape).parameters()) == 16 * 48 + 48
    with pytest.raises(config.UsageError, match="needs at least"):   # (its batch alone, when too wide)
        config.check_size(args, "fork", {**shape, "n_embd": 2**40})
