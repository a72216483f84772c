"""Test-time canonicalization (``canonicalization=tta``): invariance on real digits, no weights of its own,
and evaluation of a trained plain-backbone checkpoint through it."""

from __future__ import annotations

import pytest
import torch

from canonical_network.canonicalization.base import CanonicalizedModel
from canonical_network.canonicalization.test_time import TestTimeCanonicalizer, inverse_exact
from canonical_network.evaluate import compose_evaluation, evaluate
from canonical_network.records import record_path
from canonical_network.utils.checkpoints import RUN_CONFIG_KEY, model_from_checkpoint
from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import compose_experiment
from tests.helpers import compose_config, fit_image_model, shrink

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cnn(rotated_digits):
    """The plain rotmnist/cnn after 5 Adam steps on rotated digits (its logits depend on the input)."""
    return fit_image_model(["experiment=rotmnist/cnn"], train_steps=5, data=rotated_digits)


def _tta(cnn, **options) -> CanonicalizedModel:
    return CanonicalizedModel(TestTimeCanonicalizer(**options), cnn.network.predictor).eval()


@pytest.mark.parametrize("options", [{}, {"num_rotations": 4}, {"score": "neg_energy"}, {"reflection": True}],
                         ids=["c8", "c4", "c8-energy", "d8"])
def test_tta_cnn_is_exactly_invariant_to_quarter_turns_and_the_plain_cnn_is_not(cnn, rotated_digits, options):
    images, _ = rotated_digits
    model = _tta(cnn, **options)
    n = model.canonicalizer.num_rotations
    with torch.no_grad():
        logits, g = model.forward_with_element(images)
        scores = model.canonicalizer.scores([inverse_exact(images, a, r) for a, r in model.canonicalizer.elements])
        top = scores.topk(2, dim=-1).values
        assert (top[:, 0] > top[:, 1]).all()  # a unique argmax: the exact claim holds (ties: see the class)
        for k in (1, 2, 3):
            moved = torch.rot90(images, k, dims=(-2, -1))
            logits_moved, g_moved = model.forward_with_element(moved)
            assert torch.equal(logits_moved, logits)  # bit for bit
            shifted = (g.index % n + k * n // 4) % n + (g.index // n) * n  # 90°·k composed with h(x)
            assert torch.equal(g_moved.index, shifted)
            plain = cnn(images), cnn(moved)
            # the backbone alone fails the same check (logits ~0.1 after 5 steps; rounding would be ~1e-8)
            assert (plain[0] - plain[1]).abs().max() > 1e-3


def test_tta_picks_the_most_confident_pose_and_identity_rate_reads_its_index(cnn, digits):
    images, _ = digits
    model = _tta(cnn)
    h = model.canonicalizer
    with torch.no_grad():
        (canonical,), g = h.canonicalize(images)
        best = torch.stack([cnn.network.predictor(inverse_exact(images, a, r)).softmax(-1).amax(-1)
                            for a, r in h.elements], dim=-1).argmax(-1)
        assert torch.equal(g.index, best)
        assert torch.equal(canonical[0], inverse_exact(images[:1], *h.elements[int(best[0])])[0])
        assert torch.equal(g.angle_deg, best.float() * 45.0)
    assert torch.equal(h.is_identity(g, len(images)), best == 0)
    assert h.group_name == "C8" and torch.isfinite(h.prior(g))


def test_tta_has_no_parameters_nor_state_and_the_predictor_is_not_its_submodule(cnn):
    model = _tta(cnn)
    h = model.canonicalizer
    assert list(h.parameters()) == [] and h.state_dict() == {} and list(h.children()) == []
    assert h.predictor is cnn.network.predictor
    assert set(model.state_dict()) == {f"predictor.{k}" for k in cnn.network.predictor.state_dict()}
    with pytest.raises(RuntimeError, match="CanonicalizedModel"):
        TestTimeCanonicalizer().canonicalize(torch.zeros(1, 1, 28, 28))
    # scoring leaves the predictor in the mode it was in
    model.train()
    with torch.no_grad():
        model(torch.rand(2, 1, 28, 28))
    assert cnn.network.predictor.training
    cnn.eval()


def test_tta_from_the_config_and_an_so2_grid():
    cfg = compose_experiment(["experiment=rotmnist/cnn", "canonicalization=tta",
                              "canonicalization.angles=[-30,0,30]"])
    import hydra

    model = hydra.utils.instantiate(cfg.model)
    h = model.canonicalizer
    assert h.group_name == "SO(2)" and model.parameter_counts()["canonicalizer"] == 0
    with torch.no_grad():
        _, g = model.network.canonicalize(torch.rand(3, 1, 28, 28))
    assert g.index is None and set(g.angle_deg.tolist()) <= {-30.0, 0.0, 30.0}
    assert h.is_identity(g, 3).tolist() == (g.angle_deg == 0).tolist()


# ------------------------------------------------------------------------------- on a trained checkpoint

@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    """The best checkpoint of a tiny rotmnist/cnn run (as tests/test_evaluate.py makes one)."""
    cfg = shrink(compose_config(["experiment=rotmnist/cnn", "data.batch_size=32"],
                                tmp_path_factory.mktemp("cnn_run")))
    from canonical_network.train import run

    return str(record_path(run(cfg), "checkpoint"))


def test_evaluate_a_plain_cnn_checkpoint_with_tta(cnn_run, tmp_path):
    overrides = ["canonicalization=tta", "model.orbit_rotations=4", "logger=csv", "trainer.limit_test_batches=1"]
    results = evaluate(compose_evaluation(cnn_run, overrides, tmp_path))
    metrics = results["metrics"]
    for key in ("test/error", "test/orbit/error_mean", "test/orbit/error_worst", "test/identity_rate"):
        assert key in metrics
    for config in (results["config"]["canonicalization"], results["config"]["model"]["canonicalizer"]):
        assert config["_target_"].endswith("TestTimeCanonicalizer")  # the network runs it, not the identity
    assert results["params"]["canonicalizer"] == 0
    # the weights load into the predictor, unchanged
    model = model_from_checkpoint(cnn_run, ["canonicalization=tta", "canonicalization.score=neg_energy"])
    trained = torch.load(cnn_run, map_location="cpu", weights_only=True)["state_dict"]
    assert isinstance(model.canonicalizer, TestTimeCanonicalizer) and model.canonicalizer.score == "neg_energy"
    assert model.canonicalizer.predictor is model.network.predictor
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    # its options need canonicalization=tta; any other canonicalization is still an architecture change
    for refused in (["canonicalization.score=neg_energy"], ["canonicalization=gcnn"]):
        with pytest.raises(ConfigError, match="cannot be overridden when evaluating a checkpoint"):
            model_from_checkpoint(cnn_run, refused)


def test_tta_is_refused_over_a_learned_canonicalizer(cnn_run, tmp_path):
    # the run config of a CN(p4) checkpoint (checked before any weight is read)
    checkpoint = torch.load(cnn_run, map_location="cpu", weights_only=True)
    gcnn = compose_experiment(["experiment=rotmnist/cn_p4"])
    from omegaconf import OmegaConf

    checkpoint[RUN_CONFIG_KEY]["config"]["canonicalization"] = OmegaConf.to_container(gcnn.canonicalization,
                                                                                      resolve=True)
    torch.save(checkpoint, tmp_path / "cn_p4.ckpt")
    message = r"canonicalization=tta replaces .* must then be the identity .*GCNNCanonicalizer.* would be dropped"
    with pytest.raises(ConfigError, match=message):
        compose_evaluation(tmp_path / "cn_p4.ckpt", ["canonicalization=tta"])
    with pytest.raises(ConfigError, match=message):
        model_from_checkpoint(tmp_path / "cn_p4.ckpt", ["canonicalization=tta"])


def test_a_confident_predictor_keeps_tta_invariant(cnn, rotated_digits):
    """A trained classifier's top logit often leads by more than ~17, where the float32 max softmax rounds to
    exactly 1 and several poses tie; the score orders poses by the same probability without saturating, so
    the pose chosen for a quarter turn of x is still x's, turned (the 5-step CNN's logits, ~0.1 apart, scaled x1e5)."""
    from torch import nn

    from canonical_network.canonicalization.test_time import confidence

    class Confident(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return 1e5 * self.inner(x)

    images, _ = rotated_digits
    model = CanonicalizedModel(TestTimeCanonicalizer(), Confident(cnn.network.predictor)).eval()
    with torch.no_grad():
        candidates = [inverse_exact(images, a, r) for a, r in model.canonicalizer.elements]
        logits = torch.stack([model.predictor(c) for c in candidates], dim=1)  # (B, poses, classes)
        saturated = logits.softmax(-1).amax(-1)
        assert ((saturated == 1.0).sum(-1) > 1).any()  # the plain max softmax ties here
        scores = confidence(logits, "max_softmax")
        ordered = scores.topk(2, dim=-1).values
        assert (ordered[:, 0] > ordered[:, 1]).all()
        out, g = model.forward_with_element(images)
        for k in (1, 2, 3):
            out_k, g_k = model.forward_with_element(torch.rot90(images, k, dims=(-2, -1)))
            assert torch.equal(out_k, out)
            assert torch.equal(g_k.index, (g.index + 2 * k) % 8)
