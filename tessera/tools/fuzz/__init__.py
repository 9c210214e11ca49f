"""A mutation fuzzer for ``tessera-opt``: no input may end in a traceback or a hang.

Seeds are the lit tests' IR inputs (:mod:`.corpus`); each fuzzed input is a seed after
byte, token, line, type, attribute, nesting or crossover mutations (:mod:`.mutations`),
run with one of its file's pass pipelines or none, in a persistent worker process
(:mod:`.opt_worker`), and judged (:mod:`.verdict`). :func:`fuzz` runs a campaign
(:mod:`.campaign`); ``benchmarks/fuzz_opt.py`` runs one by hand, and
``tests/unit/test_fuzz_opt.py`` runs a small one in the test suite.
"""

from tessera.tools.fuzz.campaign import Report, fuzz
from tessera.tools.fuzz.corpus import Seed, load_seeds

__all__ = ["Report", "Seed", "fuzz", "load_seeds"]
