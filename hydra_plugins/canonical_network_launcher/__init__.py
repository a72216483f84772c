"""The project's two launchers (``hydra/launcher=local`` and ``hydra/launcher=slurm``).

``hydra/launcher=local``: submitit's local executor, with at most ``max_jobs`` jobs running at once.

hydra-submitit-launcher's ``LocalLauncher`` hands every job of a sweep to submitit at once, and submitit's
local executor starts them all: an 18-job table on a 2-core machine is 18 training processes (16 GB
resident here). :class:`BoundedLocalLauncher` keeps the same code path (each job is a submitit local job,
as on Slurm) but runs them as a rolling pool: ``max_jobs`` at a time (default: the machine's cores), the
next one starting when one ends, results returned in job order.

``hydra/launcher=slurm``: hydra-submitit-launcher's Slurm launcher that first makes submitit see job states
through ``scontrol`` on clusters without accounting (:func:`canonical_network.utils.slurm.install_sacct_fallback`);
installed here, where Slurm is chosen, so importing the package patches nothing.

Both live in the ``hydra_plugins`` namespace because Hydra instantiates launchers from there only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher

from canonical_network.utils.checks import check_int


class BoundedLocalLauncher(LocalLauncher):
    """Args: ``max_jobs`` (null: ``os.cpu_count()``), then those of hydra-submitit-launcher's local launcher."""

    def __init__(self, max_jobs: int | None = None, **params: Any) -> None:
        check_int("hydra.launcher.max_jobs", max_jobs, low=1, optional=True)
        super().__init__(**params)
        self.max_jobs = max_jobs or os.cpu_count() or 1

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        # One submitit job per call of the parent's launch; each call blocks until its job ends, so a pool
        # of max_jobs threads keeps at most max_jobs jobs running.
        def one(index: int) -> JobReturn:
            return super(BoundedLocalLauncher, self).launch([job_overrides[index]], initial_job_idx + index)[0]

        with ThreadPoolExecutor(max_workers=min(self.max_jobs, len(job_overrides))) as pool:
            return list(pool.map(one, range(len(job_overrides))))


class SacctFallbackSlurmLauncher(SlurmLauncher):
    """hydra-submitit-launcher's ``SlurmLauncher``, with the ``scontrol`` fallback for job states installed."""

    def __init__(self, **params: Any) -> None:
        from canonical_network.utils.slurm import install_sacct_fallback

        install_sacct_fallback()
        super().__init__(**params)
