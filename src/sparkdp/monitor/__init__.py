"""Live monitoring: worker probes report to a driver-side hub (display, run log, TensorBoard,
MLflow, straggler warnings); ``sparkdp report`` draws finished runs. See docs/architecture.md."""

from .probe import MonitorLink, NoProbe, Probe, open_probe

__all__ = ["MonitorLink", "NoProbe", "Probe", "open_probe"]
