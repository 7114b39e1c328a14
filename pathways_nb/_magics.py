"""``%pathways``: start or connect to a cluster and look at it from a notebook.

>>> %load_ext pathways_nb
>>> %pathways start --islands 2 --devices 4
>>> %pathways status
>>> %%pathways --slice train
... step(state, batch)
>>> %%pathways --profile /tmp/profiles/step --trace step.json.gz
... step(state, batch)

Each subcommand has a Python equivalent in :mod:`pathways_nb.viz` or on the client; this
module uses only the public API.
"""

from __future__ import annotations

import ast
import contextlib
import os
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

import pathways_nb as pw

_USAGE = """\
%pathways start [--islands N] [--devices N]   start the embedded local cluster (reused if running);
                [--platform auto] [--tls]     auto: the accelerators JAX finds (default: cpu,
                                              simulated devices); --tls: every link over TLS
%pathways connect ADDRESS|FILE [--observe]    connect to a Dask scheduler with the pathways preload,
                                              or to the one a scheduler file names; --observe:
                                              watch it without being a tenant (no slices)
%pathways status                              live cluster status
%pathways devices                             live placement map: device -> slice -> program
%pathways graph CALL                          draw the dataflow graph of CALL, e.g. step(state, x)
%pathways timeline [--last 5s] [--static]     the asynchronous schedule over time
%pathways trace FILE                          write the event log as a Perfetto/Chrome trace
%pathways stop                                close the client (and the cluster it started)
%%pathways --slice NAME                       run the cell with that slice as the default
%%pathways --profile DIR [--trace FILE]       run the cell under XLA's profiler on the hosts
                                              (traces in DIR/HOST on the hosts' filesystem;
                                              --trace: schedule + XLA events in one file);
                                              the cell's value is the pw.Profile
"""


class Session:
    """The notebook's cluster and client; one per IPython shell."""

    def __init__(self) -> None:
        self.cluster: Any = None
        self.client: pw.Client | None = None

    def start(
        self, islands: int, devices: int, platform: str | None = "cpu", tls: bool = False
    ) -> pw.Client:
        if self.client is not None and not self.client.closed:
            if self.cluster is not None:
                c = self.cluster
                have = (c.islands, c.devices_per_island, c.platform, c.security is not None)
                if have != (islands, devices, platform, tls):
                    print(
                        f"a cluster of {have[0]} islands x {have[1]} "
                        f"{have[2] or 'auto'} devices{' with TLS' if have[3] else ''} is "
                        "running; reusing it "
                        "(%pathways stop first for a different one)"
                    )
            return self.client
        try:
            self.cluster = pw.LocalCluster(
                islands=islands, devices_per_island=devices, platform=platform, security=tls
            )
        except (ValueError, ImportError) as exc:  # said before any process starts
            raise UsageError(str(exc)) from None
        self.client = pw.Client(self.cluster)
        return self.client

    def connect(self, address: str, observer: bool = False) -> pw.Client:
        if "://" not in address and os.path.isfile(address):
            client = pw.Client(scheduler_file=address, observer=observer)
        elif "://" not in address and (address.endswith(".json") or os.sep in address):
            raise UsageError(
                f"no scheduler file at {address!r}: give the file `pathways-nb cluster "
                "--scheduler-file` or `dask scheduler --scheduler-file` wrote, or the "
                "scheduler's address, e.g. tcp://scheduler:8786"
            )
        else:
            client = pw.Client(address, observer=observer)
        # Only once the new one is connected: a connect that fails keeps the session's.
        if self.client is not None and not self.client.closed:
            self.client.close()
        self.client = client
        return client

    def require(self) -> pw.Client:
        if self.client is None or self.client.closed:
            raise UsageError(
                "no cluster yet: run `%pathways start` (embedded) or `%pathways connect ADDRESS`"
            )
        return self.client

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None


class UsageError(ValueError):
    """A ``%pathways`` line that cannot be run as written."""


@magics_class
class PathwaysMagics(Magics):
    """The ``%pathways`` line and cell magic."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.session = Session()

    @magic_arguments()
    @argument("command", nargs="?", default="", help="start, connect, status, devices, ...")
    @argument("rest", nargs="*", help="the command's arguments")
    @argument("--islands", type=int, default=2, help="start: islands (one worker process each)")
    @argument("--devices", type=int, default=4, help="start: devices per island")
    @argument(
        "--platform",
        default="cpu",
        help="start: cpu (simulated devices, the default), auto (the accelerators JAX "
        "finds: each island owns GPUs of its own) or a JAX platform such as cuda",
    )
    @argument(
        "--tls",
        action="store_true",
        help="start: run every link with TLS, on certificates made for the cluster",
    )
    @argument("--last", default=None, help="timeline: a window such as 5s or 250ms")
    @argument("--static", action="store_true", help="timeline/status: draw once, no refresh")
    @argument("--slice", default=None, help="cell magic: the default slice while the cell runs")
    @argument(
        "--profile",
        default=None,
        help="cell magic: profile the cell on the hosts, writing under this absolute folder",
    )
    @argument(
        "--trace",
        default=None,
        help="cell magic with --profile: write the schedule and the hosts' XLA events here",
    )
    @argument(
        "--observe",
        action="store_true",
        help="connect: watch the cluster (status, devices, timeline) without being a tenant",
    )
    @line_cell_magic
    def pathways(self, line: str, cell: str | None = None) -> Any:
        """Start, connect to and look at a pathways cluster; see ``%pathways?``."""
        try:
            return self._run(line, cell)
        except UsageError as exc:
            print(f"UsageError: {exc}\n\n{_USAGE}")
            return None

    def _run(self, line: str, cell: str | None) -> Any:
        if cell is not None:
            return self._cell(line, cell)
        command, _, rest_text = line.strip().partition(" ")
        if command == "graph":
            # The call is Python, not options: parse it as an expression.
            return self._graph(rest_text.strip())
        try:
            args = parse_argstring(self.pathways, line)
        except Exception as exc:  # argparse reports bad options by raising
            raise UsageError(str(exc)) from None
        s = self.session
        if args.command == "start":
            platform = None if args.platform == "auto" else args.platform
            client = s.start(args.islands, args.devices, platform, args.tls)
            return s.cluster if s.cluster is not None else client
        if args.command == "connect":
            if len(args.rest) != 1:
                raise UsageError(
                    "connect takes one address, e.g. tcp://scheduler:8786, or a scheduler "
                    "file, e.g. cluster.json (what `pathways-nb cluster --scheduler-file` writes)"
                )
            return s.connect(args.rest[0], observer=args.observe)
        if args.command == "status":
            return pw.viz.status(s.require(), live=not args.static)
        if args.command == "devices":
            return pw.viz.devices(s.require(), live=not args.static)
        if args.command == "timeline":
            try:
                last = pw.viz.parse_duration(args.last) if args.last else None
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            return pw.viz.timeline(s.require(), last=last, live=not args.static)
        if args.command == "trace":
            if len(args.rest) != 1:
                raise UsageError("trace takes one file name, e.g. %pathways trace step.json")
            client = s.require()
            client.wait_all()
            try:
                path = pw.viz.write_trace(client.events(), args.rest[0])
            except OSError as exc:
                raise UsageError(
                    f"cannot write the trace to {args.rest[0]!r}: {exc.strerror or exc}. "
                    "Give a file in a directory that exists and that you may write to"
                ) from None
            print(f"wrote {path}: open it at https://ui.perfetto.dev or chrome://tracing")
            return None
        if args.command == "stop":
            s.stop()
            return None
        if args.command in ("", "help"):
            print(_USAGE)
            return None
        raise UsageError(f"unknown command {args.command!r}")

    def _shell(self) -> Any:
        if self.shell is None:
            raise UsageError("%pathways needs an IPython shell")
        return self.shell

    def _graph(self, call: str) -> Any:
        client = self.session.require()
        if not call:
            raise UsageError("graph takes a call, e.g. %pathways graph step(state, batch)")
        try:
            tree = ast.parse(call, mode="eval")
        except SyntaxError as exc:
            raise UsageError(
                f"graph takes a Python call; {call!r} is not one ({exc.msg})"
            ) from None
        node = tree.body
        if not isinstance(node, ast.Call):
            raise UsageError(f"graph takes a call such as step(state, batch); got {call!r}")
        ns = self._shell().user_ns
        fn = self._eval(node.func, ns)
        args = [self._eval(a, ns) for a in node.args]
        kwargs = {k.arg: self._eval(k.value, ns) for k in node.keywords if k.arg}
        return pw.viz.GraphWidget(client.graph(fn, *args, **kwargs))

    @staticmethod
    def _eval(node: ast.AST, ns: dict[str, Any]) -> Any:
        code = compile(ast.Expression(body=node), "<%pathways graph>", "eval")  # type: ignore[arg-type]
        return eval(code, ns)

    def _cell(self, line: str, cell: str) -> Any:
        try:
            args = parse_argstring(self.pathways, line)
        except Exception as exc:
            raise UsageError(str(exc)) from None
        if args.trace and not args.profile:
            raise UsageError("--trace FILE goes with --profile DIR")
        if not args.slice and not args.profile:
            raise UsageError(
                "the cell magic takes --slice NAME and/or --profile DIR, e.g. "
                "%%pathways --slice train"
            )
        client = self.session.require()
        with contextlib.ExitStack() as stack:
            if args.slice:
                names = [s.name for s in client.slices]
                vs = next((s for s in client.slices if s.name == args.slice), None)
                if vs is None:
                    raise UsageError(
                        f"no slice named {args.slice!r}; this client has {names}. Name "
                        "slices with client.allocate({...}, name=...)"
                    )
                stack.enter_context(vs)
            if not args.profile:
                return self._shell().run_cell(cell).result
            return self._profiled(client, args.profile, args.trace, cell, stack)

    def _profiled(
        self,
        client: pw.Client,
        folder: str,
        trace: str | None,
        cell: str,
        stack: contextlib.ExitStack,
    ) -> pw.Profile:
        try:
            prof = client.profile(folder)
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        with stack:  # the profile stops (and the slice is left) before the report
            stack.enter_context(prof)
            self._shell().run_cell(cell)
        places = ", ".join(f"{t.host}: {t.folder}" for t in prof.hosts)
        print(f"profiled {len(prof.hosts)} host(s) on the hosts' filesystem: {places}")
        if trace:
            since = prof.started or 0.0
            try:
                path = pw.viz.write_trace(client.events(since=since), trace, profile=prof)
            except OSError as exc:
                raise UsageError(f"cannot write the trace to {trace!r}: {exc}") from None
            print(f"wrote {path}: open it at https://ui.perfetto.dev or chrome://tracing")
        return prof


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext pathways_nb`` registers ``%pathways``."""
    ip.register_magics(PathwaysMagics(ip))


def unload_ipython_extension(ip: Any) -> None:
    magics = ip.magics_manager.registry.get("PathwaysMagics")
    if magics is not None:
        magics.session.stop()


__all__ = ["PathwaysMagics", "Session", "load_ipython_extension", "unload_ipython_extension"]
