"""canonical_network: learned canonicalization (Kaba et al., ICML 2023) as a Python API and a Hydra project.

Without Hydra (docs/api.md)::

    import canonical_network as cn
    canonicalizer = cn.GCNNCanonicalizer(num_rotations=4, in_channels=1, image_size=28)
    model = cn.CanonicalizedModel(canonicalizer, my_backbone)
    cn.check_equivariance(model.eval(), images)

Every canonicalizer takes the keys of its ``configs/canonicalization/<name>.yaml`` as keyword arguments, with
the same names and defaults. The names below are imported on first use (module ``__getattr__``), so
``import canonical_network`` stays cheap and imports neither torch nor escnn.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any


def _leave_the_working_directory_off_the_path() -> None:
    """``python -m canonical_network.<entry>`` puts the working directory first on ``sys.path`` (``-m`` does), so
    whatever lies there would run: a module named like a dependency (``yaml.py``, ``torch/``), or a
    ``hydra_plugins/*.py`` file, which Hydra imports when it looks for plugins. The entry points need nothing
    from it, so when this package is imported by ``-m`` (``sys.argv[0]`` is ``"-m"`` while Python locates the
    module) the entry is dropped, and ``PYTHONSAFEPATH=1`` keeps it off in the Python processes the command
    starts (local launcher jobs, worker processes). The folder is noted (:data:`USER_CODE_DIR_VARIABLE`):
    building a component the user named (``prediction._target_=my_model.Net``) puts it back, at the end of
    the path, where it shadows nothing (``utils/trust.py``). The console scripts (``cn-train``...) never add
    it. Importing the package from your own code changes nothing."""
    if sys.argv[:1] != ["-m"] or not sys.path or sys.flags.safe_path:
        return
    first = sys.path[0]
    if first in ("", os.curdir) or os.path.abspath(first) == os.getcwd():
        del sys.path[0]
        os.environ["PYTHONSAFEPATH"] = "1"
        os.environ.setdefault(USER_CODE_DIR_VARIABLE, os.getcwd())


#: The environment variable naming the working directory ``python -m`` would have put on the path.
USER_CODE_DIR_VARIABLE = "CANONICAL_NETWORK_USER_CODE_DIR"

_leave_the_working_directory_off_the_path()


#: exported name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # h, f and the composition φ(x) = h'(x) · f(h(x)⁻¹ · x)
    "Canonicalizer": "canonical_network.canonicalization.base",
    "CanonicalizedModel": "canonical_network.canonicalization.base",
    "IdentityCanonicalizer": "canonical_network.canonicalization.identity",
    "GCNNCanonicalizer": "canonical_network.canonicalization.image",
    "PCACanonicalizer": "canonical_network.canonicalization.image",
    "OptimizationCanonicalizer": "canonical_network.canonicalization.image_optimization",
    "TestTimeCanonicalizer": "canonical_network.canonicalization.test_time",
    "VNDeepSetsCanonicalizer": "canonical_network.canonicalization.nbody",
    "VNPointCloudCanonicalizer": "canonical_network.canonicalization.pointcloud",
    "PermutationCanonicalizer": "canonical_network.canonicalization.permutation",
    "ProductCanonicalizer": "canonical_network.canonicalization.product",
    "canonicalizer_from_checkpoint": "canonical_network.canonicalization.pretrained",
    # group elements, their samplers and Gram–Schmidt
    "GroupElement": "canonical_network.groups",
    "PlanarElement": "canonical_network.groups.image",
    "EuclideanTransform": "canonical_network.groups.euclidean",
    "random_rotations": "canonical_network.groups.euclidean",
    "random_orthogonal": "canonical_network.groups.euclidean",
    "random_axis_rotations": "canonical_network.groups.euclidean",
    "random_euclidean": "canonical_network.groups.euclidean",
    "PermutationElement": "canonical_network.groups.permutation",
    "ProductElement": "canonical_network.groups.product",
    "random_permutations": "canonical_network.groups.permutation",
    "gram_schmidt": "canonical_network.groups.euclidean",
    # the equivariance check
    "check_equivariance": "canonical_network.equivariance",
    "EquivarianceResult": "canonical_network.equivariance",
}
#: exported names that differ from the name in their module
_RENAMED = {"canonicalizer_from_checkpoint": "from_checkpoint"}

__all__ = [
    "CanonicalizedModel",
    "Canonicalizer",
    "EquivarianceResult",
    "EuclideanTransform",
    "GCNNCanonicalizer",
    "GroupElement",
    "IdentityCanonicalizer",
    "OptimizationCanonicalizer",
    "PCACanonicalizer",
    "PermutationCanonicalizer",
    "PermutationElement",
    "PlanarElement",
    "ProductCanonicalizer",
    "ProductElement",
    "TestTimeCanonicalizer",
    "VNDeepSetsCanonicalizer",
    "VNPointCloudCanonicalizer",
    "canonicalizer_from_checkpoint",
    "check_equivariance",
    "gram_schmidt",
    "random_axis_rotations",
    "random_euclidean",
    "random_orthogonal",
    "random_permutations",
    "random_rotations",
]

if TYPE_CHECKING:  # what static tools see; at run time the names are resolved by __getattr__
    from canonical_network.canonicalization.base import CanonicalizedModel, Canonicalizer
    from canonical_network.canonicalization.identity import IdentityCanonicalizer
    from canonical_network.canonicalization.image import GCNNCanonicalizer, PCACanonicalizer
    from canonical_network.canonicalization.image_optimization import OptimizationCanonicalizer
    from canonical_network.canonicalization.nbody import VNDeepSetsCanonicalizer
    from canonical_network.canonicalization.permutation import PermutationCanonicalizer
    from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
    from canonical_network.canonicalization.pretrained import from_checkpoint as canonicalizer_from_checkpoint
    from canonical_network.canonicalization.product import ProductCanonicalizer
    from canonical_network.canonicalization.test_time import TestTimeCanonicalizer
    from canonical_network.equivariance import EquivarianceResult, check_equivariance
    from canonical_network.groups import GroupElement
    from canonical_network.groups.euclidean import (
        EuclideanTransform,
        gram_schmidt,
        random_axis_rotations,
        random_euclidean,
        random_orthogonal,
        random_rotations,
    )
    from canonical_network.groups.image import PlanarElement
    from canonical_network.groups.permutation import PermutationElement, random_permutations
    from canonical_network.groups.product import ProductElement


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'canonical_network' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
