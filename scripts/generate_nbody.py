"""Generate the charged-particle N-body dataset: ``python scripts/generate_nbody.py --out data/nbody``, the same
as ``python -m canonical_network.data.generate_nbody`` (which an installed package has too; its options there)."""

from __future__ import annotations

import sys

from canonical_network.data.generate_nbody import main

if __name__ == "__main__":
    sys.exit(main())
