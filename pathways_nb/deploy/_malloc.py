"""The C allocator's settings for a host's process.

A program's outputs and temporaries on CPU devices are buffers XLA allocates with
``malloc`` at every run. glibc serves those above its mmap threshold (at most 32 MiB) with
a fresh ``mmap`` each time, and the kernel then faults in and zeroes every 4 KiB page
of it as the program first writes there: a stage's backward at width 2048 (32 MiB of
temporaries per device) took 24 ms where its arithmetic takes 7, with 16,000 page faults
per run. Asking glibc to map such buffers with transparent huge pages
(``glibc.malloc.hugetlb=1``, glibc 2.35 and later; others ignore it) makes that 30-odd
faults: the same backward took 10 ms, and a pipeline step at width 2048 35% less time.
glibc reads ``GLIBC_TUNABLES`` when a process starts, so it is set for the host's
process by the one that starts it (the Dask nanny, see ``pathways_nb.deploy.nanny``).
"""

from __future__ import annotations

HUGE_PAGES = "glibc.malloc.hugetlb=1"


def with_huge_pages(tunables: str | None) -> str:
    """``GLIBC_TUNABLES`` with glibc's malloc asking for transparent huge pages, unless
    ``tunables`` (what the user set) already says how it should."""
    if not tunables:
        return HUGE_PAGES
    if "glibc.malloc.hugetlb" in tunables:
        return tunables
    return f"{tunables}:{HUGE_PAGES}"
