"""Parameter server: centre state, per-shard versions and locking, checkpoints.

Transports (in-process, authenticated TCP) live in :mod:`sparkdp.ps.transport`; this
package itself opens no sockets (design rule 1, docs/architecture.md).

Example (driver, then each task; see :mod:`sparkdp.ps.transport.base`)::

    server = ParameterServer(lambda shard: RULES.create("asgd", lr=0.1), list(model.parameters()))
    endpoint = TcpTransport().serve(server, host=driver_host)      # endpoint.info: address + secret
    client = TcpTransport().connect(info.address, info.secret, worker_id, tls_cert=info.tls_cert)
    versions, center = client.pull()
    client.push(seq, versions, grads, num_samples=n)
"""

from sparkdp.ps.auth import new_secret
from sparkdp.ps.server import ParameterServer, Pulled, PushAck, PushRejected
from sparkdp.ps.sharding import ShardPlan

__all__ = ["ParameterServer", "Pulled", "PushAck", "PushRejected", "ShardPlan", "new_secret"]
