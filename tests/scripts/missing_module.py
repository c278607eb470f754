"""Imports a module no interpreter here has (to check the error names it and the interpreter)."""

import sparkdp_no_such_module  # noqa: F401
