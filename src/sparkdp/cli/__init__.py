"""The ``sparkdp`` command line."""
