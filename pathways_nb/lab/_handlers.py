"""The Jupyter server's side of the Pathways panel: JSON endpoints under
``/pathways-nb/``, thin over :class:`~pathways_nb.lab._boards.Boards` and
:class:`~pathways_nb.lab._launched.Launched`.

``GET clusters`` lists the clusters to offer, ``POST clusters`` starts one and
``DELETE clusters?address=...`` stops one this server started; ``GET board?address=...``
returns what the panel draws for one of them. A board's refresh talks to the cluster,
so it runs on that board's own thread (one cluster slow to answer holds up no other);
a start waits for one to come up, on a pool of its own; neither runs on the server's
event loop. The boards, and with them the client and JAX, are imported
when a panel first asks: a server whose panel stays closed never loads them.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from pathways_nb.lab._launched import Launched, check_platform, check_size, check_tls

if TYPE_CHECKING:
    from pathways_nb.lab._boards import Board, Boards

ROUTE = "pathways-nb"
SETTINGS_KEY = "pathways_nb_boards"
LAUNCHED_KEY = "pathways_nb_launched"
T = TypeVar("T")


class LazyBoards:
    """The server's :class:`Boards`, made on first use (from a handler's thread)."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._lock = threading.Lock()
        self._boards: Boards | None = None

    def get(self) -> Boards:
        with self._lock:
            if self._boards is None:
                from pathways_nb.lab._boards import Boards

                self._boards = Boards()
                for problem in self._boards.problems:
                    self._warn(f"pathways_nb.lab: {problem}")
                atexit.register(self._boards.close)
            return self._boards


class _Handler(APIHandler):
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pathways-panel")

    async def _off_loop(self, fn: Callable[[Boards], T]) -> T:
        lazy: LazyBoards = self.settings[SETTINGS_KEY]
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(lazy.get()))

    def _reply(self, body: dict[str, Any], status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class ClustersHandler(_Handler):
    # Starting a cluster takes seconds: on threads of its own, so boards keep polling.
    launches = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pathways-launch")

    @property
    def _launched(self) -> Launched:
        launched: Launched = self.settings[LAUNCHED_KEY]
        return launched

    @tornado.web.authenticated
    async def get(self) -> None:
        def found(boards: Boards) -> dict[str, Any]:
            ours = {c["address"]: c for c in self._launched.running()}
            clusters = [
                {**f.to_dict(), "stoppable": False} for f in boards.found() if f.address not in ours
            ]
            # Those this server started first: the panel may stop them.
            return {"clusters": [*ours.values(), *clusters], "problems": boards.problems}

        self._reply(await self._off_loop(found))

    @tornado.web.authenticated
    async def post(self) -> None:
        """Start a cluster: ``{"islands": N, "devices_per_island": M, "platform": P,
        "tls": T}`` (``"cpu"``, the default, or ``"auto"``; ``tls`` false by default)."""
        try:
            body = json.loads(self.request.body or b"{}")
            if not isinstance(body, dict):
                raise ValueError(f"the request is a JSON object; got {type(body).__name__}")
            islands, devices = check_size(body.get("islands"), body.get("devices_per_island"))
            platform = check_platform(body.get("platform", "cpu"))
            tls = check_tls(body.get("tls", False))
        except ValueError as exc:
            self._reply({"error": str(exc)}, 400)
            return
        loop = asyncio.get_running_loop()
        try:
            started = await loop.run_in_executor(
                self.launches,
                functools.partial(self._launched.start, islands, devices, platform, tls=tls),
            )
        except ValueError as exc:  # as many running as the server starts
            self._reply({"error": str(exc)}, 409)
            return
        except RuntimeError as exc:
            self._reply({"error": str(exc)}, 500)
            return
        self._reply(started, 201)

    @tornado.web.authenticated
    async def delete(self) -> None:
        """Stop a cluster this server started: ``?address=tcp://...``."""
        address = self.get_query_argument("address", "")
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(self.launches, self._launched.stop, address):
            self._reply(
                {
                    "error": f"this server started no cluster at {address!r}; the panel stops "
                    "only the clusters it started (close a pw.LocalCluster from its notebook)"
                },
                404,
            )
            return
        self._reply({"address": address, "stopped": True})


async def board_snapshot(
    boards: Callable[[], Boards], address: str, pool: Executor
) -> tuple[dict[str, Any], int]:
    """What ``GET board?address=...`` answers, and its HTTP status.

    The board is looked up on ``pool`` (shared, and quick: no cluster is asked), then
    refreshed on the board's own thread, so an address that never answers holds up only
    the tabs showing it.
    """

    def find() -> Board | str:
        try:
            return boards().board(address)
        except ValueError as exc:
            return str(exc)

    board = await asyncio.get_running_loop().run_in_executor(pool, find)
    if isinstance(board, str):
        return {"address": address, "error": board}, 400
    return await asyncio.wrap_future(board.submit()), 200


class BoardHandler(_Handler):
    @tornado.web.authenticated
    async def get(self) -> None:
        lazy: LazyBoards = self.settings[SETTINGS_KEY]
        address = self.get_query_argument("address", "")
        self._reply(*await board_snapshot(lazy.get, address, self.pool))


def setup_handlers(web_app: Any, boards: LazyBoards, launched: Launched) -> None:
    """Add the panel's endpoints to a Jupyter server's tornado application."""
    web_app.settings[SETTINGS_KEY] = boards
    web_app.settings[LAUNCHED_KEY] = launched
    base = web_app.settings["base_url"]
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, ROUTE, "clusters"), ClustersHandler),
            (url_path_join(base, ROUTE, "board"), BoardHandler),
        ],
    )
