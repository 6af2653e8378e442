"""Remote and parallel measurement through TVM's RPC, the way MetaSchedule's ``RPCRunner`` does.

A kernel is built *here* for the remote's target, uploaded to an RPC server (directly, or a
session handed out by a tracker), loaded and timed there with a Relax VM on the remote device.

* :mod:`.measurer`: :class:`RPCMeasurer`, a *measurer* for
  :class:`~tvm_taso.cost.measure.MeasuredCost` that times kernels on one RPC device, and the
  worker-side build-upload-time step it runs.
* :mod:`.pool`: :class:`RPCPool`, several measurers used at once, one kernel per device.
* :mod:`.measured_cost`: :class:`RPCMeasuredCost`, the measured cost model handed one of them.
* :mod:`.processes`: :class:`LocalServer` / :class:`LocalTracker`, an RPC server / tracker in a
  child process, which runs this package's command line (:mod:`.__main__`:
  ``python -m tvm_taso.cost.rpc server|tracker``).
"""

from .measured_cost import RPCMeasuredCost
from .measurer import RPCMeasurer, RPCUnavailable, connect, run_remote_measurement
from .pool import RPCPool
from .processes import LocalServer, LocalTracker

__all__ = [
    "LocalServer",
    "LocalTracker",
    "RPCMeasuredCost",
    "RPCMeasurer",
    "RPCPool",
    "RPCUnavailable",
    "connect",
    "run_remote_measurement",
]
