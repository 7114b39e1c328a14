"""The live timeline's incremental tracker, from hand-made event logs."""

from __future__ import annotations

import time

import pandas as pd

from pathways_nb.viz._timeline import Tracker, intervals

COLS = ["time", "kind", "tenant", "lid", "program", "slice", "island", "host", "detail"]


def _events(rows: list[tuple]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=COLS)
    df["time"] = pd.to_datetime(df["time"], unit="s")
    return df


def test_tracker_matches_the_batch_intervals_across_increments() -> None:
    t = time.time()
    rows = [
        (t + 0.00, "launch", 1, 1, "f", "s1", "i0", "h0", ""),
        (t + 0.00, "launch", 1, 2, "transfer", "s2", "i1", "h1", "h0→h1"),
        (t + 0.01, "start", 1, 1, "f", "s1", "i0", "h0", ""),
        (t + 0.03, "end", 1, 1, "f", "s1", "i0", "h0", ""),
        (t + 0.03, "start", 1, 2, "transfer", "s2", "i1", "h1", ""),
        (t + 0.04, "end", 1, 2, "transfer", "s2", "i1", "h1", "h0→h1 256 B"),
        (t + 0.05, "launch", 2, 3, "g", "s2", "i1", "h1", ""),
        (t + 0.06, "start", 2, 3, "g", "s2", "i1", "h1", ""),
        (t + 0.07, "error", 2, 3, "g", "s2", "i1", "h1", "runtime"),
        (t + 0.08, "launch", 2, 4, "never", "s2", "i1", "h1", ""),
    ]
    tr = Tracker(horizon=60.0, max_rows=100)
    tr.add([list(r) for r in rows[:4]])
    tr.add([list(r) for r in rows[4:]])
    recs, lanes = tr.records(last=60.0)
    assert lanes == ["i0/s1", "i1/s2"]
    assert [r["lid"] for r in recs] == [1, 2, 3]  # the never-started launch is not drawn
    transfer = recs[1]
    assert (
        transfer["kind"] == "transfer" and transfer["source"] == "h0" and transfer["bytes"] == 256
    )
    assert recs[2]["failed"] and recs[2]["tenant"] == 2
    batch = intervals(_events(rows))
    assert list(batch.lid) == [1, 2, 3]
    assert list(batch.bytes) == [0, 256, 0] and list(batch.failed) == [False, False, True]
    for r, (_, b) in zip(recs, batch.iterrows(), strict=True):
        assert abs((r["end"] - r["start"]) - 1e3 * (b.end - b.start)) < 1e-3


def test_tracker_forgets_what_fell_out_of_its_horizon() -> None:
    t = time.time()
    old = [
        (t - 100, "start", 1, 1, "f", "s1", "i0", "h0", ""),
        (t - 99, "end", 1, 1, "f", "s1", "i0", "h0", ""),
    ]
    new = [(t, "start", 1, 2, "f", "s1", "i0", "h0", "")]
    tr = Tracker(horizon=15.0, max_rows=10)
    tr.add([list(r) for r in old + new])
    recs, _ = tr.records(last=5.0)
    assert [r["lid"] for r in recs] == [2] and recs[0]["end"] is None


def test_lanes_are_labelled_by_slice_name_and_keep_the_id_where_two_share_one() -> None:
    t = time.time()
    rows = [
        (t, "allocate", 1, 0, "", "s1", "i0", "h0", "train {'x': 2}"),
        (t, "allocate", 2, 0, "", "s2", "i0", "h0", "train {'x': 1}"),
        (t, "allocate", 2, 0, "", "s3", "i1", "h1", "odd {name} {'x': 1}"),
    ]
    for lid, sid, island in [(1, "s1", "i0"), (2, "s2", "i0"), (3, "s3", "i1"), (4, "s4", "i1")]:
        rows.append((t + lid, "start", 1, lid, "f", sid, island, "h", ""))
    tr = Tracker(horizon=None, max_rows=10)
    tr.add([list(r) for r in rows])
    recs, lanes = tr.records(last=None)
    # Two tenants' "train" on one island stay apart; s4's allocation is not in the log.
    assert lanes == ["i0/train (s1)", "i0/train (s2)", "i1/odd {name}", "i1/s4"]
    assert [r["lane"] for r in recs] == lanes
    tr.name_slices({"s4": "eval", "s2": "warmup"})  # from a status snapshot
    recs, lanes = tr.records(last=None)
    assert lanes == ["i0/train", "i0/warmup", "i1/eval", "i1/odd {name}"]
    assert [r["lane"] for r in recs] == ["i0/train", "i0/warmup", "i1/odd {name}", "i1/eval"]


def test_a_status_summary_counts_live_islands_once_after_a_host_restarts() -> None:
    """A host that died stays in the tables, marked not alive; the island its
    replacement serves is counted once, with the replacement's devices."""
    from pathways_nb.client._status import Status

    def host(name: str, island: str, alive: bool, used: list[int]) -> dict:
        return {
            "island": island,
            "host": name,
            "alive": alive,
            "platform": "cpu",
            "process": "p",
            "devices": [0, 1],
            "used": used,
        }

    reply = {
        "hosts": [
            host("old", "island0", False, []),
            host("new", "island0", True, [0]),
            host("other", "island1", True, []),
        ],
        "slices": [
            {
                "slice": "s1",
                "name": "s1",
                "tenant": 1,
                "mesh": {"x": 2},
                "island": "island0",
                "host": "old",
                "devices": [0, 1],
                "state": "lost",
            },
            {
                "slice": "s2",
                "name": "s2",
                "tenant": 1,
                "mesh": {"x": 1},
                "island": "island0",
                "host": "new",
                "devices": [0],
                "state": "active",
            },
        ],
        "tenants": [],
        "queued": {},
        "inflight": {},
        "events_total": 0,
        "window": 16,
    }
    st = Status.from_reply(reply)
    assert len(st.rows["islands"]) == 3  # the dead host's row stays, alive False
    assert st.summary.startswith(
        "pathways_nb cluster: 2 islands, 4 devices (1 in slices), 2 slices"
    )
