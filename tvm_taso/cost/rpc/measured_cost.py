""":class:`RPCMeasuredCost`: the measured cost model pricing kernels on remote devices."""

from __future__ import annotations

from tvm_taso.cost.measure import MeasuredCost


class RPCMeasuredCost(MeasuredCost):
    """:class:`~tvm_taso.cost.measure.MeasuredCost` handed ``measurer`` (an
    :class:`~tvm_taso.cost.rpc.measurer.RPCMeasurer` or :class:`~tvm_taso.cost.rpc.pool.RPCPool`):
    the database, budget and fallback work the same. Records are kept under the measurer's
    :meth:`~tvm_taso.cost.rpc.measurer.RPCMeasurer.record_target`."""

    remote = True  # its timings are the remote's: regions cannot be timed here in its stead

    def __init__(self, measurer, target=None, db=None, **kw):
        super().__init__(target, db, measurer=measurer, **kw)
