"""sparkdp: distributed data-parallel training of PyTorch models on Apache Spark.

Several ways in, one engine:

* ``sparkdp.fit(model, data, ...)`` trains and returns the trained model;
* ``sparkdp.run(train_fn, workers=N)`` runs your own loop on N Spark tasks, where
  ``sparkdp.distribute(model, optimizer, loader)`` makes it distributed;
* ``sparkdp.launch("train.py", ...)`` / ``sparkdp launch train.py -- ARGS`` runs a whole
  script, unmodified or with that one line, as every worker;
* ``sparkdp train SCRIPT.py`` trains a script's module-level ``model`` and ``train_data``;
* ``sparkdp.predict`` and ``sparkdp.generate`` score rows and generate text on a DataFrame.

The user guide (``make docs``) has how-to guides, the API reference and runnable examples.
"""

from .config import Columns, JobConfig
from .driver import fit, fit_job, launch, run
from .errors import ConfigError, DataError, RendezvousTimeout, SparkdpError, WorkerFailed
from .spark.generate import generate
from .spark.predict import predict
from .spark.session import session
from .strategies import STRATEGIES
from .train.batch import model_loss
from .train.distribute import distribute, is_main_process, unwrap
from .train.result import TrainResult
from .tuning.tune import tune

__version__ = "0.1.0"

__all__ = [
    "STRATEGIES",
    "Columns",
    "ConfigError",
    "DataError",
    "JobConfig",
    "RendezvousTimeout",
    "SparkdpError",
    "TrainResult",
    "WorkerFailed",
    "__version__",
    "distribute",
    "fit",
    "fit_job",
    "generate",
    "is_main_process",
    "launch",
    "model_loss",
    "predict",
    "run",
    "session",
    "tune",
    "unwrap",
]
