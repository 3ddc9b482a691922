"""Adapters that let other frameworks use FORGE memory (each imports its framework lazily)."""
