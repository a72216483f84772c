"""Test a trained checkpoint again: ``python -m canonical_network.evaluate ckpt_path=<file> [overrides]``.

The model is rebuilt from the run config the checkpoint carries (``canonical_network/utils/checkpoints.py``),
not from the configs as they are now nor from the run folder, and its weights are loaded strictly. The
user's overrides are applied to that config; they may change the data (``data=<option>`` with the same
``data_info`` sizes, ``data.rotation=so3/so3``, ``data.batch_size=64``), the task's evaluation options
(``model.orbit_rotations=8`` for images), ``seed``, ``trainer=gpu``, ``logger=csv``, paths and Hydra's
settings, but never the network: an override of ``canonicalization.*``, ``prediction.*``, ``data_info.*``
or another ``model.*`` key fails before anything is created, naming the key and what may be overridden.
The exceptions add no weights: the canonicalizer's symmetrization keys (``canonicalization.symmetrization``,
``frame_size``, ``frame_temperature``, ``frame_weights``; docs/symmetrization.md), e.g.
``canonicalization.symmetrization=weighted_frame canonicalization.frame_size=2`` to average a checkpoint
trained canonically over its two best poses at test time (a mode the canonicalizer cannot build fails with
the canonicalizer's own error), and ``canonicalization=tta`` (test-time canonicalization, with its own
``canonicalization.<key>`` options) in front of a checkpoint whose canonicalizer is the identity.

Then ``trainer.test`` runs, logging to the same loggers as training (W&B offline and CSV by default), and
``<run dir>/results.json`` is written in the evaluation's own folder
(``outputs/evaluate/<date>/<time>_<experiment>/``) with the record of ``train``
(:class:`~canonical_network.records.RunResults`), ``"status": "evaluated"`` and ``"checkpoint"`` the file
read. ``tables`` and ``report`` leave such records out (:func:`canonical_network.records.load_runs`).

The checkpoint may come from another machine or checkout: its data paths under the training run's
``paths.data_dir`` follow this command's ``paths.data_dir``, and its data is downloaded only when the command
line asks (``data.download=true``, ``data.generate_if_missing=true``), never because the stored config said so
(:func:`register_run_config`).
Pretrained weights a component loaded when the run started (``prediction.weights=IMAGENET1K_V1``) are not read
again: the checkpoint's state dict holds every weight (:func:`~canonical_network.utils.checkpoints.without_pretrained_weights`).

A refused evaluation (a :class:`ConfigError`) prints one line, ``canonical_network.evaluate: error: <message>``,
and exits with status 2; in a multirun the job fails as any job does.

From Python: ``evaluate(compose_evaluation(ckpt_path, overrides, output_dir))`` returns the record written.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from canonical_network.records import EVALUATED, EVALUATED_CHECKPOINT_KEY, RESULTS_FILE, RunResults
from canonical_network.utils.checkpoints import (
    check_architecture_unchanged,
    check_overrides,
    load_checkpoint,
    load_weights,
    require_run_config,
    use_symmetrization,
    use_training_free_canonicalizer,
    without_pretrained_weights,
)
from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import CONFIG_DIR
from canonical_network.utils.run_config import validate_run_config
from canonical_network.utils.runs import (
    build_trainer,
    building_error,
    code_version,
    finish,
    instantiate_callbacks,
    instantiate_loggers,
    is_multirun,
    logged_test_metrics,
    no_test_metric,
    prepare_process,
    refuse,
    remove_unused_run_folder,
    run_record,
    save_hydra_record,
)
from canonical_network.utils.trust import build, check_buildable, granted, targets_named_by

log = logging.getLogger("canonical_network.evaluate")

#: Name of the options under which the checkpoint's run config is registered (configs/evaluate.yaml).
FROM_CHECKPOINT = "from_checkpoint"
#: Keys of the stored run config that an evaluation takes from its own config instead: its loggers, paths
#: and callbacks (the run's would write into the training run's folder), the options of fitting, and the trust
#: the user gives (``trusted_targets``: the evaluation's command line names it, never the file).
NOT_REUSED = ("logger", "callbacks", "paths", "hydra", "ckpt_path", "resume", "test", "test_ckpt", "trusted_targets")
#: Keys of the stored run config registered as options of their own group, so that ``data=<option>`` and
#: ``trainer=<option>`` replace them whole instead of merging into them.
GROUPS = {"data": ("data", "data_info"), "trainer": ("trainer",)}
#: The command's name in its one-line refusals (exit status 2, as argparse's: utils/runs.py ``refuse``).
COMMAND = "canonical_network.evaluate"
_FOLDER_TAKEN = (f"{{folder}} already holds a {RESULTS_FILE} or a training run's checkpoints/ (another run's "
                 "folder): an evaluation writes into a folder of its own; leave hydra.run.dir to its default, or "
                 "give a new folder")


def _folder_taken(folder: Path | str) -> bool:
    """Whether ``folder`` belongs to another run: a record, or the checkpoints of a (maybe unfinished) training."""
    return (Path(folder) / RESULTS_FILE).exists() or (Path(folder) / "checkpoints").exists()


#: Keys of a data config that make the data module write into its data folder when files are missing.
DATA_WRITING_KEYS = ("download", "generate_if_missing")


def data_for_this_machine(data: Any, stored_paths: Any) -> Any:
    """The checkpoint's ``data`` section as this machine reads it: every string under the training run's
    ``paths.data_dir`` (``/home/them/canonical_network/data/rotated_mnist``) becomes the same place under this
    command's (``${paths.data_dir}/rotated_mnist``), and the switches that make a data module write into its
    folder (:data:`DATA_WRITING_KEYS`: ``download``, ``generate_if_missing``) are false: the command line may
    set them again, but a file read from disk never decides that something is downloaded or generated, nor
    where (a data folder the run named outside its ``paths.data_dir`` is only read)."""
    root = str((stored_paths or {}).get("data_dir") or "").rstrip("/")

    def moved(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: moved(item) for key, item in value.items()}
        if isinstance(value, list):
            return [moved(item) for item in value]
        if root and isinstance(value, str) and (value == root or value.startswith(root + "/")):
            return "${paths.data_dir}" + value[len(root):]
        return value

    if not isinstance(data, dict):
        return data or {}
    data = moved(data)
    for key in DATA_WRITING_KEYS:
        if key in data:
            data[key] = False
    return data


def register_run_config(stored: dict[str, Any]) -> None:
    """Make the checkpoint's run config composable: ``checkpoint_run`` (its own keys), ``data/from_checkpoint``
    (``data`` as :func:`data_for_this_machine` reads it, and ``data_info``, global package) and
    ``trainer/from_checkpoint``, as configs/evaluate.yaml expects. Registering again (another checkpoint in the
    same process) replaces them."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    grouped = {key for keys in GROUPS.values() for key in keys}
    store.store(name="checkpoint_run", node={k: v for k, v in stored.items()
                                             if k not in NOT_REUSED and k not in grouped})
    data = {key: stored.get(key) or {} for key in GROUPS["data"]}
    data["data"] = data_for_this_machine(data["data"], stored.get("paths"))
    store.store(group="data", name=FROM_CHECKPOINT, package="_global_", node=data)
    store.store(group="trainer", name=FROM_CHECKPOINT, node=stored.get("trainer") or {})


def prepare(ckpt_path: str | Path, overrides: list[str]) -> dict[str, Any]:
    """Read the run config of ``ckpt_path`` through the trust boundary (plain data, only the package's components
    and those the command line names: ``trusted_targets=[...]``), check ``overrides`` against it, and register it
    for composing; returns it. Nothing is created: a missing file, a checkpoint without a run config, a config
    that is not plain data or would build anything else, or a refused override fails here."""
    path = Path(ckpt_path)
    with granted(targets_named_by(overrides)):
        stored = require_run_config(load_checkpoint(path), path)
        check_overrides(overrides, stored)
    register_run_config(stored)
    return stored


def _quoted(value: str) -> str:
    """``value`` as a Hydra override value (a path may hold characters of the override grammar)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def compose_evaluation(ckpt_path: str | Path, overrides: list[str] | tuple[str, ...] = (),
                       output_dir: str | Path | None = None) -> DictConfig:
    """The config that ``python -m canonical_network.evaluate ckpt_path=<ckpt_path> <overrides>`` runs,
    with the run folder set to ``output_dir`` (required to run it outside ``@hydra.main``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    overrides = list(overrides)
    prepare(ckpt_path, overrides)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[f"ckpt_path={_quoted(str(ckpt_path))}", *overrides])
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir)
    return cfg


def evaluate(cfg: DictConfig) -> RunResults:
    """Test the checkpoint ``cfg.ckpt_path`` under the composed evaluation config ``cfg`` and write
    ``results.json`` into ``cfg.paths.output_dir``; returns the record written.

    Everything that can fail on the config (the checkpoint, the trust boundary, the architecture check, building
    the data, model, loggers and trainer) fails with a :class:`ConfigError` before the test loop.
    """
    with granted(cfg.get("trusted_targets")):
        return _evaluate(cfg)


def _evaluate(cfg: DictConfig) -> RunResults:
    start = time.time()
    path = Path(cfg.ckpt_path).resolve()
    output_dir = Path(cfg.paths.output_dir)
    try:
        checkpoint = load_checkpoint(path)
        stored = require_run_config(checkpoint, path)
    except (OSError, ValueError) as error:
        raise ConfigError(str(error)) from error
    # the composed config, every node of it (the checkpoint's, and whatever composing added), before any
    # component is imported
    check_buildable(cfg, f"the evaluation of {path}")
    validate_run_config(cfg, tuple(stored))  # first: a data set of another task is named as such
    use_training_free_canonicalizer(cfg)  # canonicalization=tta: the task's canonicalizer becomes it
    use_symmetrization(cfg)  # canonicalization.symmetrization=...: the task's canonicalizer takes it
    check_architecture_unchanged(stored, cfg)
    if _folder_taken(output_dir):
        raise ConfigError(_FOLDER_TAKEN.format(folder=output_dir))
    save_hydra_record(cfg, output_dir)  # admitted: now the folder may be written
    prepare_process(cfg, output_dir)
    config = OmegaConf.to_container(cfg, resolve=True)

    try:  # building from the config: a failure here is a config error, found before testing
        datamodule = build(cfg.data, "data")
        model = build(without_pretrained_weights(cfg.model), "model")  # its weights: the checkpoint's
        load_weights(model, checkpoint, path)
        loggers = instantiate_loggers(cfg, output_dir, job_type="evaluate")
        trainer = build_trainer(cfg, output_dir, instantiate_callbacks(cfg), loggers)
    except Exception as error:
        raise ConfigError(building_error(error)) from error
    del checkpoint  # the optimiser state and the rest are not needed for testing
    param_counts = model.parameter_counts() if hasattr(model, "parameter_counts") else {}
    for lg in loggers:
        lg.log_hyperparams({**config, "params": param_counts, EVALUATED_CHECKPOINT_KEY: str(path),
                            "code_version": code_version()})
    log.info("Evaluating %s (%s); parameters: %s", path, cfg.get("experiment_name"), param_counts)

    trainer.test(model, datamodule=datamodule)
    metrics = logged_test_metrics(trainer)
    if not metrics:  # an empty test split: no record that looks like a result
        raise RuntimeError(f"{path}: {no_test_metric(trainer)}; no results.json written")
    results = run_record(cfg, config, status=EVALUATED, metrics=metrics,
                         params=param_counts, checkpoint=str(path), trainer=trainer, started=start,
                         output_dir=output_dir)
    finish(results, output_dir, trainer, loggers, log)
    return results


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
def _evaluate_main(cfg: DictConfig) -> None:
    from canonical_network.data.errors import DataFilesError

    try:
        evaluate(cfg)
    except (ConfigError, DataFilesError) as error:
        remove_unused_run_folder(Path(cfg.paths.output_dir))  # a refused evaluation leaves no folder behind
        if is_multirun():
            raise  # the job fails as a job does; the sweep reports it
        refuse(COMMAND, error)  # one line, no traceback


def _command_line(arguments: list[str]) -> tuple[str, list[str]]:
    """``(ckpt_path, overrides)`` of a command line, parsed as Hydra parses it."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = get_args_parser().parse_args(arguments).overrides or []
    parsed = OverridesParser.create().parse_overrides(overrides)
    given = [o for o in parsed if o.key_or_group == "ckpt_path" and not o.is_delete()]
    if not given:
        raise ConfigError("ckpt_path is required: python -m canonical_network.evaluate ckpt_path=<checkpoint file> "
                          "[overrides], the file a `python -m canonical_network.train` run wrote (e.g. "
                          "outputs/runs/<date>/<time>_<experiment>/checkpoints/last.ckpt)")
    if len(given) > 1 or given[0].is_sweep_override():
        raise ConfigError("ckpt_path takes one checkpoint per command (a multirun may sweep evaluation options, "
                          "not checkpoints): run the command once per checkpoint")
    # Hydra writes .hydra/ into the run folder before the evaluation starts: never into another run's
    run_dir = next((str(o.value()) for o in parsed if o.key_or_group == "hydra.run.dir"), None)
    if run_dir and _folder_taken(run_dir):
        raise ConfigError(_FOLDER_TAKEN.format(folder=run_dir))
    return str(given[0].value()), overrides


def main() -> None:
    """The command line (console script ``cn-evaluate``): the checkpoint's run config is read and the
    overrides are checked before Hydra composes the config and creates the run folder."""
    from canonical_network.utils.config import check_output_writable

    try:
        ckpt_path, overrides = _command_line(sys.argv[1:])
        check_output_writable(sys.argv[1:], COMMAND)
        prepare(ckpt_path, overrides)
    except (ConfigError, OSError, ValueError) as error:
        refuse(COMMAND, error)
    _evaluate_main()


if __name__ == "__main__":
    main()
