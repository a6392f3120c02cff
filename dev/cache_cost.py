"""What data.cache_problem costs on a 200 MB cached folder (3 files, as ListOps' LRA arrays): with the stamps as
written (stat calls only), after every file was touched (a CRC-32 of each, once), and then again (the new stamps
kept). docs/tasks.md ("Checked before every use") quotes it. Run from the repository root: python dev/cache_cost.py"""

import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.getcwd())
import data  # noqa: E402


def build(out):
    rng = np.random.default_rng(0)
    for name, mb in (("train.tokens.npy", 190), ("train.lengths.npy", 5), ("train.labels.npy", 5)):
        rng.integers(0, 255, mb << 20, dtype=np.uint8).tofile(os.path.join(out, name))


def median_ms(folder, before=lambda: None, n=5):
    times = []
    for _ in range(n):
        before()
        t = time.perf_counter()
        assert data.cache_problem(folder) is None
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2] * 1e3


def touch_all(folder):
    for name in os.listdir(folder):
        if name != data.MANIFEST:
            os.utime(os.path.join(folder, name))


if __name__ == "__main__":
    root = tempfile.mkdtemp()
    try:
        folder = data.cached_dir(os.path.join(root, "cache"), build)
        print(f"stamps as written (sizes and stamps only): median {median_ms(folder):.2f} ms")
        print(f"after a touch of every file (a CRC-32 of 200 MB, from the page cache): median "
              f"{median_ms(folder, lambda: touch_all(folder)):.0f} ms")
        print(f"then again (the new stamps kept): median {median_ms(folder):.2f} ms")
    finally:
        shutil.rmtree(root)
