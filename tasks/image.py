"""
Image: CIFAR-10 in grayscale (LRA): 1,024 pixel tokens (+ 1, vocabulary 257), 10 classes; train = the
first 90% of CIFAR's training set (45,000), val = the last 10% (5,000), test = its test set (10,000).
"""

import os
import pickle

import numpy as np

from data import (DataError, cached_dir, check_labels, cls_task, prepare_main, reading, release, save_arrays,
                  source_key, task)
from tasks.sources import hf_rows, hf_split, load_hf


CIFAR_LAYOUT = ("DIR with CIFAR-10's python release (cifar-10-python.tar.gz unpacked): DIR/cifar-10-batches-py/"
                "data_batch_1 ... data_batch_5 and test_batch (DIR may also be cifar-10-batches-py/ itself)")
CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def rgb_to_gray(rgb):
    """(..., 3) uint8 -> (...) uint8 exactly as LRA's tf.image.rgb_to_grayscale on uint8 images: the weights
    0.2989, 0.5870, 0.1140 on [0, 1] floats, then back to uint8 by tf's convert_image_dtype (x 255.5, truncated)."""
    gray = (np.asarray(rgb, np.float32) / 255) @ np.array([0.2989, 0.5870, 0.1140], np.float32)
    return np.clip(gray * 255.5, 0, 255).astype(np.uint8)


class ArraysOnly(pickle.Unpickler):
    """Unpickles plain values and numpy arrays, nothing else: a CIFAR batch is a pickle, and unpickling
    anything more could run code."""
    ALLOWED = {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")}
    ALLOWED |= {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.numeric", "_frombuffer"),
                ("numpy._core.numeric", "_frombuffer"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it holds a {module}.{name}, which is not loaded")
        return super().find_class(module, name)


def read_cifar_batch(path):
    """One batch file: (rgb (N, 32, 32, 3) uint8, labels (N,) int64)."""
    with reading(path, "is not a CIFAR-10 python batch"), open(path, "rb") as f:
        d = ArraysOnly(f, encoding="bytes").load()
        if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
            raise ValueError("expected a dict with b'data' and b'labels'")
        x, y = np.asarray(d[b"data"]), np.asarray(d[b"labels"])
    if x.ndim != 2 or x.shape[1] != 3072 or x.dtype.kind not in "iu" or not len(x) or x.min() < 0 or x.max() > 255:
        raise DataError(f"{path}: b'data' is {x.dtype} {x.shape}; a CIFAR-10 batch holds (N, 3072) bytes, N > 0")
    if y.shape != (len(x),):
        raise DataError(f"{path}: {y.size} labels for {len(x)} images")
    y = check_labels(y, 10, path)
    return x.astype(np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), y.astype(np.int64)


def save_images(out, rgb_by_split):
    """{"train": (rgb, labels), "test": ...} -> cached gray splits train (90%) / val (10%) / test."""
    rgb, labels = rgb_by_split["train"]
    gray = rgb_to_gray(rgb).reshape(len(rgb), -1)
    cut = int(0.9 * len(gray))
    trgb, tlabels = rgb_by_split["test"]
    for split, x, y in (("train", gray[:cut], labels[:cut]), ("val", gray[cut:], labels[cut:]),
                        ("test", rgb_to_gray(trgb).reshape(len(trgb), -1), tlabels)):
        save_arrays(out, split, tokens=x, labels=np.asarray(y, np.uint8), lengths=np.full(len(x), x.shape[1], np.int32))


@task("image")
def image(cache_dir="data", data_dir=None, block_size=1024, **_):
    if data_dir is not None:
        folder, files = release("image", data_dir, f"use {CIFAR_LAYOUT}", CIFAR_FILES, ["cifar-10-batches-py"])
        files = list(files.values())

        def build(out):
            parts = [read_cifar_batch(f) for f in files[:5]]
            save_images(out, {"train": (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])),
                              "test": read_cifar_batch(files[5])})
        key, what = source_key(files), f"image: reading CIFAR-10 from {folder}"
    else:
        def build(out):
            dd = load_hf("image", CIFAR_LAYOUT, "uoft-cs/cifar10")
            splits = {}
            for split in ("train", "test"):
                imgs, labels = [], []
                for batch_imgs, batch_labels in hf_rows(hf_split(dd, [split], "image"), ["img", "label"]):
                    imgs += [np.asarray(im.convert("RGB") if hasattr(im, "convert") else im, np.uint8)
                             for im in batch_imgs]
                    labels += batch_labels
                splits[split] = (np.stack(imgs), check_labels(labels, 10, f"image: uoft-cs/cifar10 {split}"))
            save_images(out, splits)
        key, what = "hf", "image: CIFAR-10 (Hugging Face) in grayscale"
    folder = cached_dir(os.path.join(cache_dir, "image", key), build, what)
    return cls_task("image", "cls", folder, 257, block_size, 10, 1, {s: s for s in ("train", "val", "test")})


if __name__ == "__main__":                                   # python -m tasks.image: prepare its files alone
    prepare_main("tasks.image")
