"""The single-message round: the evaluation of round t rides on round t+1's message.

A two-phase round sends every client a training message, then an evaluation message: two
message trips per client per round, each paying a deployed node's process start and its 3 s
idle polls. With ``single-message`` (the default) the server holds round t's evaluation
messages back and attaches each to the next message its client gets (the first phase of round
t+1); the client evaluates what the evaluation carries, exactly as an evaluation message would
have it evaluate, *before* it handles the rest of the message, and its reply carries the
evaluation's metrics beside its own. Clients that get no message in that phase, and clients
whose ClientApp did not say it evaluates this way (a quickstart-style ClientApp), get their
evaluation message on its own in the same phase; the last round's evaluation is a phase of its
own. metrics.json records each evaluation under the round whose model it measured.

The records that ride, named once for both sides:

- ``evaluate`` (ConfigRecord): the evaluation message's config (its round, the evaluate
  config), plus ``evaluate-with``: the name of the ArrayRecord to evaluate with;
- ``evaluate-arrays`` (ArrayRecord): the evaluation's arrays, only where they differ from the
  message's own ``arrays`` (FedAvg's global model is both: it is sent once);
- ``evaluation`` (MetricRecord, in the reply): the evaluation's metrics;
- ``evaluation-error`` (ConfigRecord, in the reply, instead): why the evaluation failed (its
  ``reason``); the rest of the reply is the message's own, which the failure did not touch.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.app.message.message import make_message
from flwr.common.constant import ErrorCode

EVALUATE = "evaluate"
#: Evaluation-config key, on whichever message an evaluation travels: the round whose end state
#: the client evaluates (its state after that round's training, or its last training before it).
STATE_AFTER = "state-after-round"
EVALUATE_ARRAYS = "evaluate-arrays"
EVALUATE_WITH = "evaluate-with"
EVALUATION = "evaluation"
EVALUATION_ERROR = "evaluation-error"
#: The most characters of a failure's reason a reply carries.
MAX_REASON = 500
#: The identity-reply metric by which a ClientApp says it evaluates riding evaluations first.
CAPABLE = "evaluates-riding"


def same_arrays(a: ArrayRecord, b: ArrayRecord) -> bool:
    """Whether two records hold the same arrays (keys in order, dtypes, shapes, bytes)."""
    if a is b:
        return True
    if list(a.keys()) != list(b.keys()):
        return False
    return all(x.dtype == y.dtype and x.shape == y.shape and x.data == y.data for x, y in zip(a.values(), b.values()))


def attach(host: Message, evaluation: Message) -> None:
    """Put ``evaluation``'s config and arrays into ``host`` (a message to the same node)."""
    content = evaluation.content
    arrays = content.array_records.get("arrays", ArrayRecord())
    own = host.content.array_records.get("arrays")
    with_ = "arrays" if own is not None and same_arrays(own, arrays) else EVALUATE_ARRAYS
    host.content[EVALUATE] = ConfigRecord({**content.config_records.get("config", ConfigRecord()), EVALUATE_WITH: with_})
    if with_ == EVALUATE_ARRAYS:
        host.content[EVALUATE_ARRAYS] = arrays


@dataclass(frozen=True)
class Riding:
    """An evaluation a client found in its message: its config and the arrays to evaluate with."""

    config: ConfigRecord
    arrays: ArrayRecord


def detach(msg: Message) -> Riding | None:
    """The evaluation riding on ``msg`` (None if there is none); ``msg`` is left with a content
    of its own records only (a new RecordDict: the one it arrived with is not changed)."""
    content = msg.content
    if EVALUATE not in content.config_records:
        return None
    config = ConfigRecord(dict(content[EVALUATE]))
    with_ = str(config.pop(EVALUATE_WITH, EVALUATE_ARRAYS))
    arrays = content.array_records.get(with_, ArrayRecord())
    msg.content = RecordDict({name: record for name, record in content.items() if name not in (EVALUATE, EVALUATE_ARRAYS)})
    return Riding(config, arrays)


def failure(err: BaseException) -> ConfigRecord:
    """The ``evaluation-error`` record of an evaluation that raised ``err``."""
    return ConfigRecord({"reason": f"{type(err).__name__}: {err}"[:MAX_REASON]})


def split(reply: Message) -> tuple[Message, Message | None]:
    """A reply to a message that carried an evaluation, as the two replies it stands for: the
    reply without its ``evaluation`` (or ``evaluation-error``) record, and an evaluation reply:
    its metrics, an error reply naming why it failed, or None if it has neither (the reply
    itself if it is an error, which both share)."""
    if reply.has_error():
        return reply, reply
    content = reply.content
    if EVALUATION_ERROR in content.config_records:
        why = str(content[EVALUATION_ERROR].get("reason", ""))[:MAX_REASON]
        del content[EVALUATION_ERROR]
        if EVALUATION in content.metric_records:
            del content[EVALUATION]
        return reply, make_message(reply.metadata, error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"the evaluation failed: {why}"))
    if EVALUATION not in content.metric_records:
        return reply, None
    metrics: MetricRecord = content[EVALUATION]
    del content[EVALUATION]
    return reply, make_message(reply.metadata, RecordDict({"metrics": metrics}))
