"""The ingestion-record rules shared by the ledger and the runtime (torch-free, no database).

:mod:`yoco_records.schema` holds the rules of one record, :mod:`yoco_records.canonical`
strict JSON and RFC 8785 canonical bytes. Importing this package has no side effects.
"""
