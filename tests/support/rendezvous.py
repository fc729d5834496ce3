"""A gang's ranks meeting as torchrun's do: rank 0 listens at $GPUFED_MASTER_ADDR and
$GPUFED_MASTER_PORT, every other rank connects and says who it is, and rank 0 prints whom it
met (`rank 0 of 3 met rank 1 on n1, rank 2 on n2`). The same on every runtime."""

from __future__ import annotations

import sys

_SCRIPT = """
import os, socket, sys, time
rank, n = int(os.environ["GPUFED_NODE_RANK"]), int(os.environ["GPUFED_NUM_NODES"])
addr = (os.environ["GPUFED_MASTER_ADDR"], int(os.environ["GPUFED_MASTER_PORT"]))
if rank == 0:
    server = socket.create_server(addr)
    met = sorted(server.accept()[0].recv(100).decode() for _ in range(n - 1))
    print("rank 0 of", n, "met", ", ".join(met))
    sys.exit(0)
deadline = time.monotonic() + 30  # as torchrun's ranks do: try until rank 0 listens
while True:
    try:
        peer = socket.create_connection(addr)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
peer.sendall(f"rank {rank} on {os.environ['GPUFED_NODE']}".encode())
"""

#: The command of a rank (the test's own Python: the runtimes pass PATH, not a venv).
RENDEZVOUS = (sys.executable, "-c", _SCRIPT)
