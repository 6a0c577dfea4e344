"""Persistence of runs, sessions and turns; trajectory export."""
