"""What every task module shares: the canonicalized network, the step skeleton, optimiser set-up, parameter
counts.

The step is written once (:meth:`CanonicalizedTask.model_step`, as the Lightning-Hydra template's
``model_step``): split the batch into inputs and target, run φ, compute the loss (plus, in training, the
weighted canonicalization prior), log ``{split}/loss``, update and log the split's metrics. A task gives only
what is its own: :meth:`~CanonicalizedTask.loss` and, through the constructor's ``metrics``, what it measures
per split (``update_metrics`` when a metric needs more than ``(output, target)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from lightning import LightningModule
from torch import nn
from torchmetrics import MeanMetric, Metric

from canonical_network.canonicalization.base import CanonicalizedModel, Canonicalizer
from canonical_network.data.base import SPLITS
from canonical_network.tasks.metrics import FigureDict
from canonical_network.utils.checkpoints import RUN_CONFIG_KEY, run_config_entry
from canonical_network.utils.checks import check_positive


class CanonicalizedTask(LightningModule):
    """Base LightningModule holding ``self.network = CanonicalizedModel(canonicalizer, predictor)``.

    Args:
        canonicalizer: h (use the identity canonicalizer for baselines).
        predictor: f.
        optimizer: a partially applied optimiser (Hydra ``_partial_: true``), finished here with the
            trainable parameters only, so frozen canonicalizers are never touched.
        scheduler: optional partially applied LR scheduler, stepped per epoch.
        canonicalizer_lr: learning rate of the canonicalizer's parameters; ``None`` (default) gives every
            parameter the optimiser's own. The authors' code uses one learning rate for both; a separate
            one is an ablation (h sees a few hundred steps and may need a larger step than f).
        metrics: per split (``"train"``, ``"val"``, ``"test"``), the metrics logged as ``{split}/{name}``
            (epoch means). A :class:`~canonical_network.tasks.metrics.FigureDict` metric, whose ``compute``
            returns several named figures, is logged at the epoch's end as ``{split}/{figure}``.

    Batches are ``(*inputs, target)``: the network is called on the inputs (``split_batch`` to change that).

    Canonicalization prior (Mondal et al. 2023), the same for every task and canonicalizer: in training the
    loss is ``task loss + canonicalization.prior_weight · prior`` (:meth:`Canonicalizer.prior
    <canonical_network.canonicalization.base.Canonicalizer.prior>` of the element the forward pass chose),
    ``train/loss`` logs that sum and ``train/prior_loss`` the unweighted prior (logged whatever the weight).
    Validation and test log ``{split}/identity_rate``, the share of inputs whose chosen element is the
    identity (:meth:`~canonical_network.canonicalization.base.Canonicalizer.is_identity`; 1 for baselines).
    """

    #: whether validation and test log ``{split}/loss`` (off where the loss *is* a metric, e.g. N-body MSE)
    log_eval_loss: bool = True
    #: constructor arguments that change what the test loop measures, never the network or its weights:
    #: ``python -m canonical_network.evaluate`` lets ``model.<option>`` be overridden for these only
    evaluation_options: tuple[str, ...] = ()
    #: the resolved config of the run (``train`` sets it), stored in every checkpoint
    #: (:data:`~canonical_network.utils.checkpoints.RUN_CONFIG_KEY`) so the model can be rebuilt from the file
    run_config: dict[str, Any] | None = None

    def __init__(
        self,
        canonicalizer: Canonicalizer,
        predictor: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        canonicalizer_lr: float | None = None,
        metrics: Mapping[str, Mapping[str, Metric]] | None = None,
    ) -> None:
        super().__init__()
        metrics = dict(metrics or {})
        unknown = set(metrics) - set(SPLITS)
        if unknown:
            raise ValueError(f"metrics are keyed by split, one of {list(SPLITS)}; got {sorted(unknown)}")
        # keyed by the logged name, "{split}/{name}" (a ModuleDict, so the metrics follow the module's device)
        self.metrics = nn.ModuleDict(
            {f"{split}/{name}": metric for split, named in metrics.items() for name, metric in named.items()}
        )
        self.canonicalizer_lr = check_positive("model.canonicalizer_lr", canonicalizer_lr, optional=True)
        # share of inputs canonicalized to the identity, per evaluation split (kept apart from ``metrics``,
        # which are the task's own)
        self.identity_rates = nn.ModuleDict({split: MeanMetric() for split in ("val", "test")})
        # the evaluation loss as a metric (sum and count synchronised across DDP processes), so that
        # ``{val,test}/loss`` is the mean over the whole split, not the mean over one process's share
        self.eval_losses = nn.ModuleDict({split: MeanMetric() for split in ("val", "test")})
        self.network = CanonicalizedModel(canonicalizer, predictor)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler

    @property
    def canonicalizer(self) -> Canonicalizer:
        return self.network.canonicalizer

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.network(*inputs)

    # --- the step, written once -------------------------------------------------------------------------

    def split_metrics(self, split: str) -> dict[str, Metric]:
        """``{name: metric}`` of one split."""
        return {key.split("/", 1)[1]: metric for key, metric in self.metrics.items() if key.startswith(f"{split}/")}

    def monitorable_metrics(self) -> frozenset[str]:
        """Every name this task logs in training and validation: what a callback's ``monitor`` (and
        ``optimized_metric``) may name. Training logs its loss per step and per epoch (``train/loss``,
        ``train/loss_step``, ``train/loss_epoch``; the same for ``train/prior_loss``) and its ``train`` metrics;
        validation logs ``val/identity_rate``, ``val/loss`` unless :attr:`log_eval_loss` is off, and its
        ``val`` metrics (a :class:`FigureDict`'s under each of its ``names``)."""
        names = {f"train/{loss}{suffix}" for loss in ("loss", "prior_loss") for suffix in ("", "_step", "_epoch")}
        names.add("val/identity_rate")
        if self.log_eval_loss:
            names.add("val/loss")
        for split in ("train", "val"):
            for name, metric in self.split_metrics(split).items():
                figures = metric.names if isinstance(metric, FigureDict) else (name,)
                names.update(f"{split}/{figure}" for figure in figures)
        return frozenset(names)

    def split_batch(self, batch: Any) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """``(inputs, target)`` of a batch ``(*inputs, target)``."""
        *inputs, target = batch
        return tuple(inputs), target

    def loss(self, output: torch.Tensor, target: torch.Tensor, split: str) -> torch.Tensor:
        """The task's loss for ``split`` (e.g. label smoothing or a regulariser only in training)."""
        raise NotImplementedError

    def update_metrics(self, metrics: Mapping[str, Metric], output: torch.Tensor, target: torch.Tensor,
                       inputs: tuple[torch.Tensor, ...]) -> None:
        """Update the split's metrics with one batch; by default ``metric.update(output, target)``."""
        for metric in metrics.values():
            metric.update(output, target)

    def model_step(self, batch: Any, split: str) -> torch.Tensor:
        inputs, target = self.split_batch(batch)
        output, group_element = self.network.forward_with_element(*inputs)
        loss = self.loss(output, target, split)
        batch_size = len(inputs[0])
        if split == "train":
            prior = self.canonicalizer.prior(group_element).to(loss)
            if self.canonicalizer.prior_weight > 0:
                loss = loss + self.canonicalizer.prior_weight * prior
            self.log("train/prior_loss", prior.detach(), on_step=True, on_epoch=True, batch_size=batch_size,
                     sync_dist=True)
        else:
            identity_rate = self.identity_rates[split]
            identity_rate.update(self.canonicalizer.is_identity(group_element, batch_size).to(loss))
            self.log(f"{split}/identity_rate", identity_rate, on_step=False, on_epoch=True, batch_size=batch_size)
        if split == "train":
            # under DDP the mean over every process's batches (the curve, and what the divergence monitor judges on
            # every rank alike); a no-op in one process
            self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=batch_size,
                     sync_dist=True)
        elif self.log_eval_loss:  # weighted by the batch's size: the mean over the split's samples
            eval_loss = self.eval_losses[split]
            eval_loss.update(loss.detach(), weight=batch_size)
            self.log(f"{split}/loss", eval_loss, on_step=False, on_epoch=True, prog_bar=split != "test",
                     batch_size=batch_size)
        metrics = self.split_metrics(split)
        self.update_metrics(metrics, output, target, inputs)
        for name, metric in metrics.items():
            if not isinstance(metric, FigureDict):  # those are logged at the epoch's end
                self.log(f"{split}/{name}", metric, on_step=False, on_epoch=True, prog_bar=split == "val",
                         batch_size=batch_size)
        return loss

    def log_figures(self, split: str) -> None:
        """Compute, log and reset the split's :class:`FigureDict` metrics (``self.log`` takes one value)."""
        for metric in self.split_metrics(split).values():
            if isinstance(metric, FigureDict):
                values = metric.compute()
                self.log_dict({f"{split}/{name}": value for name, value in values.items()}, prog_bar=split == "val")
                metric.reset()

    def training_step(self, batch, batch_idx):
        loss = self.model_step(batch, "train")
        if not torch.isfinite(loss):  # a diverged run must fail, not train on NaN and report chance as a result
            raise FloatingPointError(
                f"training loss is {loss.item()} at epoch {self.current_epoch}, step {self.global_step}: the run "
                f"diverged. Lower the learning rate (model.optimizer.lr) or clip gradients "
                f"(trainer.gradient_clip_val=1.0).")
        return loss

    def validation_step(self, batch, batch_idx):
        return self.model_step(batch, "val")

    def test_step(self, batch, batch_idx):
        return self.model_step(batch, "test")

    def setup(self, stage: str) -> None:
        # the run's seed (train.py seeds every process with it before the model is built), kept before any
        # per-process reseeding below changes torch.initial_seed()
        self.run_seed = getattr(self, "run_seed", None) or torch.initial_seed()

    def on_train_epoch_start(self) -> None:
        """Under DDP, reseed each process's torch RNG from ``(run seed, epoch, rank)`` at every training epoch.

        Every process starts from the same seed (and, forked, from the same RNG state), so without this the
        processes would draw the same augmentation angles, dropout masks and Gumbel noise for their different
        samples. Seeding from ``(seed, epoch, rank)`` makes the draws differ across processes and stay
        reproducible, including after a resume (runs resume at epoch boundaries, where this reseeds). One
        process: nothing changes (the RNG stream of single-process runs, hence their records, is untouched).
        """
        trainer = self._trainer
        if trainer is None or trainer.world_size < 2:
            return
        state = np.random.SeedSequence([int(self.run_seed), int(self.current_epoch), int(trainer.global_rank)])
        torch.manual_seed(int(state.generate_state(1, dtype=np.uint64)[0] % 2**63))

    def on_validation_epoch_end(self) -> None:
        self.log_figures("val")

    def on_test_epoch_end(self) -> None:
        self.log_figures("test")

    # --- set-up ---------------------------------------------------------------------------------------

    def parameter_counts(self) -> dict[str, int]:
        """Parameter counts for results.json and the loggers (frozen parameters count as parameters)."""

        def count(module: nn.Module, trainable_only: bool = False) -> int:
            return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)

        return {
            "total": count(self.network),
            "trainable": count(self.network, trainable_only=True),
            "canonicalizer": count(self.network.canonicalizer),
            "predictor": count(self.network.predictor),
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store :attr:`run_config` under :data:`~canonical_network.utils.checkpoints.RUN_CONFIG_KEY`
        (``{"version": 1, "config": ...}``); nothing when no run config was given (a module built by hand)."""
        if self.run_config is not None:
            checkpoint[RUN_CONFIG_KEY] = run_config_entry(self.run_config)

    def configure_optimizers(self):
        canonicalizer_ids = {id(p) for p in self.network.canonicalizer.parameters()}
        if self.canonicalizer_lr is None:
            params: Any = [p for p in self.parameters() if p.requires_grad]
        else:
            h = [p for p in self.parameters() if p.requires_grad and id(p) in canonicalizer_ids]
            rest = [p for p in self.parameters() if p.requires_grad and id(p) not in canonicalizer_ids]
            params = [{"params": rest}] + ([{"params": h, "lr": self.canonicalizer_lr}] if h else [])
        optimizer = self.optimizer_factory(params=params)
        if self.scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer=optimizer)}}
