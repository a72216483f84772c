"""Diagnose a model: is φ equivariant where the data says it must be, is h, which poses does h choose, and
does the output jump under small perturbations.

* :mod:`~canonical_network.diagnostics.symmetries` — per task family, the group elements a diagnosis samples
  and their actions on inputs and outputs;
* :mod:`~canonical_network.diagnostics.measures` — the measures (:func:`~.measures.diagnose` runs them all);
* :mod:`~canonical_network.diagnostics.figures` — inputs beside their canonical versions, pose histograms;
* :mod:`~canonical_network.diagnostics.summary` — the console table, the CI verdict, flat numbers for loggers.

The command line is :mod:`canonical_network.diagnose`.
"""

from canonical_network.diagnostics.measures import Diagnosis, diagnose
from canonical_network.diagnostics.symmetries import Symmetry, symmetry_for

__all__ = ["Diagnosis", "Symmetry", "diagnose", "symmetry_for"]
