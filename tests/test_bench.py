"""bench.py: the FLOP count and the peak memory against hand counts, the records of a run, the command line.
(No test is timed: the times are only checked to be positive.)"""

import json
import os
import subprocess
import sys

import pytest
import torch

import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------
# FLOPs and memory

def test_flop_count_of_matmuls_and_attention_backward():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    assert bench.count_flops(lambda: a @ b) == 2 * 3 * 4 * 5
    assert bench.count_flops(lambda: torch.randn(2, 3, 4) @ torch.randn(2, 4, 6)) == 2 * 2 * 3 * 4 * 6
    B, H, L, d = 2, 2, 16, 8
    q = torch.randn(B, H, L, d, requires_grad=True)
    for causal, frac in ((False, 1.0), (True, (L + 1) / (2 * L))):
        # forward Q K^T, P V; backward Q K^T again (recomputed), dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q:
        # 7 products of 2 B H L^2 d flops; a causal kernel computes (L + 1) / 2L of each
        flops = bench.count_flops(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=causal).sum().backward())
        assert flops == 7 * 2 * B * H * L * L * d * frac, causal


def test_flop_count_of_attention_on_cpu():
    B, H, L, d = 2, 4, 64, 16
    q = torch.randn(B, H, L, d)
    full = bench.count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert full == 4 * B * H * L * L * d                    # Q K^T and P V: 2 flops per multiply-add
    causal = bench.count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert causal == full * (L + 1) / (2 * L)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_peak_memory_sees_a_step_again_and_again():
    def step():
        a = torch.ones(10 * 2 ** 20 // 4)                    # 10 MiB, then 20 MiB alive at once
        b = a * 2
        return (a + b).sum()
    measured = [bench.peak_memory(step, "cpu") for _ in range(3)]
    assert all(25 <= m <= 45 for m in measured), measured   # a, b and a + b: 30 MiB at the peak


# ----------------------------------------------------------------------------------------------
# Command line

def test_bad_input_is_one_line_and_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench.py"), "--models", "gpt5", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: unknown model 'gpt5' in --models")
    cases = [("--models", "gpt5"),
             ("--nanogpt", tmp_path / "nowhere.py"),
             ("--nanogpt", os.path.join(ROOT, "simpletron.py")),     # inside the project
             ("--head", "both"),
             ("--generate", "--contexts", "8,x"),
             ("--bogus", "1")]
    for argv in cases:
        with pytest.raises(bench.UsageError) as e:
            bench.main([*map(str, argv), "--out", str(tmp_path)])
        assert "\n" not in str(e.value) and str(e.value), argv


def test_speed_records(tmp_path):
    out = tmp_path / "speed"
    threads = torch.get_num_threads()
    bench.main(["--out", str(out), "--models", "simpletron,softmax", "--lengths", "32,64", "--repeats", "1",
                "--inner", "1", "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--vocab", "32", "--threads", "1"])
    assert torch.get_num_threads() == threads                 # restored
    records = json.loads((out / "speed.json").read_text())
    keys = {"model", "length", "mode", "ms", "peak_mem_mb", "tokens_per_s", "flops"}
    main = [r for r in records if "config" not in r]
    assert len(main) == 2 * 2 * 2 and all(keys <= set(r) for r in records)
    assert {(r["model"], r["length"], r["mode"]) for r in main} == \
        {(m, L, mode) for m in ("simpletron", "softmax") for L in (32, 64) for mode in ("train", "infer")}
    assert all(r["ms"] > 0 and r["flops"] > 0 for r in records)
    nano = [r for r in records if r.get("config") == "nanogpt-cpu"]
    assert [(r["model"], r["length"], r["batch"]) for r in nano] == [("softmax", 64, 12)]
    assert (out / "speed.png").exists() and "| model |" in (out / "speed.md").read_text()


# ----------------------------------------------------------------------------------------------
# Plots

def test_same_lines_finds_the_lines_drawn_one_over_the_other():
    lines = {"simpletron": ([16, 64], [0.002, 0.002]), "softmax": ([16, 64], [0.005, 0.02]),
             "transject": ([16, 64], [0.0002, 0.0002]), "diffeqformer": ([16, 64], [0.005, 0.0201])}
    assert bench.same_lines(lines) == [("diffeqformer", "softmax")]          # within 1%: the later names the earlier
    lines["diffeqformer"] = ([16, 64], [0.005, 0.021])                       # 5% apart: two lines
    assert bench.same_lines(lines) == []
    assert bench.same_lines({"a": ([1, 2], [1.0, 2.0]), "b": ([1, 4], [1.0, 2.0])}) == []   # other lengths


def test_generation_plot(tmp_path):
    out = tmp_path / "gen"
    bench.main(["--out", str(out), "--lengths", "", "--generate", "--contexts", "8,16", "--new_tokens", "2",
                "--repeats", "1", "--models", "simpletron,softmax,diffeqformer", "--n_layer", "1", "--n_head", "2",
                "--n_embd", "16", "--vocab", "32", "--threads", "1"])
    records = [r for r in json.loads((out / "speed.json").read_text()) if r["mode"] == "generate"]
    state = {(r["model"], r["length"]): r["state_mb"] for r in records}
    assert state["softmax", 16] == state["diffeqformer", 16] > state["simpletron", 16]   # the KV caches: equal
    with open(out / "speed_generate.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
