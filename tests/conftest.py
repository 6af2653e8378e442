"""The test processes (one per core, pytest-xdist) search regions in one process each unless a
test asks for workers: region workers on top of them would only share the same cores."""

import os

os.environ.setdefault("TVM_TASO_WORKERS", "1")
