"""Which rank of a distributed launch this process is, read from the environment the
launcher sets (no MLX: the command line reads it before anything loads, to decide who
prints), and the errors that mean a lost connection between ranks.

mlx.launch sets MLX_RANK for the ring, JACCL and NCCL backends; mpirun sets its own.
"""

from __future__ import annotations

import os

from ..text import ascii_digits

SHARD_MODES = ("pipeline", "tensor")
_RANK_VARIABLES = ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
# how MLX's backends start the message of a failed send or receive
_BACKEND_PREFIXES = ("[ring]", "[jaccl]", "[mpi]", "[nccl]")


def launched() -> bool:
    """Whether a distributed launcher started this process (it may still be alone: -n 1)."""
    return any(name in os.environ for name in _RANK_VARIABLES)


def rank() -> int:
    """This process's rank (0 when not launched)."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if ascii_digits(value.strip()):
            return int(value)
    return 0


def is_main() -> bool:
    """Rank 0: the one that prints, serves and decides."""
    return rank() == 0


def is_lost_connection(error: BaseException) -> bool:
    """An MLX backend's error for a peer that went away (the ring backend raises
    "[ring] connection to a peer was lost" at the next transfer when a socket closes)."""
    return isinstance(error, RuntimeError) and str(error).lstrip().startswith(_BACKEND_PREFIXES)


def lost_connection_message(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (
        f"the connection to another rank was lost ({first}): a rank stopped or the network failed, so every rank stops"
    )


def free_ring_ports() -> int:
    """A port p with p and p + 1 free on 127.0.0.1: `mlx.launch --backend ring -n 2
    --starting-port p` on one machine listens on one per rank (tests, demos)."""
    import socket

    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")
