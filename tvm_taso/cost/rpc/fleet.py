"""A fleet of RPC devices as the command line names it, checked before any search starts.

``"host:port/key"`` is a tracker and the key its devices registered under (one measurer per
device registered there); ``"host:port,host:port"`` (or a list) are RPC servers, one measurer
each. :func:`open_fleet` makes the :class:`~tvm_taso.cost.rpc.pool.RPCPool`, :func:`fleet_cost`
the measured cost model on it (``cost_model="rpc"``, ``--cost rpc --rpc SPEC``).
"""

from __future__ import annotations

import socket
import struct

from tvm_taso.cost.rpc.measured_cost import RPCMeasuredCost
from tvm_taso.cost.rpc.measurer import RPCMeasurer, RPCUnavailable
from tvm_taso.cost.rpc.pool import RPCPool

CONNECT_SECONDS = 5.0
FORMS = "host:port/key (a tracker and its devices' key) or host:port[,host:port...] (servers)"


def parse(spec) -> dict:
    """``{"tracker": (host, port), "key": key}`` or ``{"servers": [(host, port), ...]}``;
    ValueError (one line) for anything else."""
    items = [spec] if isinstance(spec, str) else list(spec or [])
    text = ",".join(str(s) for s in items).strip()
    if not text:
        raise ValueError(f"rpc: nothing given; expected {FORMS}")
    if "/" in text:
        where, _, key = text.partition("/")
        if "," in where or not key:
            raise ValueError(f"rpc {text!r}: expected {FORMS}")
        return {"tracker": _address(where, text), "key": key}
    return {"servers": [_address(part, text) for part in text.split(",")]}


def _address(part: str, spec: str) -> tuple[str, int]:
    host, sep, port = part.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"rpc {spec!r}: {part.strip()!r} is not host:port; expected {FORMS}")
    return host, int(port)


def _reachable(host: str, port: int, what: str, key: str = "") -> None:
    """:class:`RPCUnavailable` (one line) unless a TVM RPC ``what`` ("tracker" or "server")
    answers its handshake at ``host:port`` within :data:`CONNECT_SECONDS`: a port that accepts
    and never answers, or that speaks another protocol (a tracker given as a server), is said
    before any search rather than hung on or failed in the middle of one."""
    from tvm.rpc import base

    if what == "tracker":
        hello, answers = struct.pack("<i", base.RPC_TRACKER_MAGIC), {base.RPC_TRACKER_MAGIC}
    else:
        name = f"client:{key}".encode()
        hello = struct.pack("<i", base.RPC_MAGIC) + struct.pack("<i", len(name)) + name
        answers = {base.RPC_CODE_SUCCESS, base.RPC_CODE_MISMATCH, base.RPC_CODE_DUPLICATE}
    try:
        with socket.create_connection((host, port), timeout=CONNECT_SECONDS) as sock:
            sock.settimeout(CONNECT_SECONDS)
            sock.sendall(hello)
            reply = b""
            while len(reply) < 4:
                chunk = sock.recv(4 - len(reply))
                if not chunk:
                    break
                reply += chunk
    except socket.timeout:
        raise RPCUnavailable(f"the RPC {what} at {host}:{port} did not answer within {CONNECT_SECONDS:g} s") from None
    except OSError as err:
        raise RPCUnavailable(f"cannot reach the RPC {what} at {host}:{port} ({err.strerror or err})") from None
    if len(reply) < 4 or struct.unpack("<i", reply)[0] not in answers:
        raise RPCUnavailable(f"{host}:{port} is not a TVM RPC {what} (it does not answer the {what} handshake)")


def open_fleet(spec, **measurer_options) -> RPCPool:
    """The :class:`RPCPool` of the devices ``spec`` names (see :func:`parse`); raises
    :class:`RPCUnavailable` (one line) when a tracker or server cannot be reached, or a tracker
    has no device under the key."""
    fleet = parse(spec)
    if "tracker" in fleet:
        from tvm import rpc

        host, port = fleet["tracker"]
        _reachable(host, port, "tracker")
        queues = rpc.connect_tracker(host, port).summary().get("queue_info", {})
        devices = int(queues.get(fleet["key"], {}).get("free", 0)) + int(queues.get(fleet["key"], {}).get("pending", 0))
        if devices < 1:
            raise RPCUnavailable(f"the tracker at {host}:{port} has no device under key {fleet['key']!r} "
                                 f"(keys: {', '.join(sorted(queues)) or 'none'})")
        return RPCPool.from_tracker((host, port), fleet["key"], devices, **measurer_options)
    for host, port in fleet["servers"]:
        _reachable(host, port, "server")
    return RPCPool([RPCMeasurer(host, port, **measurer_options) for host, port in fleet["servers"]])


def fleet_cost(spec, target, db=None, **measurer_options) -> RPCMeasuredCost:
    """The measured cost model pricing kernels on the fleet ``spec`` names, for ``target``."""
    return RPCMeasuredCost(open_fleet(spec, **measurer_options), target, db)
