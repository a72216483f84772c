"""Where the real datasets come from: one :class:`DatasetSource` per archive, with its known URLs and checksum.

Each entry names the archive, the URLs to try in order (the original first, then the mirrors researchers use
today), the checksum the downloaded bytes must have and where that value was published, and the DataModule
that reads the unpacked files (its ``check_files`` says whether a folder is complete, its ``prepare_files``
builds the parsed caches). ``python -m canonical_network.data.download`` (:mod:`canonical_network.data.download`)
and the DataModules' ``prepare_data`` (``data.download=true``) read this table; data/README.md shows it.

A checksum is recorded only where a published value could be found, with its source; none is ever computed
here from a download and written back. Where none exists, ``checksum`` is None and ``why`` says so; the archive
is then checked by its size (where a published size exists) and by reading every member (zip CRCs).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

#: The copy of the checkout's ``data/README.md`` (the manual route, the URLs and checksums) that a wheel ships
#: beside this module (setup.py); an editable install or a checkout has none there.
_SHIPPED_README = Path(__file__).with_name("README.md")


def data_readme() -> str:
    """Where the datasets' instructions are, as an error message names them: ``data/README.md`` in a checkout,
    else the full path of the copy an installed wheel carries (a wheel has no ``data/`` folder of its own)."""
    return str(_SHIPPED_README) if _SHIPPED_README.is_file() else "data/README.md"


#: Digest algorithms a checksum may use (hashlib names).
CHECKSUM_ALGORITHMS = ("sha256", "md5")


@dataclass(frozen=True)
class Checksum:
    """A published digest of an archive: ``algorithm`` (``sha256`` or ``md5``), hex ``value``, and
    ``source``, where the value was published (so that a reader can check it)."""

    algorithm: str
    value: str
    source: str

    def __post_init__(self) -> None:
        if self.algorithm not in CHECKSUM_ALGORITHMS:
            raise ValueError(
                f"checksum algorithm must be one of {CHECKSUM_ALGORITHMS}; got {self.algorithm!r}"
            )
        if not self.value or any(c not in "0123456789abcdef" for c in self.value):
            raise ValueError(f"checksum value must be lower-case hex; got {self.value!r}")


@dataclass(frozen=True)
class DatasetSource:
    """One downloadable dataset archive.

    Args:
        name: registry key, the same as the data config (``configs/data/<name>.yaml``).
        archive: file name of the archive; ``--mirror URL`` fetches ``URL/<archive>``.
        folder: folder under the data root the DataModule reads (``data/<folder>``).
        urls: URLs to try, in order.
        checksum: published digest of the archive, or None (then ``why`` must say why there is none).
        why: why there is no checksum (None when there is one).
        size: published size of the archive in bytes, or None; ``size_source`` says where it was published.
        loader: ``"module:Class"`` of the DataModule that reads the unpacked folder.
        description: one line for messages and the docs.
    """

    name: str
    archive: str
    folder: str
    urls: tuple[str, ...]
    checksum: Checksum | None
    loader: str
    description: str
    why: str | None = None
    size: int | None = None
    size_source: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if (self.checksum is None) == (self.why is None):
            raise ValueError(f"{self.name}: give either a checksum or, when none is published, a `why`")
        if (self.size is None) != (self.size_source is None):
            raise ValueError(f"{self.name}: a size needs the source that published it")
        if not self.urls:
            raise ValueError(f"{self.name}: no URL")

    def loader_class(self) -> type:
        """The DataModule class named by ``loader`` (imported on first use: no imports at module load)."""
        module, _, attribute = self.loader.partition(":")
        return getattr(importlib.import_module(module), attribute)


ROTATED_MNIST = DatasetSource(
    name="rotated_mnist",
    archive="mnist_rotation_new.zip",
    folder="rotated_mnist",
    description="MNIST-rot (Larochelle et al. 2007): two .amat files, 12,000 train+validation and 50,000 test rows",
    urls=(
        # The LISA lab's page "Variations on the MNIST digits" links this file; research code still fetches it
        # from here (tscohen/gconv_experiments, dwromero/g_selfatt, the paper authors' oumarkaba/canonical_network).
        "http://www.iro.umontreal.ca/~lisa/icml2007data/mnist_rotation_new.zip",
        # The same server over HTTPS, for networks that block plain HTTP.
        "https://www.iro.umontreal.ca/~lisa/icml2007data/mnist_rotation_new.zip",
    ),
    checksum=Checksum(
        "md5",
        "0f9a947ff3d30e95cd685462cbf3b847",
        "dwromero/g_selfatt, datasets/mnist_rot.py (commit 95af302), where torchvision's "
        "download_and_extract_archive(md5=...) rejects any other file; the same value in "
        "david-knigge/separable-group-convolutional-networks, datasets/mnist_rot.py (commit 1f47d73). "
        "The LISA lab publishes no checksum.",
    ),
    loader="canonical_network.data.rotated_mnist:RotatedMNISTDataModule",
    notes=(
        "A Dropbox file of the same name (Harmonic Networks' code) holds preprocessed .npz files, not this "
        "archive; it is not a mirror.",
    ),
)

MODELNET40 = DatasetSource(
    name="modelnet40",
    archive="modelnet40_ply_hdf5_2048.zip",
    folder="modelnet40",
    description="ModelNet40 as PointNet's HDF5 files: 2,048 points per shape, 40 classes",
    urls=(
        # PointNet's (charlesq34/pointnet provider.py) and DGCNN's original link; refusing connections since
        # 2024 (charlesq34/pointnet#308, ma-xu/pointMLP-pytorch#98).
        "https://shapenet.cs.stanford.edu/media/modelnet40_ply_hdf5_2048.zip",
        # The Hugging Face mirror that maintainers point to today (vinits5/learning3d#23, comment of
        # 2025-03-01; charlesq34/pointnet#318).
        "https://huggingface.co/datasets/Msun/modelnet40/resolve/main/modelnet40_ply_hdf5_2048.zip",
    ),
    checksum=Checksum(
        "sha256",
        "07670e237db72ece0f723b9abb571534c9ad655a6456b389646587dc72bb8bae",
        "TensorFlow Graphics' TFDS checksum file for this URL: tensorflow/graphics, "
        "tensorflow_graphics/datasets/modelnet40/checksums.tsv (commit 10866c4) and "
        "checksums/model_net40.txt (its ModelNet40.zip entry agrees with InterDigitalInc/CompressAI's "
        "independently published hash)",
    ),
    size=435_212_151,
    size_source="the same TensorFlow Graphics checksum file",
    loader="canonical_network.data.modelnet:ModelNet40DataModule",
)

SHAPENET_PART = DatasetSource(
    name="shapenet_part",
    archive="shapenetcore_partanno_segmentation_benchmark_v0_normal.zip",
    folder="shapenet_part",
    description="ShapeNet-part as PointNet++'s text files with normals: 16 categories, 50 parts, 16,881 shapes",
    urls=(
        # PointNet++'s and torch_geometric.datasets.ShapeNet's link; refusing connections since 2024
        # (Julie-tang00/Point-BERT#75, Pang-Yatian/Point-MAE#56).
        "https://shapenet.cs.stanford.edu/media/shapenetcore_partanno_segmentation_benchmark_v0_normal.zip",
        # Hugging Face copies of the same file that point-cloud projects fetch today; the checksum below
        # decides whether what they serve is the original archive.
        "https://huggingface.co/datasets/cminst/ShapeNet/resolve/main/"
        "shapenetcore_partanno_segmentation_benchmark_v0_normal.zip",
        "https://huggingface.co/datasets/ShapeSplats/sharing/resolve/main/"
        "shapenetcore_partanno_segmentation_benchmark_v0_normal.zip",
    ),
    checksum=Checksum(
        "sha256",
        "0e26411700bae2da38ee8ecc719ba4db2e6e0133486e258665952ad5dfced0fe",
        "InterDigitalInc/CompressAI, compressai/datasets/pointcloud/shapenet.py (commit 4fb0456), HASHES, "
        "asserted after downloading the Stanford URL",
    ),
    loader="canonical_network.data.shapenet:ShapeNetPartDataModule",
)

#: Every downloadable dataset, by registry key (= data config name).
SOURCES: dict[str, DatasetSource] = {s.name: s for s in (ROTATED_MNIST, MODELNET40, SHAPENET_PART)}


def get_source(name: str) -> DatasetSource:
    """The registry entry ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        return SOURCES[name]
    except KeyError:
        raise KeyError(f"no downloadable dataset {name!r}; known: {', '.join(SOURCES)}") from None
