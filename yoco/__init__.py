"""yoco package."""
