"""Graph transforms before placement (coarsening, fusion, splitting, replication); each maps back to the original graph."""
