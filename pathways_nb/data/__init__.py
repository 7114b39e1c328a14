"""Host-side data pipelines: Dask collections feeding virtual slices.

A Dask array put on a slice (``vs.put(x, spec)``) is computed by the Dask worker that
runs the slice's host and stored there in the same process; :func:`batches` walks a
dataset that way a batch at a time, a few batches ahead of the training loop:

>>> import dask.array as da
>>> x = da.from_zarr("train/x.zarr"); y = da.from_zarr("train/y.zarr")
>>> for bx, by in pw.data.batches((x, y), vs, batch_size=256):
...     params, opt_state, loss = step(params, opt_state, bx, by)

This package uses only the client's public API.
"""

from __future__ import annotations

from pathways_nb.data._batches import batches

__all__ = ["batches"]


def __dir__() -> list[str]:
    return __all__
