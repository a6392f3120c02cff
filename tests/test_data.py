"""data.py and tasks/: every task's loaders on data the tests write (each release's file format, and Hugging Face
datasets built in memory), Pathfinder's generator against an independent connectivity check, tokenizers, caching,
and the one-line errors when data is missing or the network is not there."""

import os
import pickle
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import config
import data
import tasks
from tasks import image, listops, lm, pathfinder, sources, text
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEN = ("listops", "pathfinder", "image", "text", "retrieval", "imdb", "agnews", "ptb", "wikitext103", "openwebtext")


def batch_of(split, n=None):
    """Every example of a split, in its stored order, as one batch (x, y)."""
    return split._batch(np.arange(len(split) if n is None else n))


@pytest.fixture
def hf(monkeypatch):
    """Replace the Hugging Face download: hf.datasets[path] = DatasetDict; hf.calls records what was asked."""
    class Fake:
        datasets, calls = {}, []

    def fake(path, config=None, parquet_dir=None):
        Fake.calls.append((path, config))
        return Fake.datasets[path]

    monkeypatch.setattr(sources, "hf_dataset", fake)
    return Fake


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network, whatever this machine has: every probe fails; empty tiktoken and Hugging Face caches. (The
    libraries read HF_HUB_OFFLINE when imported, which this test process did already: their settings are set
    here as sources.hf_dataset's environment variables set them in a fresh process.)"""
    import datasets.config
    import huggingface_hub.constants
    monkeypatch.setattr(sources, "reachable", lambda *a, **k: False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    for module, name in ((datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
                         (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(module, name, True)
    import tiktoken.registry                                  # forget encodings loaded earlier in this process
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})


def assert_one_line_error(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for part in parts:
        assert part in msg, (part, msg)


# ----------------------------------------------------------------------------------------------
# Splits, tokenizers, registry

def test_all_tasks_are_known_to_train_py():
    assert set(TEN) | {"textfile"} <= set(data.TASKS)        # the papers' ten, and any task added since
    for name in data.TASKS:
        args, given, _ = config.parse_args(["--task", name])
        assert args.task == name


def test_shifted_split_keeps_zero_bytes_and_pads_with_zero():
    tokens = np.array([[0, 7, 255, 9], [3, 0, 0, 0]], np.uint8)          # row 0: a real 0 byte first
    split = data.ClassificationSplit(tokens, [1, 0], lengths=[3, 2], offset=1)
    x, y = batch_of(split)
    assert x.tolist() == [[1, 8, 256], [4, 1, 0]] and y.tolist() == [1, 0]   # padded to the longest: 3
    assert split.tokens_in(x) == 5
    assert batch_of(split.subset(1))[0].tolist() == [[1, 8, 256]]
    assert batch_of(split.truncate(2))[0].tolist() == [[1, 8], [4, 1]]
    pairs = data.ClassificationSplit(np.zeros((1, 2, 4), np.uint8), [1], lengths=[[1, 3]], offset=1)
    assert batch_of(pairs)[0].tolist() == [[[1, 0, 0], [1, 1, 1]]]


def test_the_samplers_can_draw_every_window_and_every_example():
    """LMSplit.sample: any start from 0 to the last whose window (block_size + 1 tokens) fits, so the stream's last
    token is a target; ClassificationSplit.sample: any example, the last too. 400 draws from 14 and 7 choices."""
    stream = np.arange(1, 18)                                # 17 tokens, block_size 3: starts 0 .. 13
    x, y = data.LMSplit(stream, 3).sample(400, np.random.default_rng(0))
    assert set((x[:, 0] - 1).tolist()) == set(range(14)) and y.max() == 17 and torch.equal(x[:, 1:], y[:, :-1])
    _, labels = data.ClassificationSplit(np.ones((7, 2), np.uint8), np.arange(7)).sample(400, np.random.default_rng(0))
    assert set(labels.tolist()) == set(range(7))


def test_a_stream_of_one_window_is_the_least_a_split_takes():
    """block_size + 1 tokens make one window (its inputs and their next tokens), the only one drawn; block_size
    tokens make none: refused in one line when the split is made, not an error at the first batch."""
    x, y = data.LMSplit(np.arange(1, 5), 3).sample(5, np.random.default_rng(0))
    assert x.tolist() == [[1, 2, 3]] * 5 and y.tolist() == [[2, 3, 4]] * 5
    with pytest.raises(data.DataError, match="gives 3 tokens, too few for one window of block_size"):
        data.LMSplit(np.arange(1, 4), 3)


def test_byte_tokenizer_round_trip():
    enc = sources.get_tokenizer("byte", "t")
    text = "Ünïcödé — naïve 東京 🙂\n\n  spaces\t<|endoftext|>"
    ids = enc.encode_ordinary(text)
    assert ids == list(text.encode("utf-8")) and enc.decode(ids) == text
    assert enc.n_vocab == 257 and enc.eot_token == 256


def test_unknown_tokenizer(offline):
    with pytest.raises(data.DataError) as e:
        sources.get_tokenizer("nonsense", "imdb")
    assert_one_line_error(e, "imdb", "nonsense", "cl100k_base")


def test_gpt2_offline_fails_fast_and_points_to_byte(offline, tmp_path):
    root = write_agnews(tmp_path / "ag", [(1, "t", "d")] * 10, [(2, "t", "d")] * 4)
    t0 = time.time()
    with pytest.raises(data.DataError) as e:
        data.load_task("agnews", cache_dir=tmp_path / "c", data_dir=str(root), tokenizer="gpt2")
    assert time.time() - t0 < 5
    assert_one_line_error(e, "agnews", "gpt2", "--tokenizer byte")


def test_an_error_of_two_files_names_the_one_it_is_about(tmp_path, monkeypatch):
    """os.replace of hr/test.txt.tmp onto hr/test.txt, a folder: the problem is the target, hr/test.txt (the line
    named the temporary file alone: 'hr/test.txt.tmp: Is a directory'); an error of either names both."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("hr/test.txt")
    with open("hr/test.txt.tmp", "w") as f:
        f.write("1\t-\n")
    with pytest.raises(OSError) as e:
        os.replace("hr/test.txt.tmp", "hr/test.txt")
    line = data.error_line(e.value)
    assert line.startswith("hr/test.txt (the target of hr/test.txt.tmp): Is a directory"), line
    with pytest.raises(OSError) as e:
        os.replace("hr/gone.tmp", "hr/new.txt")               # (the source is missing: both named)
    line = data.error_line(e.value)
    assert line.startswith("hr/gone.tmp -> hr/new.txt: No such file or directory"), line


def test_gpt2_offline_from_sample_py_advises_no_flag_sample_py_lacks(offline):
    """sample.py (and analyze.py) read the run's tokenizer and have no --tokenizer: the line must not tell them to
    use one ("use --tokenizer byte to work offline" did); its offline advice is for a new run, train.py's flag."""
    import sample
    ckpt = {"args": {"task": "textfile", "tokenizer": "gpt2"}, "config": {"vocab_size": 50304}}
    with pytest.raises(data.DataError) as e:
        sample.tokenizer_of(ckpt)
    assert_one_line_error(e, "textfile", "cannot load the gpt2 tokenizer", "TIKTOKEN_CACHE_DIR",
                          "a new run started with train.py --tokenizer byte")
    assert "use --tokenizer" not in str(e.value)


def test_text_chunks_tokenise_like_the_whole_text():
    import tiktoken
    ranks = {bytes([i]): i for i in range(256)}
    for merged in (b"\n\n", b" \n", b"\n ", b" t", b"he", b" the", b" =", b"  "):
        ranks[merged] = len(ranks)
    enc = tiktoken.Encoding(name="merges", pat_str=sources.GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    text = " = Title = \n \n The head , the tail \n\nthe end \n \n  indented\n\tx\n = = Sub = = \n" * 40
    lines = text.splitlines(keepends=True)
    pieces = list(lm.text_chunks(lines, size=50))
    assert len(pieces) > 10 and "".join(pieces) == text
    assert [t for p in pieces for t in enc.encode_ordinary(p)] == enc.encode_ordinary(text)
    careless, buf = [], ""                                      # cut before every line that starts a word
    for line in lines:
        if buf and not line[0].isspace():
            careless.append(buf)
            buf = ""
        buf += line
    careless.append(buf)
    assert [t for p in careless for t in enc.encode_ordinary(p)] != enc.encode_ordinary(text)
    # a file's last line a lone space (no newline): never cut before it (what follows it is unknown)
    assert list(lm.text_chunks(["ab\n", "cd\n", " "], size=1)) == ["ab\n", "cd\n "]


# ----------------------------------------------------------------------------------------------
# Pathfinder: generated

def bridged_components(on, radius=3):
    """Connected components of the True pixels of a 2-D mask, two pixels joined when their Chebyshev
    distance is at most `radius` (so dashes separated by short gaps join). Returns an int label image."""
    labels = np.zeros(on.shape, int)
    pts = list(zip(*np.nonzero(on)))
    current = 0
    for p in pts:
        if labels[p]:
            continue
        current += 1
        labels[p] = current
        stack = [p]
        while stack:
            y, x = stack.pop()
            ys, xs = np.nonzero(on[max(0, y - radius):y + radius + 1, max(0, x - radius):x + radius + 1])
            for q in zip(ys + max(0, y - radius), xs + max(0, x - radius)):
                if not labels[q]:
                    labels[q] = current
                    stack.append(q)
    return labels


def markers_of(clean):
    """The marker discs, found from the drawing alone: pixels whose whole 3x3 neighbourhood is drawn (lines
    are one pixel thin) grouped into discs. Returns a list of (y, x) seeds, one per disc."""
    H, W = clean.shape
    core = np.zeros_like(clean)
    core[1:-1, 1:-1] = np.all([clean[1 + dy:H - 1 + dy, 1 + dx:W - 1 + dx]
                               for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=0)
    comp = bridged_components(core, radius=1)
    return [tuple(np.argwhere(comp == c)[0]) for c in range(1, comp.max() + 1)]


def test_pathfinder_label_is_the_connectivity_of_the_markers(tmp_path):
    images, labels, clean = pathfinder.generate_pathfinder(120, seed=5, clean=True)
    assert images.shape == (120, 32, 32) and images.dtype == np.uint8 and clean.shape == (120, 64, 64)
    assert labels.sum() == 60                                              # exactly balanced
    connected = []
    for drawing in clean:
        marks = markers_of(drawing)
        assert len(marks) in (1, 2)                                        # 1: the two discs touch
        comp = bridged_components(drawing)
        connected.append(len(marks) == 1 or comp[marks[0]] == comp[marks[1]])
    assert (np.array(connected) == (labels == 1)).all()
    # the image is the clean drawing averaged 2x2: dark exactly where its block is empty
    blocks = clean.reshape(120, 32, 2, 32, 2).any((2, 4))
    assert ((images > 0) == blocks).all() and images.max() == 255
    # a look at a few (not committed): tmp_path/pathfinder.png
    from PIL import Image
    tiles = [np.kron(im, np.ones((4, 4), np.uint8)) for im in images[:8]]
    Image.fromarray(np.hstack(tiles)).save(tmp_path / "pathfinder.png")


def test_pathfinder_stamps_stay_in_their_own_image():
    pix = np.array([[[-1000, -1000]], [[1000, 1000]], [[-5, 70]]])              # far off the canvas
    idx = pathfinder._pf_index(np.arange(3) * pathfinder.PF_N ** 2, pix)[:, 0]
    reach = np.abs(pathfinder._PF_DISC_BOX).max()
    for i, j in enumerate(idx):
        y, x = divmod(j - i * pathfinder.PF_N ** 2, pathfinder.PF_N)
        assert reach <= y < pathfinder.PF_N - reach and reach <= x < pathfinder.PF_N - reach


def test_a_pathfinder_path_keeps_clear_of_its_own_dashes_but_the_newest(monkeypatch):
    """_pf_lay marks, for the path itself, the pixels near its previous dash: each dash of a contour path is laid
    with the one laid before it as `prev` (none for the first), never with itself (its next dash must touch it)."""
    laid, lay = {1: [], 2: []}, pathfinder._pf_lay

    def record(near, own, ink, idx, prev, bit, ink_bit):
        if ink_bit == 1:                                     # the two contour paths, not the distractors
            laid[int(bit)].append((idx.copy(), None if prev is None else prev.copy()))
        lay(near, own, ink, idx, prev, bit, ink_bit)
    monkeypatch.setattr(pathfinder, "_pf_lay", record)
    pathfinder.pathfinder_draw(np.array([0, 1, 1, 0]), np.random.default_rng(0))
    for dashes in laid.values():
        assert len(dashes) == pathfinder.PF_CONTOUR and dashes[0][1] is None
        for (before, _), (idx, prev) in zip(dashes, dashes[1:]):
            if len(prev) == len(before):                     # (between two drops of the stuck images)
                assert (prev == before).all() and not (prev == idx).all()


def test_pathfinder_is_deterministic_and_varied():
    a, la = pathfinder.generate_pathfinder(40, seed=[0, 0, 3])
    b, lb = pathfinder.generate_pathfinder(40, seed=[0, 0, 3])
    c, _ = pathfinder.generate_pathfinder(40, seed=[0, 0, 4])
    assert (a == b).all() and (la == lb).all() and not (a == c).all()
    assert len({im.tobytes() for im in a}) == 40


@pytest.fixture
def small_pathfinder(monkeypatch):
    monkeypatch.setattr(pathfinder, "PATHFINDER_SIZES", {"train": 300, "val": 100, "test": 100})
    monkeypatch.setattr(pathfinder, "PATHFINDER_SHARD", 100)
    monkeypatch.setattr(pathfinder, "MAX_WORKERS", 1)


def test_pathfinder_task_makes_only_the_shards_it_needs(small_pathfinder, tmp_path):
    task = data.load_task("pathfinder", cache_dir=tmp_path, data_dir=None, seed=0)
    assert (task.kind, task.vocab_size, task.block_size, task.n_classes) == ("cls", 257, 1024, 2)
    sub = task.split("train").subset(150)                                  # shards 0 and 1 only
    folder = tmp_path / "pathfinder" / "generated"
    assert sorted(os.listdir(folder)) == ["train_000", "train_001"] and len(sub) == 150
    x, y = batch_of(sub)
    assert sorted(os.listdir(folder / "train_000")) == ["manifest.json", "shard.images.npy", "shard.labels.npy"]
    images = np.load(folder / "train_000" / "shard.images.npy")
    assert x.shape == (150, 1024) and (x[:100].numpy() == images.astype(np.int64) + 1).all()
    assert x.min() >= 1 and x.max() <= 256 and set(y.tolist()) == {0, 1}   # pixel + 1: no padding inside
    assert len(task.split("train")) == 300 and len(task.split("test")) == 100
    x, y = task.split("val").sample(8, np.random.default_rng(0))
    assert x.shape == (8, 1024)
    assert sorted(os.listdir(folder)) == ["test_000", "train_000", "train_001", "val_000"]


def test_pathfinder_shards_are_the_same_in_parallel(small_pathfinder, monkeypatch, tmp_path):
    monkeypatch.setattr(pathfinder, "MAX_WORKERS", 2)
    a = pathfinder.pathfinder_generated(str(tmp_path / "a"), "train", 2)         # two processes
    monkeypatch.setattr(pathfinder, "MAX_WORKERS", 1)
    b = pathfinder.pathfinder_generated(str(tmp_path / "b"), "train", 2)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()


def test_generated_pathfinder_trains(small_pathfinder, tmp_path):
    m = train.main(["--task", "pathfinder", "--cache_dir", str(tmp_path), "--n_layer", "1", "--n_embd", "16",
                    "--n_head", "2", "--batch_size", "50", "--max_iters", "2", "--eval_iters", "1",
                    "--block_size", "64", "--out_dir", str(tmp_path / "out")])   # the first 2 rows: quick
    assert m["iters"] == 2 and m["n_test"] == 100 and 0 <= m["test_acc"] <= 1
    assert m["config"]["block_size"] == 64 and m["config"]["vocab_size"] == 257


# ----------------------------------------------------------------------------------------------
# Pathfinder: LRA's release folder

def write_pathfinder_release(root, n=30):
    """pathfinder32/curv_contour_length_14/ with metadata in both formats (text: images 0-19, .npy: the rest).
    Pixel [0, 0] of image i is i, so a loaded example can be traced back to its file."""
    from PIL import Image
    folder = root / "pathfinder32" / "curv_contour_length_14"
    rows = []
    for i in range(n):
        sub = f"imgs/{i // 10}"
        (folder / sub).mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, (32, 32)).astype(np.uint8)
        pixels[0, 0] = i
        Image.fromarray(pixels).save(folder / sub / f"sample_{i}.png")
        rows.append([sub, f"sample_{i}.png", str(i), str(i % 2), "1.0", "14", "4", "2", "0.5", "1", "1"])
    (folder / "metadata").mkdir()
    (folder / "metadata" / "0.npy").write_text("".join(" ".join(r) + "\n" for r in rows[:20]))
    np.save(folder / "metadata" / "1.npy", np.array(rows[20:]))            # a real .npy of strings
    return folder


def test_pathfinder_release(tmp_path):
    folder = write_pathfinder_release(tmp_path / "lra")
    sizes = []
    for given in (tmp_path / "lra", folder.parent, folder):
        task = data.load_task("pathfinder", cache_dir=tmp_path / "cache", data_dir=str(given))
        splits = [batch_of(task.split(s)) for s in ("train", "val", "test")]
        sizes.append([len(y) for _, y in splits])
    assert sizes == [[24, 3, 3]] * 3                                       # 30 images, 80/10/10
    seen = []
    for x, y in splits:
        for row, label in zip(x.numpy(), y.tolist()):
            i = row[0] - 1
            expected = np.asarray(__import__("PIL.Image").Image.open(folder / f"imgs/{i // 10}/sample_{i}.png"))
            assert (row == expected.reshape(-1).astype(np.int64) + 1).all() and label == i % 2
            seen.append(i)
    assert sorted(seen) == list(range(30))
    assert len(os.listdir(tmp_path / "cache" / "pathfinder")) == 1         # one cache for the three layouts


def test_pathfinder_release_damage_is_one_line_before_training(tmp_path):
    """An empty PNG, a PNG that does not decode, a metadata file cut in the middle of a line: each a one-line
    DataError naming the file (and the line, or the row that lists the image) and what to do; nothing cached."""
    import shutil
    good = write_pathfinder_release(tmp_path / "good")
    png = (good / "imgs/0/sample_7.png").read_bytes()
    meta = (good / "metadata/0.npy").read_text()
    damage = [("imgs/0/sample_7.png", b"",
               ["sample_7.png: an empty file", "0.npy, row 8", "extract the release again"]),
              ("imgs/0/sample_7.png", png[:len(png) // 2],
               ["sample_7.png: is not a readable PNG image", "0.npy, row 8", "extract the release again"]),
              ("imgs/0/sample_7.png", b"GIF89a, not a PNG", ["sample_7.png: is not a readable PNG image", "row 8"]),
              ("metadata/0.npy", meta[:meta.index("sample_12.png") + 6].encode(),
               ["0.npy, line 13: the file ends in the middle of this line", "extract the release again"])]
    for k, (name, content, parts) in enumerate(damage):
        root, cache = tmp_path / f"bad{k}", tmp_path / f"cache{k}"
        shutil.copytree(tmp_path / "good", root)
        (root / "pathfinder32/curv_contour_length_14" / name).write_bytes(content)
        with pytest.raises(data.DataError) as e:
            data.load_task("pathfinder", cache_dir=cache, data_dir=str(root)).open()
        assert_one_line_error(e, *parts)
        assert not (cache / "pathfinder").exists() or os.listdir(cache / "pathfinder") == []


# ----------------------------------------------------------------------------------------------
# Image: CIFAR-10

RED, WHITE, BLACK = (255, 0, 0), (255, 255, 255), (0, 0, 0)


def cifar_images(n, seed):
    rgb = np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3)).astype(np.uint8)
    rgb[0, 0, 0], rgb[0, 0, 1], rgb[0, 0, 2] = RED, WHITE, BLACK
    return rgb, [int(v) for v in np.random.default_rng(seed).integers(0, 10, n)]


def write_cifar(folder):
    folder.mkdir(parents=True)
    for i in range(1, 6):
        rgb, labels = cifar_images(4, i)
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"data": rgb.transpose(0, 3, 1, 2).reshape(4, -1), b"labels": labels}, f)
    rgb, labels = cifar_images(3, 9)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": rgb.transpose(0, 3, 1, 2).reshape(3, -1), b"labels": labels}, f)


def test_image_local_and_hugging_face_agree(tmp_path, hf):
    import datasets
    from PIL import Image
    write_cifar(tmp_path / "cifar-10-batches-py")
    local = data.load_task("image", cache_dir=tmp_path / "c1", data_dir=str(tmp_path))
    assert (local.kind, local.vocab_size, local.block_size, local.n_classes) == ("cls", 257, 1024, 10)
    xs = {s: batch_of(local.split(s)) for s in ("train", "val", "test")}
    assert [len(y) for _, y in xs.values()] == [18, 2, 3]                  # first 90% / last 10% / test
    train_rgb = np.concatenate([cifar_images(4, i)[0] for i in range(1, 6)])
    gray = image.rgb_to_gray(train_rgb).reshape(20, -1).astype(np.int64) + 1
    assert (xs["train"][0].numpy() == gray[:18]).all() and (xs["val"][0].numpy() == gray[18:]).all()
    assert xs["train"][1].tolist() == sum((cifar_images(4, i)[1] for i in range(1, 6)), [])[:18]
    assert xs["train"][0][0, :3].tolist() == [76 + 1, 255 + 1, 0 + 1]     # tf's grayscale; black is token 1
    hf.datasets["uoft-cs/cifar10"] = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"img": [Image.fromarray(a) for a in train_rgb],
                                             "label": sum((cifar_images(4, i)[1] for i in range(1, 6)), [])}),
        "test": datasets.Dataset.from_dict({"img": [Image.fromarray(a) for a in cifar_images(3, 9)[0]],
                                            "label": cifar_images(3, 9)[1]})})
    remote = data.load_task("image", cache_dir=tmp_path / "c2", data_dir=None)
    for s, (x, y) in xs.items():
        x2, y2 = batch_of(remote.split(s))
        assert torch.equal(x, x2) and torch.equal(y, y2)


# ----------------------------------------------------------------------------------------------
# IMDb: text (bytes) and imdb (BPE)

REVIEWS = {("train", "neg"): ["Awful.", "Ünbearable — 2/10 " * 300], ("train", "pos"): ["Great film!", "Loved it 🙂"],
           ("test", "neg"): ["Boring"], ("test", "pos"): ["Fine, fine.", "<br /><br />Good"]}


def write_aclimdb(root):
    for (split, sub), texts in REVIEWS.items():
        folder = root / "aclImdb" / split / sub
        folder.mkdir(parents=True)
        for i, t in enumerate(texts):
            (folder / f"{i * 11}_{7 if sub == 'pos' else 2}.txt").write_text(t, encoding="utf-8")
    return root


def imdb_dict():
    import datasets
    return datasets.DatasetDict({s: datasets.Dataset.from_dict({
        "text": REVIEWS[(s, "neg")] + REVIEWS[(s, "pos")],
        "label": [0] * len(REVIEWS[(s, "neg")]) + [1] * len(REVIEWS[(s, "pos")])}) for s in ("train", "test")})


def release_order(task):
    """(x, y) of a task's train and val splits together, back in the release's order (val is held out of train by
    text.hold_out_val, tested below)."""
    (xt, yt), (xv, yv) = batch_of(task.split("train")), batch_of(task.split("val"))
    n = len(yt) + len(yv)
    parts = text.hold_out_val({"train": (list(range(n)), [0] * n)}, "t")
    x, y = torch.zeros((n, max(xt.shape[1], xv.shape[1])), dtype=xt.dtype), torch.zeros(n, dtype=yt.dtype)
    for (idx, _), xs, ys in ((parts["train"], xt, yt), (parts["val"], xv, yv)):
        x[idx, :xs.shape[1]], y[idx] = xs, ys
    return x, y


def test_val_is_held_out_of_train():
    """Releases without a validation split: val is a fixed 5% of train (at least one), taken out of it; both keep
    the release's order, test is untouched, and the draw is the same every time (no --seed in it)."""
    for n in (2, 3, 20, 101, 25_000, 120_000):
        texts, labels = [f"doc {i}" for i in range(n)], [i % 3 for i in range(n)]
        test = (["t"], [1])
        out = text.hold_out_val({"train": (texts, labels), "test": test}, "x")
        (tt, tl), (vt, vl) = out["train"], out["val"]
        assert out["test"] is test and len(vt) == max(1, round(0.05 * n)) and len(tt) + len(vt) == n
        assert not set(tt) & set(vt) and set(tt) | set(vt) == set(texts)                  # disjoint, drawn from train
        index = {t: i for i, t in enumerate(texts)}
        for part in (tt, vt):                                                           # the release's order
            assert [index[t] for t in part] == sorted(index[t] for t in part)
        assert tl == [labels[index[t]] for t in tt] and vl == [labels[index[t]] for t in vt]   # labels follow
        assert text.hold_out_val({"train": (texts, labels)}, "x")["val"] == out["val"]       # deterministic
    assert (len(out["val"][0]), len(text.hold_out_val({"train": (texts[:25_000], labels[:25_000])}, "x")["val"][0])) \
        == (6_000, 1_250)                                                               # AG News, IMDb
    spread = [int(t.split()[1]) for t in out["val"][0]]
    assert min(spread) < 6_000 and max(spread) > 114_000                                # drawn over the whole split
    with pytest.raises(data.DataError, match="x: 1 training example"):
        text.hold_out_val({"train": (["a"], [0])}, "x")


def test_text_task_bytes(tmp_path, hf):
    root = write_aclimdb(tmp_path / "d")
    task = data.load_task("text", cache_dir=tmp_path / "c", data_dir=str(root))
    assert (task.kind, task.vocab_size, task.block_size, task.n_classes) == ("cls", 257, 4000, 2)
    x, y = release_order(task)
    texts = REVIEWS[("train", "neg")] + REVIEWS[("train", "pos")]
    assert y.tolist() == [0, 0, 1, 1] and x.shape == (4, 4000)
    for row, t in zip(x.numpy(), texts):
        b = t.encode("utf-8")[:4000]
        assert (row[:len(b)] == np.frombuffer(b, np.uint8) + 1).all() and (row[len(b):] == 0).all()
    assert len(texts[1].encode()) > 4000                                   # that one was cut
    assert [len(task.split(s)) for s in ("train", "val", "test")] == [3, 1, 3]   # val: held out of train
    again = data.load_task("text", cache_dir=tmp_path / "c", data_dir=str(root / "aclImdb"))
    assert torch.equal(release_order(again)[0], x)
    hf.datasets["stanfordnlp/imdb"] = imdb_dict()
    remote = data.load_task("text", cache_dir=tmp_path / "c2", data_dir=None, block_size=100)
    x2, y2 = release_order(remote)
    assert remote.block_size == 100 and torch.equal(x2, x[:, :100]) and torch.equal(y2, y)


def test_imdb_task_bpe(tmp_path, hf):
    hf.datasets["stanfordnlp/imdb"] = imdb_dict()
    task = data.load_task("imdb", cache_dir=tmp_path, data_dir=None, tokenizer="byte")
    assert (task.vocab_size, task.block_size, task.n_classes) == (258, 512, 2)   # byte ids + 1
    x, y = batch_of(task.split("test"))
    enc = sources.byte_encoding()
    texts = REVIEWS[("test", "neg")] + REVIEWS[("test", "pos")]
    for row, t in zip(x.numpy(), texts):
        ids = enc.encode_ordinary(t)[:512]
        assert row[:len(ids)].tolist() == [i + 1 for i in ids] and (row[len(ids):] == 0).all()
    assert y.tolist() == [0, 1, 1] and hf.calls == [("stanfordnlp/imdb", None)]
    local = data.load_task("imdb", cache_dir=tmp_path, data_dir=str(write_aclimdb(tmp_path / "d")), tokenizer="byte")
    assert torch.equal(batch_of(local.split("test"))[0], x)
    assert release_order(local)[0].shape == (4, 512)                        # the long review, cut to 512


def test_cache_is_reused_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    root = write_aclimdb(tmp_path / "d")
    first = data.load_task("text", cache_dir=tmp_path / "c", data_dir=str(root))
    monkeypatch.setattr(tasks.text, "read_aclimdb", lambda *a: pytest.fail("the cache was not used"))
    second = data.load_task("text", cache_dir=tmp_path / "c", data_dir=str(root))
    assert torch.equal(batch_of(first.split("train"))[0], batch_of(second.split("train"))[0])
    assert isinstance(second.split("train").tokens, np.memmap)
    leftovers = [f for _, dirs, files in os.walk(tmp_path / "c") for f in dirs + files if ".tmp" in f]
    assert leftovers == []


# ----------------------------------------------------------------------------------------------
# AG News

def write_agnews(folder, train_rows, test_rows):
    import csv
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.csv", train_rows), ("test.csv", test_rows)):
        if rows is not None:
            with open(folder / name, "w", newline="") as f:
                csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
    return folder


def test_agnews_csv(tmp_path, capsys):
    train_rows = [(c, f"Title {i}, with comma", f'Desc "{i}" \\ more') for i, c in enumerate([1, 2, 3, 4] * 3)]
    root = write_agnews(tmp_path / "ag", train_rows, [(4, "T", "D"), (1, "A", "B")])
    task = data.load_task("agnews", cache_dir=tmp_path / "c", data_dir=str(root), tokenizer="byte")
    assert (task.kind, task.vocab_size, task.block_size, task.n_classes) == ("cls", 258, 512, 4)
    x, y = release_order(task)
    assert y.tolist() == [0, 1, 2, 3] * 3
    first = bytes(v - 1 for v in x[0].tolist() if v).decode()
    assert first == 'Title 0, with comma Desc "0" \\ more'                 # title + " " + description
    assert batch_of(task.split("test"))[1].tolist() == [3, 0]
    # a folder with test.csv only (the AG News test split alone): first 80% (at most 6,000) train, rest test
    only = write_agnews(tmp_path / "only", None, train_rows)
    task = data.load_task("agnews", cache_dir=tmp_path / "c", data_dir=str(only), tokenizer="byte")
    assert len(task.split("train")) == 8 and len(task.split("test")) == 3 and len(task.split("val")) == 1
    assert "training on the first 9 rows of test.csv" in capsys.readouterr().out
    bad = write_agnews(tmp_path / "bad", [(1, "a", "b"), (5, "c", "d")], [(1, "a", "b")])
    with pytest.raises(data.DataError) as e:
        data.load_task("agnews", cache_dir=tmp_path / "c", data_dir=str(bad), tokenizer="byte")
    assert_one_line_error(e, "train.csv, line 2", "class 1-4")


def test_agnews_hugging_face(tmp_path, hf):
    import datasets
    hf.datasets["fancyzhx/ag_news"] = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": ["a b", "c"], "label": [3, 0]}),
        "test": datasets.Dataset.from_dict({"text": ["d"], "label": [2]})})
    task = data.load_task("agnews", cache_dir=tmp_path, data_dir=None, tokenizer="byte")
    x, y = release_order(task)
    assert x.tolist() == [[ord("a") + 1, ord(" ") + 1, ord("b") + 1], [ord("c") + 1, 0, 0]] and y.tolist() == [3, 0]


# ----------------------------------------------------------------------------------------------
# Retrieval: AAN pairs

def write_aan(folder, n):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    pairs = []
    for name in ("train", "eval", "test"):
        rows = []
        for i in range(n):
            t1 = "paper one " * int(rng.integers(1, 30)) + "ü"
            t2 = "x" * 4100 if i == 0 else f"other paper {i}"
            label = ["0", "1", "1.0", "0.0"][i % 4]
            rows.append(f"{label}\tid{i}a\tid{i}b\t{t1}\t{t2}\n")
            pairs.append((name, int(float(label)), t1, t2))
        (folder / f"new_aan_pairs.{name}.tsv").write_text("".join(rows), encoding="utf-8")
    return pairs


def test_retrieval_pairs(tmp_path):
    pairs = write_aan(tmp_path / "lra_release" / "tsv_data", 6)
    task = data.load_task("retrieval", cache_dir=tmp_path / "c", data_dir=str(tmp_path))
    assert (task.kind, task.vocab_size, task.block_size, task.n_classes) == ("match", 257, 4000, 2)
    split = task.split("val")
    assert isinstance(split.tokens, np.memmap) and split.tokens.dtype == np.uint8
    x, y = batch_of(split)
    assert x.shape == (6, 2, 4000)
    for (name, label, t1, t2), row, got in zip([p for p in pairs if p[0] == "eval"], x.numpy(), y.tolist()):
        assert got == label
        for doc, t in zip(row, (t1, t2)):
            b = t.encode()[:4000]
            assert (doc[:len(b)] == np.frombuffer(b, np.uint8) + 1).all() and (doc[len(b):] == 0).all()
    import simpletron
    model = simpletron.Model(simpletron.Config(vocab_size=257, block_size=4000, head="match", n_classes=2,
                                               n_layer=1, n_embd=16, n_head=2))
    logits, loss = model(*task.split("train").sample(3, np.random.default_rng(0)))
    assert logits.shape == (3, 2) and torch.isfinite(loss)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "new_aan_pairs.train.tsv").write_text("1\ta\tb\tonly four fields\n")
    with pytest.raises(data.DataError) as e:
        data.load_task("retrieval", cache_dir=tmp_path / "c", data_dir=str(tmp_path / "bad"))
    assert_one_line_error(e, "new_aan_pairs.train.tsv, line 1", "5 tab-separated fields")


@pytest.mark.parametrize("row, which", [("1\ta\tb\t\tsome text\n", "text1 (id1 a)"),
                                        ("0\ta\tb\tsome text\t\n", "text2 (id2 b)"),
                                        ("0\ta\tb\tsome text\t\r\n", "text2 (id2 b)"),
                                        ("1\t" + "x" * 50 + "\tb\t\tt\n", "text1 (id1 " + "x" * 40 + ") is")])  # (40)
def test_an_empty_aan_document_is_refused_naming_the_file_row_and_document(tmp_path, row, which):
    """A pair with a document of no bytes has nothing to pool (TransJect's max over no tokens: a nan loss at step 1,
    with advice about --lr): refused in one line before any work."""
    write_aan(tmp_path / "d", 3)
    path = tmp_path / "d" / "new_aan_pairs.eval.tsv"
    path.write_text("1\tx\ty\tone\ttwo\n" + row, encoding="utf-8")
    with pytest.raises(data.DataError) as e:
        data.load_task("retrieval", cache_dir=tmp_path / "c", data_dir=str(tmp_path / "d"))
    assert_one_line_error(e, "new_aan_pairs.eval.tsv, line 2", which, "empty")


# ----------------------------------------------------------------------------------------------
# Language modelling: PTB, WikiText-103, OpenWebText, any text file

PTB = {"train": ["the cat sat", "the <unk> ran N"], "valid": ["the cat ran"], "test": ["sat N"]}


def test_ptb_vocabulary_is_the_files_and_hugging_face_gives_the_same(tmp_path, hf):
    import datasets
    folder = tmp_path / "simple-examples" / "data"
    folder.mkdir(parents=True)
    for name, lines in PTB.items():
        (folder / f"ptb.{name}.txt").write_text("".join(f" {s} \n" for s in lines))
    local = data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(tmp_path), block_size=2)
    words = sorted({"the", "cat", "sat", "<unk>", "ran", "N", "<eos>"})
    assert local.vocab_size == len(words) + 1 and local.kind == "lm"
    stream = local.split("train").stream
    assert [words[i - 1] for i in stream] == "the cat sat <eos> the <unk> ran N <eos>".split()
    hf.datasets["ptb-text-only/ptb_text_only"] = datasets.DatasetDict({
        s: datasets.Dataset.from_dict({"sentence": PTB[f]}) for s, f in (("train", "train"), ("validation", "valid"),
                                                                         ("test", "test"))})
    remote = data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=None, block_size=2)
    assert hf.calls == [("ptb-text-only/ptb_text_only", "penn_treebank")]
    assert sorted(os.listdir(tmp_path / "c" / "ptb")) == ["manifest.json", "ptb.test.txt", "ptb.train.txt",
                                                          "ptb.valid.txt"]
    for s in ("train", "val", "test"):
        assert (remote.split(s).stream == local.split(s).stream).all()


WIKI = {"train": [" = Title = \n", " \n", " The cat sat on the mat . \n", " Ünïcode line \n"] * 20,
        "valid": [" = Other = \n", " Valid text here . \n"] * 10, "test": [" Test text , more . \n"] * 10}


def test_wikitext_memmap_bins_local_and_hugging_face(tmp_path, hf):
    import datasets
    folder = tmp_path / "wikitext-103"
    folder.mkdir()
    for name, lines in WIKI.items():
        (folder / f"wiki.{name}.tokens").write_text("".join(lines), encoding="utf-8")
    task = data.load_task("wikitext103", cache_dir=tmp_path / "c", data_dir=str(tmp_path), tokenizer="byte",
                          block_size=16)
    assert (task.kind, task.vocab_size, task.block_size) == ("lm", 257, 16)
    enc = sources.byte_encoding()
    streams = {}
    for s, name in (("train", "train"), ("val", "valid"), ("test", "test")):
        stream = task.split(s).stream
        assert isinstance(stream, np.memmap) and stream.dtype == np.uint16
        assert enc.decode(stream.tolist()) == "".join(WIKI[name])
        streams[s] = np.array(stream)
    x, y = task.split("train").sample(4, np.random.default_rng(0))
    assert x.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    again = data.load_task("wikitext103", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="byte")
    assert (np.array(again.split("train").stream) == streams["train"]).all()           # reloads identically
    hf.datasets["Salesforce/wikitext"] = datasets.DatasetDict({
        s: datasets.Dataset.from_dict({"text": WIKI[f]}) for s, f in (("train", "train"), ("validation", "valid"),
                                                                      ("test", "test"))})
    remote = data.load_task("wikitext103", cache_dir=tmp_path / "c", data_dir=None, tokenizer="byte", block_size=16)
    assert hf.calls == [("Salesforce/wikitext", "wikitext-103-raw-v1")]
    assert all((np.array(remote.split(s).stream) == streams[s]).all() for s in streams)


def test_openwebtext_hugging_face_and_nanogpt_bins(tmp_path, hf):
    import datasets
    docs = [f"document {i} text" for i in range(300)]
    hf.datasets["Skylion007/openwebtext"] = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs})})
    task = data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=None, tokenizer="byte", block_size=8)
    assert (task.vocab_size, task.has("val"), task.has("test")) == (257, True, False)
    enc = sources.byte_encoding()
    got = [enc.decode(np.array(task.split(s).stream).tolist()).split("<|endoftext|>")[:-1] for s in ("train", "val")]
    assert len(got[1]) == 1 and sorted(got[0] + got[1]) == sorted(docs)     # nanoGPT's 0.05% for val
    # nanoGPT's prepared files are used where they are: uint16 gpt2 ids, no tokenizer needed
    folder = tmp_path / "owt"
    folder.mkdir()
    ids = {s: np.random.default_rng(i).integers(0, 50257, 1000).astype(np.uint16) for i, s in enumerate(("train", "val"))}
    for s, a in ids.items():
        a.tofile(folder / f"{s}.bin")
    task = data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=str(tmp_path / "owt"), tokenizer="gpt2",
                          block_size=8)
    assert task.vocab_size == 50257 and (np.array(task.split("val").stream) == ids["val"]).all()
    for small in (False, True):                              # gpt2 ids read as bytes, or ids all below 257: the
        if small:                                            # files' ids are gpt2's, whatever --tokenizer says
            for s, a in ids.items():
                (a % 256).tofile(folder / f"{s}.bin")
        with pytest.raises(data.DataError) as e:
            data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="byte")
        assert_one_line_error(e, "--tokenizer byte: nanoGPT's train.bin and val.bin hold gpt2 ids", "a meta.json")
    (folder / "meta.json").write_text('{"vocab_size": 257, "dtype": "uint16"}')             # files of byte ids
    assert data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="byte",
                          block_size=8).vocab_size == 257
    (folder / "val.bin").write_bytes(ids["val"].tobytes())                                    # gpt2 ids again
    with pytest.raises(data.DataError) as e:
        data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="byte", block_size=8)
    assert_one_line_error(e, "val.bin holds id")


def test_textfile_chars_and_bytes(tmp_path):
    path = tmp_path / "tiny.txt"
    text = "to be or not to be, that is the question — ü\n" * 30
    path.write_text(text, encoding="utf-8")
    task = data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(path), tokenizer="char", block_size=8)
    chars = sorted(set(text))
    assert task.vocab_size == len(chars) + 1
    decoded = "".join(chars[i - 1] for i in np.concatenate([task.split("train").stream, task.split("val").stream]))
    assert decoded == text and len(task.split("val").stream) == len(text) - int(0.9 * len(text))
    task = data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(tmp_path), tokenizer="byte", block_size=8)
    stream = np.concatenate([task.split("train").stream, task.split("val").stream])
    assert task.vocab_size == 257 and bytes(stream.astype(np.uint8)) == text.encode()


# ----------------------------------------------------------------------------------------------
# Missing data and no network: one line, at once

def test_hf_dataset_offline_mode_and_parquet_fallback(monkeypatch):
    """Offline, hf_dataset sets the libraries' own switches (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) before
    datasets.load_dataset; online, a dataset with a loading script is read from the parquet conversion."""
    import datasets
    calls = []

    def load_dataset(path, name=None, **kw):
        calls.append((path, name, kw, os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE")))
        if "revision" not in kw:
            raise RuntimeError("Dataset scripts are no longer supported, but found ptb_text_only.py")
        return "parquet"

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "0")                         # restored after the test, whatever happens
        monkeypatch.delenv(name)
    monkeypatch.setattr(sources, "reachable", lambda *a, **k: True)          # online: the script fallback
    assert sources.hf_dataset("p/d", "cfg", parquet_dir="cfg") == "parquet"
    assert calls == [("p/d", "cfg", {}, None, None),
                     ("p/d", None, {"revision": "refs/convert/parquet", "data_dir": "cfg"}, None, None)]
    calls.clear()
    monkeypatch.setattr(sources, "reachable", lambda *a, **k: False)         # offline: the cache only, once
    with pytest.raises(data.DataError, match="no network and not in the Hugging Face cache"):
        sources.hf_dataset("p/d", "cfg", parquet_dir="cfg")
    assert calls == [("p/d", "cfg", {}, "1", "1")]


@pytest.mark.parametrize("name,layout", [("text", "aclImdb"), ("image", "cifar-10-batches-py"),
                                         ("agnews", "train.csv"), ("ptb", "ptb.train.txt"),
                                         ("wikitext103", "wiki.train.tokens"), ("openwebtext", "train.bin")])
def test_offline_hugging_face_fails_fast_in_one_line(name, layout, offline, tmp_path):
    t0 = time.time()
    with pytest.raises(data.DataError) as e:                 # gpt2 is not there either: the data comes first
        data.load_task(name, cache_dir=tmp_path / "c", data_dir=None, tokenizer="gpt2")
    assert time.time() - t0 < 10
    assert_one_line_error(e, f"{name}: tried Hugging Face", "no network", "--data_dir", layout)


@pytest.mark.parametrize("name,layout", [("pathfinder", "metadata"), ("image", "data_batch_1"), ("text", "aclImdb"),
                                         ("imdb", "aclImdb"), ("agnews", "test.csv"), ("retrieval", "new_aan_pairs"),
                                         ("ptb", "ptb.train.txt"), ("wikitext103", "wiki.train"),
                                         ("openwebtext", "train.bin"), ("textfile", ".txt")])
def test_empty_data_dir_names_the_layout(name, layout, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(data.DataError) as e:
        data.load_task(name, cache_dir=tmp_path / "c", data_dir=str(tmp_path / "empty"),
                       tokenizer="gpt2" if name == "ptb" else "byte")              # (ptb: its words)
    assert_one_line_error(e, name, layout)


def test_train_py_reports_missing_data_in_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    for argv, parts in ((["--task", "retrieval"], ["retrieval", "lra_release.gz", "new_aan_pairs.train.tsv"]),
                        (["--task", "text"], ["text: tried Hugging Face", "aclImdb"])):
        t0 = time.time()
        r = subprocess.run([sys.executable, "train.py", *argv, "--cache_dir", str(tmp_path / "c"), "--max_iters", "1"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert time.time() - t0 < 60 and r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and all(p in lines[0] for p in parts), r.stderr


def rss_file_mb():
    return int(open("/proc/self/status").read().split("RssFile:")[1].split()[0]) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_random_batches_of_a_mapped_file_do_not_keep_its_pages(tmp_path):
    """A memory map kept open keeps every page it has read in the process's memory: batches drawn at random
    from 20,000 rows of 2,000 bytes (40 MB) would end with most of the file resident (the kernel maps up to 16
    neighbouring pages on each read). Each batch maps the file anew, so the process holds at most a batch."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "t.npy", rng.integers(1, 10, (20000, 2000), dtype=np.uint8))
    np.save(tmp_path / "s.npy", rng.integers(1, 10, 20_000_000, dtype=np.uint8))
    tokens = np.load(tmp_path / "t.npy", mmap_mode="r")
    split = data.ClassificationSplit(tokens, np.zeros(20000, int), np.full(20000, 2000)).truncate(1500)
    stream = data.LMSplit(np.load(tmp_path / "s.npy", mmap_mode="r")[:19_000_000], 1000)
    before = rss_file_mb()
    for _ in range(500):
        split.sample(16, rng), stream.sample(16, rng)
    assert rss_file_mb() - before < 8, rss_file_mb() - before
    idx = np.array([19999, 3, 7])                            # and the batches read the file's rows
    assert (split._batch(idx)[0].numpy() == np.load(tmp_path / "t.npy")[idx, :1500]).all()
    w, y = stream._windows(np.array([0, 18_998_999]))
    s = np.load(tmp_path / "s.npy")
    assert (w.numpy() == np.stack([s[:1000], s[18_998_999:18_999_999]])).all() and (y[1, -1] == s[18_999_999])


@pytest.mark.parametrize("position", [0, 1, 99, 100, 998, 999])
def test_an_id_outside_the_vocabulary_is_found_at_either_end_of_a_bin(position, tmp_path, monkeypatch):
    monkeypatch.setattr(lm, "CHECK_CHUNK", 100)              # read in chunks of 100 ids: each chunk's ends too
    ids = np.ones(1000, np.uint16)
    ids[position] = 50257
    ids.tofile(tmp_path / "train.bin")
    with pytest.raises(data.DataError) as e:
        lm.check_ids(str(tmp_path / "train.bin"), np.uint16, 50257, "GPT-2's ids", str(tmp_path / "checked"))
    assert str(e.value) == f"{tmp_path / 'train.bin'} holds id 50257 (at position {position:,}), outside GPT-2's ids"
    ids[position] = 50256                                    # the largest id: fine, and remembered
    ids.tofile(tmp_path / "train.bin")
    lm.check_ids(str(tmp_path / "train.bin"), np.uint16, 50257, "GPT-2's ids", str(tmp_path / "checked"))


def test_a_byte_order_mark_before_the_first_line_is_left_out(tmp_path):
    """Excel and Notepad start a UTF-8 file with one (U+FEFF): ListOps' header, a recall file's first id, AG News'
    first label were refused with it."""
    listops.write_listops_tsv(tmp_path / "b.tsv", listops.listops_chunk(((1, 0), 3, 5, 30)))
    (tmp_path / "a.tsv").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "b.tsv").read_bytes())
    a, b = (tasks.listops_format.read_listops_arrays(str(tmp_path / f"{n}.tsv")) for n in "ab")
    assert all((x == y).all() for x, y in zip(a, b)) and len(a[2]) == 3
    (tmp_path / "r.txt").write_bytes("\ufeff1 2\t- 2\n".encode())
    assert list(data.read_lines(str(tmp_path / "r.txt"))) == ["1 2\t- 2\n"]
    (tmp_path / "ag.csv").write_bytes('\ufeff"3","Wall St.","Shares rose."\n'.encode())
    texts, labels = text.read_agnews_csv(str(tmp_path / "ag.csv"))
    assert labels == [2] and "Wall St." in texts[0]


def test_finite_is_a_json_number_a_float_can_hold():
    assert all(data.finite(v) for v in (0, -3, 1.5, 10**308, -1.7976931348623157e308))
    assert not any(data.finite(v) for v in (True, None, "1", [1], float("nan"), float("inf"), -float("inf"), 10**309,
                                            -10**400))


def test_sigterm_while_a_second_program_runs_is_passed_on_and_waited_for(tmp_path):
    """data.run_program (experiments.py's held-out generators): SIGTERM to the caller reaches the program it runs,
    which stops as it would alone (its `finally` runs: a pool's workers, its temporary files), then the caller ends
    with 143; was: the program SIGKILLed, its pool's workers orphaned (resource_tracker's warning, a temporary folder
    left)."""
    import signal
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child, outer = tmp_path / "child.py", tmp_path / "outer.py"
    child.write_text(f"import sys, time\nsys.path.insert(0, {root!r})\nimport data\n\ndef main():\n    try:\n"
                     f"        open({str(tmp_path / 'started')!r}, 'w').close()\n        time.sleep(60)\n    finally:\n"
                     f"        open({str(tmp_path / 'cleaned')!r}, 'w').close()\n\ndata.run_main(main)\n")
    outer.write_text(f"import sys\nsys.path.insert(0, {root!r})\nimport data\n"
                     f"data.run_main(lambda: data.run_program([{str(child)!r}]))\n")
    p = subprocess.Popen([sys.executable, str(outer)], stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if (tmp_path / "started").exists():
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 143 and "Traceback" not in err, err
    assert (tmp_path / "cleaned").exists()                   # the program stopped as it would alone


def test_labels_run_from_0_to_n_classes_minus_1_and_an_answer_in_any_row_counts():
    """Mutants: check_labels taking a label of n_classes (>= made >); the check that an evaluation split has an
    answer reading from row -1 (the last row alone) rather than row 0."""
    data.check_labels(np.array([0, 1, 1]), 2, "src")
    with pytest.raises(data.DataError, match=r"^src: label 2 of example 1 is not an integer"):
        data.check_labels(np.array([0, 2, 1]), 2, "src")
    x = np.ones((3, 4), dtype=np.int64)
    y = np.full((3, 4), -1, dtype=np.int64)
    y[0, 2] = 1                                              # the first row's answer alone; the last row has none
    t = data.Task("ans", "lm", 8, 4, loaders={"train": lambda: data.AnswerSplit(x, y),
                                              "val": lambda: data.AnswerSplit(x, y)})
    assert t.open() == ["val"]


def test_a_failure_in_a_class_names_its_modules_file_and_the_line_there():
    """Mutant: loader_failure finding the file by fn's code object alone: a class (a model's constructor, as
    config.build_model passes it) has none, and the line lost its file and line."""
    import simpletron
    try:
        simpletron.Model.forward(None, None)
    except AttributeError as e:
        said = data.loader_failure("m", simpletron.Model, e)
    assert said.startswith("m (simpletron.py line ") and " fails: AttributeError: " in said
