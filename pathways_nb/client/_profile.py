"""``client.profile``: XLA's own profiler (``jax.profiler``) run on the hosts of a
client's slices while a step runs, as Pathways on Cloud collects its workers' traces.

Each host writes its trace into a folder of its own under the path given, on the hosts'
filesystem (as ``pw.save`` writes checkpoints): ``PATH/HOST/plugins/profile/RUN/``, the
host's name made a file name (``tcp_10.0.0.5_40123``), the layout TensorBoard's and
XProf's profile tools read (``--logdir PATH``), with a Perfetto trace beside XLA's own
files. Each host also sends its Perfetto trace back (up to 64 MiB),
so that ``pw.viz.write_trace(client.events(), path, profile=prof)`` draws the runtime's
schedule and every host's XLA events on one time axis.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gzip
import json
import math
import os
import time
from typing import TYPE_CHECKING, Any

from pathways_nb._core import PROFILE_MAX_SECONDS, BrokenError, ClosedError
from pathways_nb.client._waiting import block

if TYPE_CHECKING:
    from pathways_nb.client._session import Client


@dataclasses.dataclass(frozen=True)
class HostTrace:
    """What one host's profiler wrote: its folder and files on the host's filesystem,
    when it ran (seconds since the epoch), and its Perfetto trace's events (empty when
    the trace was too large to send: ``left_out`` says why)."""

    host: str
    folder: str
    files: tuple[str, ...]
    started: float
    ended: float
    why: str
    events: tuple[dict[str, Any], ...] = ()
    left_out: str = ""

    def __repr__(self) -> str:
        return (
            f"HostTrace(host={self.host!r}, folder={self.folder!r}, files={len(self.files)}, "
            f"{self.ended - self.started:.3f} s, {self.why}, {len(self.events)} events)"
        )


class Profile:
    """XLA's profiler on the hosts of this client's slices, between :meth:`start` and
    :meth:`stop`, or around a ``with`` block::

        with client.profile("/tmp/profiles/step") as prof:
            state = step(state, batch)
        prof.hosts                      # a HostTrace per host: folder, files, times
        pw.viz.write_trace(client.events(since=prof.started), "step.json", profile=prof)

    Leaving the block (or :meth:`stop`) first waits for the launches this client
    submitted, so the trace holds them whole. ``path`` is an absolute folder on the
    hosts' filesystem; ``slices`` limits the hosts to those of the slices given
    (default: every slice of the client); ``python=True`` also traces the hosts' Python
    (costly: every call of the runtime's own threads); a host ends a profile after
    ``limit`` seconds (at most an hour) on its own.
    """

    def __init__(
        self,
        client: Client,
        path: str | os.PathLike[str],
        *,
        slices: Any = None,
        python: bool = False,
        limit: float = 600.0,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"a profile's path is a folder's name; got {type(path).__name__}")
        if not os.path.isabs(path):
            raise ValueError(
                "a profile's path is an absolute folder on the hosts' filesystem, as the "
                f"hosts resolve it from working directories of their own; got {path!r} "
                f"(os.path.abspath gives this machine's: {os.path.abspath(path)!r})"
            )
        if type(python) is not bool:
            raise TypeError(f"python is True or False; got {python!r}")
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not 0 < limit <= PROFILE_MAX_SECONDS
            or math.isnan(limit)
        ):
            raise ValueError(
                f"limit is the most seconds the profile may run, above 0 and at most "
                f"{PROFILE_MAX_SECONDS:.0f}; got {limit!r}"
            )
        self.path = os.fspath(path)
        self.python = python
        self.limit = float(limit)
        self._client = client
        self._slices = slices
        self._addresses: dict[str, str] = {}  # host name -> its data-plane address
        self.started: float | None = None
        self.hosts: list[HostTrace] = []
        self._state = "new"

    def __repr__(self) -> str:
        where = ", ".join(sorted(self._addresses)) or "no hosts yet"
        return f"<pw.Profile {self.path} on {where}: {self._state}>"

    def __enter__(self) -> Profile:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Profile:
        """Start XLA's profiler on the hosts; returns once all have started. A host
        that cannot start (another client profiles it; the folder is not writable)
        raises, and the others are stopped again."""
        if self._state != "new":
            raise RuntimeError(f"this profile is {self._state}; make a new one to profile again")
        client = self._client
        client._check_open()
        self._addresses = _hosts_of(client, self._slices)
        header = {"t": "profile", "op": "start", "path": self.path, "python": self.python}
        asks = {
            host: client._io.host_request(address, dict(header, limit=self.limit))
            for host, address in self._addresses.items()
        }
        try:
            block(list(asks.values()), [client])
            failed = [f.exception() for f in asks.values() if f.exception() is not None]
            if failed:
                raise failed[0]  # type: ignore[misc]
        except BaseException:  # a host refused, or Ctrl-C: the others stop again
            self._stop_quietly(list(asks))
            self._state = "failed"
            raise
        self.started = min(f.result()[0]["started"] for f in asks.values())
        self._state = "running"
        client._profiles.add(self)
        return self

    def stop(self) -> Profile:
        """Wait for this client's launches, stop the profiler on every host, and collect
        what each wrote (:attr:`hosts`). Raises the first host's failure, once what the
        other hosts wrote is in :attr:`hosts`."""
        if self._state != "running":
            raise RuntimeError(f"this profile is {self._state}; only a running one stops")
        self._state = "stopping"
        client = self._client
        client._profiles.discard(self)
        left = self.limit - (time.time() - (self.started or time.time()))
        try:
            client.wait_all(timeout=max(0.0, left))
        except TimeoutError:
            pass  # the hosts have ended the profile by now; collect what they wrote
        finally:
            asks = {
                host: client._io.host_request(address, {"t": "profile", "op": "stop"})
                for host, address in self._addresses.items()
            }
            # A host that cannot be reached fails its own answer, raised below once the
            # others' are in.
            with contextlib.suppress(BrokenError, ClosedError):
                block(list(asks.values()), [client])
            self._state = "stopped"
        # What the hosts that answered wrote is kept even when another failed (lost
        # with its host, say): the first failure is raised after.
        self.hosts = [
            _host_trace(host, *f.result())
            for host, f in sorted(asks.items())
            if f.exception() is None and not f.result()[0].get("shared")
        ]
        for f in asks.values():
            exc = f.exception()
            if exc is not None:
                raise exc
        return self

    @property
    def files(self) -> list[str]:
        """Every file the hosts wrote, as paths on the hosts' filesystem."""
        return [p for t in self.hosts for p in t.files]

    def _abandon(self) -> None:
        """The client closes: stop the hosts without waiting for launches (files stay)."""
        if self._state == "running":
            self._state = "abandoned"
            self._client._profiles.discard(self)
            self._stop_quietly(list(self._addresses))

    def _stop_quietly(self, hosts: list[str]) -> None:
        """Stop ``hosts``, their answers unread (a host that had not started says so):
        another host would not start, or the client closes."""
        futures = [
            self._client._io.host_request(self._addresses[h], {"t": "profile", "op": "stop"})
            for h in hosts
        ]
        concurrent.futures.wait(futures, timeout=30)


def _hosts_of(client: Client, slices: Any) -> dict[str, str]:
    """The hosts of ``slices`` (all the client's when None), by name."""
    from pathways_nb.client._slice import VirtualSlice

    if slices is None:
        chosen = list(client.slices)
    elif isinstance(slices, VirtualSlice):
        chosen = [slices]
    else:
        chosen = list(slices)
    for vs in chosen:
        if not isinstance(vs, VirtualSlice):
            raise TypeError(f"slices are this client's VirtualSlices (client.allocate); got {vs!r}")
        if vs._client is not client:
            raise ValueError(f"slice {vs.name!r} belongs to another client")
        vs._ready_for_work()
    if not chosen:
        raise ValueError(
            "a profile traces the hosts of this client's slices, and it has none: "
            "allocate a slice first (client.allocate({...}))"
        )
    return {vs.host: vs.data_address for vs in chosen}


def _host_trace(host: str, h: dict[str, Any], bufs: list[Any]) -> HostTrace:
    events: tuple[dict[str, Any], ...] = ()
    left_out = str(h.get("trace_left", ""))
    if bufs:
        try:
            doc = json.loads(gzip.decompress(bytes(bufs[0])))
            events = tuple(doc.get("traceEvents", ()))
        except (OSError, ValueError) as exc:
            left_out = f"the host's Perfetto trace could not be read: {exc}"
    return HostTrace(
        # The host whose folder it is: hosts sharing one process share its trace.
        host=str(h.get("host") or host),
        folder=str(h["folder"]),
        files=tuple(h["files"]),
        started=float(h["started"]),
        ended=float(h["ended"]),
        why=str(h["why"]) + (f" ({h['error']})" if h.get("error") else ""),
        events=events,
        left_out=left_out,
    )
