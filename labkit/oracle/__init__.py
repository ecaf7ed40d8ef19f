"""Independent engines as stage-level oracles. `llamacpp`: llama.cpp through llama-cpp-python (extra `oracle`).

Importing this package does not import llama_cpp; `run_llamacpp` does, on first use, and
raises OracleUnavailableError when it is not installed.
"""

from labkit.oracle.llamacpp import MAPPINGS, NO_COUNTERPART, ORACLE_THRESHOLDS, coverage
from labkit.oracle.llamacpp_run import run_llamacpp

__all__ = ["MAPPINGS", "NO_COUNTERPART", "ORACLE_THRESHOLDS", "coverage", "run_llamacpp"]
