"""Callbacks that show what the canonicalizer learned."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger

log = logging.getLogger(__name__)


def _first_batches(loader, num_items: int):
    seen = 0
    for batch in loader:
        yield batch
        seen += len(batch[0])
        if seen >= num_items:
            return


def save_captioned(grid: torch.Tensor, caption: str, path: Path, scale: int = 2) -> None:
    """Save a (C, H, W) image grid in [0, 1] as PNG, enlarged ``scale`` times, under a strip with ``caption``."""
    from PIL import Image, ImageDraw

    pixels = (grid.clamp(0, 1) * 255).round().to(torch.uint8)
    pixels = pixels.expand(3, *pixels.shape[1:]) if pixels.shape[0] == 1 else pixels
    image = Image.fromarray(pixels.permute(1, 2, 0).numpy())
    image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    canvas = Image.new("RGB", (image.width, image.height + 16), "white")
    canvas.paste(image, (0, 16))
    ImageDraw.Draw(canvas).text((3, 2), caption, fill="black")
    canvas.save(path)


class CanonicalizedImageGrid(Callback):
    """At every validation, log a grid of validation images: originals (top rows) above canonicalized ones.

    The images are a fixed set of ``num_images`` validation digits, so successive epochs are comparable.
    Saved as ``<run dir>/canonicalized/epoch_XXXX.png`` and, when a W&B logger is attached, logged to W&B
    under ``val/canonicalized``.
    """

    def __init__(self, num_images: int = 16, output_dir: str | None = None) -> None:
        self.num_images = num_images
        self.output_dir = output_dir
        self._images: torch.Tensor | None = None

    def _fixed_images(self, trainer: Trainer) -> torch.Tensor | None:
        if self._images is None:
            dm = trainer.datamodule
            if dm is None:
                return None
            images = []
            # Our loaders draw their iterators' seeds from a generator of their own (data/base.py), but a data
            # module of the user's may not: fork the global RNG so that looking at images never changes training
            # (a resumed run must draw the same dropout masks as an uninterrupted one).
            with torch.random.fork_rng(devices=[]):
                batches = list(_first_batches(dm.val_dataloader(), self.num_images))
            for batch in batches:
                if not (torch.is_tensor(batch[0]) and batch[0].dim() == 4):
                    return None  # not an image task: nothing to show
                images.append(batch[0])
            # Validation shows each digit under several rotations: take every view of the first digits.
            self._images = torch.cat(images)[: self.num_images]
        return self._images

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero or not hasattr(pl_module, "network"):
            return
        images = self._fixed_images(trainer)
        if images is None:
            return
        import torchvision

        was_training = pl_module.training
        pl_module.eval()
        canonical = pl_module.network.canonicalize(images.to(pl_module.device))[0][0].cpu()
        pl_module.train(was_training)
        nrow = min(8, len(images))
        grid = torchvision.utils.make_grid(torch.cat([images, canonical]).clamp(0, 1), nrow=nrow, pad_value=0.5)
        out_dir = Path(self.output_dir or trainer.default_root_dir) / "canonicalized"
        out_dir.mkdir(parents=True, exist_ok=True)
        caption = f"epoch {trainer.current_epoch}: top, validation digits; bottom, canonicalized by h"
        path = out_dir / f"epoch_{trainer.current_epoch:04d}.png"
        save_captioned(grid, caption, path)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                # the file itself, so W&B shows the PNG's pixels (a float tensor reached W&B all black)
                logger.log_image(key="val/canonicalized", images=[str(path)], caption=[caption],
                                 step=trainer.global_step)


class PoseHistogram(Callback):
    """At every validation, a W&B histogram of the group elements the canonicalizer chooses (``val/pose``) on a
    fixed set of ``num_items`` validation inputs: per element index for a finite group (C_N, D_N), per rotation
    angle for a continuous one (2-D, or 3-D: the angle of the rotation part). A canonicalizer that always picks the
    same element, or spreads its choices uniformly, shows at a glance. Nothing is done without a W&B logger, nor
    for the identity canonicalizer."""

    def __init__(self, num_items: int = 256, bins: int = 36) -> None:
        self.num_items, self.bins = int(num_items), int(bins)
        self._inputs: tuple[torch.Tensor, ...] | None = None

    def _fixed_inputs(self, trainer: Trainer, pl_module: LightningModule) -> tuple[torch.Tensor, ...] | None:
        if self._inputs is None and trainer.datamodule is not None:
            with torch.random.fork_rng(devices=[]):  # looking never changes training's random draws
                batches = list(_first_batches(trainer.datamodule.val_dataloader(), self.num_items))
            if not batches:
                return None
            parts = [pl_module.split_batch(batch)[0] for batch in batches]
            self._inputs = tuple(torch.cat(tensors)[: self.num_items] for tensors in zip(*parts, strict=True))
        return self._inputs

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        canonicalizer = getattr(pl_module, "canonicalizer", None)
        if (not loggers or trainer.sanity_checking or not trainer.is_global_zero or canonicalizer is None
                or canonicalizer.group_name == "trivial"):
            return
        inputs = self._fixed_inputs(trainer, pl_module)
        if inputs is None:
            return
        import numpy as np
        import wandb

        from canonical_network.diagnostics.measures import coordinate_element, rotation_angles_deg

        was_training = pl_module.training
        pl_module.eval()
        _, chosen = pl_module.network.canonicalize(*(x.to(pl_module.device) for x in inputs))
        pl_module.train(was_training)
        element = coordinate_element(chosen)
        if element is None:
            return
        index = canonicalizer.group_element_index(element)
        if index is not None:
            order = int(getattr(canonicalizer, "group_order", 0) or int(index.max()) + 1)
            counts = torch.bincount(index.cpu(), minlength=order).numpy()
            histogram = wandb.Histogram(np_histogram=(counts, np.arange(order + 1) - 0.5))
        else:
            angles = rotation_angles_deg(element.matrix())[0].double().cpu().numpy()
            histogram = wandb.Histogram(angles, num_bins=self.bins)
        for logger in loggers:
            logger.experiment.log({"val/pose": histogram, "trainer/global_step": trainer.global_step})


class RNGStateCheckpoint(Callback):
    """Store the Python, NumPy and torch RNG states in every checkpoint and restore them on resume.

    With it (and epoch-seeded shuffling), a run stopped after an epoch's checkpoint and resumed draws the
    same dropout masks and augmentations as an uninterrupted run: same weights, same test metrics in
    deterministic mode.
    """

    def state_dict(self) -> dict:
        import random

        import numpy as np

        # Plain tuples and tensors only, so checkpoints still load with torch.load(weights_only=True).
        name, keys, pos, has_gauss, cached = np.random.get_state()
        numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))
        state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        import random

        import numpy as np

        random.setstate(state_dict["python"])
        name, keys, pos, has_gauss, cached = state_dict["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


class FitClock(Callback):
    """Seconds spent fitting, summed over every process that trained this run (resumes included).

    Stored in each checkpoint, so a run resumed from ``last.ckpt`` continues the count: ``train.py`` writes
    it to ``results.json`` as ``fit_time_s`` beside ``wall_time_s`` (that of the last process only).
    """

    def __init__(self) -> None:
        self.previous_s = 0.0
        self._start: float | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        import time

        self._start = time.monotonic()

    def on_fit_end(self, trainer, pl_module) -> None:
        self.previous_s, self._start = self.total_s, None  # stop: testing is not fitting

    @property
    def total_s(self) -> float:
        import time

        return self.previous_s + (time.monotonic() - self._start if self._start is not None else 0.0)

    def state_dict(self) -> dict:
        return {"fit_time_s": self.total_s}

    def load_state_dict(self, state_dict: dict) -> None:
        self.previous_s = float(state_dict.get("fit_time_s", 0.0))


class EpochCheckpoint(Checkpoint):
    """Write ``<dirpath>/last.ckpt`` at the end of every training epoch, after that epoch's validation.

    Lightning's ``ModelCheckpoint(save_last=True)`` rewrites ``last.ckpt`` only at the steps where it also
    saves a top-k checkpoint; with a monitored metric that is the epochs where validation improved, so a run
    stopped on a plateau resumed from its last improvement and trained again epochs it had finished (issue
    32; a 10,000-epoch N-body run can plateau for thousands). This callback saves unconditionally instead.

    It is a :class:`~lightning.pytorch.callbacks.Checkpoint`, which Lightning runs after every other callback
    in list order: placed after the ``ModelCheckpoint`` in the config, the file it writes holds that
    callback's state (best path and score) and the early-stopping counter as they are after the epoch.
    ``best_model_path``/``best_model_score`` are empty, in case it is the run's only checkpoint callback.
    """

    best_model_path = ""
    best_model_score = None

    def __init__(self, dirpath: str, filename: str = "last.ckpt", every_n_epochs: int = 1) -> None:
        from canonical_network.utils.checks import check_int

        self.dirpath = Path(dirpath)
        if "/" in filename or not filename.endswith(".ckpt"):
            raise ValueError(f"callbacks.last_checkpoint.filename must be a plain '<name>.ckpt', got {filename!r}")
        self.filename = filename
        self.every_n_epochs = check_int("callbacks.last_checkpoint.every_n_epochs", every_n_epochs, low=1)

    @property
    def path(self) -> Path:
        return self.dirpath / self.filename

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:
            return
        if (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        # every rank calls it; the strategy writes once (rank 0). The whole training state (optimizer, loops,
        # callbacks: what resume needs), said explicitly: left unset, Lightning logs a line at every save
        # (10,000 lines in a 10,000-epoch run's train.log). It holds plain tensors and containers, so it still
        # loads with torch.load(weights_only=True).
        # The loggers' buffered rows first (the CSV logger writes every 100 steps): a run killed after this
        # checkpoint resumes from it and never logs those rows again, so they must be on disk with it.
        for logger in trainer.loggers:
            logger.save()
        trainer.save_checkpoint(self.path, weights_only=False)


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` whose stored paths follow the run folder they are read in.

    A checkpoint's callback state holds absolute paths (the best checkpoint, the top-k files). Resumed in a
    copied or moved run folder, Lightning kept them as they were: the rerun then tested, and could delete,
    the *original* folder's files. Here every stored path is re-rooted on load into this callback's
    ``dirpath`` (the resuming run's ``checkpoints/``) by file name, and a path whose file is not there is
    refused, naming it: nothing read from a checkpoint may point outside the run that reads it. The
    resume from an explicit ``ckpt_path`` of another run may also use that run's checkpoint folder
    (``also_allowed``, set by ``train``).

    Its state is stored under ``ModelCheckpoint``'s key, so checkpoints written with either class resume.
    """

    also_allowed: tuple[Path, ...] = ()

    @property
    def state_key(self) -> str:
        return "ModelCheckpoint" + super().state_key.removeprefix(type(self).__qualname__)

    def _own_path(self, stored: str) -> str:
        if not stored:
            return stored
        path = Path(stored)
        if path.parent.resolve() == Path(self.dirpath).resolve():
            return stored
        here = Path(self.dirpath) / path.name
        if here.is_file():
            return str(here)
        if any(path.resolve().parent == folder.resolve() for folder in self.also_allowed) and path.is_file():
            return str(path)
        raise ValueError(
            f"the checkpoint's stored path {stored!r} is neither in this run's folder ({self.dirpath}) nor a "
            "file of the run it resumes from: refused (a path read from a checkpoint never leaves its run)"
        )

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            if key == "last_model_path":
                state[key] = ""  # last.ckpt is EpochCheckpoint's
            elif state.get(key):
                state[key] = self._own_path(state[key])
        if "best_k_models" in state:
            state["best_k_models"] = {self._own_path(k): v for k, v in state["best_k_models"].items()}
        state["dirpath"] = self.dirpath  # re-rooted: restore the scores too
        super().load_state_dict(state)


class DivergenceMonitor(Callback):
    """Tell a run whose training diverged from one that finished: ``train`` records it as ``"diverged"``.

    The stated criterion (:meth:`verdict`), with ``L₀`` the training loss of the very first batch (computed
    before any update: the untrained model's loss, about ln C for a C-class classifier):

    * the training loss of an epoch is not finite (training then stops at once: nothing more can be learned);
    * the last epoch's mean training loss exceeds ``factor × L₀``: training made the model far worse than it
      started (an exploding loss that stays finite, e.g. ``model.optimizer.lr=1e6``: 6e18);
    * a test metric is not finite.

    A run that learned nothing sits near ``L₀`` and is *not* flagged: that is a result (a floor), not a
    divergence. Nor is a test loss far above ``L₀`` or a test error at chance: a network with batch norm
    tested after a few batches has both without having diverged (its running statistics are not yet
    estimated). ``L₀`` is kept in checkpoints, so a resumed run judges against the same start.
    """

    def __init__(self, factor: float = 10.0) -> None:
        from canonical_network.utils.checks import check_number

        self.factor = check_number("callbacks.divergence.factor", factor, low=1, low_inclusive=False)
        self.initial_loss: float | None = None
        self.nonfinite_epoch: int | None = None
        #: the mean training loss of the last epoch trained (what :meth:`verdict` judges when given none)
        self.last_loss: float | None = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx) -> None:
        # the first batch of the run only: a run resumed from a checkpoint written without this callback's
        # state has no untrained loss to judge by (a trained model's loss would flag any later rise)
        if self.initial_loss is None and trainer.global_step <= 1:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None:
                self.initial_loss = float(loss.detach()) if torch.is_tensor(loss) else float(loss)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        value = trainer.callback_metrics.get("train/loss_epoch")
        if value is not None:
            self.last_loss = float(torch.as_tensor(value).detach())
        if value is not None and not torch.isfinite(torch.as_tensor(value)).all() and self.nonfinite_epoch is None:
            self.nonfinite_epoch = trainer.current_epoch
            trainer.should_stop = True
            log.warning("training loss is not finite at epoch %d: training stops (the run will be recorded as "
                        "diverged)", trainer.current_epoch)

    def verdict(self, final_train_loss: float | None, test_metrics: dict[str, float]) -> str | None:
        """Why the run diverged (one sentence), or ``None`` when it did not. ``final_train_loss``: the last
        epoch's mean training loss (``None``: the one this callback saw)."""
        import math

        if final_train_loss is None:
            final_train_loss = getattr(self, "last_loss", None)
        if self.nonfinite_epoch is not None:
            return f"the training loss was not finite at epoch {self.nonfinite_epoch}"
        if reason := self.test_verdict(test_metrics):
            return reason
        if self.initial_loss is None or not math.isfinite(self.initial_loss):
            return None
        limit = self.factor * abs(self.initial_loss)
        if final_train_loss is not None and not math.isfinite(final_train_loss):
            return "the last epoch's training loss is not finite"
        if final_train_loss is not None and final_train_loss > limit:
            return (f"the last epoch's training loss {final_train_loss:.4g} exceeds {self.factor:g} x the "
                    f"untrained model's {self.initial_loss:.4g}")
        return None

    @staticmethod
    def test_verdict(test_metrics: dict[str, float]) -> str | None:
        """The test-time part of :meth:`verdict`: test metrics that are not finite."""
        import math

        bad = sorted(k for k, v in test_metrics.items() if not math.isfinite(v))
        return f"test metric(s) not finite: {', '.join(bad)}" if bad else None

    def state_dict(self) -> dict:
        return {"initial_loss": self.initial_loss, "nonfinite_epoch": self.nonfinite_epoch, "last_loss": self.last_loss}

    def load_state_dict(self, state_dict: dict) -> None:
        self.initial_loss = state_dict.get("initial_loss")
        self.nonfinite_epoch = state_dict.get("nonfinite_epoch")
        self.last_loss = state_dict.get("last_loss")
