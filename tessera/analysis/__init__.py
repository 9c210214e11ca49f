"""Analyses over graph IR that look ops up in the op table (:mod:`tessera.opdefs`)."""
