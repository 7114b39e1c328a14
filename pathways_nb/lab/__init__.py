"""JupyterLab's Pathways panel: a side panel that shows a cluster's islands, slices,
tenants, device placement and live timeline, beside any notebook.

Two halves: a JupyterLab extension (``extensions/lab``, built into ``labextensions/``
here and installed under ``share/jupyter/labextensions`` by the wheel) and this Jupyter
server extension, which connects to the cluster and serves what the panel draws. The
panel offers this user's ``pw.LocalCluster`` s, the address in ``$PATHWAYS_ADDRESS``,
and any Dask scheduler address typed into it; it also starts and stops clusters of its
own (``pathways-nb cluster`` processes of the server).

``pathways-nb lab`` starts JupyterLab with both halves enabled, from any install.
Elsewhere, ``jupyter server extension enable pathways_nb.lab`` enables the server half.
"""

from __future__ import annotations

import pathlib
from typing import Any

LABEXTENSIONS = pathlib.Path(__file__).parent / "labextensions"
NAME = "pathways-nb-lab"


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "pathways_nb.lab"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": f"labextensions/{NAME}", "dest": NAME}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    import atexit

    from pathways_nb.lab._handlers import LazyBoards, setup_handlers
    from pathways_nb.lab._launched import Launched

    launched = Launched()
    # The clusters the panel started end as the server exits (a module extension has no
    # stop hook); were it killed, they see it gone and end themselves.
    atexit.register(launched.close)
    setup_handlers(serverapp.web_app, LazyBoards(serverapp.log.warning), launched)
    serverapp.log.info("pathways_nb.lab: the Pathways panel's endpoints are under /pathways-nb/")


def lab_arguments() -> list[str]:
    """Arguments that make ``jupyter lab`` load the panel's two halves from this install."""
    # traitlets' command-line forms of a dict and a list entry.
    return [
        "--ServerApp.jpserver_extensions=pathways_nb.lab=True",
        f"--LabApp.extra_labextensions_path={LABEXTENSIONS}",
    ]


__all__ = ["LABEXTENSIONS", "NAME", "lab_arguments"]
