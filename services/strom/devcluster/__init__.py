"""Run a local strom cluster as real processes: used by ``strom dev up`` and by the tests."""
