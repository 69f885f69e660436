"""Alerts: tell an operator (webhooks, e-mail) when the guarantee or the ledger needs a person.

Events (docs/alerts.md): a contract year turning at risk or below the guarantee, a year
missed, a credit issued, a ledger log whose newest signed checkpoint is too old, a record
refused by the ledger. Each event has a deterministic idempotency key and is stored once
(a unique constraint), whatever number of detectors run at once; each is delivered to
every matching destination with retries, and every attempt is logged.

Imports point one way: ``alerts`` reads ``billing`` and ``ledger``; ``web`` and ``yoco``
read ``alerts``.
"""
