"""The states a stored row is in, as types: each member equals the string the database holds (StrEnum), so
rows written before these types read the same and no value was migrated."""

from __future__ import annotations

from enum import StrEnum


class AnswerStatus(StrEnum):
    """Where a message stands (``messages.status``)."""

    OK = "ok"  # complete: a customer's question, a finished answer, a person's reply
    STOPPED = "stopped"  # cut short: the customer's Stop, a closed page, a restart
    ERROR = "error"  # failed; ``error_code`` says why in the customer's words
    GENERATING = "generating"  # the model is still writing it
    REPLACED = "replaced"  # an earlier answer a retry or an edit took the place of; never shown
    WITH_PERSON = "with_person"  # never stored: the notice of a turn a person answers (no answer row)


class Handoff(StrEnum):
    """Who answers a conversation (``conversations.handoff``)."""

    MODEL = ""  # the model (falsy, as the empty string it is stored as)
    WAITING = "waiting"  # the customer asked for a person and waits in the queue
    PERSON = "person"  # an operator holds the conversation


class Arm(StrEnum):
    """The side of a live A/B split a conversation is on (the ``arm`` label of /metrics)."""

    PUBLISHED = "published"
    CANDIDATE = "candidate"
