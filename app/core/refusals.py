"""Why the desk did not answer, as a code and its parameters — never as text a customer reads.

The chat says each code in the customer's language and in plain words (app/chat/text.py); ``str()`` of
a refusal is the precise English, with the limits' numbers, that the developers' APIs (/v1, /chat) return
and the operators' log and console show.
"""

from __future__ import annotations

ENGLISH = {
    "not_text": "The message must be text.",
    "empty": "Please type a question before sending.",
    "rate": "You are sending messages faster than {per_minute} a minute; please wait {wait_s} s and send again.",
    "streams": "You already have {open} answers in progress; the limit is {limit}. Wait for one to finish, "
               "then send again.",
    "address_rate": "Your network's address is sending messages faster than {per_minute} a minute, all its browsers "
                    "together; please wait {wait_s} s and send again.",
    "address_streams": "Your network's address already has {open} answers in progress, all its browsers together; "
                       "the limit is {limit}. Wait for one to finish, then send again.",
    "message_chars": "This message has {chars:,} characters; the limit is {limit:,}. Please shorten it or split it "
                     "into several messages.",
    "session": "This session is not valid; reload the page and send the message again.",
    "no_conversation": "That conversation does not exist here; please start a new one.",
    "nothing_to_retry": "This conversation has no question to answer again.",
    "nothing_to_edit": "This conversation has no question to edit.",
    "edit_with_person": "A person is answering this conversation; send a new message instead of editing.",
    "edit_stale": "This conversation has changed since the page showed it; reload the page, then edit.",
    "answering": "The last question is still being answered; wait for the answer to end (or stop it), then try "
                 "again.",
    "edit_last_only": "Only the last question of a conversation can be edited.",
    "no_template": "There is no published template named {name!r}. Choose one of: {shown}.",
    "not_saved": "Your message could not be saved, so it was not sent: {detail}.",
    "not_retried": "The answer could not be retried: {detail}.",
    "unreadable": "The conversation could not be read: {detail}.",
    "history_messages": "The history has {count:,} messages; the limit is {limit}. Send only the recent ones, or "
                        "start a new conversation.",
    "history_chars": "The history has {chars:,} characters; the limit is {limit:,}. Send only the recent messages, "
                     "or start a new conversation.",
    "message_too_long": "This message is too long: with the system prompt it needs {num_tokens:,} tokens, {over:,} "
                        "more than the {limit:,} this model allows. Please shorten it.",
    "conversation_too_long": "This conversation is too long for the model ({num_tokens:,} tokens, limit "
                             "{limit:,}). Please start a new conversation.",
    "prefix_unstable": "the model's chat template renders the system prompt differently from request to request, "
                       "so it can never be cached; use a chat template without dates or defaults",
    "not_continuable": "This model's chat template cannot continue an answer; ask again to get a new one.",
    "nothing_to_continue": "The last answer of this conversation was not cut short; there is nothing to continue.",
    "person_queue_full": "{limit} conversations are already waiting for a person, the most the desk takes at "
                         "once; ask for a person again in a few minutes.",
    "person_queue_own": "{limit} of your conversations already wait for a person, the most one customer may have; "
                        "a person will answer those first.",
    "busy": "The help desk is busy right now: {detail}.",
    "rejected": "This request could not be answered: {detail}.",
    "broke_off": "The answer broke off: {detail}.",
    "internal": "internal error; the answer was not completed",
}


def english(code: str, **params) -> str:
    """The precise English of ``code`` with its parameters (for developers and operators)."""
    return ENGLISH[code].format(**params)


class Refused:
    """Mixed into the core's refusals: ``code`` (a key of ENGLISH) and ``params``, the values it names."""

    code: str
    params: dict

    def _refuse(self, code: str, params: dict) -> str:
        self.code, self.params = code, dict(params)
        return english(code, **params)
