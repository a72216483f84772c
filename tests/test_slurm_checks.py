"""What a Slurm job's trainer must match (no cluster needed): the Slurm launcher sizes the job from the trainer
config, and inside a job a trainer that does not match its tasks is refused with one message naming both sides
(``canonical_network.utils.slurm.check_trainer_for_slurm_tasks``). The jobs themselves: tests/test_slurm.py."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from canonical_network.utils.slurm import check_trainer_for_slurm_tasks


def _job(tasks_per_node: int, nodes: int = 1) -> dict[str, str]:
    """The variables srun gives each task of ``sbatch --nodes=<nodes> --ntasks-per-node=<tasks_per_node>``."""
    return {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": str(tasks_per_node * nodes),
            "SLURM_NTASKS_PER_NODE": str(tasks_per_node), "SLURM_NNODES": str(nodes), "SLURM_PROCID": "0"}


def _trainer(**keys):
    return OmegaConf.create({"accelerator": "cpu", "strategy": "ddp", "devices": 2, "num_nodes": 1, **keys})


@pytest.mark.parametrize(("trainer", "job"), [
    (_trainer(), _job(2)),                                              # trainer=ddp_cpu_slurm
    (_trainer(accelerator="gpu", devices=4, num_nodes=2), _job(4, 2)),  # trainer=ddp, 2 nodes x 4 GPUs
    (_trainer(strategy="auto", devices=1), _job(1)),                    # trainer=cpu, one task
])
def test_a_trainer_matching_its_job_passes(trainer, job):
    check_trainer_for_slurm_tasks(trainer, job)


def test_outside_slurm_and_in_interactive_allocations_nothing_is_checked():
    check_trainer_for_slurm_tasks(_trainer(devices=8, strategy="ddp_fork"), {})
    check_trainer_for_slurm_tasks(_trainer(devices=8), {**_job(2), "SLURM_JOB_NAME": "bash"})


def test_devices_not_equal_to_tasks_per_node_names_both():
    with pytest.raises(ValueError, match=r"trainer.devices=2 but Slurm job 42 runs 1 task\(s\) per node "
                                         r"\(hydra.launcher.tasks_per_node, SLURM_NTASKS_PER_NODE=1\)"):
        check_trainer_for_slurm_tasks(_trainer(), _job(1))
    with pytest.raises(ValueError, match=r"trainer.devices='auto' but .* SLURM_NTASKS_PER_NODE=2"):
        check_trainer_for_slurm_tasks(_trainer(devices="auto"), _job(2))


def test_num_nodes_not_equal_to_the_job_nodes_names_both():
    with pytest.raises(ValueError, match=r"trainer.num_nodes=1 but Slurm job 42 runs on 2 node\(s\) "
                                         r"\(hydra.launcher.nodes, SLURM_NNODES=2\)"):
        check_trainer_for_slurm_tasks(_trainer(), _job(2, nodes=2))


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_spawn", "ddp_notebook"])
def test_a_strategy_that_starts_processes_is_refused_in_a_multi_task_job(strategy):
    with pytest.raises(ValueError, match=rf"trainer.strategy='{strategy}' starts its own processes, but srun already "
                                         r"started the 2 tasks of Slurm job 42 .*trainer=ddp_cpu_slurm"):
        check_trainer_for_slurm_tasks(_trainer(strategy=strategy), _job(2))


def test_tasks_without_tasks_per_node_are_refused():
    job = {k: v for k, v in _job(2).items() if k != "SLURM_NTASKS_PER_NODE"}
    with pytest.raises(ValueError, match=r"SLURM_NTASKS=2 tasks without --ntasks-per-node"):
        check_trainer_for_slurm_tasks(_trainer(), job)


@pytest.mark.parametrize(("overrides", "tasks", "nodes", "gpus"), [
    (["trainer=ddp_cpu_slurm"], 2, 1, None),
    (["trainer=ddp_cpu_slurm", "trainer.devices=4"], 4, 1, None),
    (["trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"], 4, 2, 4),
])
def test_the_slurm_launcher_sizes_multi_task_jobs_from_the_trainer(overrides, tasks, nodes, gpus):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from canonical_network.utils.config import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert (launcher.tasks_per_node, launcher.nodes, launcher.gpus_per_node) == (tasks, nodes, gpus)
    assert cfg.trainer.strategy == "ddp"
    # stale rank variables of the submitting shell are dropped before srun starts the tasks
    assert any(line.startswith("unset RANK LOCAL_RANK") for line in launcher.setup)
