"""Fixtures of the Python tests: a pool of ranks per world size, spawned once.

Each world size's ranks are forked once (a gloo process group over loopback) and then run many
cases: a test sends a function and its arguments to every rank and gets every rank's result
back. A rank's exception comes back as text, and the test fails with every failing rank's
traceback. Run from a source tree, the package comes from python/ and the library from
$ASYNCTP_LIBRARY or build*/lib/libasynctp_c.so; an installed package is used as installed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _use_source_tree() -> None:
    try:
        import asynctp._capi as capi

        capi.library_path()
        return
    except ImportError:
        pass
    for name in list(sys.modules):
        if name == "asynctp" or name.startswith("asynctp."):
            del sys.modules[name]
    sys.path.insert(0, str(REPO / "python"))
    if "ASYNCTP_LIBRARY" not in os.environ:
        for build in ("build", "build-cpu"):
            candidate = REPO / build / "lib" / "libasynctp_c.so"
            if candidate.exists():
                os.environ["ASYNCTP_LIBRARY"] = str(candidate)
                break


_use_source_tree()

import torch  # noqa: E402

# A case that hangs fails after this many seconds (asynctp's own waits are bounded below it).
CASE_TIMEOUT_S = 120
RANK_TIMEOUT_S = 60


def package_env() -> dict:
    """The environment of a subprocess that imports the asynctp imported here (the benchmarks'
    command lines), one thread per process, quiet logs."""
    import asynctp

    env = dict(os.environ)
    package_root = str(Path(asynctp.__file__).resolve().parents[1])
    paths = [package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("ASYNCTP_LOG_LEVEL", "error")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, conn) -> None:
    import torch.distributed as dist

    import asynctp.torch as atp

    torch.set_num_threads(1)
    os.environ.setdefault("ASYNCTP_LOG_LEVEL", "error")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    atp.set_options(timeout_s=RANK_TIMEOUT_S, dispatch_cache="off")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args, kwargs = msg
        try:
            conn.send((True, fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 (every failure goes back to the test)
            conn.send((False, f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    dist.destroy_process_group()
    conn.send((True, None))


class RankPool:
    """world_size forked ranks in one gloo group; run(fn, ...) calls fn on every rank."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        ctx = mp.get_context("fork")
        port = _free_port()
        self.conns, self.procs = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, world_size, port, child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self, fn, *args, **kwargs) -> list:
        for conn in self.conns:
            conn.send((fn, args, kwargs))
        results, failures = [], []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(CASE_TIMEOUT_S):
                self.close(force=True)
                pytest.fail(f"rank {rank} of {self.world_size} hung in {fn.__name__}")
            ok, value = conn.recv()
            results.append(value)
            if not ok:
                failures.append(value)
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)
        return results

    def close(self, force: bool = False) -> None:
        if not force:
            for conn in self.conns:
                conn.send(None)
            for conn in self.conns:
                if conn.poll(30):
                    conn.recv()
        for proc in self.procs:
            proc.join(timeout=5 if not force else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.conns, self.procs = [], []


@pytest.fixture(scope="session", params=[1, 2, 3, 4], ids=lambda ws: f"ws{ws}")
def pool(request):
    p = RankPool(request.param)
    yield p
    p.close()


@pytest.fixture(scope="session")
def pool2():
    p = RankPool(2)
    yield p
    p.close()


@pytest.fixture(scope="session")
def pool4():
    p = RankPool(4)
    yield p
    p.close()


@pytest.fixture(scope="session")
def pool8():
    p = RankPool(8)
    yield p
    p.close()
