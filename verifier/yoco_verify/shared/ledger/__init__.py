"""Copies of the yoco modules the verifier needs (see scripts/vendor_verifier.py)."""
