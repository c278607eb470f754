"""Hyperparameter search over sparkdp jobs with Optuna: the search grammar (``space``), the
study and its storage (``study``), and trials run concurrently on the cluster's slots (``runner``)."""
