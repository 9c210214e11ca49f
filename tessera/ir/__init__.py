"""Tessera's IR: dialects, meshes, shardings and the helpers the passes share."""

from tessera.ir import lexer_fix

lexer_fix.install()
