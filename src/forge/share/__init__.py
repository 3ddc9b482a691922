"""Sharing memory between agents: capsules, identities, the screen, the exchange, consensus, conflicts, topologies, triggers and the bus."""
