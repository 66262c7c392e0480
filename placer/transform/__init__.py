"""Graph transforms that run before placement: coarsening, fusion, op splitting, replication; each maps back."""
