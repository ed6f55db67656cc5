"""Finished runs through the live engine: `replay`'s timeline and its HTML report."""
