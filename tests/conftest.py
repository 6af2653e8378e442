"""The test processes (one per core, pytest-xdist) search regions in one process each unless a
test asks for workers: region workers on top of them would only share the same cores. For the
same reason each runs TVM's parallel kernels (CPU builds are scheduled in parallel) on one
thread: thread pools spinning side by side on two cores slow each other a hundredfold, past the
measurements' timeouts (RPC servers started by a test inherit it)."""

import os

os.environ.setdefault("TVM_TASO_WORKERS", "1")
os.environ.setdefault("TVM_NUM_THREADS", "1")
