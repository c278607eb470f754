"""How workers reach the parameter server: in-process (tests, one worker) or TCP."""

from sparkdp.ps.transport.base import Client, ConnectFailed, ConnectInfo, Endpoint, Transport
from sparkdp.ps.transport.inproc import InProcTransport
from sparkdp.ps.transport.tcp import TcpOptions, TcpTransport

__all__ = [
    "Client",
    "ConnectFailed",
    "ConnectInfo",
    "Endpoint",
    "InProcTransport",
    "TcpOptions",
    "TcpTransport",
    "Transport",
]
