"""ART·E on real Enron mail: the inbox database and the agent's tools (more of the task is being built)."""
