"""The chat page's event handlers, by concern; each takes the page's ChatContext first and returns its event's
outputs (app/chat/outputs.py)."""
