"""The customer's chat page in small parts, in the order a message goes through them: page (components and
wiring) → handlers/ (by concern, over one ChatContext) → app/core's desk → stream (paced pieces) → render (rows
as the chatbot's messages, answers' Markdown by markdown). text holds the page's words, api the scriptable
/chat, outputs each event's outputs."""
