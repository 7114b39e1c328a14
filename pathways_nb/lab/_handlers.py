"""The Jupyter server's side of the Pathways panel: two JSON endpoints under
``/pathways-nb/``, thin over :class:`~pathways_nb.lab._boards.Boards`.

``GET clusters`` lists the clusters to offer; ``GET board?address=...`` returns what
the panel draws for one of them. A board's refresh talks to the cluster, so it runs on
a small thread pool of its own, never on the server's event loop.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from pathways_nb.lab._boards import Boards

ROUTE = "pathways-nb"
SETTINGS_KEY = "pathways_nb_boards"


class _Handler(APIHandler):
    @property
    def boards(self) -> Boards:
        boards: Boards = self.settings[SETTINGS_KEY]
        return boards

    def _reply(self, body: dict[str, Any], status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class ClustersHandler(_Handler):
    @tornado.web.authenticated
    def get(self) -> None:
        boards = self.boards
        self._reply(
            {"clusters": [f.to_dict() for f in boards.found()], "problems": boards.problems}
        )


class BoardHandler(_Handler):
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pathways-panel")

    @tornado.web.authenticated
    async def get(self) -> None:
        address = self.get_query_argument("address", "")
        try:
            board = self.boards.board(address)
        except ValueError as exc:
            self._reply({"address": address, "error": str(exc)}, 400)
            return
        snap = await asyncio.get_running_loop().run_in_executor(self.pool, board.snapshot)
        self._reply(snap)


def setup_handlers(web_app: Any, boards: Boards) -> None:
    """Add the panel's endpoints to a Jupyter server's tornado application."""
    web_app.settings[SETTINGS_KEY] = boards
    base = web_app.settings["base_url"]
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, ROUTE, "clusters"), ClustersHandler),
            (url_path_join(base, ROUTE, "board"), BoardHandler),
        ],
    )
