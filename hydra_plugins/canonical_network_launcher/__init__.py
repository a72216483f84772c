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

import logging
import os
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher

from canonical_network.utils.checks import check_int

log = logging.getLogger(__name__)


def terminate_children(sig: int = signal.SIGTERM) -> list[int]:
    """Send ``sig`` to every direct child process of this one (submitit's local jobs); returns their pids.

    Read from ``/proc`` (Linux, where the local launcher runs jobs); elsewhere nothing is found.
    """
    me, children = os.getpid(), []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                # "pid (comm) state ppid ...": comm may hold spaces, so split after its closing parenthesis
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            children.append(int(entry))
    for pid in children:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return children


class BoundedLocalLauncher(LocalLauncher):
    """Args: ``max_jobs`` (null: ``os.cpu_count()``), then those of hydra-submitit-launcher's local launcher."""

    def __init__(self, max_jobs: int | None = None, **params: Any) -> None:
        check_int("hydra.launcher.max_jobs", max_jobs, low=1, optional=True)
        super().__init__(**params)
        self.max_jobs = max_jobs or os.cpu_count() or 1

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Run the jobs, ``max_jobs`` at a time. Stopping the launcher (Ctrl-C, SIGINT or SIGTERM sent to its
        process) stops its jobs too: each running job gets SIGTERM (a training run saves its checkpoint and
        exits, to be resumed by rerunning the sweep in the same folder) and no further job starts."""
        stop = threading.Event()

        # One submitit job per call of the parent's launch; each call blocks until its job ends, so a pool
        # of max_jobs threads keeps at most max_jobs jobs running.
        def one(index: int) -> JobReturn:
            if stop.is_set():
                raise RuntimeError(f"job {initial_job_idx + index} not started: the multirun was stopped")
            return super(BoundedLocalLauncher, self).launch([job_overrides[index]], initial_job_idx + index)[0]

        def interrupt(signum, frame):
            raise KeyboardInterrupt(signal.Signals(signum).name)

        previous = signal.signal(signal.SIGTERM, interrupt)
        pool = ThreadPoolExecutor(max_workers=min(self.max_jobs, len(job_overrides)))
        try:
            return list(pool.map(one, range(len(job_overrides))))
        except KeyboardInterrupt:
            stop.set()
            stopped = terminate_children()
            log.warning("multirun stopped: SIGTERM sent to its %d running job(s) (processes %s); rerun the same "
                        "command with hydra.sweep.dir=%s skip_finished=true to resume them (finished jobs are "
                        "kept as they are)", len(stopped), stopped,
                        self.config.hydra.sweep.dir if self.config is not None else "<the sweep folder>")
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            signal.signal(signal.SIGTERM, previous)


class SacctFallbackSlurmLauncher(SlurmLauncher):
    """hydra-submitit-launcher's ``SlurmLauncher``, with the ``scontrol`` fallback for job states installed."""

    def __init__(self, **params: Any) -> None:
        from canonical_network.utils.slurm import install_sacct_fallback

        install_sacct_fallback()
        super().__init__(**params)
