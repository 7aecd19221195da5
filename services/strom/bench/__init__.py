"""Benchmarks behind ``strom bench``: numbers are printed, never asserted (DESIGN §11)."""
