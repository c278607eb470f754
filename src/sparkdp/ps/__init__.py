"""Parameter server: centre state, per-shard versions and locking, its state dict (saved as
checkpoints by :mod:`sparkdp.train.checkpoint_store`).

Transports (in-process, authenticated TCP) live in :mod:`sparkdp.ps.transport`; this
package itself opens no sockets (design rule 1, docs/architecture.md).

How the driver serves it and each task connects: :mod:`sparkdp.ps.transport.base`.
"""

from sparkdp.ps.auth import new_secret
from sparkdp.ps.server import ParameterServer, Pulled, PushAck, PushRejected
from sparkdp.ps.sharding import ShardPlan

__all__ = ["ParameterServer", "Pulled", "PushAck", "PushRejected", "ShardPlan", "new_secret"]
