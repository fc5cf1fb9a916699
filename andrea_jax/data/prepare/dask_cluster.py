"""The Dask cluster of `prepare --runner dask` (the `dask` extra): a running scheduler at
`--scheduler ADDRESS`, checked before the pipeline starts (it answers, it has workers, and they can
import this package: otherwise the run would wait or fail deep inside Beam), or a local cluster of
`--workers` processes of one thread each (the tokenizer is single-threaded per shard), closed after.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import logging
from typing import Iterator

from andrea_jax.errors import DataError, MissingExtraError, is_missing

PACKAGE = "andrea-jax"


@contextlib.contextmanager
def scheduler(address: str | None, workers: int, timeout_s: float = 30.0) -> Iterator[str]:
    """The address of the scheduler to run on, for the duration of the block."""
    try:
        import distributed
    except ImportError as err:
        if not is_missing(err, "distributed", "dask"):
            raise
        raise MissingExtraError("andrea-prepare --runner dask", "dask") from None
    # Set after the import, which configures it: the scheduler of a local cluster logs every step at INFO.
    logging.getLogger("distributed").setLevel(logging.WARNING)
    if address is None:
        with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                      dashboard_address=":0", silence_logs=logging.ERROR) as cluster:
            yield cluster.scheduler_address
        return
    check(address, timeout_s)
    yield address


def check(address: str, timeout_s: float) -> None:
    """Refuses, in one line, a scheduler that does not answer, has no worker, or has a worker
    without this package."""
    import distributed

    try:
        client = distributed.Client(address, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise DataError(f"--scheduler {address}: no Dask scheduler answered in {timeout_s:.0f} s "
                        f"({type(e).__name__})") from None
    with client:
        try:
            client.wait_for_workers(1, timeout=timeout_s)
        except TimeoutError:
            raise DataError(f"--scheduler {address} has no worker after {timeout_s:.0f} s: start "
                            f"`dask worker {address}` where this package is installed") from None
        # importlib.metadata.version travels by reference: any worker's Python can run it.
        found = client.run(importlib.metadata.version, PACKAGE, on_error="return")
        missing = sorted(w for w, v in found.items() if isinstance(v, BaseException))
        if missing:
            raise DataError(f"--scheduler {address}: {len(missing)} worker(s) ({', '.join(missing)}) do not have "
                            f"{PACKAGE} installed: install it (pip install {PACKAGE}[dask]) where the workers run")
