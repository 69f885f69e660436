"""Adapters: other training runtimes report their failures into the yoco ledger.

The contract between any runtime and the ledger is two things only: the ingestion record
format (DESIGN section 4, :mod:`yoco_records.schema`) and the durable outbox
(:mod:`runtime.outbox`) that keeps each record until a sink has acknowledged it. An
adapter is a small library the training script calls; it decides *what* happened in the
ledger's words and hands the records to an outbox. See docs/adapters.md.

* :mod:`adapters.torchrun` -- torch.distributed.elastic (``torchrun``): a worker-group
  restart is a failure rolled back to the checkpoint the new group loads.
* :mod:`adapters.torchft` -- TorchFT: a replica group lost and healed from a live peer.

Imports point one way: this package uses ``yoco_records`` and the torch-free parts of
``runtime`` (records, outbox, sink) and nothing from ``ledger``, ``billing``, ``reports``,
``web`` or ``yoco``; it does not import torch either (the training script has it). Importing
it has no side effects.
"""
