"""N-body dynamics data (paper §5.2, Appendix G.2): dataset files, their generation and verification, and
the LightningDataModule.

Files follow EGNN's generator exactly (names, layout, float64), so EGNN's original files can be dropped
into ``data_dir`` instead of generating them::

    loc_{split}{suffix}.npy      (S, T, 3, N)  positions at the saved frames
    vel_{split}{suffix}.npy      (S, T, 3, N)  velocities
    edges_{split}{suffix}.npy    (S, N, N)     q_i q_j
    charges_{split}{suffix}.npy  (S, N, 1)     ±1

with split in {train, valid, test} and suffix e.g. ``_charged5_initvel1small``. Our generator also writes
``manifest{suffix}.json`` (parameters, shapes, sha256) beside them, which lets the data module detect
corrupted files and files made with other parameters.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from canonical_network.data.base import SplitDataModule
from canonical_network.data.errors import DataFilesError
from canonical_network.data.nbody_sim import ChargedSimConfig, draw_initial_conditions, resolve_dot, simulate
from canonical_network.groups.euclidean import random_orthogonal
from canonical_network.utils.checks import check_choice
from canonical_network.utils.files import atomic_write, atomic_write_text, file_sha256

log = logging.getLogger(__name__)

# The split names in the N-body arrays' file names (``loc_valid<suffix>.npy``), as EGNN's generator wrote them;
# the DataModule's loaders call "valid" "val" (``data.base.SPLITS``).
NBODY_FILE_SPLITS = ("train", "valid", "test")
ARRAYS = ("loc", "vel", "edges", "charges")
MANIFEST_FORMAT = "canonical_network.nbody/1"
GENERATE_COMMAND = "python -m canonical_network.data.generate_nbody"


class NBodyDataError(DataFilesError, RuntimeError):
    """N-body data files are missing, corrupted, or do not match the requested dataset."""


@dataclass(frozen=True)
class NBodyDatasetSpec:
    """One N-body dataset: how EGNN's ``generate_dataset.py`` was called to make it.

    All splits come from one random stream seeded once: train simulations first, then valid, then test.

    Attributes:
        name: dataset name used by EGNN's data loader (``nbody_small``, ``nbody``).
        seed: global NumPy seed.
        num_train, num_valid, num_test: simulations per split.
        sim: simulation parameters.
        name_suffix: EGNN's ``--sufix`` argument, appended to the file names.
        frames: (input, target) frame EGNN trains on for this dataset (for error messages).
    """

    name: str
    seed: int
    num_train: int
    num_valid: int
    num_test: int
    sim: ChargedSimConfig = field(default_factory=ChargedSimConfig)
    name_suffix: str = ""
    frames: tuple[int, int] = (30, 40)

    @property
    def file_suffix(self) -> str:
        return self.sim.file_suffix(self.name_suffix)

    def num_sims(self, split: str) -> int:
        return {"train": self.num_train, "valid": self.num_valid, "test": self.num_test}[split]

    def file_name(self, array: str, split: str) -> str:
        return f"{array}_{split}{self.file_suffix}.npy"

    @property
    def manifest_name(self) -> str:
        return f"manifest{self.file_suffix}.json"

    def file_names(self) -> list[str]:
        return [self.file_name(a, s) for s in NBODY_FILE_SPLITS for a in ARRAYS]

    def expected_shape(self, array: str, split: str) -> tuple[int, ...]:
        s, n, d, t = self.num_sims(split), self.sim.n_particles, self.sim.dim, self.sim.num_frames
        return {"loc": (s, t, d, n), "vel": (s, t, d, n), "edges": (s, n, n), "charges": (s, n, 1)}[array]

    def parameters(self) -> dict:
        """What the files' contents depend on (compared against a manifest)."""
        return {
            "seed": self.seed,
            "num_train": self.num_train,
            "num_valid": self.num_valid,
            "num_test": self.num_test,
            "simulation": dataclasses.asdict(self.sim),
        }

    def generate_command(self, out_dir: str | Path) -> str:
        """The command line that generates exactly this dataset into ``out_dir``."""
        cmd = f"{GENERATE_COMMAND} --out {out_dir}"
        if self.name != "nbody_small":
            cmd += f" --dataset {self.name}"
        base = NBODY_DATASETS[self.name]
        for attr, flag in [
            ("seed", "--seed"),
            ("num_train", "--num-train"),
            ("num_valid", "--num-valid"),
            ("num_test", "--num-test"),
        ]:
            if getattr(self, attr) != getattr(base, attr):
                cmd += f" {flag} {getattr(self, attr)}"
        for attr, flag in [
            ("n_particles", "--n-particles"),
            ("n_steps", "--n-steps"),
            ("sample_every", "--sample-every"),
        ]:
            if getattr(self.sim, attr) != getattr(base.sim, attr):
                cmd += f" {flag} {getattr(self.sim, attr)}"
        return cmd


# EGNN's datasets (n_body_system/dataset/generate_dataset.py docstring and dataset_nbody.py).
NBODY_DATASETS: dict[str, NBodyDatasetSpec] = {
    # The paper's dataset: `--num-train 10000 --seed 43 --sufix small`, frames 30 -> 40.
    "nbody_small": NBodyDatasetSpec(
        "nbody_small",
        seed=43,
        num_train=10000,
        num_valid=2000,
        num_test=2000,
        name_suffix="small",
        frames=(30, 40),
    ),
    # EGNN's larger variant: `--num-train 50000 --sample-freq 500` (default seed 42), frames 6 -> 8.
    "nbody": NBodyDatasetSpec(
        "nbody",
        seed=42,
        num_train=50000,
        num_valid=2000,
        num_test=2000,
        sim=ChargedSimConfig(sample_every=500),
        frames=(6, 8),
    ),
}


def get_dataset_spec(name: str, **overrides) -> NBodyDatasetSpec:
    """The spec of a named dataset, with optional overrides.

    Args:
        name: a key of :data:`NBODY_DATASETS`.
        **overrides: ``seed``, ``num_train``, ``num_valid``, ``num_test`` or any
            :class:`ChargedSimConfig` field (e.g. ``n_particles``); None values are ignored.
    """
    if name not in NBODY_DATASETS:
        raise ValueError(f"unknown N-body dataset {name!r}; valid choices: {sorted(NBODY_DATASETS)}")
    spec = NBODY_DATASETS[name]
    overrides = {k: v for k, v in overrides.items() if v is not None}
    sim_fields = {f.name for f in dataclasses.fields(ChargedSimConfig)}
    sim_overrides = {k: overrides.pop(k) for k in list(overrides) if k in sim_fields}
    if sim_overrides:
        overrides["sim"] = dataclasses.replace(spec.sim, **sim_overrides)
    return dataclasses.replace(spec, **overrides)


def _save_atomic(path: Path, array: np.ndarray) -> None:
    """Write via a temporary name so an interrupted run never leaves a plausible-looking partial file."""
    atomic_write(path, lambda stream: np.save(stream, array))


def generate_nbody_dataset(
    out_dir: str | Path,
    spec: NBodyDatasetSpec | None = None,
    progress: bool = True,
    chunk_size: int = 1000,
) -> Path:
    """Simulate all splits of a dataset and write EGNN's files plus a manifest into ``out_dir``.

    Random numbers for every simulation of every split are drawn first, in the reference order (train,
    valid, test; per simulation charges, positions, velocities, noise); the trajectories are then
    integrated in batches.

    Args:
        out_dir: directory to write into (created if needed).
        spec: the dataset; default nbody_small.
        progress: show a tqdm progress bar over simulations.
        chunk_size: simulations integrated at once.

    Returns:
        Path of the manifest.
    """
    spec = spec or NBODY_DATASETS["nbody_small"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / spec.manifest_name
    manifest_path.unlink(missing_ok=True)  # the manifest is written last and marks a complete dataset
    # and every file of the dataset goes with it: an interrupted regeneration (another seed into a folder holding a
    # dataset) must leave files missing, which forces the next run to generate again, never a mix of the two
    for split in NBODY_FILE_SPLITS:
        for array in ARRAYS:
            (out / spec.file_name(array, split)).unlink(missing_ok=True)

    start = time.perf_counter()
    rng = np.random.RandomState(spec.seed)
    inits = {split: draw_initial_conditions(rng, spec.num_sims(split), spec.sim) for split in NBODY_FILE_SPLITS}
    total = sum(spec.num_sims(s) for s in NBODY_FILE_SPLITS)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"simulating {spec.name}", unit="sim")
    update: Callable[[int], None] | None = bar.update if bar is not None else None

    files = {}
    try:
        for split in NBODY_FILE_SPLITS:
            traj = simulate(inits[split], spec.sim, chunk_size=chunk_size, progress=update)
            for array in ARRAYS:
                name = spec.file_name(array, split)
                data = getattr(traj, array)
                _save_atomic(out / name, data)
                files[name] = {
                    "sha256": file_sha256(out / name),
                    "shape": list(data.shape),
                    "dtype": str(data.dtype),
                }
    finally:
        if bar is not None:
            bar.close()

    manifest = {
        "format": MANIFEST_FORMAT,
        "dataset": spec.name,
        **spec.parameters(),
        "file_suffix": spec.file_suffix,
        "generator": "canonical_network.data.nbody_sim",
        "dot_products": resolve_dot("auto", spec.sim),
        "numpy_version": np.__version__,
        "machine": platform.machine(),
        "generation_seconds": round(time.perf_counter() - start, 2),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return manifest_path


def _fix_hint(spec: NBodyDatasetSpec, data_dir: Path) -> str:
    return (
        f"Delete the listed file(s) (or the whole directory {data_dir}) and regenerate with "
        f"`{spec.generate_command(data_dir)}`, or let NBodyDataModule(generate_if_missing=True) regenerate them."
    )


def verify_nbody_files(data_dir: str | Path, spec: NBodyDatasetSpec) -> bool:
    """Check that ``data_dir`` holds the dataset ``spec`` intact.

    With our manifest, every file's shape and sha256 are checked against it and the manifest's parameters
    against ``spec``. Without one (e.g. EGNN's original files dropped in), shapes only.

    Returns:
        Whether a manifest was found.

    Raises:
        NBodyDataError: one error naming every problem file and how to fix it.
    """
    data_dir = Path(data_dir)
    manifest_path = data_dir / spec.manifest_name
    manifest = None
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
            recorded = {k: manifest[k] for k in spec.parameters()}
            recorded_files = manifest["files"]
        except (ValueError, KeyError, TypeError) as e:
            raise NBodyDataError(
                f"N-body manifest {manifest_path} is unreadable ({e}). " + _fix_hint(spec, data_dir)
            ) from e
        if recorded != spec.parameters():
            diff = {k: (recorded[k], v) for k, v in spec.parameters().items() if recorded[k] != v}
            raise NBodyDataError(
                f"The N-body files in {data_dir} (manifest {manifest_path.name}) were generated with other "
                f"parameters than requested for {spec.name!r}: {{name: (on disk, requested)}} = {diff}. "
                f"Use another data_dir, or delete the files there and regenerate with "
                f"`{spec.generate_command(data_dir)}`."
            )

    problems = []
    for split in NBODY_FILE_SPLITS:
        for array in ARRAYS:
            name = spec.file_name(array, split)
            path = data_dir / name
            want = spec.expected_shape(array, split)
            try:
                shape = np.load(path, mmap_mode="r").shape  # reads the header, checks the size
            except Exception as e:  # noqa: BLE001 - any failure to read means the file is unusable
                problems.append(f"{path}: unreadable ({type(e).__name__}: {e})")
                continue
            if tuple(shape) != want:
                problems.append(f"{path}: shape {tuple(shape)}, expected {want}")
                continue
            if manifest is not None:
                entry = recorded_files.get(name)
                if entry is None:
                    problems.append(f"{path}: not listed in the manifest")
                elif file_sha256(path) != entry.get("sha256"):
                    problems.append(f"{path}: sha256 differs from the manifest (file corrupted or replaced)")
    if problems:
        extra = (
            f" If you replaced the files on purpose (e.g. with EGNN's originals), delete {manifest_path} "
            "and only their shapes will be checked."
            if manifest is not None
            else ""
        )
        raise NBodyDataError(
            f"N-body data for {spec.name!r} in {data_dir} is corrupted or mis-shaped:\n  "
            + "\n  ".join(problems)
            + "\n"
            + _fix_hint(spec, data_dir)
            + extra
        )
    return manifest is not None


#: ``data.augmentation`` of the N-body module: none, or a Haar-random element of O(3) per training system
AUGMENTATIONS = ("none", "o3")


class NBodyDataModule(SplitDataModule):
    """Charged-particle N-body data for the dynamics-prediction task (paper §5.2, EGNN protocol).

    Each sample is one simulation: the state at frame ``frame_in`` and the positions at ``frame_out``
    (frames are 100 steps of Δt = 0.001 apart in nbody_small, so 30 -> 40 predicts 1000 steps ahead).
    Batches are tuples of float32 tensors::

        loc (B, N, 3), vel (B, N, 3), charges (B, N, 1), target_loc (B, N, 3)

    Training uses the first ``max_train_samples`` training simulations (3,000 in EGNN and the paper);
    validation and test use all of theirs. ``self.splits`` holds them as ``train``, ``val`` and ``test``
    (the files say ``valid``).

    Args:
        data_dir: directory holding (or receiving) the .npy files.
        dataset: ``nbody_small`` (the paper's) or ``nbody`` (EGNN's 50k-simulation variant, frames 6 -> 8).
        frame_in: input frame index.
        frame_out: target frame index.
        max_train_samples: number of training simulations used (None: all).
        batch_size: batch size of all loaders.
        num_workers: DataLoader workers.
        generate_if_missing: simulate the dataset into ``data_dir`` when files are missing (else raise).
        num_train, num_valid, num_test, seed: override the dataset's counts / seed (None: the dataset's),
            e.g. for small test datasets; files on disk must have been generated with the same values.
        augmentation: ``none`` (default; the paper's protocol) or ``o3``: each training system turned by its
            own Haar-random element Q of O(3) at every step (``loc Qᵀ``, ``vel Qᵀ``, ``target Qᵀ``; charges
            unchanged): data augmentation for a model that is not rotation-equivariant, e.g. the GNN.
            Validation and test systems are never moved.
    """

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "nbody"  # configs/data/<config_name>.yaml
    display_name = "N-body charged particles"
    paper_data = True  # the paper's numbers were measured on (a subset of) this data
    tasks = ("NBodyDynamicsTask",)  # the task classes (model._target_) that read it

    def __init__(
        self,
        data_dir: str = "data/nbody",
        dataset: str = "nbody_small",
        frame_in: int = 30,
        frame_out: int = 40,
        max_train_samples: int | None = 3000,
        batch_size: int = 100,
        num_workers: int = 0,
        generate_if_missing: bool = True,
        num_train: int | None = None,
        num_valid: int | None = None,
        num_test: int | None = None,
        seed: int | None = None,
        augmentation: str = "none",
    ):
        super().__init__(batch_size, num_workers)
        self.augmentation = check_choice("data.augmentation", augmentation, AUGMENTATIONS)
        self.save_hyperparameters()
        check_choice("data.dataset", dataset, sorted(NBODY_DATASETS))
        self.spec = get_dataset_spec(
            dataset, num_train=num_train, num_valid=num_valid, num_test=num_test, seed=seed
        )
        frames = self.spec.sim.num_frames
        for label, frame in (("data.frame_in", frame_in), ("data.frame_out", frame_out)):
            if not 0 <= frame < frames:
                raise ValueError(
                    f"{label}={frame} is out of range: {dataset!r} has {frames} frames (0..{frames - 1}); "
                    f"EGNN uses frame_in={self.spec.frames[0]}, frame_out={self.spec.frames[1]}"
                )
        self.data_dir = Path(data_dir)
        self.frame_in, self.frame_out = frame_in, frame_out
        self.max_train_samples = max_train_samples
        self.generate_if_missing = generate_if_missing

    def missing_files(self) -> list[str]:
        return [name for name in self.spec.file_names() if not (self.data_dir / name).exists()]

    def augment_train_batch(self, batch):
        # a fresh element of O(3) per system and per step, from the seeded global RNG (as the image modules)
        if self.augmentation == "none":
            return batch
        loc, vel, charges, target = batch
        q = random_orthogonal(loc.shape[0], dtype=loc.dtype, device=loc.device).transpose(1, 2)  # Qᵀ
        return loc @ q, vel @ q, charges, target @ q

    def prepare_data(self) -> None:
        """Generate the dataset into ``data_dir`` if any file is missing (and allowed to)."""
        missing = self.missing_files()
        if not missing:
            return
        if not self.generate_if_missing:
            raise NBodyDataError(
                f"N-body dataset {self.spec.name!r} is missing {len(missing)} file(s) in {self.data_dir}: "
                f"{', '.join(missing)}. Generate them with `{self.spec.generate_command(self.data_dir)}` "
                f"(or pass generate_if_missing=True), or copy EGNN's original files there."
            )
        log.info(
            "N-body dataset %r not found in %s (missing %s); generating it (about 1 ms per simulation, "
            "%d simulations).",
            self.spec.name,
            self.data_dir,
            ", ".join(missing),
            self.spec.num_train + self.spec.num_valid + self.spec.num_test,
        )
        generate_nbody_dataset(self.data_dir, self.spec)
        log.info("N-body dataset written to %s", self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # idempotent; lets the module be used without a Trainer
        has_manifest = verify_nbody_files(self.data_dir, self.spec)
        if not has_manifest:
            log.info("No manifest in %s: checked the N-body files' shapes only.", self.data_dir)
        for split in NBODY_FILE_SPLITS:
            limit = self.max_train_samples if split == "train" else None
            self.splits["val" if split == "valid" else split] = self._load_split(split, limit)

    def _load_split(self, split: str, limit: int | None) -> TensorDataset:
        def load(array: str) -> np.ndarray:
            return np.load(self.data_dir / self.spec.file_name(array, split), mmap_mode="r")

        loc, vel, charges = load("loc"), load("vel"), load("charges")
        count = loc.shape[0] if limit is None else min(limit, loc.shape[0])
        if limit is not None and limit > loc.shape[0]:
            log.warning("max_train_samples=%d but only %d training simulations exist", limit, loc.shape[0])

        def frame(a: np.ndarray, t: int) -> torch.Tensor:
            # Files are (S, T, 3, N); samples are (N, 3).
            return torch.from_numpy(np.ascontiguousarray(a[:count, t].transpose(0, 2, 1), dtype=np.float32))

        return TensorDataset(
            frame(loc, self.frame_in),
            frame(vel, self.frame_in),
            torch.from_numpy(np.ascontiguousarray(charges[:count], dtype=np.float32)),
            frame(loc, self.frame_out),
        )
