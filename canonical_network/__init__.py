"""canonical_network."""
