"""Side-by-side benchmarks of pathways_nb against plain JAX (JSON out)."""
