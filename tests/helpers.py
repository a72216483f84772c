"""Test helpers that are not fixtures (those live in ``tests/conftest.py``): the real configs composed and
shrunk (:func:`compose_config`, :func:`shrink`, :data:`EXPERIMENTS`), seeded inputs and fitted image models,
and float tolerances derived from the arithmetic, not tuned to one CPU.

Why the tolerances: float results differ in their last bits between x86-64 machines. OpenBLAS, oneDNN and PyTorch pick
AVX2 or AVX-512 kernels (and ``OPENBLAS_CORETYPE`` overrides OpenBLAS's pick), and these block, vectorise
and fuse their sums differently. A tolerance fitted to the errors seen on one machine can fail on another
(a float32 invariance error of 1.4e-4 against a bound of 1e-4 on an AVX-512 Xeon), so every float
comparison of the suite uses a tolerance of the form

    tol = factor · eps(dtype) · scale

* ``eps`` is the machine epsilon of the dtype the compared values are computed in (2⁻²³ ≈ 1.2e-7 for
  float32, 2⁻⁵² ≈ 2.2e-16 for float64);
* ``scale`` is the size of the compared values (``max |value|``), so that the bound is relative;
* ``factor`` bounds the error relative to that scale: ``n``, the number of terms accumulated along the
  longest chain of the computation (worst-case recursive summation errs by at most ``≈ n·eps`` relative to
  the sum of the magnitudes of its terms, whatever order a kernel sums them in), times the amplification
  ``κ`` of that error by the computation's conditioning (a frame's ``1 / sin`` of the angle between the
  vectors it is built from, a normalisation dividing by a small standard deviation). Each caller states
  its ``n`` and ``κ`` next to the factor.

Where a test claims exactness (equivariance by construction) of a deep network, whose ``κ`` nobody can
state tightly, the check runs in float64 with the generous :data:`DEEP64`: any machine's float64 rounding
stays orders of magnitude below it, and a model that is not equivariant misses it by ~9 orders of
magnitude (each such test also checks a non-equivariant control against the same tolerance).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, open_dict

from canonical_network.utils.config import CONFIG_DIR, compose_experiment

# Configs, inputs and models

#: every experiment file, as ``<family>/<row>`` (what ``experiment=`` takes)
EXPERIMENTS = sorted(
    str(p.relative_to(CONFIG_DIR / "experiment").with_suffix(""))
    for p in (CONFIG_DIR / "experiment").rglob("*.yaml")
)


def compose_config(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    """Compose configs/train.yaml as the CLI would, with the run folder set to ``output_dir``."""
    cfg = compose_experiment(overrides)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir)
    return cfg


def shrink(cfg: DictConfig) -> DictConfig:
    """CPU, no logger, a couple of batches: what a fast test needs from a real config."""
    with open_dict(cfg):
        cfg.trainer.accelerator = "cpu"
        cfg.trainer.max_epochs = 1
        cfg.trainer.limit_train_batches = 2
        cfg.trainer.limit_val_batches = 1
        cfg.trainer.limit_test_batches = 1
        cfg.trainer.num_sanity_val_steps = 0
        cfg.trainer.enable_progress_bar = False
        cfg.logger = {}
        cfg.callbacks.rich_progress_bar = None
    return cfg


def seeded_gen(seed: int = 0) -> torch.Generator:
    """A fresh CPU generator: tests draw their random inputs from it, never from the global RNG."""
    return torch.Generator().manual_seed(seed)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a − b|`` as a Python float (for a tolerance, see :func:`rel_tol` and :func:`assert_close`)."""
    return (a - b).abs().max().item()


def fit_image_model(overrides: list[str], train_steps: int = 0, data=None):
    """The configured image LightningModule (seed 0), after ``train_steps`` Adam steps (lr 1e-3) on
    ``data`` = (images, labels), so that its logits depend on the input; returned in eval mode."""
    cfg = compose_config(overrides)
    torch.manual_seed(0)
    model = hydra.utils.instantiate(cfg.model)
    if train_steps:
        images, labels = data
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        model.train()
        for _ in range(train_steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
    return model.eval()


# Float tolerances

#: machine epsilon (the spacing of floats at 1) of float32 and float64
EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps

#: ``n`` for deep networks (canonicalizer + backbone, VN networks, GNNs): ≤ 2¹³ terms accumulated along the
#: longest chain (the widest layer of the suite's models sums ≤ 4,944 inputs, PointNet's segmentation head
#: at the reference width; a whole small network ≤ ~8e3)
DEEP_TERMS = 2.0**13
#: ``κ`` assumed for them: a frame whose vectors are 0.5° from parallel, or a batch norm dividing by a
#: standard deviation 1 % of its features' scale, amplifies by ~1e2. Tests whose model builds a frame
#: measure its conditioning instead (:func:`frame_factor`).
MAX_FRAME_CONDITION = 2.0**7
#: ``factor`` for deep networks checked in float64: ``2¹³ · 2⁷ = 2²⁰``, a tolerance of
#: ``2²⁰ · 2⁻⁵² = 2⁻³² ≈ 2.3e-10`` of the outputs' scale. Observed float64 errors are ~1e-15..1e-12 of
#: the scale, and a non-equivariant model's O(0.1..1) errors exceed it ~1e9-fold.
DEEP64 = DEEP_TERMS * MAX_FRAME_CONDITION
#: beyond this frame conditioning a check is too loose to mean much (tolerance 2⁻²³ ≈ 1.2e-7 of the scale)
#: and the inputs should be changed
WORST_FRAME_CONDITION = 2.0**16


def frame_conditions(vectors: torch.Tensor, group: str = "O3") -> torch.Tensor:
    """How much Gram–Schmidt amplifies a relative error of its input vectors, per sample of ``vectors``
    ``(B, 3, 3)`` (rows ``v₁, v₂, v₃``, as the canonicalizers' ``frame_vectors``): ``max_i ‖v_i‖ / ‖r_k‖``
    over the residuals ``r_k`` Gram–Schmidt normalises into ``e_k`` (``r₁ = v₁``, ``r₂`` = the part of
    ``v₂`` orthogonal to ``e₁``, and for O(3) ``r₃`` = the part of ``v₃`` orthogonal to both; SO(3) takes
    ``e₃ = e₁ × e₂``). For two vectors that is ``1 / sin`` of their angle (times their norms' ratio)."""
    v = vectors.detach().double()
    biggest = v.norm(dim=-1).amax(dim=-1)  # (B,)
    e1 = v[:, 0] / v[:, 0].norm(dim=-1, keepdim=True)
    r2 = v[:, 1] - (v[:, 1] * e1).sum(-1, keepdim=True) * e1
    residuals = [v[:, 0].norm(dim=-1), r2.norm(dim=-1)]
    if group == "O3":
        e2 = r2 / residuals[1].unsqueeze(-1)
        r3 = v[:, 2] - (v[:, 2] * e1).sum(-1, keepdim=True) * e1 - (v[:, 2] * e2).sum(-1, keepdim=True) * e2
        residuals.append(r3.norm(dim=-1))
    return biggest / torch.stack(residuals).amin(dim=0)


def frame_condition(vectors: torch.Tensor, group: str = "O3") -> float:
    """The worst :func:`frame_conditions` of the batch."""
    return frame_conditions(vectors, group).max().item()


def frame_factor(condition: float) -> float:
    """``factor`` for a deep network that builds a frame of measured :func:`frame_condition` ``κ``:
    ``DEEP_TERMS · max(κ, MAX_FRAME_CONDITION)`` (DEEP64 unless the frame is worse conditioned)."""
    assert condition < WORST_FRAME_CONDITION, f"inputs too close to a degenerate frame: κ = {condition:.3g}"
    return DEEP_TERMS * max(condition, MAX_FRAME_CONDITION)


def orthonormality_tol(dtype: torch.dtype) -> float:
    """Bound on ``max |RᵀR − I|`` (and ``|det R − 1|`` / 3) for ``R = gram_schmidt(V)`` on *any* input.

    Gram–Schmidt normalises a residual ``r`` computed with an absolute error of ≤ ~5 eps·max‖v‖ (a 3-term
    projection and a subtraction), so ``e = r / ‖r‖`` leaves the plane of the axes before it by
    ≤ 5 eps·max‖v‖ / ‖r‖; ``gram_schmidt`` accepts a residual only when ``‖r‖ > sqrt(eps)·max‖v‖`` (its
    ``parallel_tol``), so that is ≤ 5 sqrt(eps), plus a few eps of normalisation: 8 sqrt(eps) (2.8e-3 in
    float32, 1.2e-7 in float64). A frame that is not orthonormal at all is off by O(1).
    """
    return 8 * torch.finfo(dtype).eps ** 0.5


def scale_of(*values: torch.Tensor) -> float:
    """``max |value|`` over all the given tensors: the size a relative tolerance is taken of."""
    return max(v.detach().abs().max().item() for v in values)


def rel_tol(*values: torch.Tensor, factor: float, dtype: torch.dtype | None = None) -> float:
    """``factor · eps(dtype) · max |values|`` (dtype: that of the first value unless given).

    The caller states why ``factor`` bounds the relative rounding error (see the module docstring).
    """
    eps = torch.finfo(dtype or values[0].dtype).eps
    return factor * eps * scale_of(*values)


#: Rounding of a squared distance, relative to the largest squared distance of the cloud: rotating the
#: points (3-term products: ≤ ~3 eps on each coordinate, so ≤ ~12 eps on a squared difference) plus
#: computing it (torch.cdist's ‖x‖² + ‖y‖² − 2 x·y: ≤ ~8 eps of the largest ‖x‖²) is ≤ ~32 eps; twice that.
KNN_ROUNDINGS = 64


def knn_margin(points: torch.Tensor, k: int) -> float:
    """Smallest gap between the squared distances to the k-th and the (k+1)-th nearest point (self
    included) of any point of ``points`` ``(B, P, 3)``, relative to the cloud's largest squared distance."""
    points = points.double()
    d2 = (points.unsqueeze(2) - points.unsqueeze(1)).square().sum(-1)  # (B, P, P)
    ordered = d2.sort(dim=-1).values
    gap = ordered[..., k] - ordered[..., k - 1]  # (k+1)-th minus k-th (0-based: self is index 0)
    return (gap / d2.flatten(1).amax(dim=1).view(-1, 1)).min().item()


def assert_knn_stable(points: torch.Tensor, k: int) -> None:
    """The kNN graph of ``points`` cannot change under a rotation or another machine's rounding.

    A kNN graph is a discontinuous function of the cloud: where the gap of :func:`knn_margin` is below the
    rounding error of the squared distances (``KNN_ROUNDINGS · eps`` of the points' dtype), a rotation or
    another machine's kernels may swap a neighbour and move the outputs by O(1), which no rounding
    tolerance can cover. (Float32 clouds of ~100 random surface points have gaps of ~1e-6 ≈ 10 eps32, too
    close for float32 checks; in float64 the same gaps are ~1e10 eps64.)
    """
    margin, needed = knn_margin(points, k), KNN_ROUNDINGS * torch.finfo(points.dtype).eps
    assert margin > needed, f"kNN graph within rounding of a tie: gap {margin:.3g} ≤ {needed:.3g}"


def assert_close(actual: torch.Tensor, expected: torch.Tensor, factor: float) -> float:
    """``max |actual − expected| < rel_tol(actual, expected, factor=factor)``; returns the error."""
    tol = rel_tol(actual, expected, factor=factor)
    error = (actual - expected).abs().max().item()
    assert error < tol, f"max error {error:.3g} vs tolerance {tol:.3g} (factor {factor:g})"
    return error


def clear_argmax(scores: torch.Tensor, factor: float) -> torch.Tensor:
    """Per row, whether the largest score beats the runner-up by more than the scores' rounding error,
    ``factor · eps · max |score|`` of the row. Where it does not, the argmax (a discontinuous choice) may
    flip under a transformation or on another machine's kernels and change the outputs by O(1), so checks
    that depend on the choice are restricted to the rows where it is clear."""
    top = scores.detach().topk(2, dim=-1).values
    gap = top[..., 0] - top[..., 1]
    return gap > factor * torch.finfo(scores.dtype).eps * scores.detach().abs().amax(dim=-1)


# Markdown examples

#: a fenced block whose info string is exactly ``python`` (``python no-run`` or ``pycon`` blocks are not run)
_PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def markdown_python_blocks(path: Path | str) -> list[tuple[int, str]]:
    """``(line, source)`` of every ```` ```python ```` block of a markdown file, in order (``line``: 1-based line
    of the block's first code line)."""
    text = Path(path).read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _PYTHON_BLOCK.finditer(text)]


def run_markdown_python_blocks(path: Path | str, namespace: dict | None = None) -> dict:
    """Execute the ```` ```python ```` blocks of a markdown file in order, in one namespace (a later block may use
    what an earlier one defined, as a reader running them in one session would), and return that namespace.

    A failing block raises with a traceback that names the file and the line in it. Blocks tagged otherwise
    (```` ```python no-run ````, ```` ```bash ````) are skipped. Fails if the file has no python block, so that
    a renamed fence does not silently test nothing.
    """
    blocks = markdown_python_blocks(path)
    assert blocks, f"{path} has no ```python block to run"
    namespace = {"__name__": "__markdown__"} if namespace is None else namespace
    for line, source in blocks:
        # blank lines first, so that the code's line numbers are the markdown file's
        code = compile("\n" * (line - 1) + source, str(path), "exec")
        exec(code, namespace)  # noqa: S102 - the project's own documentation
    return namespace


@contextmanager
def hold_lock(path: Path | str):
    """Another process holding the POSIX lock on ``path`` for the ``with`` block (such locks are per process, so a
    thread of the test's own process could not stand for another run or lane)."""
    import subprocess
    import sys

    from canonical_network.utils.config import PROJECT_ROOT

    proc = subprocess.Popen([sys.executable, "-c", (
        "import sys; from canonical_network.utils.files import exclusive_lock\n"
        f"with exclusive_lock({str(path)!r}) as holder:\n"
        "    print('held' if holder is None else 'not held', flush=True); sys.stdin.readline()")],
        cwd=PROJECT_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield
    finally:
        proc.communicate("\n", timeout=60)
