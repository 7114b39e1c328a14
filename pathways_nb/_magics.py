"""``%pathways``: start or connect to a cluster and look at it from a notebook.

>>> %load_ext pathways_nb
>>> %pathways start --islands 2 --devices 4
>>> %pathways status
>>> %%pathways --slice train
... step(state, batch)
>>> %%pathways --profile /tmp/profiles/step --trace step.json.gz
... step(state, batch)

Each subcommand has a Python equivalent in :mod:`pathways_nb.viz` or on the client; this
module uses only the public API. A line that cannot be run as written raises IPython's
``UsageError``, which fails the cell as any error does, so that "Run All" stops there.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import shlex
import sys
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

import pathways_nb as pw

_USAGE = """\
%pathways start [--islands N] [--devices N]   start the embedded local cluster (reused if running);
                [--platform auto] [--tls]     auto: the accelerators JAX finds (default: cpu,
                                              simulated devices); --tls: every link over TLS
%pathways connect ADDRESS|FILE [--observe]    connect to a Dask scheduler with the pathways preload,
                                              or to the one a scheduler file names; --observe:
                                              watch it without being a tenant (no slices)
%pathways status [--static]                   live cluster status (--static: drawn once)
%pathways devices [--static]                  live placement map: device -> slice -> program
%pathways graph CALL                          draw the dataflow graph of CALL, e.g. step(state, x)
%pathways timeline [--last 5s] [--static]     the asynchronous schedule over time
%pathways trace FILE                          write the event log as a Perfetto/Chrome trace,
                                              once this client's launches have finished
%pathways jax [--name NAME] [--weight W]      this kernel's plain JAX runs on the cluster:
                                              jax.devices(), device_put and jit go there,
                                              through an IFRT proxy (pw.use_jax)
%pathways stop                                close the client (and the cluster it started)
%%pathways --slice NAME                       run the cell with that slice as the default
%%pathways --profile DIR [--trace FILE]       run the cell under XLA's profiler on the hosts
                                              (traces in DIR/HOST on the hosts' filesystem;
                                              --trace: schedule + XLA events in one file);
                                              the cell's value is the pw.Profile
Arguments are split as a shell splits them: quote names and paths with spaces, 'my slice'.
"""

# Seconds a wait for launches goes on before it says what it waits for.
_MOMENT = 1.0


@dataclasses.dataclass(frozen=True)
class _Command:
    """What one subcommand takes: its options (name -> int, str, or bool for a flag, which
    takes no value) and how many words besides them."""

    usage: str
    options: dict[str, type]
    words: int = 0
    words_wanted: str = ""


_COMMANDS = {
    "start": _Command(
        "%pathways start [--islands N] [--devices N] [--platform cpu|auto|PLATFORM] [--tls]",
        {"--islands": int, "--devices": int, "--platform": str, "--tls": bool},
    ),
    "connect": _Command(
        "%pathways connect ADDRESS|FILE [--observe]",
        {"--observe": bool},
        1,
        "one address, e.g. tcp://scheduler:8786, or a scheduler file, e.g. cluster.json "
        "(what `pathways-nb cluster --scheduler-file` writes)",
    ),
    "status": _Command("%pathways status [--static]", {"--static": bool}),
    "devices": _Command("%pathways devices [--static]", {"--static": bool}),
    "timeline": _Command(
        "%pathways timeline [--last 5s] [--static]", {"--last": str, "--static": bool}
    ),
    "trace": _Command(
        "%pathways trace FILE", {}, 1, "one file name, e.g. %pathways trace step.json"
    ),
    "jax": _Command("%pathways jax [--name NAME] [--weight W]", {"--name": str, "--weight": str}),
    "stop": _Command("%pathways stop", {}),
    "help": _Command("%pathways help", {}),
    "": _Command("%pathways", {}),
}
_CELL = _Command(
    "%%pathways [--slice NAME] [--profile DIR [--trace FILE]], above the cell's code",
    {"--slice": str, "--profile": str, "--trace": str},
    words_wanted="only --slice NAME, --profile DIR and --trace FILE (the commands, such "
    "as status, are line magics: %pathways status on a line of its own)",
)


def _use_jax(client: pw.Client, options: dict[str, Any]) -> None:
    """``%pathways jax``: says what it changes, then changes it."""
    import jax

    before = jax.default_backend()
    try:
        # pw.use_jax checks the weight (and the cluster) before it starts anything.
        weight = float(options.get("weight", 1.0))
        proxy = pw.use_jax(client, name=options.get("name"), weight=weight)
    except ValueError as exc:
        raise UsageError(f"%pathways jax: {exc}") from None
    devices = jax.devices()
    islands = sorted({getattr(d, "slice_index", 0) for d in devices})
    print(
        f"plain JAX in this kernel now runs on the cluster: jax.devices() lists its "
        f"{len(devices)} devices on {len(islands)} island(s) (d.slice_index), and "
        f"jax.device_put and jax.jit go there, through the proxy at {proxy.target} (a "
        f"tenant of its own). JAX's {before} backend stays for pw.jit's tracing and the "
        "arrays this kernel made before; an array on it given to a cluster program is "
        "refused: jax.device_put it first."
    )


def _split(text: str) -> list[str]:
    """``text`` as words, quotes taken off as a shell takes them off."""
    try:
        return shlex.split(text)
    except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
        raise UsageError(
            f"cannot split {text.strip()!r} into arguments: {str(exc).lower()}. Close each "
            "quote, e.g. --slice 'my slice'"
        ) from None


def _parse(name: str, spec: _Command, words: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The options given (by name, without the dashes) and the other words, each checked
    against ``spec``: nothing is dropped unread."""
    options: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-":
            rest.append(word)
            continue
        option, eq, value = word.partition("=")
        kind = spec.options.get(option)
        if kind is None:
            raise UsageError(_not_an_option(name, spec, option))
        if option[2:] in options:
            raise UsageError(f"{option} is given twice; give it once. Usage: {spec.usage}")
        if kind is bool:
            if eq:
                raise UsageError(f"{option} takes no value; got {word!r}. Usage: {spec.usage}")
            options[option[2:]] = True
            continue
        if not eq:
            # The next word whatever it starts with: --last -1s is a (bad) duration.
            if i == len(words) or words[i] in spec.options:
                raise UsageError(f"{option} takes a value; got none. Usage: {spec.usage}")
            value = words[i]
            i += 1
        if kind is int:
            try:
                options[option[2:]] = int(value)
            except ValueError:
                raise UsageError(
                    f"{option} takes a whole number, e.g. {option} 2; got {value!r}"
                ) from None
        else:
            options[option[2:]] = value
    if len(rest) != spec.words:
        what = spec.words_wanted or "no arguments besides its options"
        said = f"{len(rest)}: {' '.join(map(shlex.quote, rest))}" if rest else "none"
        raise UsageError(f"{name} takes {what}; got {said}. Usage: {spec.usage}")
    return options, rest


def _not_an_option(name: str, spec: _Command, option: str) -> str:
    """Why ``option`` is refused, saying where it belongs if anywhere."""
    if option in ("-h", "--help"):
        return f"for help, run %pathways help (or %pathways?). Usage: {spec.usage}"
    if spec is not _CELL and option in _CELL.options:
        return (
            f"{option} is an option of the cell magic: put %%pathways {option} ... on the "
            "first line of a cell, above the code to run"
        )
    owners = [n for n, c in _COMMANDS.items() if option in c.options]
    if spec is _CELL and owners:
        return (
            f"{option} is an option of %pathways {owners[0]}, a line magic; the cell magic "
            f"takes --slice, --profile and --trace. Usage: {spec.usage}"
        )
    if owners and not name:
        return f"{option} goes after a command, e.g. %pathways {owners[0]} {option}"
    if owners:
        return f"{option} is an option of {' and '.join(owners)}, not of {name}"
    takes = ", ".join(spec.options) or "no options"
    return f"{name or '%pathways'} has no option {option}; it takes {takes}. Usage: {spec.usage}"


class Session:
    """The notebook's cluster and client; one per IPython shell."""

    def __init__(self) -> None:
        self.cluster: Any = None
        self.client: pw.Client | None = None
        # The client `start` made, of `cluster`: `connect` replaces the session's client,
        # and `start` then has no cluster of that client's to reuse.
        self._started: pw.Client | None = None

    def start(
        self, islands: int, devices: int, platform: str | None = "cpu", tls: bool = False
    ) -> pw.Client:
        client = self.client
        if client is not None and not client.closed:
            if client is not self._started:
                raise UsageError(self._not_started(client))
            c = self.cluster
            have = (c.islands, c.devices_per_island, c.platform, c.security is not None)
            if have != (islands, devices, platform, tls):
                print(
                    f"{c!r} is running"
                    f"{' with TLS' if have[3] else ''}; reusing it "
                    "(%pathways stop first for a different one)"
                )
            return client
        self.stop()  # a closed client's cluster goes before a new one starts
        try:
            self.cluster = pw.LocalCluster(
                islands=islands, devices_per_island=devices, platform=platform, security=tls
            )
        except (ValueError, ImportError) as exc:  # said before any process starts
            raise UsageError(str(exc)) from None
        self.client = self._started = pw.Client(self.cluster)
        return self.client

    def _not_started(self, client: pw.Client) -> str:
        where = _address(client)
        if client.observer:
            has = (
                f"this session's client only observes the cluster at {where} (%pathways "
                "connect --observe): it cannot allocate slices"
            )
        else:
            has = f"this session is connected to the cluster at {where} (%pathways connect)"
        if self.cluster is not None:
            has += ", and the cluster it started is still running"
            stop = "%pathways stop closes both"
        else:
            stop = "%pathways stop disconnects (the cluster itself goes on)"
        return (
            f"{has}. {stop}; then %pathways start starts a cluster of your own, or "
            "%pathways connect ADDRESS (without --observe) makes this session a tenant"
        )

    def connect(self, address: str, observer: bool = False) -> pw.Client:
        if not address.strip():
            raise UsageError(
                f"connect takes an address, e.g. tcp://scheduler:8786, or a scheduler file, "
                f"e.g. cluster.json; got {address!r}"
            )
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
        again = "%pathways start (embedded) or %pathways connect ADDRESS"
        if self.client is None:
            raise UsageError(f"no cluster yet: run {again}")
        if self.client.closed:
            raise UsageError(
                f"this session's client of the cluster at {_address(self.client)} "
                "is closed (client.close(), or its cluster stopped or went away): run "
                f"{again} for a new one"
            )
        return self.client

    def stop(self) -> None:
        self._started = None
        # This kernel's JAX leaves the cluster before the cluster goes.
        if "pathways_nb.proxy" in sys.modules:
            pw.stop_jax()
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None


def _address(client: pw.Client) -> str:
    """Where ``client`` connected: the scheduler's address a user gave, if any."""
    return client.scheduler_address or client.controller_address


def _wait_for_launches(
    client: pw.Client, before: str, interrupt: str, limit: float | None = None
) -> None:
    """Wait up to ``limit`` seconds (None: for ever) for the launches ``client`` submitted
    to finish, saying what it waits for, and what an interrupt does, once that takes more
    than a moment."""
    first = _MOMENT if limit is None else min(_MOMENT, limit)
    with contextlib.suppress(TimeoutError):
        client.wait_all(timeout=first)
        return
    n = client.pending()
    print(
        f"waiting for {n} launch{'es' if n != 1 else ''} of this client to finish before "
        f"{before} (interrupting the kernel {interrupt})",
        flush=True,
    )
    with contextlib.suppress(TimeoutError):
        client.wait_all(timeout=None if limit is None else max(0.0, limit - first))


def _write_trace(events: Any, path: str, **kw: Any) -> None:
    try:
        written = pw.viz.write_trace(events, path, **kw)
    except OSError as exc:
        raise UsageError(
            f"cannot write the trace to {path!r}: {exc.strerror or exc}. Give a file in a "
            "directory that exists and that you may write to"
        ) from None
    print(f"wrote {written}: open it at https://ui.perfetto.dev or chrome://tracing")


@magics_class
class PathwaysMagics(Magics):
    """The ``%pathways`` line and cell magic."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.session = Session()

    @line_cell_magic
    def pathways(self, line: str, cell: str | None = None) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of the cell's traceback
        if cell is not None:
            return self._cell(line, cell)
        return self._line(line)

    pathways.__doc__ = (
        "Start, connect to and look at a pathways cluster from a notebook.\n\n" + _USAGE
    )

    def _line(self, line: str) -> Any:
        __tracebackhide__ = True
        command, *call = line.split(None, 1) or [""]
        if command == "graph":
            # The call is Python, not options: parse it as an expression.
            return self._graph(call[0].strip() if call else "")
        words = _split(line)
        command = words.pop(0) if words and not words[0].startswith("-") else ""
        spec = _COMMANDS.get(command)
        if spec is None:
            raise UsageError(f"unknown command {command!r}; the commands are:\n\n{_USAGE}")
        if any(w in ("-h", "--help") for w in words):
            print(_USAGE)
            return None
        options, rest = _parse(command, spec, words)
        s = self.session
        if command == "start":
            platform = options.get("platform", "cpu")
            client = s.start(
                options.get("islands", 2),
                options.get("devices", 4),
                None if platform == "auto" else platform,
                options.get("tls", False),
            )
            return s.cluster if s.cluster is not None else client
        if command == "connect":
            return s.connect(rest[0], observer=options.get("observe", False))
        live = not options.get("static", False)
        if command == "status":
            return pw.viz.status(s.require(), live=live)
        if command == "devices":
            return pw.viz.devices(s.require(), live=live)
        if command == "timeline":
            last = _window(options["last"]) if "last" in options else None
            return pw.viz.timeline(s.require(), last=last, live=live)
        if command == "trace":
            client = s.require()
            # Ctrl-C leaves the launches alone: the trace only looks at them.
            _wait_for_launches(
                client, "writing the trace", "stops waiting and writes nothing; they go on"
            )
            _write_trace(client.events(), rest[0])
            return None
        if command == "jax":
            return _use_jax(s.require(), options)
        if command == "stop":
            s.stop()
            return None
        print(_USAGE)
        return None

    def _shell(self) -> Any:
        if self.shell is None:
            raise UsageError("%pathways needs an IPython shell")
        return self.shell

    def _graph(self, call: str) -> Any:
        __tracebackhide__ = True
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
        shell = self._shell()
        fn = _eval(node.func, shell.user_ns)

        # Python itself takes the arguments apart (*xs, **kw, repeated keywords), as it
        # would for the call written: errors name the function called.
        def arguments(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
            return args, kwargs

        arguments.__qualname__ = arguments.__name__ = ast.unparse(node.func)
        arguments.__module__ = None  # type: ignore[assignment]  # not "pathways_nb._magics.step"
        taker = "__pathways_graph_arguments__"
        args_call = ast.Call(ast.Name(taker, ast.Load()), node.args, node.keywords)
        args, kwargs = _eval(
            ast.fix_missing_locations(args_call), shell.user_ns, {taker: arguments}
        )
        return pw.viz.GraphWidget(client.graph(fn, *args, **kwargs))

    def _cell(self, line: str, cell: str) -> Any:
        __tracebackhide__ = True
        options, _ = _parse("the cell magic", _CELL, _split(line))
        if "trace" in options and "profile" not in options:
            raise UsageError("--trace FILE goes with --profile DIR")
        if not options:
            raise UsageError(
                "the cell magic takes --slice NAME and/or --profile DIR, e.g. "
                "%%pathways --slice train"
            )
        client = self.session.require()
        with contextlib.ExitStack() as stack:
            if "slice" in options:
                wanted = options["slice"]
                vs = next((s for s in client.slices if s.name == wanted), None)
                if vs is None:
                    names = [s.name for s in client.slices]
                    raise UsageError(
                        f"no slice named {wanted!r}; this client has {names}. Name "
                        "slices with client.allocate({...}, name=...)"
                    )
                stack.enter_context(vs)
            if "profile" not in options:
                return self._execute(cell)
            return self._profiled(client, options["profile"], options.get("trace"), cell)

    def _profiled(self, client: pw.Client, folder: str, trace: str | None, cell: str) -> Any:
        """Run ``cell`` under XLA's profiler on the hosts; the profile stops (and its
        folders are said) whether the cell raises or not, and then what it raised is
        raised, so the cell fails as any failing cell."""
        __tracebackhide__ = True
        try:
            prof = client.profile(folder)
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        prof.start()
        try:
            value = self._execute(cell)
        except BaseException:
            _stop_profile(client, prof, failed=True)
            raise
        _stop_profile(client, prof, failed=False)
        if value is not None:
            display(value)  # the cell's own value, shown once; the Out is the profile
        if trace:
            try:
                _write_trace(client.events(since=prof.started or 0.0), trace, profile=prof)
            except UsageError as exc:
                print(f"the profile ran, but {exc}")  # and is the Out all the same
        return prof

    def _execute(self, cell: str) -> Any:
        """Run ``cell`` as IPython runs one (its magics and ``!`` lines too) and return
        the value of its last expression, for the magic's caller to display once.

        Not through ``shell.run_cell``, which reports a failure itself and returns: what
        the cell raises is raised here, so that IPython fails the cell around the magic.
        """
        __tracebackhide__ = True
        shell = self._shell()
        # A leading line for the magic's own, so the traceback's line numbers are the
        # cell's; IPython counts the cell before running it, hence the - 1.
        source = "\n" + shell.transform_cell(cell)
        name = shell.compile.cache(source, max(shell.execution_count - 1, 0), raw_code=cell)
        tree = shell.compile.ast_parse(source, filename=name)
        body = list(tree.body)
        last = body.pop() if body and isinstance(body[-1], ast.Expr) else None
        ns = (shell.user_global_ns, shell.user_ns)
        if body:
            exec(shell.compile(ast.Module(body, type_ignores=[]), name, "exec"), *ns)
        if last is None:
            return None
        return eval(shell.compile(ast.Expression(last.value), name, "eval"), *ns)


def _eval(node: ast.AST, ns: dict[str, Any], local: dict[str, Any] | None = None) -> Any:
    __tracebackhide__ = True
    code = compile(ast.Expression(body=node), "<%pathways graph>", "eval")  # type: ignore[arg-type]
    return eval(code, ns, local)


def _window(text: str) -> float:
    """``--last``'s window in seconds, refused as a usage error unless above 0."""
    try:
        last = pw.viz.parse_duration(text.strip().lstrip("-"))
    except ValueError as exc:
        raise UsageError(f"--last: {exc}") from None
    if text.strip().startswith("-") or not last > 0:
        raise UsageError(
            f"--last is a window of time above 0 (the log's last 5s, say), e.g. --last 5s "
            f"or --last 250ms; got {text!r}. Leave --last out for the whole log"
        )
    return last


def _stop_profile(client: pw.Client, prof: pw.Profile, failed: bool) -> None:
    """Stop ``prof`` once the cell's launches finish and say where the hosts wrote.

    Interrupting the wait cancels the cell's launches that have not started, as it does
    while a cell waits on its arrays, and still stops the profile. After a cell that
    failed, a profile that cannot stop is said, not raised: the cell's error is the one
    to see.
    """
    left = prof.limit - (time.time() - (prof.started or time.time()))
    interrupted: KeyboardInterrupt | None = None
    try:
        _wait_for_launches(
            client,
            "stopping the profile",
            "cancels those not started and stops the profile",
            limit=max(0.0, left),
        )
    except KeyboardInterrupt as exc:
        client.cancel()
        interrupted = exc
    try:
        prof.stop()
    except Exception as exc:  # said here, raised only where nothing else is
        if not failed and interrupted is None:
            raise
        print(f"the profile did not stop cleanly: {type(exc).__name__}: {exc}")
    places = ", ".join(f"{t.host}: {t.folder}" for t in prof.hosts)
    print(f"profiled {len(prof.hosts)} host(s) on the hosts' filesystem: {places}")
    if interrupted is not None:
        raise interrupted


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext pathways_nb`` registers ``%pathways``."""
    ip.register_magics(PathwaysMagics(ip))


def unload_ipython_extension(ip: Any) -> None:
    magics = ip.magics_manager.registry.get("PathwaysMagics")
    if magics is not None:
        magics.session.stop()


__all__ = [
    "PathwaysMagics",
    "Session",
    "UsageError",
    "load_ipython_extension",
    "unload_ipython_extension",
]
