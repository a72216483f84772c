"""Torchvision backbones (ResNet, ViT) as the prediction network f, pretrained or from scratch.

Mondal et al. (NeurIPS 2023), "Equivariant Adaptation of Large Pretrained Models": a large pretrained
network, not equivariant, becomes C_N-invariant behind a canonicalizer, φ(x) = f(h(x)⁻¹ · x), whatever f
is. This module is that f for torchvision's classifiers; the composition stays in
:class:`~canonical_network.canonicalization.base.CanonicalizedModel`.

What :class:`TorchvisionBackbone` does to a canonical image (B, C, S, S) in [0, 1], in this order:

1. **Channels.** Grey-scale images (C = 1) are repeated to 3 channels; the first convolution (or patch
   embedding) is never changed, so any torchvision state dict loads into it and ImageNet filters see a grey
   image as the equal-RGB image it is. C must be 1 or 3.
2. **Size.** Resized (bilinear; antialiased when shrinking) to ``input_size`` when given, e.g. 224 for the
   ImageNet weights. This is inside f, after canonicalization, so it costs no equivariance. Padding is not
   done here: the data pads (``data.pad_to``, :mod:`canonical_network.data.torchvision_images`) so that the
   canonicalizer rotates the padded image.
3. **Normalisation.** ImageNet's mean and std (the statistics torchvision's weights were trained with) when
   ``normalize="imagenet"``, or with ``"auto"`` whenever weights are loaded.
4. The backbone, with a **new head**: a linear layer to ``num_classes`` (ResNet ``fc``, ViT ``heads.head``),
   freshly initialised whatever the weights held. ``freeze_backbone`` trains that head only.

**Weights** (``prediction.weights``): ``null`` (random initialisation), a torchvision weights name of the
architecture (``IMAGENET1K_V1``, ``DEFAULT``, …), or the path of a local state dict (``.pth``/``.pt``, e.g. one
saved with ``torch.save(model.state_dict(), path)`` from the torchvision model). A weights name is read from
the local torch hub cache (``$TORCH_HOME/hub/checkpoints/``, where torchvision keeps its downloads); when the
file is not there, the constructor raises one error naming the file and the two ways to get it, and nothing
is downloaded unless ``prediction.download_weights=true``. The head's entries of any state dict are ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.nn.functional as F
from torch import nn

from canonical_network.utils.checks import check_bool, check_choice, check_int

#: ImageNet's per-channel statistics (RGB), with which every torchvision ImageNet model was trained
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
#: torchvision's ViT sizes (torchvision/models/vision_transformer.py): patch size, depth, heads, widths
VITS = {
    "vit_b_16": {"patch_size": 16, "num_layers": 12, "num_heads": 12, "hidden_dim": 768, "mlp_dim": 3072},
    "vit_b_32": {"patch_size": 32, "num_layers": 12, "num_heads": 12, "hidden_dim": 768, "mlp_dim": 3072},
    "vit_l_16": {"patch_size": 16, "num_layers": 24, "num_heads": 16, "hidden_dim": 1024, "mlp_dim": 4096},
}
ARCHS = (*RESNETS, *VITS)
NORMALIZATIONS = ("auto", "imagenet", "none")
#: the head each architecture family gets replaced (its state-dict prefix)
_HEAD_PREFIX = {"resnet": "fc.", "vit": "heads."}


def hub_checkpoint_path(url: str) -> Path:
    """Where ``torch.hub`` (and so torchvision) caches the file of ``url``: ``<hub dir>/checkpoints/<name>``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


def resolve_weights(arch: str, weights: str, download: bool = False) -> Mapping[str, torch.Tensor]:
    """The state dict that ``prediction.weights`` names for ``arch``: a file, or a torchvision weights name.

    A name is loaded from the torch hub cache; if its file is missing, ``FileNotFoundError`` says where it is
    expected and how to get it, unless ``download`` (``prediction.download_weights``) allows torchvision to
    fetch it.
    """
    text = str(weights)
    path = Path(text).expanduser()
    if path.suffix in (".pth", ".pt") or os.sep in text or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"prediction.weights={text!r}: no such state-dict file")
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, Mapping) or not all(torch.is_tensor(v) for v in state.values()):
            raise ValueError(f"prediction.weights={text!r} is not a state dict (a mapping of names to tensors), "
                             "as torch.save(model.state_dict(), path) writes")
        return state
    from torchvision.models import get_model_weights

    enum = get_model_weights(arch)
    if text not in enum.__members__:
        raise ValueError(f"prediction.weights={text!r} is neither a state-dict file nor a torchvision weights "
                         f"name of {arch}: {list(enum.__members__)}")
    entry = enum[text]
    cached = hub_checkpoint_path(entry.url)
    if not cached.is_file() and not download:
        raise FileNotFoundError(
            f"prediction.weights={text} ({arch}: {entry.url}) is not in the local torch hub cache: {cached} does "
            "not exist, and nothing is downloaded unless asked. Either set prediction.download_weights=true "
            f"(needs internet; torchvision fetches it into that cache once), or download {entry.url} on a "
            f"machine with internet access and copy it to {cached} (or anywhere, and give "
            "prediction.weights=<that path>)."
        )
    if cached.is_file():
        check_hub_file(cached)
    # check_hash: a download is verified against the hash its name carries (torchvision's files all do)
    return entry.get_state_dict(progress=False, weights_only=True, check_hash=True)


def check_hub_file(path: Path) -> None:
    """Refuse a cached torchvision weights file whose SHA-256 does not start with the hash in its name
    (``resnet18-f37072fd.pth``): torch.hub checks a file only when it downloads it, and a file put in the
    cache by other means (a copy, a download without the check, a mirror serving another file) would be
    loaded as the named weights."""
    import hashlib

    match = torch.hub.HASH_REGEX.search(path.name)
    if match is None:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if not digest.hexdigest().startswith(match.group(1)):
        raise ValueError(
            f"{path}: its SHA-256 {digest.hexdigest()[:16]}... does not start with {match.group(1)!r}, the hash its "
            "name states: not the published weights (a truncated or replaced file). Delete it and download it "
            "again (prediction.download_weights=true), or give prediction.weights=<a state-dict file>."
        )


class TorchvisionBackbone(nn.Module):
    """A torchvision ResNet or ViT with a new ``num_classes`` head, as the predictor of a canonicalized model.

    Not equivariant (nothing here is): invariance comes from the canonicalizer in front of it.

    Args:
        arch: ``resnet18`` … ``resnet152`` or ``vit_b_16``, ``vit_b_32``, ``vit_l_16``.
        num_classes: size of the logits (the new head).
        in_channels: channels of the images, 1 (repeated to 3) or 3.
        image_size: side of the square images the predictor receives (the data's, padded); a ViT without
            ``input_size`` is built for it.
        weights: ``None``, a torchvision weights name, or a state-dict path (module docstring).
        download_weights: allow torchvision to download a weights name missing from the cache.
        freeze_backbone: keep every backbone weight (and its batch-norm statistics) fixed; only the head trains.
        input_size: side the image is resized to before the backbone; ``None`` keeps ``image_size``.
        normalize: ``auto`` (ImageNet statistics when ``weights`` is given), ``imagenet`` or ``none``.
        vit: a ViT's sizes (``patch_size``, ``num_layers``, ``num_heads``, ``hidden_dim``, ``mlp_dim``); each
            missing or null one is the architecture's. Pretrained weights need the architecture's own.

    Shapes: ``forward((B, in_channels, image_size, image_size)) -> (B, num_classes)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("ImageClassificationTask",)

    def __init__(
        self,
        arch: str = "resnet18",
        num_classes: int = 10,
        in_channels: int = 3,
        image_size: int = 224,
        weights: str | None = None,
        download_weights: bool = False,
        freeze_backbone: bool = False,
        input_size: int | None = None,
        normalize: str = "auto",
        vit: Mapping[str, int | None] | None = None,
    ) -> None:
        super().__init__()
        self.arch = check_choice("prediction.arch", arch, ARCHS)
        self.family = "vit" if arch in VITS else "resnet"
        check_int("prediction.num_classes", num_classes, low=2)
        check_choice("prediction.in_channels", in_channels, (1, 3))
        check_int("prediction.image_size", image_size, low=1)
        self.input_size = check_int("prediction.input_size", input_size, low=1, optional=True)
        self.freeze_backbone = check_bool("prediction.freeze_backbone", freeze_backbone)
        check_choice("prediction.normalize", normalize, NORMALIZATIONS)
        if vit is not None and self.family != "vit":
            raise ValueError(f"prediction.vit sets a ViT's sizes; prediction.arch={arch} is not a ViT")
        size = self.input_size or image_size

        self.backbone = self._build(size, dict(vit or {}))
        if weights is not None:
            state = resolve_weights(arch, weights, check_bool("prediction.download_weights", download_weights))
            self._load(state, weights)
        self._replace_head(num_classes)
        if self.freeze_backbone:
            for name, p in self.backbone.named_parameters():
                p.requires_grad_(name.startswith(_HEAD_PREFIX[self.family]))
        self.normalize = normalize == "imagenet" or (normalize == "auto" and weights is not None)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def _build(self, size: int, vit: dict) -> nn.Module:
        import torchvision

        if self.family == "resnet":
            return getattr(torchvision.models, self.arch)(weights=None)
        unknown = set(vit) - set(VITS[self.arch])
        if unknown:
            raise ValueError(f"prediction.vit has unknown keys {sorted(unknown)}; valid: {list(VITS[self.arch])}")
        sizes = {k: (v if vit.get(k) is None else check_int(f"prediction.vit.{k}", vit[k], low=1))
                 for k, v in VITS[self.arch].items()}
        if size % sizes["patch_size"]:
            raise ValueError(f"a ViT needs an image side divisible by its patch size: {size} (prediction.input_size,"
                             f" or the data's image_size) and prediction.vit.patch_size={sizes['patch_size']}")
        if sizes["hidden_dim"] % sizes["num_heads"]:
            raise ValueError(f"prediction.vit.hidden_dim={sizes['hidden_dim']} must be divisible by "
                             f"prediction.vit.num_heads={sizes['num_heads']}")
        return torchvision.models.VisionTransformer(image_size=size, **sizes)

    def _load(self, state: Mapping[str, torch.Tensor], weights: str) -> None:
        head = _HEAD_PREFIX[self.family]
        body = {k: v for k, v in state.items() if not k.startswith(head)}
        try:
            missing, unexpected = self.backbone.load_state_dict(body, strict=False)
        except RuntimeError as error:  # a shape mismatch (another architecture, or a ViT of another size)
            raise ValueError(f"prediction.weights={weights!r} does not fit {self.arch} as configured "
                             f"(a ViT's position embeddings also fix prediction.input_size): {error}") from None
        missing = [k for k in missing if not k.startswith(head)]
        if missing or unexpected:
            raise ValueError(f"prediction.weights={weights!r} does not fit {self.arch}: missing {missing[:5]}"
                             f"{' …' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                             f"{' …' if len(unexpected) > 5 else ''}")

    def _replace_head(self, num_classes: int) -> None:
        if self.family == "resnet":
            self.backbone.fc = nn.Linear(self.backbone.fc.in_features, num_classes)
        else:
            self.backbone.heads.head = nn.Linear(self.backbone.heads.head.in_features, num_classes)

    @property
    def head(self) -> nn.Linear:
        """The new classification layer (the only trained part under ``freeze_backbone``)."""
        return self.backbone.fc if self.family == "resnet" else self.backbone.heads.head

    def train(self, mode: bool = True) -> TorchvisionBackbone:
        # A frozen backbone stays in eval mode: its batch-norm statistics (and dropout) are part of the
        # pretrained function that "frozen" keeps.
        super().train(mode)
        if self.freeze_backbone:
            self.backbone.eval()
            self.head.train(mode)
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images
        if self.input_size is not None and x.shape[-2:] != (self.input_size, self.input_size):
            shrink = x.shape[-1] > self.input_size or x.shape[-2] > self.input_size
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False,
                              antialias=shrink)
        if self.normalize:
            x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return self.backbone(x)
