"""LightningModules, one per task family: losses, metrics and logging around a CanonicalizedModel."""
