"""The spoke agent: report capacity, apply the hub's commands, report what happens to work.

It keeps working while the hub or NATS is away: running work goes on, events wait in the
on-disk journal and are delivered in order on reconnect, and a full-state sync with the hub on
every (re)connect corrects whatever diverged.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from bus.client import Bus
from bus.natsclient import no_responders
from bus.tasks import pause, supervise, unless_stopped
from schemas import (
    Assignment,
    CancelCommand,
    CapacityReport,
    Command,
    EventPhase,
    LeaseAck,
    PlaceCommand,
    PreemptCommand,
    RunningRef,
    SyncReply,
    SyncRequest,
    WorkloadEvent,
    parse_commands,
    subjects,
)
from schemas.common import clean_text
from spoke.activity import ActivityMonitor
from spoke.devices import check_assignments, node_capacity, with_mig_profiles
from spoke.errors import PermanentSpokeError, SpokeError
from spoke.fencing import Fence, OwnStalls, fence_file
from spoke.interruption import InterruptionNotice, watch_interruption
from spoke.inventory.lastknown import LastKnown
from spoke.journal import Journal
from spoke.logserve import answer_log_request
from spoke.outbox import Outbox, drain, publish_outbox
from spoke.ports import EventSink, Inventory, Launch, NodeInventory, Runtime, RuntimeEvent
from spoke.settings import SpokeSettings
from spoke.telemetry import NoTelemetry, Telemetry

log = structlog.get_logger(__name__)

#: Heartbeats triggered by a change are spaced at least this far apart (they coalesce).
MIN_REPORT_INTERVAL_S = 0.05
#: Decision ids remembered to drop repeats (JetStream dedupes only inside its window).
SEEN_DECISIONS = 100_000
#: Least time between two fetches of commands while they keep coming (`Bus.consume`): a fetch
#: costs the spoke and the server the same for one Place as for many. A Place that finds the
#: spoke idle is fetched at once; one that arrives while it starts others waits at most this.
COMMANDS_LINGER_S = 0.005


class SpokeAgent:
    """One spoke: owns its runtime and its side of the capacity, commands and events subjects."""

    def __init__(
        self,
        settings: SpokeSettings,
        bus: Bus,
        inventory: Inventory,
        runtime_factory: Callable[[EventSink], Runtime],
        clock: Callable[[], float] = time.time,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.inventory = LastKnown(inventory)  # a heartbeat even while the cluster is away
        self.runtime = runtime_factory(self._on_runtime_event)
        self.clock = clock
        self.incarnation = f"{int(clock())}-{secrets.token_hex(4)}"
        self.counters: Counter[str] = Counter()
        self.ready = asyncio.Event()
        self.journal = Journal(
            settings.workdir / "journal.jsonl",
            max_outbox=settings.max_pending_events,
            fsync=settings.journal_fsync,
        )
        self._nodes: dict[str, NodeInventory] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._outbox: Outbox = asyncio.Queue()
        self._report_now = asyncio.Event()
        self._sync_now = asyncio.Event()
        self._seq = 0
        self._stops: set[asyncio.Task[None]] = set()
        self.fence = Fence(
            fence_file(settings.workdir),
            heartbeat_s=settings.heartbeat_s,
            stop_grace_s=settings.stop_grace_s,
            fence_after_s=settings.fence_after_s,
        )
        self._lease_inbox = ""
        self.draining = False  # a spot interruption notice came: the instance is going
        self.activity = ActivityMonitor(
            telemetry or NoTelemetry(),
            self.nodes,
            lambda: self._allocations,
            self.runtime,
            settings.heartbeat_s,
        )

    @property
    def _allocations(self) -> dict[str, tuple[int, tuple[Assignment, ...]]]:
        return self.journal.state.allocations

    @property
    def _epochs(self) -> dict[str, int]:
        return self.journal.state.epochs

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set."""
        await self._refresh_inventory()
        for event in self.journal.state.outbox.values():
            # owed to the hub from before a restart
            self._outbox.put_nowait((event.event_id, event.model_dump_json().encode()))
        await self._adopt()
        tasks: list[asyncio.Task[Any]] = []
        log_sub: Subscription | None = None
        try:
            if not await unless_stopped(self.bus.connect(), stop):
                return  # told to stop before NATS answered: what it owes stays in the journal
            nc = self.bus.nc
            log_sub = await nc.subscribe(subjects.logs(self.settings.id), cb=self._on_log_msg)
            self._lease_inbox = nc.new_inbox()
            await nc.subscribe(self._lease_inbox, cb=self._on_lease_ack)
            events = subjects.events(self.settings.id)
            outbox = publish_outbox(self.bus, self.journal, self._outbox, events)
            tasks = [
                supervise(self._heartbeat_loop(stop), "spoke-heartbeat"),
                supervise(outbox, "spoke-outbox"),
                supervise(self._fence_loop(stop), "spoke-fence"),
                supervise(self.activity.run(stop), "spoke-activity"),
            ]
            if self.settings.interruption_imds_url:
                url = self.settings.interruption_imds_url
                watch = watch_interruption(self._drain, stop, base_url=url)
                tasks.append(supervise(watch, "spoke-interruption"))
            await self.bus.wait_for_stream(subjects.COMMANDS_STREAM, stop)
            if stop.is_set():
                return
            tasks.append(supervise(self._sync_loop(stop), "spoke-sync"))
            tasks.append(
                supervise(
                    self.bus.consume(
                        subjects.COMMANDS_STREAM,
                        subjects.spoke_consumer(self.settings.id),
                        subjects.commands(self.settings.id),
                        self._on_command_msg,
                        stop,
                        linger_s=COMMANDS_LINGER_S,
                    ),
                    "spoke-commands",
                )
            )
            self.ready.set()
            log.info("spoke_ready", spoke=self.settings.id, nodes=len(self._nodes))
            await stop.wait()
        finally:
            if self.settings.stop_workloads_on_exit:
                await asyncio.gather(
                    *(
                        self.runtime.stop(w, self.settings.stop_grace_s, EventPhase.CANCELLED)
                        for w in list(self.runtime.running())
                    ),
                    return_exceptions=True,
                )
            if log_sub is not None:
                with contextlib.suppress(Exception):
                    await log_sub.unsubscribe()
            with contextlib.suppress(OSError):  # the lease as last heard, for the watchdog
                self.fence.save()
            await self.runtime.close()
            if tasks:  # the outbox's publisher runs: let it deliver what is queued
                await drain(self._outbox, within_s=3.0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.bus.close()
            self.journal.close()
            log.info("spoke_stopped", spoke=self.settings.id, connected=log_sub is not None)

    async def _on_log_msg(self, msg: Msg) -> None:
        await answer_log_request(msg, self.runtime, self.settings.id, self.counters)

    async def _adopt(self) -> None:
        adopted = await self.runtime.adopt()
        for wid, (epoch, _assignments) in list(self._allocations.items()):
            if adopted.get(wid) == epoch or wid in self.runtime.running():
                continue
            # Placed before a restart, but the runtime knows nothing of it: it never started
            # (or its traces are gone). Report it lost; the hub decides what happens next.
            log.warning("workload_lost_on_restart", workload=wid, epoch=epoch)
            await self._on_runtime_event(
                RuntimeEvent(wid, epoch, EventPhase.FAILED, reason="lost_on_spoke_restart")
            )

    def nodes(self) -> list[NodeInventory]:
        """The GPU nodes as last read from the inventory."""
        return list(self._nodes.values())

    # --- capacity ---

    def report(self) -> CapacityReport:
        """The heartbeat as it would be sent now."""
        self._seq += 1
        self.fence.sent(self._seq, self.clock())
        running = self.runtime.running()
        return CapacityReport(
            spoke_id=self.settings.id,
            region=self.settings.region,
            kind=self.settings.kind,
            incarnation=self.incarnation,
            seq=self._seq,
            nodes=tuple(
                node_capacity(n, self._allocations.values(), self.draining)
                for n in self._nodes.values()
            ),
            running=self.activity.refs(running),
            labels=self.settings.labels,
            price_per_gpu_hour=self.settings.price_per_gpu_hour,
            applied_seq=self.journal.state.applied_seq,
            sent_at=self.clock(),
            capabilities=with_mig_profiles(self.runtime.capabilities(), self._nodes),
        )

    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._refresh_inventory()
                self.journal.flush()
                await self.bus.publish(
                    subjects.capacity(self.settings.id),
                    self.report().model_dump_json().encode(),
                    reply=self._lease_inbox,
                )
            except Exception as exc:  # a failed heartbeat is logged; the next one may work
                log.warning("heartbeat_failed", error=str(exc) or type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_now.wait(), self.settings.heartbeat_s)
            self._report_now.clear()
            await asyncio.sleep(MIN_REPORT_INTERVAL_S)

    async def _on_lease_ack(self, msg: Msg) -> None:
        if no_responders(msg):  # the server's own reply: nobody serves capacity reports
            self.fence.no_hub(self.clock())
            return
        try:
            ack = LeaseAck.model_validate_json(msg.data)
        except ValidationError as exc:
            log.warning("malformed_lease_ack", error=str(exc)[:500])
            return
        if ack.spoke_id == self.settings.id and ack.incarnation == self.incarnation:
            self.fence.acked(ack)

    async def _fence_loop(self, stop: asyncio.Event) -> None:
        """Stop movable work once the hub is unheard for fence_after (fencing, `OwnStalls`)."""
        every, loop = min(0.5, self.settings.heartbeat_s / 2), asyncio.get_running_loop()
        stalls = OwnStalls(every, self.settings.heartbeat_s, loop.time())
        while not stop.is_set():
            with contextlib.suppress(OSError):
                self.fence.save()
            held = stalls.holds(loop.time(), self.fence.overdue(self.clock()))
            if held:
                self._report_now.set()  # answered within a heartbeat, it stops nothing
            for wid in [] if held else self.fence.to_stop(self.runtime.running(), self.clock()):
                self.counters["fenced"] += 1
                self._stop_in_background(wid, self.settings.stop_grace_s, EventPhase.PREEMPTED)
            await pause(stop, every)

    async def _drain(self, notice: InterruptionNotice) -> None:
        """Take no more work and stop all of it gracefully (reported preempted: requeued)."""
        self.draining = True
        self._report_now.set()  # unschedulable nodes: the hub places nothing more here
        # Leave the work its grace, but have it gone well before the instance.
        grace = max(0.0, min(self.settings.stop_grace_s, notice.at - self.clock() - 30.0))
        for wid in sorted(self.runtime.running()):
            self._stop_in_background(wid, grace, EventPhase.PREEMPTED)

    async def _refresh_inventory(self) -> None:
        self._nodes = {n.name: n for n in await self.inventory.nodes()}

    # --- reconciliation ---

    async def sync(self) -> SyncReply:
        """Send the full state to the hub and apply its corrections (idempotent)."""
        finished = list(self.journal.state.finished.items())[-500:]
        request = SyncRequest(
            spoke_id=self.settings.id,
            incarnation=self.incarnation,
            running=tuple(
                RunningRef(workload_id=w, epoch=e)
                for w, e in sorted(self.runtime.running().items())
            ),
            finished=tuple(RunningRef(workload_id=w, epoch=e) for w, e in finished),
            applied_seq=self.journal.state.applied_seq,
        )
        self.journal.flush()
        msg = await self.bus.nc.request(
            subjects.sync(self.settings.id), request.model_dump_json().encode(), timeout=5
        )
        reply = SyncReply.model_validate_json(msg.data)
        for ref in reply.stop:
            if self.runtime.running().get(ref.workload_id) == ref.epoch:
                log.warning("stopping_superseded_work", workload=ref.workload_id, epoch=ref.epoch)
                self._stop_in_background(ref.workload_id, 0.0, EventPhase.CANCELLED)
        self.counters["syncs"] += 1
        return reply

    async def _sync_loop(self, stop: asyncio.Event) -> None:
        self._sync_now.set()  # at start
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_sync_trigger(), self.settings.resync_interval_s)
            self._sync_now.clear()
            self.bus.reconnected.clear()
            try:
                await self.sync()
            except (nats.errors.Error, TimeoutError, ValidationError) as exc:
                log.warning("sync_failed", error=str(exc) or type(exc).__name__)
                await asyncio.sleep(1.0)
                self._sync_now.set()

    async def _wait_sync_trigger(self) -> None:
        if self._sync_now.is_set():
            return
        waiters = [
            asyncio.create_task(self._sync_now.wait()),
            asyncio.create_task(self.bus.reconnected.wait()),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    # --- commands ---

    async def _on_command_msg(self, msg: Msg) -> None:
        seq: int | None = None
        with contextlib.suppress(AttributeError, ValueError):
            seq = msg.metadata.sequence.stream
        try:
            commands = parse_commands(msg.data)  # one, or several in order
        except ValidationError as exc:
            self.counters["malformed"] += 1
            log.warning("malformed_command", subject=msg.subject, error=str(exc)[:500])
            await msg.ack()  # acked so it is not redelivered forever
            return
        for i, command in enumerate(commands, 1):  # its sequence noted with the last: a spoke
            # stopped halfway gets the whole message again and drops what it applied
            await self._apply_command(command, seq if i == len(commands) else None)
        if seq is not None and seq > self.journal.state.applied_seq:  # (a started Place's
            self.journal.applied(seq)  # is noted with it, on disk before its process)
            self.journal.flush()
        await msg.ack()

    async def _apply_command(self, command: Command, seq: int | None) -> None:
        if command.term < self.fence.term:
            # From a hub that is no longer the leader: the newer leader decides now.
            self.counters["stale_term"] += 1
            log.warning("command_old_term", decision=command.decision_id, term=command.term)
        elif command.decision_id in self._seen:
            self.counters["duplicate"] += 1
            log.info("duplicate_decision", decision=command.decision_id)
        elif isinstance(command, PlaceCommand):
            self.fence.saw_term(command.term)
            await self._place(command, seq)
        else:
            self.fence.saw_term(command.term)
            self._stop(command)
        self._seen[command.decision_id] = None  # (JetStream dedupes only inside its window)
        while len(self._seen) > SEEN_DECISIONS:
            self._seen.popitem(last=False)

    async def _place(self, command: PlaceCommand, seq: int | None = None) -> None:
        wid = command.workload_id
        known = self._epochs.get(wid, -1)
        if command.epoch <= known:
            self.counters["stale"] += 1
            log.info("stale_place_dropped", workload=wid, epoch=command.epoch, known=known)
            return
        if wid in self.runtime.running():
            # An older assignment of this workload still runs here: it was superseded.
            await self.runtime.stop(wid, 0.0, EventPhase.CANCELLED)
        # Fenced, the hub may have moved it already (this Place can be older than the move);
        # draining, the instance is about to go.
        fenced = command.spec.fenced and self.fence.overdue(self.clock())
        if fenced or self.draining:
            why = "fenced" if fenced else "draining"
            log.warning("placement_refused", workload=wid, epoch=command.epoch, reason=why)
            self._epochs[wid] = command.epoch
            await self._emit(wid, command.epoch, EventPhase.REJECTED, reason=why, message=why)
            return
        problem = check_assignments(
            command, self._nodes, self._allocations.values(), self.settings.id
        )
        if problem is not None:
            log.warning("placement_rejected", workload=wid, problem=problem)
            self._epochs[wid] = command.epoch
            await self._emit(
                wid, command.epoch, EventPhase.REJECTED, reason="bad_assignment", message=problem
            )
            return
        self.journal.placed(wid, command.epoch, command.assignments)
        if seq is not None:
            self.journal.applied(seq)  # with the placement: one write before the start
        self.fence.placed(wid, command.spec.fenced)
        self.journal.flush()  # on disk before the process exists (and before the ack)
        launch = Launch(wid, command.epoch, command.decision_id, command.spec, command.assignments)
        try:
            await self.runtime.start(launch)
        except SpokeError as exc:
            self.journal.ended(wid, command.epoch)
            # "runtime_refused": this spoke will never run it, and the hub sends it elsewhere.
            reason = "runtime_refused" if isinstance(exc, PermanentSpokeError) else "runtime_error"
            await self._emit(
                wid, command.epoch, EventPhase.REJECTED, reason=reason, message=str(exc)
            )
        self._report_now.set()

    def _stop(self, command: CancelCommand | PreemptCommand) -> None:
        wid = command.workload_id
        if self._epochs.get(wid, -1) > command.epoch:
            self.counters["stale"] += 1
            return
        if isinstance(command, CancelCommand):
            self._stop_in_background(wid, self.settings.stop_grace_s, EventPhase.CANCELLED)
        else:
            self._stop_in_background(wid, command.grace_s, EventPhase.PREEMPTED)

    def _stop_in_background(self, wid: str, grace_s: float, phase: EventPhase) -> None:
        # Stopping waits out a grace period: do it beside the command stream, not in it.
        task = asyncio.create_task(self.runtime.stop(wid, grace_s, phase))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    # --- events ---

    async def _on_runtime_event(self, event: RuntimeEvent) -> None:
        if event.phase != EventPhase.RUNNING:
            # Devices are released before the end is reported: the hub relies on that order.
            self.journal.ended(event.workload_id, event.epoch)
            self.fence.ended(event.workload_id)
            self._report_now.set()
        await self._emit(
            event.workload_id,
            event.epoch,
            event.phase,
            exit_code=event.exit_code,
            reason=event.reason,
            message=event.message,
            endpoint=event.endpoint or None,
        )

    async def _emit(
        self,
        workload_id: str,
        epoch: int,
        phase: EventPhase,
        *,
        exit_code: int | None = None,
        reason: str = "",
        message: str = "",
        endpoint: str | None = None,
    ) -> None:
        event = WorkloadEvent(
            event_id=f"{self.settings.id}-{workload_id}-e{epoch}-{phase.value}",
            spoke_id=self.settings.id,
            workload_id=workload_id,
            epoch=epoch,
            phase=phase,
            exit_code=exit_code,
            # Reasons and messages come from runtimes (a pod's termination message is anything
            # the container wrote): made to fit the wire's bounds, never a reason to fail.
            reason=clean_text(reason, 256),
            message=clean_text(message, 4096),
            at=self.clock(),
            endpoint=endpoint,
        )
        payload = self.journal.queue_event(event)  # serialised once, for both
        if payload is not None:
            self._outbox.put_nowait((event.event_id, payload))
        else:
            self.counters["events_dropped"] += 1
