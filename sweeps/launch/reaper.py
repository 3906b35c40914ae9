"""Stopping a trial that wraps a Ray Train run: its actor cannot be reused (``reuse_actors=True``
fails in ``reset_config``, whose thread is still inside ``TorchTrainer.fit()``), so it exits and
kills its Train controller in the middle of ``fit()``.
In Ray 2.60 that can leave the workers' placement group behind (a controller that was restarting
its worker group when it died creates a group its ``PlacementGroupCleaner`` never hears of; the
cleaner also needs a dashboard), and the next trials then wait forever for those CPUs. Some of
those groups keep ``creator_actor_dead = False`` in the GCS although the controller's actor row
reads ``DEAD`` (a controller killed with its trial's group while creating one), so the
reaper also asks the actor table. Ray never removes those groups itself, not even when their job
ends: on a cluster that outlives its sweeps (a shared head, a test suite's) one sweep's leftovers
starved the next sweep of every CPU, so the reaper removes any job's orphaned groups, not only its own.
:class:`PlacementGroupReaper` is the Tune callback that removes them.
"""

from __future__ import annotations

import logging
import time

from ray.tune import Callback

from sweeps._compat import actor_is_dead, placement_group_table

__all__ = ["PlacementGroupReaper"]

log = logging.getLogger(__name__)


class PlacementGroupReaper(Callback):
    """Removes the cluster's placement groups whose creating actor is dead, whatever their job.

    A placement group created by an actor (a Ray Train controller) is only usable by that actor's
    workers, which die with it, and Ray removes it when the actor dies, except when the GCS missed the
    death (module docstring): then it stays for good, also past its job's end, holding its CPUs. Pruned
    and stopped trials leave them. Detached groups and groups a driver created (no creator actor) are
    never touched. Checked at most every ``interval_s`` seconds of the Tune loop.
    """

    def __init__(self, interval_s: float = 2.0):
        self.interval_s = interval_s
        self._last = 0.0
        self.removed: list[str] = []

    def on_step_begin(self, iteration, trials, **info):
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self.reap()

    def reap(self) -> int:
        """Remove every orphaned placement group of the cluster now; returns how many."""
        import ray
        from ray.core.generated import gcs_pb2
        from ray.util.placement_group import PlacementGroup

        if not ray.is_initialized():
            return 0
        nil = ray.ActorID.nil().binary()
        # protobuf makes its message classes at import: no attribute a type checker can see
        table = gcs_pb2.PlacementGroupTableData  # pyright: ignore[reportAttributeAccessIssue]
        n = 0
        for pg in placement_group_table():
            candidate = (
                pg.state in (table.CREATED, table.PENDING)
                and not pg.is_detached
                and pg.creator_actor_id not in (b"", nil)
            )
            # the group's own flag is not always set when its creator dies (sweeps._compat.actor_is_dead)
            orphan = candidate and (pg.creator_actor_dead or actor_is_dead(pg.creator_actor_id))
            if orphan:
                pg_id = ray.PlacementGroupID(pg.placement_group_id)
                ray.util.remove_placement_group(PlacementGroup(pg_id))
                self.removed.append(pg_id.hex())
                log.warning(
                    "removed placement group %s of job %s: its creator (a Ray Train controller) is gone "
                    "(trial finished or stopped)",
                    pg_id.hex(),
                    pg.creator_job_id.hex(),
                )
                n += 1
        return n
