"""
Where a training step's time goes: PyTorch's profiler over a few steps of each model at each length (the step of
bench.py: forward, backward, clipping, AdamW), its operators by their own time, with their input shapes.

    python dev/profile_ops.py --models simpletron,transject --lengths 1024,4096 [--rows 25] [--steps 3]

Any other flag is bench.py's (--n_embd, --batch, --head, --dtype, --device ...). Prints each table and writes them
to OUT/profile.txt (--out, default out/profile).
"""

import argparse
import os
import sys

from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import data  # noqa: E402
from measure import synchronize  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=25, help="operators shown per table")
    p.add_argument("--steps", type=int, default=3, help="steps profiled (after one untimed)")
    p.add_argument("--shapes", action="store_true", help="one row per operator and input shapes")
    own, rest = p.parse_known_args(argv)
    args = bench.parse(["--out", "out/profile", *rest])
    device = bench.pick_device(args.device)
    models, lengths, _ = bench.read_lists(args, device)
    cuda, texts = device.startswith("cuda"), []
    for rec, steps, mode in bench.length_configs(args, device, models, lengths):
        steps[mode]()
        with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda,
                     record_shapes=own.shapes) as prof:
            for _ in range(own.steps):
                steps[mode]()
            synchronize(device)
        table = prof.key_averages(group_by_input_shape=own.shapes).table(
            sort_by=f"self_{'cuda' if cuda else 'cpu'}_time_total", row_limit=own.rows, max_name_column_width=50)
        texts.append(f"{rec['model']}, {mode}, {rec['batch']} x {rec['length']} tokens, {own.steps} steps\n{table}")
        print(texts[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    data.atomic_write_text(os.path.join(args.out, "profile.txt"), "\n\n".join(texts))
    print(f"wrote {os.path.join(args.out, 'profile.txt')}")


if __name__ == "__main__":
    data.run_main(main, bench.UsageError)
