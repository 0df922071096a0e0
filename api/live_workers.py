"""The live workers as the API reads them: an in-process directory directly, a shared (Redis) one through the
cached listing (cluster/worker_listing.py: read once per settings.routing.worker_view_cache_s, the last listing while
it fails). The directory is published after the services are built, so callers pass the current one.
"""

from __future__ import annotations

from cluster.membership import InMemoryWorkerDirectory, WorkerDirectory, WorkerRecord
from cluster.worker_listing import CachedWorkerListing


def live_workers(directory: WorkerDirectory | None, listing: CachedWorkerListing) -> list[WorkerRecord]:
    """The live worker records of `directory` (none when no directory is published yet)."""
    if directory is None:
        return []
    if isinstance(directory, InMemoryWorkerDirectory):
        return directory.list_live()
    return listing.list_live(directory)


def cached_live_workers(
    directory: WorkerDirectory | None, listing: CachedWorkerListing
) -> list[WorkerRecord] | None:
    """The live worker records when they can be had without I/O (in-process directory, or a fresh cached
    listing); None when the shared directory must be read."""
    if directory is None:
        return []
    if isinstance(directory, InMemoryWorkerDirectory):
        return directory.list_live()
    return listing.fresh(directory)
