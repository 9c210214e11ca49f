"""Tessera's IR: the graph, schedule and tile dialects, their attributes (meshes, shardings,
reduction kinds), shape and sharding rules, verifiers, and builders of their ops."""

from tessera.ir import lexer_fix

lexer_fix.install()
