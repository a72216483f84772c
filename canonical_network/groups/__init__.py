"""Group elements and their actions on the inputs of each task."""
