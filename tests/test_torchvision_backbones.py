"""Torchvision backbones as predictors: a new head, channels and size adapted, ImageNet statistics, weights from a
local state dict or the torch hub cache (never downloaded unless asked), a frozen backbone. Nothing here touches
the network: downloads are made to fail loudly if anything tries one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision

from canonical_network.prediction.torchvision_backbones import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TorchvisionBackbone,
    hub_checkpoint_path,
)

TINY_VIT = {"patch_size": 8, "num_layers": 1, "num_heads": 2, "hidden_dim": 16, "mlp_dim": 32}


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch, tmp_path):
    """An empty torch hub cache of our own, and any download attempt an error."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))

    def refuse(*args, **kwargs):
        raise AssertionError(f"a download was attempted: {args[:1]}")

    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)


def saved_resnet18(path, seed: int = 1) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    state = torchvision.models.resnet18(weights=None).state_dict()
    torch.save(state, path)
    return state


def test_random_init_new_head_and_grey_images():
    model = TorchvisionBackbone("resnet18", num_classes=7, in_channels=1, image_size=28).eval()
    assert model.head is model.backbone.fc and model.head.out_features == 7
    assert not model.normalize  # no weights: the images go in as they are
    grey = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(grey), model(grey.expand(-1, 3, -1, -1)))  # 1 channel = the equal-RGB image
    assert model(grey).shape == (2, 7)


def test_local_state_dict_is_loaded_and_the_head_replaced(tmp_path):
    state = saved_resnet18(tmp_path / "resnet18.pth")
    model = TorchvisionBackbone("resnet18", num_classes=10, image_size=32, weights=str(tmp_path / "resnet18.pth"))
    loaded = model.backbone.state_dict()
    for key, value in state.items():
        if not key.startswith("fc."):
            assert torch.equal(loaded[key], value), key
    assert model.head.weight.shape == (10, 512)  # the 1000-way ImageNet head is gone
    assert model.normalize  # weights given: ImageNet statistics (normalize=auto)


def test_torchvision_weights_name_missing_from_the_cache_is_one_clear_error():
    with pytest.raises(FileNotFoundError) as error:
        TorchvisionBackbone("resnet18", weights="IMAGENET1K_V1")
    message = str(error.value)
    cached = hub_checkpoint_path(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url)
    assert str(cached) in message and "prediction.download_weights=true" in message
    assert "prediction.weights=<that path>" in message
    assert not cached.exists()


def test_torchvision_weights_name_is_read_from_the_hub_cache(tmp_path, monkeypatch):
    """A cached file is read when its SHA-256 starts with the hash its name states (torchvision's names all
    carry one; the entry's URL is pointed at a file named after this one's hash), and refused when it does
    not: torch.hub checks a file only as it downloads it."""
    import hashlib

    entry = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    real = hub_checkpoint_path(entry.url)
    real.parent.mkdir(parents=True)
    state = saved_resnet18(tmp_path / "r.pth", seed=2)
    prefix = hashlib.sha256((tmp_path / "r.pth").read_bytes()).hexdigest()[:8]
    (tmp_path / "r.pth").rename(real.parent / f"resnet18-{prefix}.pth")
    published = entry.url
    monkeypatch.setattr(entry.value, "url", published.replace(real.name, f"resnet18-{prefix}.pth"))
    model = TorchvisionBackbone("resnet18", weights="IMAGENET1K_V1", image_size=32)
    assert torch.equal(model.backbone.conv1.weight, state["conv1.weight"])
    monkeypatch.setattr(entry.value, "url", published)
    saved_resnet18(real, seed=2)  # other weights under the published name
    with pytest.raises(ValueError, match=f"does not start with '{real.name.split('-')[1][:8]}'.*not the published"):
        TorchvisionBackbone("resnet18", weights="IMAGENET1K_V1", image_size=32)


def test_bad_weights_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"prediction.weights='IMAGENET9K' is neither .* \['IMAGENET1K_V1', "):
        TorchvisionBackbone("resnet18", weights="IMAGENET9K")
    with pytest.raises(FileNotFoundError, match=r"no such state-dict file"):
        TorchvisionBackbone("resnet18", weights=str(tmp_path / "missing.pth"))
    torch.save(TorchvisionBackbone("vit_b_16", image_size=32, vit=TINY_VIT).backbone.state_dict(), tmp_path / "v.pth")
    with pytest.raises(ValueError, match=r"does not fit resnet18"):
        TorchvisionBackbone("resnet18", weights=str(tmp_path / "v.pth"))


def test_frozen_backbone_trains_the_head_only(tmp_path):
    saved_resnet18(tmp_path / "r.pth")
    model = TorchvisionBackbone("resnet18", image_size=32, weights=str(tmp_path / "r.pth"), freeze_backbone=True)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"backbone.fc.weight", "backbone.fc.bias"}
    model.train()
    assert not model.backbone.layer1.training and model.head.training  # batch-norm statistics stay fixed
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    F.cross_entropy(model(torch.rand(4, 3, 32, 32)), torch.arange(4)).backward()
    optimizer.step()
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"backbone.fc.weight", "backbone.fc.bias"}


def test_resize_and_imagenet_normalisation_happen_inside_the_predictor():
    model = TorchvisionBackbone("resnet18", image_size=46, input_size=64, normalize="imagenet").eval()
    images = torch.rand(2, 3, 46, 46)
    resized = F.interpolate(images, size=(64, 64), mode="bilinear", align_corners=False)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        assert torch.allclose(model(images), model.backbone((resized - mean) / std), atol=1e-6, rtol=1e-5)


def test_tiny_vit_and_its_size_checks():
    model = TorchvisionBackbone("vit_b_16", num_classes=10, in_channels=1, image_size=32, vit=TINY_VIT)
    assert model.head is model.backbone.heads.head and model.head.out_features == 10
    assert model.backbone.patch_size == 8 and len(model.backbone.encoder.layers) == 1
    assert model(torch.rand(2, 1, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match=r"divisible by its patch size: 28 .*vit.patch_size=8"):
        TorchvisionBackbone("vit_b_16", image_size=28, vit=TINY_VIT)
    with pytest.raises(ValueError, match=r"prediction.vit sets a ViT's sizes; prediction.arch=resnet18"):
        TorchvisionBackbone("resnet18", vit=TINY_VIT)
    with pytest.raises(ValueError, match=r"prediction.in_channels must be one of \[1, 3\]; got 4"):
        TorchvisionBackbone("resnet18", in_channels=4)
