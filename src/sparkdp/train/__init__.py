"""The training engine: the worker loop and the fit / run / distribute entry points."""
