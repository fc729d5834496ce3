"""Submissions over NATS: one task takes what has arrived, saves it together, answers each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

import structlog
from nats.aio.msg import Msg
from pydantic import ValidationError

from hub.authstore import AuditEntry
from hub.errors import HubError
from hub.records import WorkloadRecord
from hub.state import HubState
from schemas import (
    MAX_BATCH,
    ErrorReply,
    SubmitBatchReply,
    SubmitReply,
    WorkloadSpec,
    subjects,
)
from schemas.workloads import spec_problems

log = structlog.get_logger(__name__)


class Replier(Protocol):
    """What the handlers answer and ack with (`bus.client.Bus`): a batch in one write."""

    async def respond(self, replies: Sequence[tuple[Msg, bytes]]) -> None: ...

    async def ack(self, msgs: Sequence[Msg]) -> None: ...


class _OneByOne:
    """A `Replier` over nats-py's own calls, one message at a time."""

    async def respond(self, replies: Sequence[tuple[Msg, bytes]]) -> None:
        for msg, data in replies:
            if msg.reply:
                await msg.respond(data)

    async def ack(self, msgs: Sequence[Msg]) -> None:
        for msg in msgs:
            await msg.ack()


#: Stands in for an accepted submission's reply until it is taken.
_ACCEPTED = SubmitReply(ok=True)
#: Bytes of a reply's `max_payload` left for the headers it carries.
REPLY_HEADROOM = 1024
_INTERNAL = ErrorReply(code="internal", message="the hub failed; try again", retryable=True)

#: The service's `accept_for_cycle`: specs (and their audit entries) in; per spec the new
#: record or why it was refused, and the future done once the next cycle has saved them.
AcceptForCycle = Callable[
    [Sequence[WorkloadSpec], Callable[[WorkloadSpec, str], AuditEntry] | None],
    tuple[Sequence[WorkloadRecord | HubError], "asyncio.Future[None] | None"],
]
_Outcome = WorkloadRecord | HubError | ErrorReply
#: The service's `keyed.submit` (`hub.keyed`): spec, user, key and audit entry in; the workload
#: the key names and whether it was taken before.
KeyedSubmit = Callable[
    [WorkloadSpec, str, str, Callable[[WorkloadRecord], AuditEntry] | None],
    Awaitable[tuple[WorkloadRecord, bool]],
]
#: The service's `keyed.submit_batch` (`hub.keyed`): specs, their places in the batch, user,
#: key and what takes the new ones (specs and ids) in; per spec its workload or why not.
KeyedBatch = Callable[
    [
        Sequence[WorkloadSpec],
        Sequence[int],
        str,
        str,
        Callable[
            [Sequence[WorkloadSpec], Sequence[str]], Awaitable[Sequence[WorkloadRecord | HubError]]
        ],
    ],
    Awaitable[Sequence[WorkloadRecord | HubError]],
]


class Intake:
    """`submit` and `submit_batch`; `submit` and `submit_many` are the service's."""

    def __init__(
        self,
        state: HubState,
        submit: Callable[..., Awaitable[WorkloadRecord]],
        submit_many: Callable[..., Awaitable[list[WorkloadRecord | HubError]]] | None = None,
        bus: Replier | None = None,
        accept_for_cycle: AcceptForCycle | None = None,
        keyed: KeyedSubmit | None = None,
        keyed_batch: KeyedBatch | None = None,
    ) -> None:
        self.state = state
        self._keyed = keyed
        self._keyed_batch = keyed_batch
        self._submit = submit
        self._submit_many = submit_many
        self._bus = bus or _OneByOne()
        self._accept_for_cycle = accept_for_cycle
        self._answering: set[asyncio.Task[None]] = set()
        self._submits: list[Msg] = []  # arrived, not yet taken by the submitter
        self._submitter: asyncio.Task[None] | None = None

    async def on_submit(self, msg: Msg) -> None:
        """`submit`: a WorkloadSpec in, a SubmitReply out.

        Submissions are taken together: while the cycle loop runs, each waits for the next
        cycle, which takes all that arrived (`take_for_cycle`), plans them, saves them with its
        decisions in one transaction, and then they are answered in one write. Without a cycle
        loop one task takes what has arrived, and what arrives meanwhile is taken next.
        """
        key = msg.headers.get(subjects.IDEMPOTENCY_KEY) if msg.headers else None
        if key is not None and self._keyed is not None:  # looked up first: a task of its own
            self._answering_with(self._answer_keyed(msg, key), "hub-keyed-submit")
            return
        self._submits.append(msg)
        if self.state.paced and self._accept_for_cycle is not None:
            self.state.trigger()
        elif self._submitter is None:
            self._submitter = asyncio.create_task(self._run_submitter(), name="hub-submits")

    def take_for_cycle(self) -> None:
        """Hand what arrived since the last cycle to this one (the cycle loop calls this just
        before it plans); each is answered once the cycle has saved it."""
        if not self._submits or self._accept_for_cycle is None:
            return
        msgs, self._submits = self._submits, []
        specs, replies = self._parse(msgs)
        valid = [spec for spec in specs if spec is not None]
        outcomes: Sequence[_Outcome] = ()
        saved = None
        try:
            if valid:
                outcomes, saved = self._accept_for_cycle(valid, self._accepted_entry())
        except Exception:
            log.exception("submit_failed", count=len(valid))
            outcomes = [_INTERNAL] * len(valid)
        answer = self._answer_when_saved(msgs, specs, replies, outcomes, saved)
        self._answering_with(answer, "hub-submit-replies")

    def _answering_with(self, answer: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(answer, name=name)
        self._answering.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._answering.discard)

    async def _answer_keyed(self, msg: Msg, key: str) -> None:
        """A submission under an Idempotency-Key (`hub.keyed`): taken at most once, and the
        workload it names in the reply however often it is sent."""
        specs, replies = self._parse([msg])
        outcomes: list[_Outcome] = []
        spec = specs[0]
        if spec is not None and self._keyed is not None:
            entry_for = self._accepted_entry()
            audit = None if entry_for is None else (lambda r: entry_for(spec, r.id))
            try:
                outcomes.append((await self._keyed(spec, "", key, audit))[0])
            except HubError as exc:
                outcomes.append(exc)
            except Exception:
                log.exception("submit_failed", count=1)
                outcomes.append(_INTERNAL)
        try:
            await self._answer([msg], specs, replies, outcomes)
        except Exception:
            log.exception("submit_failed", count=1)

    def kick_submits(self) -> None:
        """Take what waits for a cycle that will not come (the cycle loop stopped)."""
        if self._submits and self._submitter is None:
            self._submitter = asyncio.create_task(self._run_submitter(), name="hub-submits")

    async def _run_submitter(self) -> None:
        try:
            while self._submits:
                msgs, self._submits = self._submits, []
                try:
                    await self.answer_submits(msgs)
                except Exception:
                    log.exception("submit_failed", count=len(msgs))
        finally:
            self._submitter = None

    async def answer_submits(self, msgs: Sequence[Msg]) -> None:
        """Take submissions (each a WorkloadSpec) and answer each."""
        specs, replies = self._parse(msgs)
        valid = [spec for spec in specs if spec is not None]
        outcomes = await self._take(valid) if valid else ()
        await self._answer(msgs, specs, replies, outcomes)

    async def _answer_when_saved(
        self,
        msgs: Sequence[Msg],
        specs: list[WorkloadSpec | None],
        replies: list[SubmitReply],
        outcomes: Sequence[_Outcome],
        saved: asyncio.Future[None] | None,
    ) -> None:
        if saved is not None:
            failure: _Outcome | None = None
            try:
                await saved
            except HubError as exc:  # the whole batch
                failure = exc
            except Exception:
                log.exception("submit_failed", count=len(outcomes))
                failure = _INTERNAL
            if failure is not None:
                outcomes = [failure if isinstance(o, WorkloadRecord) else o for o in outcomes]
        try:
            await self._answer(msgs, specs, replies, outcomes)
        except Exception:
            log.exception("submit_failed", count=len(msgs))

    def _parse(self, msgs: Sequence[Msg]) -> tuple[list[WorkloadSpec | None], list[SubmitReply]]:
        """Each message's spec (None if invalid) and its reply so far."""
        replies: list[SubmitReply] = []
        specs: list[WorkloadSpec | None] = []
        for msg in msgs:
            try:
                specs.append(WorkloadSpec.model_validate_json(msg.data))
                replies.append(_ACCEPTED)  # placeholder until taken
            except ValidationError as exc:
                self._refused()
                specs.append(None)
                replies.append(SubmitReply(ok=False, error=validation_error(exc, _json(msg.data))))
        return specs, replies

    async def _answer(
        self,
        msgs: Sequence[Msg],
        specs: list[WorkloadSpec | None],
        replies: list[SubmitReply],
        outcomes: Sequence[_Outcome],
    ) -> None:
        """Answer each message: its validation error, or its valid spec's outcome."""
        entry_for = self.state.submit_audit
        taken = iter(outcomes)
        for i, spec in enumerate(specs):
            if spec is None:
                continue
            outcome = next(taken)
            if isinstance(outcome, WorkloadRecord):
                replies[i] = SubmitReply(ok=True, workload_id=outcome.id)
                if entry_for is not None:
                    continue  # audited: the entry was saved with the workload
            else:
                if isinstance(outcome, HubError) and not outcome.retryable:
                    self._refused()
                error = outcome.reply() if isinstance(outcome, HubError) else outcome
                replies[i] = SubmitReply(ok=False, error=error)
            reply = replies[i]
            result = "ok" if reply.ok or reply.error is None else reply.error.code
            for listener in self.state.submit_listeners:
                await listener(spec, reply.workload_id, result)
        await self._bus.respond(
            [
                (msg, reply.model_dump_json().encode())
                for msg, reply in zip(msgs, replies, strict=True)
            ]
        )

    async def _take(self, specs: list[WorkloadSpec]) -> Sequence[_Outcome]:
        """Accept `specs` (saved together, their audit entries with them): per spec, its new
        record or why it was refused."""
        audit = self._accepted_entry()
        try:
            if self._submit_many is not None:
                return await self._submit_many(specs, "", audit=audit)
            return [await self._submit_one(spec, audit) for spec in specs]
        except HubError as exc:  # the whole batch: a standby hub takes none
            return [exc] * len(specs)
        except Exception:
            log.exception("submit_failed", count=len(specs))
            return [_INTERNAL] * len(specs)

    async def _submit_one(
        self, spec: WorkloadSpec, audit: Callable[[WorkloadSpec, str], AuditEntry] | None
    ) -> WorkloadRecord | HubError:
        try:
            if audit is None:
                return await self._submit(spec)
            return await self._submit(spec, audit=lambda r: audit(spec, r.id))
        except HubError as exc:
            return exc

    def _accepted_entry(self) -> Callable[[WorkloadSpec, str], AuditEntry] | None:
        """The audit entry of an accepted submission (spec, workload id), saved with it."""
        entry_for = self.state.submit_audit
        return None if entry_for is None else (lambda spec, wid: entry_for(spec, wid, "ok"))

    async def _tell_refused(self, refused: Sequence[tuple[WorkloadSpec, str]]) -> None:
        """Tell the submit listeners (the audit log) of specs over NATS policy refused,
        together (the audit log writes entries that arrive together in one transaction)."""
        await asyncio.gather(
            *(
                listener(spec, None, code)
                for spec, code in refused
                for listener in self.state.submit_listeners
            )
        )

    def _refused(self) -> None:
        self.state.counters["submit_invalid"] += 1
        self.state.metrics.rejections.labels("submit").inc()

    async def on_submit_batch(self, msg: Msg) -> None:
        """`submit_batch`: a JSON list of WorkloadSpec in, a SubmitBatchReply out."""
        key = msg.headers.get(subjects.IDEMPOTENCY_KEY) if msg.headers else None
        try:
            reply = await self.submit_batch(
                msg.data, audit=self._accepted_entry(), on_refused=self._tell_refused, key=key
            )
        except HubError as exc:  # the batch as a whole: a key that is none, say
            reply = SubmitBatchReply(error=exc.reply())
        except Exception:
            log.exception("submit_batch_failed")
            reply = SubmitBatchReply(error=_INTERNAL)
        if msg.reply:
            # Within what the server carries (less room for the request's headers, which the
            # reply echoes): a larger reply would never reach its sender.
            data = reply.encode(msg._client.max_payload - REPLY_HEADROOM)
            await msg.respond(data)

    async def submit_batch(
        self,
        body: bytes | str,
        user: str = "",
        audit: Callable[[WorkloadSpec, str], AuditEntry] | None = None,
        on_refused: Callable[[Sequence[tuple[WorkloadSpec, str]]], Awaitable[None]] | None = None,
        key: str | None = None,
    ) -> SubmitBatchReply:
        """Validate each spec of a JSON list on its own; store the valid ones together.

        A body that is not a list, or holds more than MAX_BATCH specs, is refused whole.
        `audit`: the entry of each accepted spec (spec, workload id), saved with it;
        `on_refused`: told, once, the valid specs policy refused, each with its error code.
        `key`: an Idempotency-Key (`hub.keyed`): each spec is taken at most once, and sent
        again the batch answers with the workloads it made (raises InvalidRequest for a key
        that is none).
        """
        try:
            items = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return SubmitBatchReply(
                error=ErrorReply(code="invalid_json", message=f"body is not JSON: {exc}")
            )
        if isinstance(items, dict) and isinstance(items.get("workloads"), list):
            items = items["workloads"]
        if not isinstance(items, list):
            return SubmitBatchReply(
                error=ErrorReply(
                    code="invalid_batch",
                    message='a batch is a JSON list of workload specs (or {"workloads": [...]})',
                )
            )
        if len(items) > MAX_BATCH:
            return SubmitBatchReply(
                error=ErrorReply(
                    code="batch_too_large",
                    message=f"a batch holds at most {MAX_BATCH} workloads; this one has "
                    f"{len(items)}: split it",
                )
            )
        replies: list[SubmitReply | None] = []
        specs: list[WorkloadSpec] = []
        places: list[int] = []
        for place, item in enumerate(items):
            try:
                specs.append(WorkloadSpec.model_validate(item))
                places.append(place)
                replies.append(None)
            except ValidationError as exc:
                replies.append(SubmitReply(ok=False, error=validation_error(exc, item)))
        submit_many = self._submit_many
        if submit_many is None:
            raise RuntimeError("this hub takes no batches")
        taken: Sequence[WorkloadRecord | HubError]
        if key is None or self._keyed_batch is None:
            taken = await submit_many(specs, user, audit=audit)
        else:
            taken = await self._keyed_batch(
                specs, places, user, key, lambda new, ids: submit_many(new, user, audit, ids)
            )
        outcomes = iter(taken)
        results: list[SubmitReply] = []
        for reply in replies:
            if reply is None:
                outcome = next(outcomes)
                if isinstance(outcome, HubError):
                    reply = SubmitReply(ok=False, error=outcome.reply())
                else:
                    reply = SubmitReply(ok=True, workload_id=outcome.id)
            results.append(reply)
        turned_down = [
            (spec, o.code) for spec, o in zip(specs, taken, strict=True) if isinstance(o, HubError)
        ]
        if on_refused is not None and turned_down:
            await on_refused(turned_down)
        accepted = sum(r.ok for r in results)
        refused = len(results) - accepted
        self.state.counters["submit_invalid"] += refused
        return SubmitBatchReply(results=tuple(results), accepted=accepted, refused=refused)


def validation_error(exc: ValidationError, data: object = None) -> ErrorReply:
    """Our error shape from pydantic's about submitted `data`: every problem (its unknown
    fields first), naming the field of the first."""
    field, text = spec_problems(exc.errors(), data)
    return ErrorReply(code="invalid_workload", message=text, field=field)


def _json(data: bytes) -> object:
    """`data` as JSON, or None when it is not (a refusal's unknown fields are read from it);
    a hostile nesting too deep for the parser is no JSON either."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None
