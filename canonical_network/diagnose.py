"""Diagnose a model: ``python -m canonical_network.diagnose experiment=<family>/<row> [ckpt_path=<file>]
[diagnose.num_samples=32] [diagnose.fail_above=1e-4] [overrides]`` (console script ``cn-diagnose``).

Composes ``configs/diagnose.yaml`` (the training config plus its ``diagnose`` section), builds the
experiment's model (``cfg.model``; with ``ckpt_path`` the checkpoint's ``state_dict`` is loaded, strictly, and
pretrained weights files are not read: ``utils.checkpoints.without_pretrained_weights``)
and data module, takes ``diagnose.num_samples`` inputs spread evenly over the test split, and measures
(:mod:`canonical_network.diagnostics`): equivariance of φ under the elements the data represents exactly and
under arbitrary image angles, equivariance of the canonicalizer h alone, the distribution of the poses h
chooses, and continuity under small perturbations. Writes ``diagnostics.json`` and ``figures/*.png`` into its
own run folder (``outputs/diagnose/<date>/<time>_<experiment>/``; its ``code_version`` and ``checkpoint`` as in
``results.json``, :class:`~canonical_network.records.RunResults`), logs the numbers and figures to the
configured loggers (W&B offline by default; ``logger=none`` for none), and prints a summary table.

Exit status 0, or 1 when ``diagnose.fail_above`` is set and ``equivariance.exact.max_rel`` exceeds it.

Numerics: the model and the inputs are cast to ``diagnose.dtype``, float64 by default (``model.to(float64)``
after loading the weights): an exactly equivariant model then shows relative errors of ~1e-16..1e-12 (its
rounding), far below any threshold worth setting, while a model that is not equivariant is off by O(1e-2..1).
In float32 rounding alone reaches ~1e-6..1e-4 for the deeper models, and an argmax whose two best scores
are within float32 rounding may flip.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Subset

from canonical_network.diagnostics.figures import canonical_pairs, pose_histogram
from canonical_network.diagnostics.measures import diagnose
from canonical_network.diagnostics.summary import failed, flat_metrics, summary_table
from canonical_network.diagnostics.symmetries import GROUP_CHOICES, symmetry_for
from canonical_network.records import DIAGNOSIS_FORMAT, path_for_record
from canonical_network.utils import checkpoints
from canonical_network.utils.checks import ConfigError, check_choice, check_int, check_number
from canonical_network.utils.config import CONFIG_DIR
from canonical_network.utils.runs import (
    code_version,
    command_overrides,
    environment,
    instantiate_loggers,
    prepare_process,
    save_hydra_record,
)
from canonical_network.utils.trust import build, check_buildable, granted

log = logging.getLogger("canonical_network.diagnose")

DTYPES = {"float64": torch.float64, "float32": torch.float32}
DEVICES = ("auto", "cpu", "cuda")
RESULTS_FILE = "diagnostics.json"


def load_weights(model: torch.nn.Module, ckpt_path: str, experiment: str) -> None:
    """Load the checkpoint's ``state_dict`` into ``model``, strictly (``utils.checkpoints.load_weights``);
    errors name the experiment and the overrides the checkpoint must have been trained with."""
    mismatch = (f"the model of experiment={experiment} with these overrides ({type(model.canonicalizer).__name__}"
                f" + {type(model.network.predictor).__name__}); give the experiment and overrides it was trained with")
    checkpoints.load_weights(model, checkpoints.load_checkpoint(ckpt_path), ckpt_path, mismatch)


def select_inputs(datamodule, model, num_samples: int) -> tuple[tuple[torch.Tensor, ...], list[int]]:
    """``num_samples`` inputs of the test split at evenly spaced indices (test splits are often ordered,
    e.g. every view of one digit in a row), as the task's model takes them, and their indices."""
    datamodule.prepare_data()
    datamodule.setup("test")
    loader = datamodule.test_dataloader()
    dataset = loader.dataset
    count = min(num_samples, len(dataset))
    indices = torch.linspace(0, len(dataset) - 1, count).round().long().unique().tolist()
    batch = next(iter(DataLoader(Subset(dataset, indices), batch_size=len(indices), collate_fn=loader.collate_fn)))
    inputs, _ = model.split_batch(batch)
    return tuple(inputs), indices


@contextmanager
def in_dtype(model: torch.nn.Module, inputs: tuple, dtype: torch.dtype, device):
    """Yield ``(model, inputs, note)``: the model and the floating-point inputs in ``dtype``, and a note on it
    for ``diagnostics.json``; the model is cast back to its own dtype on exit.

    * Some layers build float32 tensors whatever their module's dtype (escnn's G-CNN predictor does): such a
      model is diagnosed in float32 instead of failing, with a warning, and the note says so.
    * Casting back matters: escnn shares its basis-expansion modules between all the models of a process
      built on the same basis, so casting one model to float64 casts the others' too.
    """
    def cast(target: torch.dtype) -> tuple:
        return tuple(x.to(device=device, dtype=target) if x.is_floating_point() else x.to(device) for x in inputs)

    own = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    note = "model and inputs cast to this dtype for every measure"
    try:
        model.to(dtype)
        try:
            with torch.no_grad():
                model(*cast(dtype))
        except RuntimeError as error:
            if dtype == torch.float32 or ("dtype" not in str(error) and "Double" not in str(error)):
                raise
            log.warning("The model does not run in %s (%s); diagnosing it in float32.", dtype, error)
            dtype, note = torch.float32, (f"requested float64 but the model does not run in it ({error}); float32 "
                                          "instead: rounding alone then reaches ~1e-6..1e-4 relative")
            model.float()
        yield model, cast(dtype), note
    finally:
        model.to(own)


def _settings(cfg: DictConfig) -> DictConfig:
    """``cfg.diagnose``, checked (errors name the full key)."""
    settings = cfg.diagnose
    check_int("diagnose.num_samples", settings.num_samples, low=1)
    check_int("diagnose.num_elements", settings.num_elements, low=1)
    check_int("diagnose.pose_bins", settings.pose_bins, low=1)
    check_int("diagnose.num_figure_examples", settings.num_figure_examples, low=1)
    check_int("diagnose.seed", settings.seed, low=0)
    check_choice("diagnose.group", settings.group, GROUP_CHOICES)
    check_choice("diagnose.dtype", settings.dtype, list(DTYPES))
    check_choice("diagnose.device", settings.device, DEVICES)
    check_number("diagnose.fail_above", settings.fail_above, low=0, optional=True)
    check_number("diagnose.margin", settings.margin, low=0)
    check_number("diagnose.jump", settings.jump, low=0, low_inclusive=False)
    check_number("diagnose.rotation_deg", settings.rotation_deg, low=0, low_inclusive=False)
    check_number("diagnose.jitter", settings.jitter, low=0, low_inclusive=False)
    return settings


def run(cfg: DictConfig) -> dict:
    """Diagnose the configured model; write ``diagnostics.json`` and figures; return the results.

    Every node of the config passes the trust boundary first (``utils/trust.py``). The output folder must be one
    of its own (:func:`check_output_folder`): a diagnosis never writes into a run's folder."""
    with granted(cfg.get("trusted_targets")):
        check_buildable(cfg, "the diagnosis's config")
        return _run(cfg)


def check_output_folder(output_dir: Path) -> None:
    """Refuse an output folder that holds another command's record: a run's ``results.json``, ``checkpoints/``
    or ``.hydra/``, or an earlier diagnosis (its ``diagnostics.json``). A finished run folder is never written
    again: ``hydra.run.dir=<a run>`` would replace its ``.hydra/`` files; a diagnosis goes into a folder of its
    own (``scripts/diagnose_runs.py`` uses a new ``<run>/diagnose-<k>/`` beside the run's files)."""
    from canonical_network.records import RESULTS_FILE as RUN_RECORD

    taken = [name for name in (RUN_RECORD, "checkpoints", ".hydra", RESULTS_FILE) if (output_dir / name).exists()]
    if taken:
        raise ConfigError(
            f"hydra.run.dir={output_dir} already holds {', '.join(taken)} (another command's folder): a diagnosis "
            "writes into a folder of its own and never into a run's; leave hydra.run.dir to its default, or give a "
            "new folder")


def _run(cfg: DictConfig) -> dict:
    settings = _settings(cfg)
    output_dir = Path(cfg.paths.output_dir)
    check_output_folder(output_dir)
    save_hydra_record(cfg, output_dir)
    prepare_process(cfg, output_dir)
    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # building from the config: a failure here is a config error
        datamodule = build(cfg.data, "data")
        # with a checkpoint, its state dict sets every weight: pretrained weights files are not read
        model = build(checkpoints.without_pretrained_weights(cfg.model) if cfg.get("ckpt_path") else cfg.model,
                      "model")
    except Exception as error:
        raise ConfigError(str(error)) from error
    if cfg.get("ckpt_path"):
        load_weights(model, cfg.ckpt_path, cfg.get("experiment_name"))
    model = model.to(device=device).eval()
    inputs, indices = select_inputs(datamodule, model, settings.num_samples)
    symmetry = symmetry_for(model, datamodule, group=settings.group, num_elements=settings.num_elements,
                            rotation_deg=settings.rotation_deg, jitter=settings.jitter)
    with in_dtype(model, inputs, DTYPES[settings.dtype], device) as (model, inputs, dtype_note):
        diagnosis = diagnose(model, symmetry, inputs, seed=settings.seed, margin=settings.margin,
                             jump=settings.jump, pose_bins=settings.pose_bins)
        if settings.figures:
            figures = [canonical_pairs(model, symmetry, diagnosis, output_dir / "figures" / "canonical_pairs.png",
                                       settings.num_figure_examples)]
            if diagnosis.results["pose"] is not None:
                figures.append(pose_histogram(diagnosis.results["pose"], output_dir / "figures" / "pose.png"))
    results = {
        "format": DIAGNOSIS_FORMAT,
        "experiment": cfg.get("experiment_name"),
        "checkpoint": path_for_record(cfg.ckpt_path) if cfg.get("ckpt_path") else None,
        "family": symmetry.family,
        "model": {"task": type(model).__name__, "canonicalizer": type(model.canonicalizer).__name__,
                  "group": model.canonicalizer.group_name, "predictor": type(model.network.predictor).__name__},
        "inputs": {"split": "test", "num_samples": len(indices), "indices": indices},
        "numerics": {"dtype": str(inputs[0].dtype).removeprefix("torch."), "device": str(device),
                     "note": dtype_note},
        "symmetry": symmetry.describe(),
        **diagnosis.results,
        "fail_above": settings.fail_above,
        "figures": [],
        "overrides": command_overrides(),
        "seed": cfg.seed,
        "environment": environment(),
        "code_version": code_version(),
    }
    results["failed"] = failed(results, settings.fail_above)
    if settings.figures:
        results["figures"] = [str(p.relative_to(output_dir)) for p in figures]
    from canonical_network.utils.files import atomic_write_text

    # whole or not at all: a reader (the report, a collect) never sees half a file
    atomic_write_text(output_dir / RESULTS_FILE, json.dumps(results, indent=2, ensure_ascii=False))
    _log_to_loggers(cfg, output_dir, results)
    log.info("%s\nWritten: %s", summary_table(results), output_dir / RESULTS_FILE)
    return results


def _log_to_loggers(cfg: DictConfig, output_dir: Path, results: dict) -> None:
    """The numbers (``diagnose/...``) to every configured logger, the figures to W&B."""
    from lightning.pytorch.loggers import WandbLogger

    loggers = instantiate_loggers(cfg, output_dir)
    metrics = flat_metrics(results)
    for logger in loggers:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        logger.log_metrics(metrics)
        if isinstance(logger, WandbLogger):
            for figure in results["figures"]:
                logger.log_image(key=f"diagnose/{Path(figure).stem}", images=[str(output_dir / figure)])
        logger.finalize("success")


def main() -> None:
    """The command line (console script ``cn-diagnose``): experiment names and override keys are checked before
    Hydra composes (one line and exit status 2 for a mistake, with the closest valid names)."""
    import sys

    from canonical_network.utils.config import (
        check_experiment_names,
        check_output_writable,
        check_override_keys,
    )

    check_experiment_names(sys.argv[1:], "canonical_network.diagnose")
    check_override_keys(sys.argv[1:], "diagnose", "canonical_network.diagnose")
    check_output_writable(sys.argv[1:], "canonical_network.diagnose")
    _main()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="diagnose")
def _main(cfg: DictConfig) -> None:
    from canonical_network.data.errors import DataFilesError
    from canonical_network.utils.runs import is_multirun, refuse

    try:
        results = run(cfg)
    except (ConfigError, DataFilesError) as error:
        if is_multirun():
            raise
        refuse("canonical_network.diagnose", error)  # one line, exit status 2
    if results["failed"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
