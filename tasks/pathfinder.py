"""
Pathfinder (Linsley et al. 2018; LRA's 32x32 setting, lra_benchmarks/data/pathfinder.py, contour length
14 = "hard"), drawn here with numpy alone. An image is drawn on a 64x64 canvas (2x, for anti-aliasing)
and averaged down 2x2 to 32x32. On the canvas (lengths in canvas pixels, half that in image pixels):
  - two target paths of 14 dashes. A dash is 4 long (2 image pixels) and 1 thick (0.5), and the next one
    starts 3 further on (a gap of ~1 image pixel), turned by an angle drawn with weight
    cos^2(turn) (continuity 1) among the turns whose dash is free: inside the canvas, away from every
    other path and from its own older dashes. Among free turns, those with room for a further dash are
    preferred (a one-step lookahead, so fewer paths get stuck). Both paths start near the centre, 14
    apart (LRA's seed distance, 7), and grow alternately, a dash each.
  - 5 distractor paths of 4 dashes (14 // 3), seeded where there is room; one that gets stuck is dropped.
  - two markers, discs of radius 3 (1.5): one where a target path starts, the other where that same path
    ends (label 1, connected) or where the other one ends (label 0). Labels are exactly 50/50 per shard.
Different paths (markers included) never come within 3 canvas pixels of each other (Chebyshev distance),
while consecutive dashes of a path are at most 3 apart: so "connected" is exactly "joined once gaps of up
to 3 canvas pixels are bridged", which the tests check by flood fill on the clean (canvas) drawing.
Lines count at contrast 1.5 (LRA: paddle contrast 0.75 x snake contrast 2), clipped to 1, markers at 1.
An image whose target paths get stuck is drawn again (about half are).
Tokens are the 1,024 pixels (0-255) in row order, + 1 (token 0 is padding), vocabulary 257.
"""

import contextlib
import glob
import os

import numpy as np

from data import (DataError, ShardedSplit, Task, cache_problem, cached_dir, cls_task, file_problem, one_line,
                  prepare_main, reading, release, save_arrays, source_key, task, worker_pool)


PF_W = 64                                  # the canvas
PF_PAD = 8                                 # margin of the work maps, so that stamps never leave them
PF_N = PF_W + 2 * PF_PAD
PF_BORDER = 2                              # paths keep this far from the canvas edge
PF_STEP = 7.0                              # one dash and its gap
PF_DASH = np.arange(1.5, 5.51, 1.0, dtype=np.float32)    # the dash: 5 points 1 apart (8-connected pixels)
PF_PROBE = np.array([3.5, 5.5], np.float32)              # lookahead: two points of a possible next dash
PF_SEP = 3                                 # other paths stay more than this far (Chebyshev)
PF_DIRS = 48                               # directions are multiples of 7.5 degrees
PF_TURNS = np.arange(-11, 12, 2)           # -82.5 ... 82.5 degrees, 12 turns
PF_TURN_W = (np.cos(np.deg2rad(PF_TURNS * 7.5)) ** 2).astype(np.float32)  # continuity 1
PF_AHEAD = np.array([-8, -4, 0, 4, 8])     # lookahead turns: -60 ... 60 degrees
PF_SEED_DISTANCE = 14.0
PF_MARKER = 3.0
PF_CONTOUR, PF_DISTRACTOR_LEN, PF_DISTRACTORS = 14, 14 // 3, 5

_pf_u = np.stack([np.sin(np.arange(PF_DIRS) * 2 * np.pi / PF_DIRS),
                  np.cos(np.arange(PF_DIRS) * 2 * np.pi / PF_DIRS)], -1).astype(np.float32)
_PF_DASH_OFF = PF_DASH[None, :, None] * _pf_u[:, None, :]        # (direction, point, yx)
_PF_PROBE_OFF = PF_PROBE[None, :, None] * _pf_u[:, None, :]
_PF_STEP_OFF = PF_STEP * _pf_u


def _pf_offsets(r, disc=None):
    o = np.array([(dy, dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1)
                  if disc is None or dy * dy + dx * dx <= disc * disc])
    return o


_PF_BOX = _pf_offsets(PF_SEP)                                    # "within PF_SEP"
_PF_DISC = _pf_offsets(int(PF_MARKER), PF_MARKER)
_PF_DISC_BOX = np.unique((_PF_DISC[:, None] + _PF_BOX[None]).reshape(-1, 2), axis=0)
_pf_flat = lambda o: o[:, 0] * PF_N + o[:, 1]                    # noqa: E731
PF_BOX_FLAT, PF_DISC_FLAT, PF_DISC_BOX_FLAT = _pf_flat(_PF_BOX), _pf_flat(_PF_DISC), _pf_flat(_PF_DISC_BOX)
PF_NEAR_FLAT = _pf_flat(_pf_offsets(1))     # a path keeps 2 pixels from its own older dashes


def _pf_pixels(knot, off):
    """Points knot + off -> canvas pixels: knot (..., 2), off (..., P, 2) -> (..., P, 2) int."""
    return np.floor(knot[..., None, :] + off).astype(np.int64)


def _pf_index(base, pix):
    """Flat indices of canvas pixels pix (B, ..., 2) into the padded (B, PF_N, PF_N) maps; base (B,). Pixels
    off the canvas (never free) are moved to just outside it, so that index + any offset of a stamp (at
    most PF_PAD - 2) stays in the image's own map."""
    p = np.clip(pix, -1, PF_W) + PF_PAD
    return base.reshape(len(base), *([1] * (pix.ndim - 2))) + p[..., 0] * PF_N + p[..., 1]


def _pf_free(near, own, base, pix, bit):
    """Whether dashes (pix (B, ..., P, 2)) are inside and clear of other paths (near) and of the path's
    own older dashes (own)."""
    inside = ((pix >= PF_BORDER) & (pix <= PF_W - 1 - PF_BORDER)).all(-1)
    idx = _pf_index(base, pix)
    busy = (near.ravel()[idx] & ~bit) | (own.ravel()[idx] & bit)
    return (inside & (busy == 0)).all(-1)


def _pf_stamp(a, idx, offsets, bits):
    """a.flat[idx + offset] |= bits, for idx (B, P) and every offset."""
    if len(idx) == 0:
        return
    a.ravel()[(idx[:, :, None] + offsets).reshape(len(idx), -1)] |= bits if np.isscalar(bits) else bits[:, None]


def _pf_choose(weights, rng):
    cum = np.cumsum(weights, 1)
    r = rng.random(len(weights), dtype=np.float32) * cum[:, -1]
    return np.minimum((cum <= r[:, None]).sum(1), weights.shape[1] - 1), cum[:, -1] > 0


def _pf_extend(near, own, base, knot, direction, bit, rng, lookahead, check=None):
    """One more dash for every image: (whether one was free, its direction, its pixels)."""
    cand = (direction[:, None] + PF_TURNS) % PF_DIRS                      # (B, K)
    pix = _pf_pixels(knot[:, None], _PF_DASH_OFF[cand])                   # (B, K, 5, 2)
    good = _pf_free(near, own, base, pix, bit)
    if check is not None:
        good &= check(pix)
    w = np.where(good, PF_TURN_W, np.float32(0))
    if lookahead:                                                         # prefer turns with room after
        nxt = knot[:, None] + _PF_STEP_OFF[cand]
        probe = _pf_pixels(nxt[:, :, None], _PF_PROBE_OFF[(cand[..., None] + PF_AHEAD) % PF_DIRS])
        room = _pf_free(near, own, base, probe, bit).any(-1)
        w2 = w * room
        w = np.where((w2 > 0).any(1, keepdims=True), w2, w)
    k, ok = _pf_choose(w, rng)
    r = np.arange(len(k))
    return ok, cand[r, k], pix[r, k]


def _pf_lay(near, own, ink, idx, prev, bit, ink_bit):
    """Lay a dash (flat pixel indices idx) of the path `bit`: the pixels near it are no longer free for the
    other paths, those near its previous dash (prev) no longer for the path itself."""
    _pf_stamp(near, idx, PF_BOX_FLAT, bit)
    if prev is not None:
        _pf_stamp(own, prev, PF_NEAR_FLAT, bit)
    ink.ravel()[idx] |= ink_bit


def _pf_distractors(near, own, ink, base, rng):
    """Draw the distractor paths into every image: each starts at the first free dash of 16 random ones,
    grows without lookahead, and is erased if it gets stuck."""
    B = len(near)
    for j in range(PF_DISTRACTORS):
        bit = np.uint8(4 << j)
        seeds = rng.uniform(PF_BORDER, PF_W - 1 - PF_BORDER, (B, 16, 2)).astype(np.float32)
        dirs = rng.integers(0, PF_DIRS, (B, 16))
        pix = _pf_pixels(seeds, _PF_DASH_OFF[dirs])
        ok = _pf_free(near, own, base, pix, bit)
        k, good = ok.argmax(1), ok.any(1)                      # the first free one of 16 tries
        r = np.arange(B)
        kn, d, pix = seeds[r, k], dirs[r, k], pix[r, k]
        prev_d = None
        for step in range(PF_DISTRACTOR_LEN):
            if step:
                ok, d, pix = _pf_extend(near, own, base, kn, d, bit, rng, False)
                good &= ok
            idx = _pf_index(base, pix)
            _pf_lay(near, own, ink, idx, prev_d, bit, 4)
            prev_d = idx
            kn = kn + _PF_STEP_OFF[d]
        near[~good] &= ~bit                                     # a stuck distractor is erased
        own[~good] &= ~bit
        ink[~good] &= ~np.uint8(4)
        ink |= (ink & 4) >> 2
        ink &= ~np.uint8(4)


def pathfinder_draw(labels, rng):
    """Try to draw one image per label. Returns (kept, lines, markers): the indices of the labels whose image
    could be drawn, and for them the clean canvas drawings (n, 64, 64) bool of the paths and the markers."""
    B = len(labels)
    kept = np.arange(B)
    near = np.zeros((B, PF_N, PF_N), np.uint8)     # bit of path s: within PF_SEP of path s
    own = np.zeros_like(near)                      # bit of path s: near its dashes but the newest
    ink = np.zeros_like(near)                      # 1 line, 2 marker, 4 distractor in progress
    base = np.arange(B) * PF_N * PF_N
    start = (PF_W / 2 + rng.uniform(-6, 6, (B, 2))).astype(np.float32)
    knot = np.stack([start, start + PF_SEED_DISTANCE * _pf_u[rng.integers(0, PF_DIRS, B)]], 1)  # (B, 2, 2)
    direction = rng.integers(0, PF_DIRS, (B, 2))
    first = rng.integers(0, 2, B)                  # the path whose start is marked
    last = np.where(np.asarray(labels) == 1, first, 1 - first)   # the path whose end is marked
    bits = np.array([1, 2], np.uint8)
    r = np.arange(B)
    tip = _pf_index(base, np.floor(knot[r, first] + _PF_DASH_OFF[direction[r, first], 0]).astype(np.int64)[:, None])
    _pf_stamp(near, tip, PF_DISC_BOX_FLAT, bits[first])
    ink.ravel()[tip + PF_DISC_FLAT] |= 2
    prev = [None, None]
    alive = np.ones(B, bool)
    for step in range(PF_CONTOUR):
        for s in (0, 1):
            bit = bits[s]
            if step == 0:
                pix = _pf_pixels(knot[:, s], _PF_DASH_OFF[direction[:, s]])
                ok, d = _pf_free(near, own, base, pix, bit), direction[:, s]
            else:
                check = None
                if step == PF_CONTOUR - 1:                      # the end marker must fit too
                    def check(pix, s=s, bit=bit):
                        end = _pf_index(base, pix[:, :, -1])
                        clear = ((near.ravel()[end[..., None] + PF_DISC_FLAT] & ~bit) == 0).all(-1)
                        return clear | (last != s)[:, None]
                ok, d, pix = _pf_extend(near, own, base, knot[:, s], direction[:, s], bit, rng, True, check)
            alive &= ok
            idx = _pf_index(base, pix)
            _pf_lay(near, own, ink, idx, prev[s], bit, 1)
            prev[s] = idx
            if step == PF_CONTOUR - 1:                          # the end marker, before the other path ends
                end = idx[last == s, -1:]
                _pf_stamp(near, end, PF_DISC_BOX_FLAT, bit)
                ink.ravel()[end + PF_DISC_FLAT] |= 2
            knot[:, s] += _PF_STEP_OFF[d]
            direction[:, s] = d
        if step % 3 == 2 or step == PF_CONTOUR - 1:             # drop the stuck ones now and then
            near, own, ink, kept, knot, direction, last = (a[alive] for a in
                                                           (near, own, ink, kept, knot, direction, last))
            new_base = np.arange(alive.sum()) * PF_N * PF_N
            prev = [p[alive] - base[alive, None] + new_base[:, None] for p in prev]
            base, alive = new_base, np.ones(len(kept), bool)
    _pf_distractors(near, own, ink, base, rng)
    ink = ink[:, PF_PAD:PF_PAD + PF_W, PF_PAD:PF_PAD + PF_W]
    return kept, (ink & 1).astype(bool), (ink & 2).astype(bool)


def pathfinder_render(lines, markers):
    """Clean canvas drawings -> anti-aliased 32x32 uint8 images: each pixel averages its 2x2 canvas block."""
    pool = lambda m: m.reshape(len(m), PF_W // 2, 2, PF_W // 2, 2).mean((2, 4))  # noqa: E731
    image = np.maximum(np.clip(1.5 * pool(lines), 0, 1), pool(markers))
    return np.round(image * 255).astype(np.uint8)


def generate_pathfinder(n, seed, clean=False):
    """n images (n, 32, 32) uint8 and their labels, exactly half 1; with clean=True also the clean canvas
    drawings (n, 64, 64) bool (paths and markers). The same for a seed (an int or a sequence of ints)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 2).astype(np.uint8)
    images = np.zeros((n, PF_W // 2, PF_W // 2), np.uint8)
    drawings = np.zeros((n, PF_W, PF_W), bool) if clean else None
    todo = np.arange(n)
    while len(todo):
        chunk = todo[:1024]
        tries = np.tile(labels[chunk], 3)[:int(2.3 * len(chunk)) + 16]   # about half the tries succeed
        kept, lines, markers = pathfinder_draw(tries, rng)
        filled = []
        for label in (0, 1):
            slots = chunk[labels[chunk] == label]
            got = np.nonzero(tries[kept] == label)[0][:len(slots)]
            slots = slots[:len(got)]
            images[slots] = pathfinder_render(lines[got], markers[got])
            if clean:
                drawings[slots] = lines[got] | markers[got]
            filled.append(slots)
        todo = np.setdiff1d(todo, np.concatenate(filled))
    return (images, labels, drawings) if clean else (images, labels)


# Generated: LRA's 160,000 training images; val and test 2,000 each, as ListOps', so that evaluating on a CPU
# takes seconds (LRA's release folder gives its own 80/10/10 split of 200,000). Shards of 4,000 (sizes are
# multiples of it), each its own seed, made when first needed and in parallel: --n_train 16000 makes 4.
PATHFINDER_SIZES = {"train": 160_000, "val": 2_000, "test": 2_000}
PATHFINDER_SHARD = 4_000
MAX_WORKERS = 8                            # processes that generate shards at once (at most one per core)
PATHFINDER_LAYOUT = ("DIR with LRA's Pathfinder release (lra_release.gz): DIR/pathfinder32/curv_contour_length_14/"
                     "metadata/*.npy and imgs/<k>/sample_<n>.png (DIR may also be pathfinder32/ or "
                     "curv_contour_length_14/ itself, or hold lra_release/)")


def pathfinder_shard(job):
    """One shard of a generated split (a worker of the pool): seed = (0, split number, shard number)."""
    split, k, size = job
    images, labels = generate_pathfinder(size, seed=[0, ("train", "val", "test").index(split), k])
    return images.reshape(size, -1), labels


def pathfinder_generated(folder, split, count):
    """The first `count` shards of a generated split, each a cached folder {split}_{k}/ of images.npy and
    labels.npy, generated (in parallel) where missing or damaged."""
    paths = [os.path.join(folder, f"{split}_{k:03d}") for k in range(count)]
    size = min(PATHFINDER_SHARD, PATHFINDER_SIZES[split])
    jobs = [(split, k, size) for k in range(count) if not os.path.isdir(paths[k]) or cache_problem(paths[k])]
    if jobs:
        for old in glob.glob(os.path.join(glob.escape(folder), f"{split}_*.npz")):  # shards of an earlier version
            os.remove(old)
        n = len(jobs) * size
        workers = min(os.cpu_count() or 1, MAX_WORKERS, len(jobs))
        print(f"generating Pathfinder ({split}: {n:,} images, Linsley/LRA settings) into {folder}, about "
              f"{max(1, round(n / 1000 / workers))} s ...", flush=True)
        with contextlib.ExitStack() as stack:
            if workers > 1:
                pool = stack.enter_context(worker_pool(workers))
                results = pool.imap(pathfinder_shard, jobs)
            else:
                results = map(pathfinder_shard, jobs)
            for (_, k, _), shard in zip(jobs, results):
                cached_dir(paths[k], lambda tmp, shard=shard: save_arrays(tmp, "shard", images=shard[0],
                                                                          labels=shard[1]))
    shards = []
    for p in paths:
        with reading(p, "is damaged", "; delete it to generate it again"):
            shards.append([np.load(os.path.join(p, f"shard.{a}.npy")) for a in ("images", "labels")])
    return np.concatenate([i for i, _ in shards]), np.concatenate([y for _, y in shards])


def read_pathfinder_metadata(path):
    """The rows of one metadata file of the release: text lines "imgs/<k> sample_<n>.png <n> <label> ..."
    (saved as .npy by some versions of the generator: then a 2-D array of strings)."""
    with reading(path, "is not a Pathfinder metadata file"), open(path, "rb") as f:
        raw = f.read()
        if raw.startswith(b"\x93NUMPY"):
            f.seek(0)
            rows = np.load(f, allow_pickle=False)
            if rows.size and rows.ndim != 2:
                raise ValueError(f"a {rows.ndim}-D array, not rows of fields")
            return [[str(v) for v in row] for row in rows]
        lines = raw.decode("utf-8").splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):              # LRA's reader drops what follows the last line break
        raise DataError(f"{path}, line {len(lines)}: the file ends in the middle of this line (cut short): extract "
                        "the release again")
    return [line.split() for line in lines if line.strip()]


def pathfinder_images(folder):
    """The release's metadata files and, for every image they list in LRA's order, (PNG path, label, where it is
    listed: "metadata/K.npy, row R")."""
    metas = sorted(glob.glob(os.path.join(glob.escape(folder), "metadata", "*.npy")),
                   key=lambda p: (len(os.path.basename(p)), os.path.basename(p)))
    if not metas:
        raise DataError(f"pathfinder: no metadata/*.npy in {folder}; use {PATHFINDER_LAYOUT}")
    images = []
    for meta in metas:
        if file_problem(meta):
            raise DataError(f"pathfinder: {meta} {file_problem(meta)}")
        for i, fields in enumerate(read_pathfinder_metadata(meta), 1):
            try:
                label = float(fields[3])
                if label not in (0, 1):
                    raise ValueError
                listed = f"{os.path.join('metadata', os.path.basename(meta))}, row {i}"
                images.append((os.path.join(folder, fields[0], fields[1]), int(label), listed))
            except (IndexError, ValueError):
                raise DataError(f"{meta}, row {i}: expected 'imgs/<k> sample_<n>.png <n> <label 0 or 1> ...', "
                                f"found {one_line(' '.join(fields), 80)!r}") from None
    if not images:
        raise DataError(f"pathfinder: the metadata files in {os.path.join(folder, 'metadata')} list no images")
    return metas, images


def read_pathfinder_release(images, out):
    """The release's images -> cached splits 80/10/10 (a fixed shuffle, as S4 does). Every image listed must be
    a 32x32 PNG that decodes: an empty or damaged file is an error that names it and where it is listed (S4
    skips the empty curv_baseline/imgs/0/sample_172.png; training on what is left would hide a damaged copy)."""
    from PIL import Image
    pixels = np.zeros((len(images), 1024), np.uint8)
    labels = np.zeros(len(images), np.uint8)
    for n, (path, label, listed) in enumerate(images):
        fix = f" (listed in {listed}): extract the release again, or delete that row"
        if os.path.getsize(path) == 0:
            raise DataError(f"{path}: an empty file, not a PNG image{fix}")
        with reading(path, "is not a readable PNG image", fix), Image.open(path) as im:
            if im.size != (32, 32):
                raise DataError(f"{path}: a {im.size[0]}x{im.size[1]} image; Pathfinder32's are 32x32{fix}")
            pixels[n], labels[n] = np.asarray(im.convert("L")).reshape(-1), label
    n = len(images)
    if n < 10:
        raise DataError(f"pathfinder: {n} images listed, too few for train, val and test (80/10/10)")
    order = np.random.default_rng(0).permutation(n)
    cut = [0, int(0.8 * n), int(0.9 * n), n]
    for split, lo, hi in zip(("train", "val", "test"), cut, cut[1:]):
        idx = np.sort(order[lo:hi])
        save_arrays(out, split, tokens=pixels[idx], labels=labels[idx], lengths=np.full(len(idx), 1024, np.int32))


@task("pathfinder")
def pathfinder(cache_dir="data", data_dir=None, block_size=1024, **_):
    if data_dir is not None:
        hard = "curv_contour_length_14"
        folder, _ = release("pathfinder", data_dir, f"use {PATHFINDER_LAYOUT}", ["metadata/"],
                            [hard, f"pathfinder32/{hard}", f"lra_release/pathfinder32/{hard}",
                             f"lra_release/lra_release/pathfinder32/{hard}"])
        metas, images = pathfinder_images(folder)
        key = source_key([*metas, *(p for p, *_ in images)], " (listed in the release's metadata)")
        out = cached_dir(os.path.join(cache_dir, "pathfinder", key), lambda tmp: read_pathfinder_release(images, tmp),
                         f"pathfinder: reading LRA's release in {folder}")
        return cls_task("pathfinder", "cls", out, 257, block_size, 2, 1, {s: s for s in ("train", "val", "test")})
    folder = os.path.join(cache_dir, "pathfinder", "generated")

    def shards(split):
        def make(k):
            images, labels = pathfinder_generated(folder, split, k)
            return images[:, :block_size], labels
        size = PATHFINDER_SIZES[split]
        return ShardedSplit(-(-size // PATHFINDER_SHARD), min(PATHFINDER_SHARD, size), make, offset=1)

    loaders = {"train": lambda: shards("train"), "val": lambda: shards("val").full(),
               "test": lambda: shards("test").full()}
    return Task("pathfinder", "cls", 257, block_size, 2, loaders)


if __name__ == "__main__":                                   # python -m tasks.pathfinder: prepare its files alone
    prepare_main("tasks.pathfinder")
