"""Populations of agents: one agent's facade, and the swarm of processes or Ray actors."""
