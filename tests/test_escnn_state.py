"""escnn convolutions' expanded filters are derived state (utils/escnn_compat.py, fix 4): never in a state dict,
re-expanded when weights are loaded into an eval-mode module, built without autograd.

Before the fix a plain-PyTorch inference script -- build the model, ``.eval()``, ``load_state_dict`` of weights
saved by a training loop that never called ``eval()`` -- loaded the zero filters escnn registers at
construction over the expanded ones: "All keys matched successfully", every score 0, equivariance gone.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

import canonical_network as cn
from canonical_network.utils.escnn_compat import DERIVED_BUFFERS
from tests.helpers import seeded_gen

# Outputs of the same weights and inputs through the same code path: equal up to the order of float32 additions
# in the filter expansion (the eval filter is one product per entry, as in training). Relative to the outputs'
# scale, bounded by 2^12 terms x eps32.
RTOL = 2**12 * torch.finfo(torch.float32).eps


def gcnn_canonicalized(seed: int) -> cn.CanonicalizedModel:
    torch.manual_seed(seed)
    return cn.CanonicalizedModel(cn.GCNNCanonicalizer(num_rotations=4),
                                 torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)))


def gcnn_predictor(seed: int) -> torch.nn.Module:
    from canonical_network.prediction.gcnn import GCNN

    torch.manual_seed(seed)
    return GCNN(num_rotations=4, channels=[4] * 7)


def saved(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() <= RTOL * b.abs().max())


@pytest.mark.parametrize("build", [gcnn_canonicalized, gcnn_predictor], ids=["canonicalizer", "gcnn"])
def test_weights_saved_in_training_load_into_an_eval_model(build):
    images = torch.rand(6, 1, 28, 28, generator=seeded_gen(0))
    trained = build(0)  # stands for a model trained in train mode: never evaluated
    state = saved(trained.state_dict())
    assert not [k for k in state if k.rsplit(".", 1)[-1] in DERIVED_BUFFERS]
    inference = build(1).eval()
    assert not inference.load_state_dict(state).missing_keys
    with torch.no_grad():
        reference = trained.eval()(images)
        assert close(inference(images), reference)
        assert reference.abs().max() > 0


def test_the_loaded_canonicalizer_stays_invariant_and_its_scores_are_not_zero():
    images = torch.rand(6, 1, 28, 28, generator=seeded_gen(1))
    inference = gcnn_canonicalized(1).eval()
    inference.load_state_dict(saved(gcnn_canonicalized(0).state_dict()))
    with torch.no_grad():
        assert inference.canonicalizer.scores(images).abs().max() > 0
    assert cn.check_equivariance(inference, images)


def test_state_dict_keys_do_not_depend_on_the_mode_and_legacy_filters_are_ignored():
    model = gcnn_canonicalized(0)
    keys_train = set(model.state_dict())
    keys_eval = set(model.eval().state_dict())
    assert keys_train == keys_eval
    # a checkpoint written before the fix, in eval mode, holds the expanded filters: they are derived, so a
    # strict load ignores them, and the module expands its own from the loaded weights
    legacy = dict(model.state_dict())
    conv = model.canonicalizer.network[0]
    legacy["canonicalizer.network.0.filter"] = torch.zeros_like(conv.filter)
    legacy["canonicalizer.network.0.expanded_bias"] = torch.zeros_like(conv.expanded_bias)
    fresh = gcnn_canonicalized(1).eval()
    fresh.load_state_dict(legacy, strict=True)
    assert torch.equal(fresh.canonicalizer.network[0].filter, conv.filter)


def test_an_eval_model_can_be_deep_copied():
    model = gcnn_canonicalized(0).eval()  # autograd on: escnn built the filters as graph nodes, refused by deepcopy
    copied = copy.deepcopy(model)
    images = torch.rand(2, 1, 28, 28, generator=seeded_gen(2))
    with torch.no_grad():
        assert torch.equal(copied(images), model(images))
