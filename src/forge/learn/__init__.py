"""Learning from experience: the one agent loop, prompts from recall, policies, reflection into rules and examples."""
