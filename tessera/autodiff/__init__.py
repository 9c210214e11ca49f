"""Reverse-mode automatic differentiation of the Graph IR (see ``passes/autodiff.py``)."""
