"""Callbacks that show what the canonicalizer learned."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from lightning import Callback, LightningModule, Trainer
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
            # Iterating a DataLoader draws from the global RNG; fork it so that looking at images never
            # changes training (a resumed run must draw the same dropout masks as an uninterrupted one).
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
        save_captioned(grid, caption, out_dir / f"epoch_{trainer.current_epoch:04d}.png")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key="val/canonicalized", images=[grid], caption=["top: original, bottom: canonical"])


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
