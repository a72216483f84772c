"""``compile=true``: train and test a run's network through ``torch.compile``, loading no code but what the process made.

Why: the N-body rows are small graphs (5 particles, batches of 100) whose steps are dominated by the cost of
launching many small operators, not by arithmetic; Inductor fuses them (``docs/measurements.md``, "Compiled
N-body epochs", measures the speed-up and checks the numbers against eager runs). The first epoch pays the
compilation (tens of seconds on a CPU), so it pays off on long runs only.

Safety: Inductor writes the code it generates (C++ or Triton sources and the shared libraries built from
them) to a cache directory and loads it from there; by default that is ``/tmp/torchinductor_<user>``, which
outlives the process and which any earlier process may have filled. Here each process gets a fresh, empty
directory of its own inside the run folder (created with ``mkdtemp``: mode 0700, a name no one chose in
advance), so the only code loaded is the code this process just generated, nothing is written outside the
run folder, and the directory is removed when the run ends. Every process compiles afresh, a resumed run
included.

The compiled module keeps its parameter names (the module is compiled in place, not wrapped), so checkpoints of
a compiled run load into an eager model and the other way round, and ``evaluate`` (which runs eagerly) reads
them unchanged. After the block the module is eager again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from canonical_network.utils.checks import check_bool

#: the cache locations of Inductor (CPU and GPU code) and Triton (GPU kernels); each is pointed into the
#: process's own directory while the run lasts, then restored
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
#: prefix of the per-process directory inside the run folder
SCRATCH_PREFIX = ".compile-"


@contextmanager
def compiled_network(network: nn.Module, output_dir: Path, enabled: bool) -> Iterator[Path | None]:
    """Compile ``network`` in place for the duration of the block when ``enabled``; yields the fresh cache
    directory (``None`` when not enabled, and then nothing happens). A
    :class:`~canonical_network.canonicalization.base.CanonicalizedModel` has its ``forward_with_element``
    compiled (the method the tasks' steps call, canonicalizer and predictor in one graph), any other module
    its ``__call__``.

    Args:
        network: the module to compile (the task's ``network``: canonicalizer and predictor).
        output_dir: the run folder, which must exist; the cache directory is made inside it.
        enabled: the run's ``compile`` setting (a bool).
    """
    if not check_bool("compile", enabled):
        yield None
        return
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=output_dir))
    saved = {name: os.environ.get(name) for name in CACHE_VARIABLES}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(scratch / "triton")
    # A task calls ``network.forward_with_element`` (CanonicalizedModel), not ``network(...)``: that method is
    # what is compiled (``forward`` calls it too), as an attribute of this instance, removed at the end.
    # Any other module is compiled through its ``__call__`` (``nn.Module.compile``).
    method = getattr(network, "forward_with_element", None)
    # Random operators (dropout, Gumbel noise, sampled frames) draw from torch's generator, not from Inductor's
    # own (fallback_random): their draws follow the RNG state that checkpoints save and resumes restore. They
    # are not the eager run's draws (the compiled graph decomposes e.g. ``bernoulli_`` into other calls).
    import torch._inductor.config as inductor_config

    patch = inductor_config.patch(fallback_random=True)
    patch.__enter__()
    try:
        if method is not None:
            network.__dict__["forward_with_element"] = _explained(torch.compile(method), network)
        else:
            network.compile()
        yield scratch
    finally:
        patch.__exit__(None, None, None)
        network.__dict__.pop("forward_with_element", None)
        network._compiled_call_impl = None
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(scratch, ignore_errors=True)


def _explained(compiled, network: nn.Module):
    """``compiled`` whose compiler failures (TorchDynamo cannot trace some modules, e.g. e3nn's ``Irreps``
    in the tensor-field rows) end in one error that names the modules and the way out."""
    from torch._dynamo.exc import TorchDynamoException

    def call(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except TorchDynamoException as error:
            parts = ", ".join(f"{name}={type(module).__name__}" for name, module in network.named_children())
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise RuntimeError(
                f"compile=true: torch.compile cannot compile this network ({parts}): {type(error).__name__}"
                f"{': ' + reason if reason else ''}. Run it eagerly with compile=false (the default); compile is "
                f"measured for the N-body rows in docs/measurements.md.") from error

    return call
