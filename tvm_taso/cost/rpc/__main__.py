"""``python -m tvm_taso.cost.rpc server|tracker``: a TVM RPC server or tracker that prints its
port as one JSON line, then serves; what :mod:`tvm_taso.cost.rpc.processes` starts."""

from __future__ import annotations

import json
import sys


def _serve(args) -> int:
    from tvm.rpc.server import PopenRPCServerState

    tracker = None
    if args.tracker:
        h, _, p = args.tracker.rpartition(":")
        tracker = (h, int(p))
    state = PopenRPCServerState(args.host, args.port, args.port_end or args.port + 100, tracker_addr=tracker, key=args.key,
                                silent=not args.verbose)
    print(json.dumps({"port": state.port}), flush=True)
    state.thread.join()
    return 0


def _track(args) -> int:
    try:
        from tvm.rpc.tracker import PopenTrackerServerState
    except ImportError as err:
        print(f"the RPC tracker needs tornado ({err}); pip install tornado", file=sys.stderr)
        return 2
    state = PopenTrackerServerState(args.host, args.port, args.port_end or args.port + 100, silent=not args.verbose)
    print(json.dumps({"port": state.port}), flush=True)
    state.thread.join()
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tvm_taso.cost.rpc",
                                description="A TVM RPC server or tracker (prints its port as JSON, then serves).")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("server", help="an RPC server (runs whatever its clients send: keep it on a trusted network)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=9090)
    s.add_argument("--port-end", type=int, default=None, help="last port to try + 1 (default port + 100)")
    s.add_argument("--tracker", help="register with this tracker (host:port)")
    s.add_argument("--key", default="", help="device key at the tracker")
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(func=_serve)
    t = sub.add_parser("tracker", help="an RPC tracker")
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=int, default=9190)
    t.add_argument("--port-end", type=int, default=None, help="last port to try + 1 (default port + 100)")
    t.add_argument("-v", "--verbose", action="store_true")
    t.set_defaults(func=_track)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
