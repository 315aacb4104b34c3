"""Side-by-side benchmarks: ``python -m benchmarks SUITE --device cpu|cuda [--quick]`` (see ``__main__``)."""
